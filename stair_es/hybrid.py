"""Hybrid search: the learned sparse retriever and BM25 over the documents' text, fused.

Two retrievers answer the same query with the same filter, each returning its best
``window`` documents (default ``max(100, top_k)``):

* ``sparse``: the request's dot product over the token fields (what :meth:`SearchBackend.search` does);
* ``bm25``: BM25 over ``bm25_text`` (caption + keyword metadata; analyzer in :mod:`stair_es.lexical`).

Their lists are fused by RRF or a normalised linear combination (:mod:`stair_es.fusion`).

Where the fusion runs:

* embedded engine: in stair_es (BM25 from :mod:`stair_es.lexical`);
* Elasticsearch: the ``retriever`` API, ``rrf`` (8.14+) or ``linear`` with ``minmax`` (8.18+/9.0+);
* OpenSearch: the ``hybrid`` query with a temporary search pipeline in the request body,
  ``score-ranker-processor`` (RRF, 2.19+) or ``normalization-processor`` (``min_max`` +
  ``arithmetic_mean``, 2.10+).

When a cluster refuses the server-side form (an older version, or an emulator without it), the
same two queries are run as plain searches and fused in stair_es, and the result notes say so.
``HybridOptions.server=False`` always fuses in stair_es (then each hit shows each retriever's
rank and score, which a server-side fusion does not report).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from .errors import InvalidInputError, StairError
from .fusion import DEFAULT_RRF_K, FUSIONS, Fused, Ranked, check_rrf_k, check_weights, fuse
from .lexical import TEXT_FIELD
from .query import SearchRequest
from .schema import Hit, SearchResult

RETRIEVERS = ("sparse", "bm25")
DEFAULT_WINDOW = 100
MAX_WINDOW = 10_000


@dataclass
class HybridOptions:
    fusion: str = "rrf"
    rrf_k: int = DEFAULT_RRF_K
    weights: Sequence[float] = (0.5, 0.5)  # sparse, bm25 (linear fusion)
    window: int | None = None  # candidates per retriever; None = max(100, top_k)
    server: bool = True  # clusters: fuse on the cluster when it can

    def checked(self, top_k: int) -> "HybridOptions":
        if self.fusion not in FUSIONS:
            raise InvalidInputError(f"unknown fusion {self.fusion!r}; use one of {', '.join(FUSIONS)}")
        window = self.window if self.window is not None else max(DEFAULT_WINDOW, top_k)
        if isinstance(window, bool) or not isinstance(window, int) or not top_k <= window <= MAX_WINDOW:
            raise InvalidInputError(f"the hybrid window must be a whole number from --top-k ({top_k}) to {MAX_WINDOW}, got {window!r}")
        return HybridOptions(self.fusion, check_rrf_k(self.rrf_k), tuple(check_weights(self.weights, 2)), window, self.server)


def _retrievers(fused: Fused) -> dict[str, dict[str, Any]]:
    return {r: {"rank": fused.ranks.get(r), "score": fused.scores.get(r)} for r in RETRIEVERS}


def fuse_results(sparse: Sequence[Hit], bm25: Sequence[Hit], opts: HybridOptions, top_k: int) -> list[Hit]:
    """Fuse two hit lists (best first) into the top ``top_k`` hits, each with its retrievers' ranks and scores."""
    by_id: dict[str, Hit] = {}
    for h in list(bm25) + list(sparse):  # sparse wins for the stored fields (same document either way)
        by_id[h.id] = h
    fused = fuse([Ranked("sparse", [h.id for h in sparse], [h.score for h in sparse]),
                  Ranked("bm25", [h.id for h in bm25], [h.score for h in bm25])],
                 opts.fusion, k=opts.rrf_k, weights=opts.weights)
    out = []
    for f in fused[:top_k]:
        h = by_id[f.id]
        out.append(Hit(h.id, f.score, h.metadata, h.caption, h.source, _retrievers(f)))
    return out


def _fusion_note(opts: HybridOptions, where: str) -> str:
    how = (f"RRF (k={opts.rrf_k})" if opts.fusion == "rrf"
           else f"min-max normalised linear combination (weights sparse {opts.weights[0]:.3g}, bm25 {opts.weights[1]:.3g})")
    return f"hybrid: learned sparse + BM25 on {TEXT_FIELD}, top {opts.window} of each, fused by {how} {where}"


def hybrid_search(backend: Any, index: str, request: SearchRequest, text: str, opts: HybridOptions | None = None,
                  *, explain: bool = False) -> SearchResult:
    """Hybrid search on any built-in backend. ``request`` is the sparse side (from
    :func:`stair_es.search.make_request`); ``text`` is the BM25 query; both share its filter.
    Each hit's ``retrievers`` gives each retriever's rank and score (on a cluster fusing
    server-side, only with ``explain=True``, which runs the two retrievers once more)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("hybrid search needs a query text for its BM25 side (give TEXT, not only --tokens or --image)")
    opts = (opts or HybridOptions()).checked(request.top_k)
    from .backends.embedded import EmbeddedBackend

    if isinstance(backend, EmbeddedBackend):
        return _embedded(backend, index, request, text, opts)
    from .backends._cluster import ClusterBackend

    if isinstance(backend, ClusterBackend):
        return _cluster(backend, index, request, text, opts, explain)
    raise InvalidInputError(f"the {getattr(backend, 'name', type(backend).__name__)} backend has no hybrid search")


# --- embedded --------------------------------------------------------------------------------
def _embedded(backend: Any, index: str, request: SearchRequest, text: str, opts: HybridOptions) -> SearchResult:
    from .lexical import search_embedded

    t0 = time.perf_counter()
    ix = backend._reader(index)  # noqa: SLF001 - the embedded backend's engine handle
    req = request.prepared(ix.schema, ix.vocab)
    notes = list(req.notes)
    sparse = ix.search(replace(req, top_k=opts.window)).hits if req.clauses else []
    if not req.clauses:
        notes.append("the query gave no tokens for the sparse retriever: BM25 alone ranks the hits")
    lex = []
    for s, d, score in search_embedded(ix, text, opts.window, req.filter, notes):
        lex.append(Hit(s.seg.doc_id(d), score, s.seg.metadata(d), s.seg.caption(d), s.seg.source(d)))
    hits = fuse_results(sparse, lex, opts, request.top_k)
    notes.append(_fusion_note(opts, "in stair_es"))
    return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)  # fusion sees only the windows


# --- Elasticsearch / OpenSearch --------------------------------------------------------------
def bm25_query(text: str, sparse_query: Mapping[str, Any]) -> dict[str, Any]:
    """BM25 on ``bm25_text`` with the sparse query's filter and exclusions (from its ``bool``)."""
    b = sparse_query.get("bool", {})
    q: dict[str, Any] = {"must": [{"match": {TEXT_FIELD: {"query": text}}}]}
    if b.get("filter"):
        q["filter"] = b["filter"]
    if b.get("must_not"):
        q["must_not"] = b["must_not"]
    return {"bool": q}


def es_retriever(sparse_query: Mapping[str, Any], text: str, opts: HybridOptions) -> dict[str, Any]:
    """The Elasticsearch ``retriever`` (the value of ``"retriever"`` in a ``_search`` body)."""
    subs = [{"standard": {"query": dict(sparse_query)}}, {"standard": {"query": bm25_query(text, sparse_query)}}]
    if opts.fusion == "rrf":
        return {"rrf": {"retrievers": subs, "rank_window_size": opts.window, "rank_constant": opts.rrf_k}}
    return {"linear": {"retrievers": [{"retriever": r, "weight": float(w), "normalizer": "minmax"}
                                      for r, w in zip(subs, opts.weights)],
                       "rank_window_size": opts.window}}


def os_search_pipeline(opts: HybridOptions) -> dict[str, Any]:
    """The OpenSearch search pipeline (temporary, in the request body) fusing a ``hybrid`` query."""
    if opts.fusion == "rrf":
        proc = {"score-ranker-processor": {"combination": {"technique": "rrf", "rank_constant": opts.rrf_k}}}
    else:
        proc = {"normalization-processor": {"normalization": {"technique": "min_max"},
                                            "combination": {"technique": "arithmetic_mean",
                                                            "parameters": {"weights": [float(w) for w in opts.weights]}}}}
    return {"phase_results_processors": [proc]}


def os_hybrid(sparse_query: Mapping[str, Any], text: str) -> dict[str, Any]:
    return {"hybrid": {"queries": [dict(sparse_query), bm25_query(text, sparse_query)]}}


def hybrid_body(engine: str, sparse_query: Mapping[str, Any], text: str, opts: HybridOptions, top_k: int) -> dict[str, Any]:
    """The whole ``_search`` body for a server-side hybrid search on ``engine``; pure, no client needed."""
    if engine == "elasticsearch":
        return {"retriever": es_retriever(sparse_query, text, opts), "size": top_k}
    # OpenSearch's hybrid query returns ``size`` hits per sub-query: ask for the window, keep top_k
    return {"query": os_hybrid(sparse_query, text), "search_pipeline": os_search_pipeline(opts), "size": opts.window}


def _cluster(backend: Any, index: str, request: SearchRequest, text: str, opts: HybridOptions, explain: bool) -> SearchResult:
    from .backends.dsl import translate

    t0 = time.perf_counter()
    meta = backend._meta(index)  # noqa: SLF001
    if not meta.has_text:
        raise InvalidInputError(
            f"index {index!r} has no {TEXT_FIELD} field for BM25 (it was created before stair_es had hybrid search): "
            f"create a new index with `stair-es index create` and ingest again to search it with --hybrid"
        )
    req = request.prepared(meta.schema, backend.vocab)
    tr = translate(req, engine=backend.adapter.engine, field_type=meta.field_type, max_clauses=backend.max_clauses - 1,
                   vocab=backend.vocab, seismic=getattr(backend, "seismic", None))
    notes = list(req.notes) + tr.notes
    source = {"excludes": list(meta.schema.sparse_fields) + ["dense", TEXT_FIELD]}
    path = backend._path(index, "_search")  # noqa: SLF001

    def component_lists() -> list[list[Hit]]:
        lists = []
        for q in (tr.query if req.clauses else None, bm25_query(text, tr.query)):
            if q is None:
                lists.append([])
                continue
            res = backend._call("POST", path, {"query": q, "size": opts.window, "_source": source},  # noqa: SLF001
                                action=f"search {index!r}", index=index)
            lists.append([_hit(backend, h, meta) for h in res.get("hits", {}).get("hits", [])])
        return lists

    if opts.server and req.clauses:
        body = hybrid_body(backend.adapter.engine, tr.query, text, opts, req.top_k)
        body["_source"] = source
        try:
            res = backend._call("POST", path, body, action=f"hybrid search {index!r}", index=index, retry=False)  # noqa: SLF001
        except StairError as e:
            notes.append(f"the cluster refused the server-side hybrid search ({str(e).splitlines()[0][:200]}); "
                         "the two result lists were fused in stair_es instead")
        else:
            hits = [_hit(backend, h, meta) for h in res.get("hits", {}).get("hits", [])][: req.top_k]
            if explain:
                ranks = [{h.id: (r, h.score) for r, h in enumerate(lst, start=1)} for lst in component_lists()]
                for h in hits:
                    h.retrievers = {name: dict(zip(("rank", "score"), rk.get(h.id, (None, None))))
                                    for name, rk in zip(RETRIEVERS, ranks)}
            where = ("by the cluster (retriever API)" if backend.adapter.engine == "elasticsearch"
                     else "by the cluster (hybrid query + search pipeline)")
            notes.append(_fusion_note(opts, where))
            return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)
    sparse, lex = component_lists()
    hits = fuse_results(sparse, lex, opts, req.top_k)
    notes.append(_fusion_note(opts, "in stair_es"))
    return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)


def _hit(backend: Any, h: Mapping[str, Any], meta: Any) -> Hit:
    src = h.get("_source") or {}
    return Hit(h["_id"], float(h.get("_score") or 0.0), backend._metadata_out(src, meta.schema),  # noqa: SLF001
               src.get("caption_text"), src.get("path"))
