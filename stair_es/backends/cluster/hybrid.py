"""Hybrid search on Elasticsearch and OpenSearch: the request bodies and the cluster's side of
:meth:`SearchBackend.hybrid_search` (options and fusion live in :mod:`stair_es.hybrid`).

* Elasticsearch: the ``retriever`` API, ``rrf`` (8.14+) or ``linear`` with ``minmax`` (8.18+/9.0+),
  over ``standard`` retrievers and a ``knn`` retriever on ``dense``;
* OpenSearch: the ``hybrid`` query (a ``knn`` sub-query on ``dense``) with a temporary search
  pipeline in the request body, ``score-ranker-processor`` (RRF, 2.19+) or
  ``normalization-processor`` (``min_max`` + ``arithmetic_mean``, 2.10+).

When a cluster refuses the server-side form (an older version, or an emulator without it), the
same queries are run as plain searches and fused in stair_es, and the result notes say so.
The body builders are pure functions (no client needed); :class:`ClusterHybrid` is the part of
:class:`~stair_es.backends.cluster.ClusterBackend` that sends them.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from ...dense import DenseSpec, no_dense_error, query_vector
from ...errors import InvalidInputError, StairError
from ...hybrid import MAX_WINDOW, HybridOptions, checked_options, fuse_results, fusion_note
from ...lexical import TEXT_FIELD
from ...query import SearchRequest
from ...schema import DENSE_FIELD, Hit, SearchResult
from .translate import filter_of


def bm25_query(text: str, sparse_query: Mapping[str, Any]) -> dict[str, Any]:
    """BM25 on ``bm25_text`` with the sparse query's filter and exclusions (from its ``bool``)."""
    return {"bool": {"must": [{"match": {TEXT_FIELD: {"query": text}}}], **filter_of(sparse_query)}}


def es_knn(vector: Any, sparse_query: Mapping[str, Any], window: int) -> dict[str, Any]:
    """Elasticsearch ``knn`` (the body of a ``knn`` retriever or search section) on ``dense``:
    ``k`` = the window, ``num_candidates`` = twice that (at most 10,000), the shared filter."""
    return _filtered({"field": DENSE_FIELD, "query_vector": [float(x) for x in vector], "k": window,
                      "num_candidates": min(MAX_WINDOW, 2 * window)}, sparse_query)


def os_knn(vector: Any, sparse_query: Mapping[str, Any], window: int) -> dict[str, Any]:
    """OpenSearch ``knn`` query on ``dense`` (``k`` = the window; the filter inside, as efficient filtering)."""
    return {"knn": {DENSE_FIELD: _filtered({"vector": [float(x) for x in vector], "k": window}, sparse_query)}}


def _filtered(knn: dict[str, Any], sparse_query: Mapping[str, Any]) -> dict[str, Any]:
    """``knn`` with the sparse query's filter and exclusions (if any) as its ``filter``."""
    f = filter_of(sparse_query)
    return {**knn, "filter": {"bool": f}} if f else knn


def _needs(opts: HybridOptions, text: str | None, vector: Any) -> None:
    if "dense" in opts.retrievers and vector is None:
        raise InvalidInputError("the dense retriever needs its query vector here: pass vector=... "
                                "(stair_es.dense.query_vector makes it from text with the index's dense model)")
    if "bm25" in opts.retrievers and not text:
        raise InvalidInputError("the BM25 retriever needs a query text")


def es_retriever(sparse_query: Mapping[str, Any], text: str | None, opts: HybridOptions, vector: Any = None) -> dict[str, Any]:
    """The Elasticsearch ``retriever`` (the value of ``"retriever"`` in a ``_search`` body)."""
    _needs(opts, text, vector)
    parts = (component_query("elasticsearch", n, sparse_query, text, vector, opts.window) for n in opts.retrievers)
    subs = [part if "knn" in part else {"standard": part} for part in parts]  # a query, or the dense knn section
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


class ClusterHybrid:
    """The hybrid search of :class:`~stair_es.backends.cluster.ClusterBackend` (a mixin: it
    uses the backend's metadata cache, translation and requests)."""

    def hybrid_search(self, index: str, request: SearchRequest, text: str | None, opts: HybridOptions | None = None,
                      *, explain: bool = False, vector: Any = None) -> SearchResult:
        opts = checked_options(request, text, opts)
        t0 = time.perf_counter()
        meta = self._meta(index)
        if "bm25" in opts.retrievers and not meta.has_text:
            raise InvalidInputError(
                f"index {index!r} has no {TEXT_FIELD} field for BM25 (it was created before stair_es had hybrid search): "
                f"create a new index with `stair-es index create` and ingest again to search it with --hybrid"
            )
        engine = self.adapter.engine
        if "dense" in opts.retrievers:
            spec = DenseSpec.from_dict(meta.schema.dense)
            if spec is None or not meta.has_dense:
                raise no_dense_error(index)
            vector = query_vector(spec, index, text=text, vector=vector)
        req = request.prepared(meta.schema, self.vocab)
        tr = self.translate_request(req, meta, max_clauses=self.config.max_clauses - 1)
        notes = list(req.notes) + tr.notes
        source = {"excludes": list(meta.schema.sparse_fields) + [DENSE_FIELD, TEXT_FIELD]}
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
                res = self.request("POST", self._path(index, "_search"), body, action=f"search {index!r} ({name})", index=index)
                lists[name] = [self._hit(h, meta) for h in res.get("hits", {}).get("hits", [])]
            return lists

        server_ok = opts.server and len(opts.retrievers) > 1 and ("sparse" not in opts.retrievers or use_sparse)
        if server_ok:
            body = hybrid_body(engine, tr.query, text, opts, req.top_k, vector=vector)
            body["_source"] = source
            try:
                res = self.request("POST", self._path(index, "_search"), body, action=f"hybrid search {index!r}", index=index,
                                   retry=False)
            except StairError as e:
                notes.append(f"the cluster refused the server-side hybrid search ({str(e).splitlines()[0][:200]}); "
                             "the result lists were fused in stair_es instead")
            else:
                hits = [self._hit(h, meta) for h in res.get("hits", {}).get("hits", [])][: req.top_k]
                if explain:
                    ranks = {name: {h.id: (r, h.score) for r, h in enumerate(lst, start=1)}
                             for name, lst in component_lists().items()}
                    for h in hits:
                        h.retrievers = {name: dict(zip(("rank", "score"), ranks[name].get(h.id, (None, None))))
                                        for name in opts.retrievers}
                where = ("by the cluster (retriever API)" if engine == "elasticsearch"
                         else "by the cluster (hybrid query + search pipeline)")
                notes.append(fusion_note(opts, where))
                return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)
        hits = fuse_results(component_lists(), opts, req.top_k)
        notes.append(fusion_note(opts, "in stair_es"))
        return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)
