"""Hybrid search: the learned sparse retriever, BM25 over the documents' text and (optionally)
dense vectors, fused.

The chosen retrievers (``HybridOptions.retrievers``, default sparse + BM25) answer the same query
with the same filter, each returning its best ``window`` documents (default ``max(100, top_k)``):

* ``sparse``: the request's dot product over the token fields (what :meth:`SearchBackend.search` does);
* ``bm25``: BM25 over ``bm25_text`` (caption + keyword metadata; analyzer in :mod:`stair_es.lexical`);
* ``dense``: exact (embedded) or kNN (clusters) similarity of the index's ``dense`` vectors to the
  query vector (given, or the query text through the index's dense model; :mod:`stair_es.dense`).

Their lists are fused by RRF or a normalised linear combination (:mod:`stair_es.fusion`).

Where the fusion runs:

* embedded engine: in stair_es (BM25 from :mod:`stair_es.lexical`, dense from :mod:`stair_es.dense`);
* Elasticsearch: the ``retriever`` API, ``rrf`` (8.14+) or ``linear`` with ``minmax`` (8.18+/9.0+),
  over ``standard`` retrievers and a ``knn`` retriever on ``dense``;
* OpenSearch: the ``hybrid`` query (a ``knn`` sub-query on ``dense``) with a temporary search
  pipeline in the request body, ``score-ranker-processor`` (RRF, 2.19+) or
  ``normalization-processor`` (``min_max`` + ``arithmetic_mean``, 2.10+).

When a cluster refuses the server-side form (an older version, or an emulator without it), the
same queries are run as plain searches and fused in stair_es, and the result notes say so.
``HybridOptions.server=False`` always fuses in stair_es (then each hit shows each retriever's
rank and score, which a server-side fusion does not report).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from .errors import InvalidInputError, StairError
from .fusion import DEFAULT_RRF_K, FUSIONS, Fused, Ranked, check_rrf_k, check_weights, fuse
from .dense import DENSE_FIELD
from .lexical import TEXT_FIELD
from .query import SearchRequest
from .schema import Hit, SearchResult

RETRIEVERS = ("sparse", "bm25", "dense")
DEFAULT_RETRIEVERS = ("sparse", "bm25")
DEFAULT_WINDOW = 100
MAX_WINDOW = 10_000


def parse_retrievers(text: str | Sequence[str]) -> tuple[str, ...]:
    """``"sparse,bm25,dense"`` (or a sequence) -> the retrievers to fuse, checked, in the given order."""
    names = [n.strip().lower() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in RETRIEVERS]
    if unknown or not names:
        raise InvalidInputError(f"unknown retriever {unknown[0]!r}; use a comma-separated list of {', '.join(RETRIEVERS)}"
                                if unknown else f"--retrievers needs at least one of {', '.join(RETRIEVERS)}")
    if len(set(names)) != len(names):
        raise InvalidInputError(f"--retrievers names a retriever twice: {','.join(names)}")
    return tuple(names)


@dataclass
class HybridOptions:
    fusion: str = "rrf"
    rrf_k: int = DEFAULT_RRF_K
    weights: Sequence[float] | None = None  # one per retriever, in ``retrievers`` order (linear fusion); None = equal
    window: int | None = None  # candidates per retriever; None = max(100, top_k)
    server: bool = True  # clusters: fuse on the cluster when it can
    retrievers: Sequence[str] = DEFAULT_RETRIEVERS  # any of sparse, bm25, dense

    def checked(self, top_k: int) -> "HybridOptions":
        if self.fusion not in FUSIONS:
            raise InvalidInputError(f"unknown fusion {self.fusion!r}; use one of {', '.join(FUSIONS)}")
        window = self.window if self.window is not None else max(DEFAULT_WINDOW, top_k)
        if isinstance(window, bool) or not isinstance(window, int) or not top_k <= window <= MAX_WINDOW:
            raise InvalidInputError(f"the hybrid window must be a whole number from --top-k ({top_k}) to {MAX_WINDOW}, got {window!r}")
        names = parse_retrievers(self.retrievers)
        weights = self.weights if self.weights is not None else [1.0] * len(names)
        return HybridOptions(self.fusion, check_rrf_k(self.rrf_k), tuple(check_weights(weights, len(names), names)), window,
                             self.server, names)


def _retrievers(fused: Fused, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    return {r: {"rank": fused.ranks.get(r), "score": fused.scores.get(r)} for r in names}


def fuse_results(lists: Mapping[str, Sequence[Hit]] | Sequence[Hit], bm25: Sequence[Hit] | None = None,
                 opts: HybridOptions | None = None, top_k: int = 10) -> list[Hit]:
    """Fuse hit lists (retriever name -> hits, best first) into the top ``top_k`` hits, each with its
    retrievers' ranks and scores. ``fuse_results(sparse, bm25, opts, top_k)`` (two lists) still works."""
    if not isinstance(lists, Mapping):
        lists = {"sparse": lists, "bm25": bm25 or []}
    opts = opts or HybridOptions(retrievers=tuple(lists)).checked(top_k)
    names = tuple(opts.retrievers)
    by_id: dict[str, Hit] = {}
    for name in reversed(names):  # the first retriever wins for the stored fields (same document either way)
        for h in lists.get(name, []):
            by_id[h.id] = h
    fused = fuse([Ranked(name, [h.id for h in lists.get(name, [])], [h.score for h in lists.get(name, [])]) for name in names],
                 opts.fusion, k=opts.rrf_k, weights=opts.weights)
    out = []
    for f in fused[:top_k]:
        h = by_id[f.id]
        out.append(Hit(h.id, f.score, h.metadata, h.caption, h.source, _retrievers(f, names)))
    return out


def _fusion_note(opts: HybridOptions, where: str) -> str:
    label = {"sparse": "learned sparse", "bm25": f"BM25 on {TEXT_FIELD}", "dense": "dense vectors"}
    how = (f"RRF (k={opts.rrf_k})" if opts.fusion == "rrf"
           else "min-max normalised linear combination (weights "
                + ", ".join(f"{n} {w:.3g}" for n, w in zip(opts.retrievers, opts.weights)) + ")")
    return f"hybrid: {' + '.join(label[n] for n in opts.retrievers)}, top {opts.window} of each, fused by {how} {where}"


def hybrid_search(backend: Any, index: str, request: SearchRequest, text: str | None, opts: HybridOptions | None = None,
                  *, explain: bool = False, vector: Any = None) -> SearchResult:
    """Hybrid search on any built-in backend. ``request`` is the sparse side (from
    :func:`stair_es.search.make_request`); ``text`` is the BM25 query and, without ``vector``, what
    the index's dense model encodes for the dense side; all share the request's filter.
    ``vector``: an explicit dense query vector. Each hit's ``retrievers`` gives each retriever's
    rank and score (on a cluster fusing server-side, only with ``explain=True``, which runs the
    retrievers once more)."""
    opts = (opts or HybridOptions()).checked(request.top_k)
    if "bm25" in opts.retrievers and (not isinstance(text, str) or not text.strip()):
        raise InvalidInputError("hybrid search needs a query text for its BM25 side (give TEXT, not only --tokens or --image)")
    from .backends.embedded import EmbeddedBackend

    if isinstance(backend, EmbeddedBackend):
        return _embedded(backend, index, request, text, opts, vector)
    from .backends._cluster import ClusterBackend

    if isinstance(backend, ClusterBackend):
        return _cluster(backend, index, request, text, opts, explain, vector)
    raise InvalidInputError(f"the {getattr(backend, 'name', type(backend).__name__)} backend has no hybrid search")


# --- embedded --------------------------------------------------------------------------------
def _embedded(backend: Any, index: str, request: SearchRequest, text: str | None, opts: HybridOptions,
              vector: Any = None) -> SearchResult:
    t0 = time.perf_counter()
    ix = backend._reader(index)  # noqa: SLF001 - the embedded backend's engine handle
    req = request.prepared(ix.schema, ix.vocab)
    notes = list(req.notes)
    lists: dict[str, list[Hit]] = {}
    if "dense" in opts.retrievers:
        from .dense import query_vector, search_embedded as dense_search

        spec = backend.dense_spec(index)
        if spec is None:
            from .dense import no_dense_error

            raise no_dense_error(index)
        q = query_vector(spec, index, text=text, vector=vector)
        lists["dense"] = [Hit(s.seg.doc_id(d), score, s.seg.metadata(d), s.seg.caption(d), s.seg.source(d))
                          for s, d, score in dense_search(ix, spec, q, opts.window, req.filter, notes)]
    if "sparse" in opts.retrievers:
        lists["sparse"] = ix.search(replace(req, top_k=opts.window)).hits if req.clauses else []
        if not req.clauses:
            notes.append("the query gave no tokens for the sparse retriever: the other retrievers rank the hits")
    if "bm25" in opts.retrievers:
        from .lexical import search_embedded

        lists["bm25"] = [Hit(s.seg.doc_id(d), score, s.seg.metadata(d), s.seg.caption(d), s.seg.source(d))
                         for s, d, score in search_embedded(ix, text, opts.window, req.filter, notes)]
    hits = fuse_results(lists, None, opts, request.top_k)
    notes.append(_fusion_note(opts, "in stair_es"))
    return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)  # fusion sees only the windows


# --- Elasticsearch / OpenSearch --------------------------------------------------------------
def _filter_of(sparse_query: Mapping[str, Any]) -> dict[str, Any]:
    """The ``filter`` / ``must_not`` of the sparse query's ``bool`` (what every retriever shares)."""
    b = sparse_query.get("bool", {})
    return {k: b[k] for k in ("filter", "must_not") if b.get(k)}


def bm25_query(text: str, sparse_query: Mapping[str, Any]) -> dict[str, Any]:
    """BM25 on ``bm25_text`` with the sparse query's filter and exclusions (from its ``bool``)."""
    return {"bool": {"must": [{"match": {TEXT_FIELD: {"query": text}}}], **_filter_of(sparse_query)}}


def es_knn(vector: Any, sparse_query: Mapping[str, Any], window: int) -> dict[str, Any]:
    """Elasticsearch ``knn`` (the body of a ``knn`` retriever or search section) on ``dense``:
    ``k`` = the window, ``num_candidates`` = twice that (at most 10,000), the shared filter."""
    out: dict[str, Any] = {"field": DENSE_FIELD, "query_vector": [float(x) for x in vector], "k": window,
                           "num_candidates": min(MAX_WINDOW, 2 * window)}
    f = _filter_of(sparse_query)
    if f:
        out["filter"] = {"bool": f}
    return out


def os_knn(vector: Any, sparse_query: Mapping[str, Any], window: int) -> dict[str, Any]:
    """OpenSearch ``knn`` query on ``dense`` (``k`` = the window; the filter inside, as efficient filtering)."""
    inner: dict[str, Any] = {"vector": [float(x) for x in vector], "k": window}
    f = _filter_of(sparse_query)
    if f:
        inner["filter"] = {"bool": f}
    return {"knn": {DENSE_FIELD: inner}}


def _needs(opts: HybridOptions, text: str | None, vector: Any) -> None:
    if "dense" in opts.retrievers and vector is None:
        raise InvalidInputError("the dense retriever needs its query vector here: pass vector=... "
                                "(stair_es.dense.query_vector makes it from text with the index's dense model)")
    if "bm25" in opts.retrievers and not text:
        raise InvalidInputError("the BM25 retriever needs a query text")


def es_retriever(sparse_query: Mapping[str, Any], text: str | None, opts: HybridOptions, vector: Any = None) -> dict[str, Any]:
    """The Elasticsearch ``retriever`` (the value of ``"retriever"`` in a ``_search`` body)."""
    _needs(opts, text, vector)
    by_name = {"sparse": lambda: {"standard": {"query": dict(sparse_query)}},
               "bm25": lambda: {"standard": {"query": bm25_query(text, sparse_query)}},
               "dense": lambda: {"knn": es_knn(vector, sparse_query, opts.window)}}
    subs = [by_name[n]() for n in opts.retrievers]
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


def os_hybrid(sparse_query: Mapping[str, Any], text: str | None, opts: HybridOptions | None = None,
              vector: Any = None) -> dict[str, Any]:
    """The OpenSearch ``hybrid`` query: one sub-query per retriever, in ``opts.retrievers`` order."""
    opts = opts or HybridOptions().checked(10)
    _needs(opts, text, vector)
    return {"hybrid": {"queries": [component_query("opensearch", n, sparse_query, text, vector, opts.window)["query"]
                                   for n in opts.retrievers]}}


def component_query(engine: str, name: str, sparse_query: Mapping[str, Any], text: str | None, vector: Any,
                    window: int) -> dict[str, Any]:
    """One retriever alone as a ``_search`` body part (for fusing in stair_es and for explain)."""
    if name == "sparse":
        return {"query": dict(sparse_query)}
    if name == "bm25":
        return {"query": bm25_query(text or "", sparse_query)}
    if engine == "elasticsearch":
        return {"knn": es_knn(vector, sparse_query, window)}
    return {"query": os_knn(vector, sparse_query, window)}


def hybrid_body(engine: str, sparse_query: Mapping[str, Any], text: str | None, opts: HybridOptions, top_k: int,
                *, vector: Any = None) -> dict[str, Any]:
    """The whole ``_search`` body for a server-side hybrid search on ``engine``; pure, no client needed."""
    if engine == "elasticsearch":
        return {"retriever": es_retriever(sparse_query, text, opts, vector), "size": top_k}
    # OpenSearch's hybrid query returns ``size`` hits per sub-query: ask for the window, keep top_k
    return {"query": os_hybrid(sparse_query, text, opts, vector), "search_pipeline": os_search_pipeline(opts),
            "size": opts.window}


def _cluster(backend: Any, index: str, request: SearchRequest, text: str | None, opts: HybridOptions, explain: bool,
             vector: Any = None) -> SearchResult:
    from .backends.dsl import translate

    t0 = time.perf_counter()
    meta = backend._meta(index)  # noqa: SLF001
    if "bm25" in opts.retrievers and not meta.has_text:
        raise InvalidInputError(
            f"index {index!r} has no {TEXT_FIELD} field for BM25 (it was created before stair_es had hybrid search): "
            f"create a new index with `stair-es index create` and ingest again to search it with --hybrid"
        )
    engine = backend.adapter.engine
    if "dense" in opts.retrievers:
        from .dense import DenseSpec, no_dense_error, query_vector

        spec = DenseSpec.from_dict(meta.schema.dense)
        if spec is None or not meta.has_dense:
            raise no_dense_error(index)
        vector = query_vector(spec, index, text=text, vector=vector)
    req = request.prepared(meta.schema, backend.vocab)
    tr = translate(req, engine=engine, field_type=meta.field_type, max_clauses=backend.max_clauses - 1,
                   vocab=backend.vocab, seismic=getattr(backend, "seismic", None))
    notes = list(req.notes) + tr.notes
    source = {"excludes": list(meta.schema.sparse_fields) + [DENSE_FIELD, TEXT_FIELD]}
    path = backend._path(index, "_search")  # noqa: SLF001
    use_sparse = "sparse" in opts.retrievers and bool(req.clauses)
    if "sparse" in opts.retrievers and not req.clauses:
        notes.append("the query gave no tokens for the sparse retriever: the other retrievers rank the hits")

    def component_lists() -> dict[str, list[Hit]]:
        lists: dict[str, list[Hit]] = {}
        for name in opts.retrievers:
            if name == "sparse" and not use_sparse:
                lists[name] = []
                continue
            body = {**component_query(engine, name, tr.query, text, vector, opts.window), "size": opts.window,
                    "_source": source}
            res = backend._call("POST", path, body, action=f"search {index!r} ({name})", index=index)  # noqa: SLF001
            lists[name] = [_hit(backend, h, meta) for h in res.get("hits", {}).get("hits", [])]
        return lists

    server_ok = opts.server and len(opts.retrievers) > 1 and ("sparse" not in opts.retrievers or use_sparse)
    if server_ok:
        body = hybrid_body(engine, tr.query, text, opts, req.top_k, vector=vector)
        body["_source"] = source
        try:
            res = backend._call("POST", path, body, action=f"hybrid search {index!r}", index=index, retry=False)  # noqa: SLF001
        except StairError as e:
            notes.append(f"the cluster refused the server-side hybrid search ({str(e).splitlines()[0][:200]}); "
                         "the result lists were fused in stair_es instead")
        else:
            hits = [_hit(backend, h, meta) for h in res.get("hits", {}).get("hits", [])][: req.top_k]
            if explain:
                ranks = {name: {h.id: (r, h.score) for r, h in enumerate(lst, start=1)}
                         for name, lst in component_lists().items()}
                for h in hits:
                    h.retrievers = {name: dict(zip(("rank", "score"), ranks[name].get(h.id, (None, None))))
                                    for name in opts.retrievers}
            where = ("by the cluster (retriever API)" if engine == "elasticsearch"
                     else "by the cluster (hybrid query + search pipeline)")
            notes.append(_fusion_note(opts, where))
            return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)
    hits = fuse_results(component_lists(), None, opts, req.top_k)
    notes.append(_fusion_note(opts, "in stair_es"))
    return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)


def _hit(backend: Any, h: Mapping[str, Any], meta: Any) -> Hit:
    src = h.get("_source") or {}
    return Hit(h["_id"], float(h.get("_score") or 0.0), backend._metadata_out(src, meta.schema),  # noqa: SLF001
               src.get("caption_text"), src.get("path"))
