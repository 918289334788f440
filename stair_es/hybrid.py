"""Hybrid search: the learned sparse retriever, BM25 over the documents' text and (optionally)
dense vectors, fused.

The chosen retrievers (``HybridOptions.retrievers``, default sparse + BM25) answer the same query
with the same filter, each returning its best ``window`` documents (default ``max(100, top_k)``):

* ``sparse``: the request's dot product over the token fields (what :meth:`SearchBackend.search` does);
* ``bm25``: BM25 over ``bm25_text`` (caption + keyword metadata; analyzer in :mod:`stair_es.lexical`);
* ``dense``: exact (embedded) or kNN (clusters) similarity of the index's ``dense`` vectors to the
  query vector (given, or the query text through the index's dense model; :mod:`stair_es.dense`).

Their lists are fused by RRF or a normalised linear combination (:mod:`stair_es.fusion`).

This module owns the options and the fusion; each backend runs its retrievers in its own
``hybrid_search`` (:class:`~stair_es.backends.base.SearchBackend`). Where the fusion runs:

* embedded engine: in stair_es (BM25 from :mod:`stair_es.lexical`, dense from :mod:`stair_es.dense`);
* Elasticsearch (:mod:`stair_es.backends.cluster.hybrid`): the ``retriever`` API, ``rrf`` (8.14+) or ``linear`` with ``minmax`` (8.18+/9.0+),
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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .errors import InvalidInputError
from .fusion import DEFAULT_RRF_K, FUSIONS, Fused, Ranked, check_rrf_k, check_weights, fuse
from .lexical import TEXT_FIELD
from .query import SearchRequest
from .schema import Hit, SearchResult

if TYPE_CHECKING:  # types only: the backends import this module for their hybrid search
    from .backends.base import SearchBackend

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


def fuse_results(lists: Mapping[str, Sequence[Hit]], opts: HybridOptions | None = None, top_k: int = 10) -> list[Hit]:
    """Fuse hit lists (retriever name -> hits, best first) into the top ``top_k`` hits, each with its
    retrievers' ranks and scores."""
    opts = opts or HybridOptions(retrievers=tuple(lists)).checked(top_k)
    names = tuple(opts.retrievers)
    by_id: dict[str, Hit] = {}
    for name in reversed(names):  # the first retriever wins for the stored fields (same document either way)
        for h in lists.get(name, []):
            by_id[h.id] = h
    fused = fuse([Ranked(name, [h.id for h in lists.get(name, [])], [h.score for h in lists.get(name, [])]) for name in names],
                 opts.fusion, k=opts.rrf_k, weights=opts.weights)
    return [Hit(f.id, f.score, by_id[f.id].metadata, by_id[f.id].caption, by_id[f.id].source, _retrievers(f, names))
            for f in fused[:top_k]]


def fusion_note(opts: HybridOptions, where: str) -> str:
    label = {"sparse": "learned sparse", "bm25": f"BM25 on {TEXT_FIELD}", "dense": "dense vectors"}
    how = (f"RRF (k={opts.rrf_k})" if opts.fusion == "rrf"
           else "min-max normalised linear combination (weights "
                + ", ".join(f"{n} {w:.3g}" for n, w in zip(opts.retrievers, opts.weights)) + ")")
    return f"hybrid: {' + '.join(label[n] for n in opts.retrievers)}, top {opts.window} of each, fused by {how} {where}"


def checked_options(request: SearchRequest, text: str | None, opts: HybridOptions | None) -> HybridOptions:
    """``opts`` checked against the request (what every backend's ``hybrid_search`` starts with)."""
    opts = (opts or HybridOptions()).checked(request.top_k)
    if "bm25" in opts.retrievers and (not isinstance(text, str) or not text.strip()):
        raise InvalidInputError("hybrid search needs a query text for its BM25 side (give TEXT, not only --tokens or --image)")
    return opts


def hybrid_search(backend: SearchBackend, index: str, request: SearchRequest, text: str | None,
                  opts: HybridOptions | None = None, *, explain: bool = False, vector: Any = None) -> SearchResult:
    """Hybrid search on any backend that has it (:meth:`SearchBackend.hybrid_search`; others raise
    :class:`~stair_es.errors.UnsupportedError`). ``request`` is the sparse side (from
    :func:`stair_es.search.make_request`); ``text`` is the BM25 query and, without ``vector``, what
    the index's dense model encodes for the dense side; all share the request's filter.
    ``vector``: an explicit dense query vector. Each hit's ``retrievers`` gives each retriever's
    rank and score (on a cluster fusing server-side, only with ``explain=True``, which runs the
    retrievers once more)."""
    checked_options(request, text, opts)  # the same message whichever backend answers
    return backend.hybrid_search(index, request, text, opts, explain=explain, vector=vector)
