"""Semantic re-ranking: the best hits of a learned sparse search reordered by what the query means.

A text query's sparse side matches words. Where a query word is one the index holds ("cat" on a
catalog whose pictures carry ``cat``), that is what a user wants; where it is not ("sunset",
"stadium", "a chemistry flask" on pictures that carry ``volcano``, ``field``, ``bottle``), the
query was grounded on related words (:mod:`stair_es.encoders.grounding`) and the ranking is a
guess. This module takes the sparse search's best :data:`WINDOW` hits and fuses their order
with a second one: the cosine between the query's sentence embedding and each hit's own tokens,
embedded as the IDF-weighted sum of its words' embeddings (:mod:`stair_es.encoders.sentence`).
So that pictures carrying none of the query's tokens can be candidates at all, the candidate
search adds the :data:`CANDIDATE_WORDS` words the index holds nearest to the query's meaning at a
weight (:data:`CANDIDATE_WEIGHT` of the query's strongest) that keeps them below every picture
matching a query token (:func:`widened`). The two orders are fused by weighted reciprocal rank (``w_s / (k + rank_sparse) + w_m / (k +
rank_meaning)``, ``k`` = :data:`RRF_K`), where the meaning's weight ``w_m`` follows how much of
the query the index holds: :data:`WEIGHT_HELD` when every word is held (kept or lemma), growing
to :data:`WEIGHT_GROUNDED` when none is; ``w_s = 1 - w_m``.

Measured on the four public sets (``python -m benchmarks.encoders.run --limit 300 --query default
--rerank off|auto``; docs/encoders.md, "Re-ranking by meaning"), P@1 / MRR: photos 0.420 / 0.509
-> 0.439 / 0.538, sample photos 0.444 / 0.555 -> 0.611 / 0.687, Tux Paint 0.293 / 0.365 -> 0.283 /
0.359, openclipart 0.277 / 0.320 -> 0.457 / 0.505.

Only the order changes: the hits are the sparse search's (its filter, its deletions), each hit's
``score`` becomes the fused score and ``retrievers`` keeps the sparse rank and dot product beside
the meaning's rank and cosine (the dot product of the query as the user gave it, the candidate
words' share taken out, so it is what ``stair-es explain`` sums to). ``rerank="auto"`` (the
default of ``stair-es search``, ``rank-eval`` and ``serve``; ``$STAIR_ES_RERANK`` sets another) re-ranks text queries on indices
of at most :data:`AUTO_MAX_DOCS` documents when the sentence model is installed and prepared
(:meth:`SentenceEncoder.prepared`: never made behind a search; on a cluster only
when the query encoder already read the index's document frequencies, a scan there: re-ranking
reuses them), and leaves others alone; ``"semantic"`` requires it and re-ranks any index; ``"off"`` never re-ranks.
Its cost on a cold one-shot ``stair-es search`` (``benchmarks/cold_search.py``, same run, load
1.7): 0.55 s and 209 MB instead of 0.43 s and 146 MB (the int8 model loads in the background
while the query is encoded).

This module must not know about a backend's internals: it reads hits, their vectors
(:meth:`SearchBackend.vectors_of`) and document frequencies (:meth:`SearchBackend.doc_freqs`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .encoders.base import single_threaded_blas
from .errors import InvalidInputError, MissingDependencyError
from .schema import Hit, SearchResult
from .sparse import SparseVector

if TYPE_CHECKING:
    from .backends.base import SearchBackend
    from .encoders.sentence import SentenceEncoder
    from .query import SearchRequest

RERANK_CHOICES = ("auto", "semantic", "off")
#: hits of the sparse search that are re-ordered (at least the request's top_k)
WINDOW = 100
RRF_K = 10
#: the meaning's weight in the fusion when every query word is held by the index, and when none is
WEIGHT_HELD = 0.1
WEIGHT_GROUNDED = 0.7
FIELD = "image"
#: ``--rerank auto`` leaves larger indices in sparse order: reading the hits' tokens back from an
#: inverted index walks every term's block table, so it costs more the larger the index (100 hits:
#: 5.5 / 14.5 ms at 100k / 1M documents of 60 tokens out of 2,000, 49 / 120 ms at 200 tokens out of
#: 30,000; ``python benchmarks/readback.py``). ``semantic`` re-ranks them anyway.
AUTO_MAX_DOCS = 1_000_000
#: words the index holds nearest to the query's meaning, added to the candidate search
CANDIDATE_WORDS = 32
CANDIDATE_WEIGHT = 0.001


def default_mode() -> str:
    """``$STAIR_ES_RERANK`` (auto, semantic or off), else ``auto``: what ``--rerank`` defaults to."""
    return check_rerank(os.environ.get("STAIR_ES_RERANK") or "auto")


def check_rerank(value: Any) -> str:
    mode = str(value or "auto").strip().lower()
    if mode not in RERANK_CHOICES:
        raise InvalidInputError(f"rerank must be one of {', '.join(RERANK_CHOICES)}; got {value!r}")
    return mode


def held_share(grounding: Sequence[dict[str, Any]]) -> float:
    """The share of a query's words the index holds (grounding steps ``kept`` or ``lemma``); 1.0
    for a query without grounding steps (its words were not planned: nothing says they are missing)."""
    actions = [s.get("action") for s in grounding if isinstance(s, dict)]
    if not actions:
        return 1.0
    return sum(a in ("kept", "lemma") for a in actions) / len(actions)


def meaning_weight(held: float) -> float:
    return WEIGHT_HELD * held + WEIGHT_GROUNDED * (1.0 - held)


def meaning_scores(query: np.ndarray, docs: Sequence[tuple[np.ndarray, np.ndarray]], idf: np.ndarray,
                   table: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Cosine of the query embedding with each document's IDF-weighted sum of its words' embeddings
    (``docs``: (token ids, weights) each); 0 for a document with no word in the table."""
    ids, emb = table
    out = np.zeros(len(docs), np.float32)
    if not docs or not ids.size:
        return out
    tok = np.concatenate([np.asarray(t, np.int64) for t, _ in docs])
    w = np.concatenate([np.asarray(x, np.float32) for _, x in docs])
    owner = np.repeat(np.arange(len(docs)), [len(t) for t, _ in docs])
    pos = np.searchsorted(ids, tok)
    ok = (pos < ids.size) & (ids[np.minimum(pos, ids.size - 1)] == tok)
    if not ok.any():
        return out
    tok, owner = tok[ok], owner[ok]
    words, col = np.unique(pos[ok], return_inverse=True)  # the hits share most of their words
    weights = np.zeros((len(docs), words.size), np.float32)
    np.add.at(weights, (owner, col), w[ok] * idf[tok].astype(np.float32))
    sums = weights @ emb[words].astype(np.float32, copy=False)  # one product, each word's row read once
    norms = np.linalg.norm(sums, axis=1)
    live = norms > 0
    out[live] = (sums[live] @ query.astype(np.float32)) / norms[live]
    return out


def held_table(df: np.ndarray, table: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the word table whose words the index holds (``df`` > 0), as float32: all that
    :func:`candidate_words` and :func:`meaning_scores` read (a hit's words are words the index
    holds). Remembered for the last few indices, so a server or ``rank-eval`` converts them once."""
    ids, emb = table
    held = df[ids] > 0
    key = (id(emb), zlib.crc32(np.packbits(held).tobytes()), int(held.sum()))
    with _HELD_LOCK:
        hit = _HELD.get(key)
        if hit is not None and hit[0] is emb:
            return hit[1]
    value = (ids[held], emb[held].astype(np.float32))
    with _HELD_LOCK:
        _HELD[key] = (emb, value)  # (emb kept: its id cannot be reused while remembered)
        while len(_HELD) > 4:
            _HELD.pop(next(iter(_HELD)))
    return value


_HELD: dict[tuple, tuple] = {}
_HELD_LOCK = threading.Lock()


def fused_order(meaning: np.ndarray, held: float, sparse_scores: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For candidates given in sparse order: (the fused order, the fused scores, the meaning ranks).
    With ``sparse_scores``, candidates of equal sparse score share its rank (the best of theirs)."""
    n = meaning.size
    if sparse_scores is None:
        sparse_rank = np.arange(1, n + 1)
    else:
        s = np.asarray(sparse_scores, np.float64)
        sparse_rank = 1 + np.searchsorted(-np.sort(s)[::-1], -s, side="left")
    order_m = np.lexsort((np.arange(n), -meaning))  # ties in meaning keep the sparse order
    meaning_rank = np.empty(n, np.int64)
    meaning_rank[order_m] = np.arange(1, n + 1)
    wm = meaning_weight(held)
    fused = (1.0 - wm) / (RRF_K + sparse_rank) + wm / (RRF_K + meaning_rank)
    order = np.lexsort((np.arange(n), -fused))
    return order, fused, meaning_rank


def semantic_encoder(mode: str | None, model: str | None = None) -> SentenceEncoder | None:
    """The sentence encoder a search with ``rerank=mode`` uses, or None (``off``, or ``auto``
    without the model on this machine). ``semantic`` without it raises with what to install.
    ``None``: :func:`default_mode`."""
    mode = default_mode() if mode is None else check_rerank(mode)
    if mode == "off":
        return None
    from .encoders.sentence import local_model, sentence_encoder

    if mode == "auto" and model is None and local_model() is None:
        return None
    try:
        return sentence_encoder(model)
    except ImportError as e:
        if mode == "auto":
            return None
        raise MissingDependencyError("semantic re-ranking", "semantic") from e


def widened(request: SearchRequest, query: np.ndarray, df: np.ndarray,
            table: tuple[np.ndarray, np.ndarray]) -> SearchRequest:
    """``request`` for the candidate search: at least :data:`WINDOW` hits, and the :data:`CANDIDATE_WORDS`
    words the index holds nearest to the query's meaning added to its image clause at
    :data:`CANDIDATE_WEIGHT` x its strongest weight x their cosine, so pictures that carry none of the
    query's tokens can still be candidates, always below every picture that carries one."""
    words, cos = candidate_words(query, df, table)
    clauses = list(request.clauses)
    for n, c in enumerate(clauses):
        if c.field != FIELD or not words.size or not c.vector.nnz:
            continue
        extra_w = CANDIDATE_WEIGHT * float(np.max(c.vector.weights)) * cos
        vec = SparseVector.from_arrays(np.concatenate([c.vector.ids, words]), np.concatenate([c.vector.weights, extra_w]),
                                       c.vector.vocab)
        clauses[n] = dataclasses.replace(c, vector=vec)
    return dataclasses.replace(request, clauses=clauses, top_k=max(request.top_k, WINDOW), notes=list(request.notes))


def added_words(request: SearchRequest, wide: SearchRequest) -> tuple[np.ndarray, np.ndarray]:
    """(token ids sorted, weights) that :func:`widened` added to ``request``'s image clause: the
    candidate words the query did not already have."""
    ids, weights = [], []
    for c, w in zip(request.clauses, wide.clauses):
        if c.field == FIELD and w.vector is not c.vector:
            new = ~np.isin(w.vector.ids, c.vector.ids)
            ids.append(w.vector.ids[new])
            weights.append(w.vector.weights[new])
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    ids_, weights_ = np.concatenate(ids).astype(np.int64), np.concatenate(weights).astype(np.float64)
    order = np.argsort(ids_, kind="stable")
    return ids_[order], weights_[order]


def _own_score(score: float, doc: tuple[np.ndarray, np.ndarray], added: tuple[np.ndarray, np.ndarray]) -> float:
    """A widened search's ``score`` of a document without the added candidate words' share: the
    score of the query the user gave (0 for a picture only those words found)."""
    ids, weights = added
    if not ids.size or not doc[0].size:
        return score
    at = np.clip(np.searchsorted(ids, doc[0]), 0, ids.size - 1)
    hit = ids[at] == doc[0]
    return max(0.0, score - float(np.dot(weights[at[hit]], doc[1][hit])))


def candidate_words(query: np.ndarray, df: np.ndarray, table: tuple[np.ndarray, np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, cosines): the :data:`CANDIDATE_WORDS` words the index holds (``df`` > 0) nearest
    to the query embedding, nearest first, cosine above 0."""
    ids, emb = held_table(df, table)
    if not ids.size:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    cos = emb @ query.astype(np.float32)
    top = np.argsort(-cos, kind="stable")[:CANDIDATE_WORDS]
    top = top[cos[top] > 0]
    return ids[top], cos[top]


def prepare(rerank: str | None = None, model: str | None = None) -> None:
    """Start loading the sentence model and its word table in a background thread, so that a
    one-shot search (the CLI) overlaps them with encoding the query and searching; a no-op when
    re-ranking is off or the model is not here. :func:`search` then finds them loaded."""
    try:
        enc = semantic_encoder(rerank, model)
        if enc is None or _unprepared(enc, default_mode() if rerank is None else check_rerank(rerank)):
            return
    except Exception:  # noqa: BLE001 - search() reports the same problem with its own message
        return
    threading.Thread(target=_warm, args=(enc,), name="stair-es-rerank-warm", daemon=True).start()


def _unprepared(enc: SentenceEncoder, mode: str) -> str | None:
    """Why ``auto`` leaves the hits in sparse order with this model, or None: its int8 tower or word
    table is not made yet (PyTorch and about 20 s, never behind a search under ``auto``)."""
    if mode != "auto" or enc.prepared():
        return None
    return ("the sentence model is not prepared in this data home: `stair-es encoders export` prepares it once "
            "(about 20 s); --rerank semantic prepares it now")


def _warm(enc: SentenceEncoder) -> None:
    try:
        enc.word_table()  # (opens the tower first)
    except Exception:  # noqa: BLE001 - the search itself raises it, in the foreground
        pass


@dataclasses.dataclass
class Reranking:
    """What re-ranking one query's hits needs, made before its (widened) search runs."""

    enc: SentenceEncoder
    query: np.ndarray  # the query's sentence embedding
    df: np.ndarray
    n_docs: int
    grounding: Sequence[dict]
    top_k: int
    spent_s: float = 0.0  # time already spent on it (the query's embedding, the widening)
    added: tuple[np.ndarray, np.ndarray] | None = None  # the candidate words the widening added (added_words)

    def apply(self, backend: SearchBackend, index: str, result: SearchResult) -> SearchResult:
        """The widened search's ``result`` re-ranked by meaning and cut to the asked ``top_k``."""
        return rerank_result(backend, index, result, self.query, self.grounding, self.top_k, self.enc, self.df,
                             self.n_docs, spent_s=self.spent_s, added=self.added)


@dataclasses.dataclass
class Planned:
    """One query's search as re-ranking plans it: the request to run, then ``finish`` its result."""

    request: SearchRequest
    reranking: Reranking | None = None
    #: why the hits stay in sparse order, for the result's notes (None: re-ranking is off or not installed)
    why_not: str | None = None

    def finish(self, backend: SearchBackend, index: str, result: SearchResult) -> SearchResult:
        if self.reranking is not None:
            return self.reranking.apply(backend, index, result)
        if self.why_not:
            return dataclasses.replace(result, notes=[*result.notes, f"not re-ranked by meaning: {self.why_not}"])
        return result


def plan(backend: SearchBackend, index: str, request: SearchRequest, text: str | None, *,
         rerank: str | None = None, model: str | None = None) -> Planned:
    """How to search ``request`` on ``index`` with its best hits re-ranked by meaning (``text`` is
    the query's text; None for a query by tokens or image, which is never re-ranked)."""
    return plan_many(backend, [(index, request, text, rerank)], model=model)[0]


def plan_many(backend: SearchBackend, queries: Sequence[tuple[str, SearchRequest, str | None, str | None]], *,
              model: str | None = None) -> list[Planned]:
    """:func:`plan` for several ``(index, request, text, rerank)`` queries (``stair-es serve`` plans a
    batch of searches at once); each text is embedded alone, so its hits do not depend on the batch."""
    out = [Planned(request) for _, request, _, _ in queries]
    ready: dict[tuple[str, str], tuple[SentenceEncoder | None, Any, str | None]] = {}
    for i, (index, request, text, rerank) in enumerate(queries):
        mode = default_mode() if rerank is None else check_rerank(rerank)
        if not (isinstance(text, str) and text.strip()) or mode == "off":
            continue
        if (index, mode) not in ready:
            ready[index, mode] = _index_ready(backend, index, mode, model, request.doc_freqs)
        enc, freqs, out[i].why_not = ready[index, mode]
        if enc is None:
            continue
        started = time.perf_counter()
        query = enc.embed([text], batch_size=1)[0]  # alone, not with the batch's other texts: see SentenceEncoder.embed
        with single_threaded_blas():  # small products, just after the model's ONNX run (see there)
            wide = widened(request, query, freqs[0], enc.word_table())
        out[i] = Planned(wide, Reranking(enc, query, *freqs, request.grounding, request.top_k,
                                         time.perf_counter() - started, added_words(request, wide)))
    return out


def _index_ready(backend: SearchBackend, index: str, mode: str, model: str | None, known: Any = None
                 ) -> tuple[SentenceEncoder | None, Any, str | None]:
    """(the sentence encoder, (document frequencies, documents), why not): the encoder is None when
    ``index``'s hits are not re-ranked under ``mode``, with the reason when a user should see one.
    ``known``: the frequencies the query was encoded with (``SearchRequest.doc_freqs``), if any."""
    enc = semantic_encoder(mode, model)
    if enc is None:
        return None, None, None
    why = _unprepared(enc, mode)
    if why:
        return None, None, why
    if mode == "auto" and known is None and backend.index_folder(index) is None:
        return None, None, ("--rerank auto asks a cluster for its document frequencies only when the query "
                            "encoder needed them (they are a scan of the index there); --rerank semantic re-ranks anyway")
    try:
        df, n_docs = known if known is not None else backend.doc_freqs(index, FIELD)
    except NotImplementedError:
        return None, None, "this backend cannot report document frequencies"
    if mode == "auto" and n_docs > AUTO_MAX_DOCS:
        return None, None, (f"the index holds {n_docs:,} documents, more than --rerank auto re-ranks "
                            f"({AUTO_MAX_DOCS:,}: each hit's tokens are read back); --rerank semantic re-ranks anyway")
    return enc, (df, n_docs), None


def search(backend: SearchBackend, index: str, request: SearchRequest, text: str | None, *,
           rerank: str | None = None, model: str | None = None) -> SearchResult:
    """``backend.search`` with the best hits re-ranked by meaning (module docstring)."""
    planned = plan(backend, index, request, text, rerank=rerank, model=model)
    return planned.finish(backend, index, backend.search(index, planned.request))


def rerank_result(backend: SearchBackend, index: str, result: SearchResult, query: np.ndarray,
                  grounding: Sequence[dict], top_k: int, enc: SentenceEncoder, df: np.ndarray, n_docs: int,
                  spent_s: float = 0.0, added: tuple[np.ndarray, np.ndarray] | None = None) -> SearchResult:
    """``result``'s hits (sparse order) re-ranked by meaning, cut to ``top_k``; ``added``: the candidate
    words the search was widened with, whose share each hit's reported sparse score leaves out."""
    started = time.perf_counter()
    hits = result.hits
    if len(hits) < 2:
        return dataclasses.replace(result, hits=hits[:top_k])
    from .search import idf as idf_of

    empty = (np.zeros(0, np.int64), np.zeros(0, np.float32))
    docs = [(v.ids, v.weights) if v is not None else empty for v in backend.vectors_of(index, [h.id for h in hits], FIELD)]
    with single_threaded_blas():
        meaning = meaning_scores(query, docs, idf_of(df, n_docs), held_table(df, enc.word_table()))
    held = held_share(grounding)
    order, fused, meaning_rank = fused_order(meaning, held, np.array([h.score for h in hits]))
    out = []
    for i in order[:top_k]:
        h = hits[i]
        own = h.score if added is None else _own_score(h.score, docs[i], added)
        retrievers = {"sparse": {"rank": int(i) + 1, "score": own},
                      "meaning": {"rank": int(meaning_rank[i]), "score": round(float(meaning[i]), 6)}}
        out.append(Hit(h.id, float(fused[i]), h.metadata, h.caption, h.source, retrievers))
    took = (time.perf_counter() - started + spent_s) * 1000
    note = (f"re-ranked the best {len(hits)} hits by meaning ({enc.version}; weight {meaning_weight(held):.2f}: "
            f"{held:.0%} of the query's words are in the index; {took:.0f} ms); --rerank off for the sparse order")
    return dataclasses.replace(result, hits=out, notes=[*result.notes, note], took_ms=result.took_ms + took)
