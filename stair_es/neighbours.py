"""IMAGINATOR-style co-occurrence neighbours: PPMI between caption words and image tokens.

What this module owns: the document-level co-occurrence counts of an index (which caption
words and which image tokens occur in the same document), their PPMI, the stored copy of
those counts beside an embedded index, and query expansion with them.

* A document contributes its caption's WordPiece tokens (the words, special and
  punctuation-only tokens left out) and the tokens of its ``image`` vector with a non-zero
  weight; each counts once per document (presence, not weight).
* ``PPMI(w, o) = max(0, log(c(w, o) * N_c / (n_w * n_o)))`` for caption word ``w`` and image
  token ``o``, where ``c`` counts documents holding both, ``n_w`` documents whose caption holds
  ``w``, ``n_o`` captioned documents holding ``o``, ``N_c`` captioned documents. For image
  token-token pairs the same with every document (``N``, ``n_o`` over all documents).
* Counts are additive: the counts of two disjoint sets of documents sum to the counts of
  their union, so an ingested batch is added and a replaced or deleted document subtracted.

Storage (embedded backend): ``<index folder>/neighbours.stats``, one engine array container
(written to a temporary file, fsynced, atomically renamed; CRC-32 footer checked on every
read) tagged with the index generation it describes. A stale or missing file is recomputed
from a scan of the index on first use; the embedded backend keeps an existing file current
on ingest and delete (:class:`StatsUpdater`). Cluster backends are scanned (one pass over
the index) the first time a process needs their statistics and kept in memory for that
process only: the clusters expose no commit generation to key a stored copy by.

It must not know how backends store documents: it reads them through ``backend.scan``.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .errors import DamagedIndexError, InvalidInputError, UnsupportedError, optional_import  # noqa: F401 - UnsupportedError: stair_es.neighbours.UnsupportedError still names it
from .sparse import SparseVector
from .vocab import VOCAB_SIZE, Vocabulary, default_vocabulary

log = logging.getLogger(__name__)

STATS_FILE = "neighbours.stats"
STATS_KIND = "stair_es.neighbours"
STATS_VERSION = 1
#: Default weight of the best-associated expansion token relative to its query token (see :func:`expand_vector`).
DEFAULT_EXPAND_WEIGHT = 0.5
#: Default minimum number of documents a pair must share to be a neighbour (one shared document is noise).
DEFAULT_MIN_COUNT = 2


# --- counting -----------------------------------------------------------------------------------
def _is_word(token: str) -> bool:
    return any(ch.isalnum() for ch in token)


def _caption_rows(captions: Sequence[str | None], vocab: Vocabulary) -> list[np.ndarray]:
    """Each caption's distinct WordPiece token ids, without special and punctuation-only tokens
    (none for a missing or blank caption), all tokenized in one batch call."""
    texts = [c for c in captions if c and c.strip()]
    encoded = iter(vocab.hf().encode_batch(texts, add_special_tokens=False)) if texts else iter(())
    keep = _word_mask(vocab)
    out = []
    for c in captions:
        if c and c.strip():
            ids = np.unique(np.asarray(next(encoded).ids, np.int64))
            out.append(ids[keep[ids]].astype(np.int32))
        else:
            out.append(np.zeros(0, np.int32))
    return out


_WORD_MASKS: dict[str, np.ndarray] = {}


def _word_mask(vocab: Vocabulary) -> np.ndarray:
    """True for the token ids a caption word may be: not special, with a letter or digit."""
    key = vocab.digest
    if key not in _WORD_MASKS:
        _WORD_MASKS[key] = np.asarray([not vocab.is_special(i) and _is_word(vocab.token(i)) for i in range(len(vocab))])
    return _WORD_MASKS[key]


def _sparse():
    """scipy.sparse, or a clear message naming the extra that installs it."""
    return optional_import("scipy.sparse", "co-occurrence neighbours (stair-es neighbours, search --expand)",
                           "neighbours", "scipy")


def _binary_rows(rows: Sequence[np.ndarray], n_cols: int = VOCAB_SIZE):
    sp = _sparse()

    ptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum([r.size for r in rows], out=ptr[1:])
    idx = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, np.int32)
    return sp.csr_matrix((np.ones(idx.size, np.int64), idx, ptr), shape=(len(rows), n_cols))


@dataclass
class Cooccurrence:
    """Document-level co-occurrence counts of one index (see the module docstring)."""

    n_docs: int = 0
    n_captioned: int = 0
    word_df: np.ndarray = field(default_factory=lambda: np.zeros(VOCAB_SIZE, np.int64))
    image_df: np.ndarray = field(default_factory=lambda: np.zeros(VOCAB_SIZE, np.int64))
    image_df_captioned: np.ndarray = field(default_factory=lambda: np.zeros(VOCAB_SIZE, np.int64))
    word_image: Any = None  # scipy CSR, VOCAB x VOCAB: documents holding caption word row and image token column
    image_image: Any = None  # scipy CSR, VOCAB x VOCAB: documents holding both image tokens (diagonal = image_df)
    generation: int | None = None  # the index generation these counts describe (embedded backend)

    def __post_init__(self) -> None:
        sp = _sparse()
        if self.word_image is None:
            self.word_image = sp.csr_matrix((VOCAB_SIZE, VOCAB_SIZE), dtype=np.int64)
        if self.image_image is None:
            self.image_image = sp.csr_matrix((VOCAB_SIZE, VOCAB_SIZE), dtype=np.int64)

    @classmethod
    def from_rows(cls, image_rows: Sequence[np.ndarray], caption_rows: Sequence[np.ndarray]) -> "Cooccurrence":
        """Counts of documents given as (image token ids, caption token ids) per document."""
        if len(image_rows) != len(caption_rows):
            raise InvalidInputError("one caption row per image row is needed")
        if not image_rows:
            return cls()
        img = _binary_rows([np.unique(np.asarray(r, np.int64)) for r in image_rows])
        cap = _binary_rows([np.unique(np.asarray(r, np.int64)) for r in caption_rows])
        captioned = np.asarray(cap.getnnz(axis=1) > 0)
        img_c = img[captioned]
        return cls(n_docs=len(image_rows), n_captioned=int(captioned.sum()),
                   word_df=np.asarray(cap.sum(axis=0)).ravel().astype(np.int64),
                   image_df=np.asarray(img.sum(axis=0)).ravel().astype(np.int64),
                   image_df_captioned=np.asarray(img_c.sum(axis=0)).ravel().astype(np.int64),
                   word_image=(cap.T @ img).tocsr(), image_image=(img.T @ img).tocsr())

    @classmethod
    def from_documents(cls, docs: Iterable[tuple[np.ndarray, str | None]], vocab: Vocabulary | None = None,
                       chunk: int = 4096) -> "Cooccurrence":
        """Counts of ``(image token ids, caption text)`` pairs, accumulated ``chunk`` at a time."""
        vocab = vocab or default_vocabulary()
        total = cls()
        it = iter(docs)
        while part := list(itertools.islice(it, chunk)):
            images = [np.asarray(ids) for ids, _ in part]
            total = total + cls.from_rows(images, _caption_rows([c for _, c in part], vocab))
        return total

    def _combine(self, other: "Cooccurrence", sign: int) -> "Cooccurrence":
        wi = (self.word_image + sign * other.word_image).tocsr()
        ii = (self.image_image + sign * other.image_image).tocsr()
        out = Cooccurrence(self.n_docs + sign * other.n_docs, self.n_captioned + sign * other.n_captioned,
                           self.word_df + sign * other.word_df, self.image_df + sign * other.image_df,
                           self.image_df_captioned + sign * other.image_df_captioned, wi, ii, None)
        if sign < 0 and (out.n_docs < 0 or out.n_captioned < 0 or (out.word_df < 0).any() or (out.image_df < 0).any()
                         or (wi.data < 0).any() or (ii.data < 0).any()):
            raise InvalidInputError("subtracting counts of documents that were never counted")
        wi.eliminate_zeros()
        ii.eliminate_zeros()
        return out

    def __add__(self, other: "Cooccurrence") -> "Cooccurrence":
        return self._combine(other, 1)

    def __sub__(self, other: "Cooccurrence") -> "Cooccurrence":
        return self._combine(other, -1)

    def same_counts(self, other: "Cooccurrence") -> bool:
        """Whether two sets of counts are identical (the generation tag is not compared)."""
        return (self.n_docs == other.n_docs and self.n_captioned == other.n_captioned
                and np.array_equal(self.word_df, other.word_df) and np.array_equal(self.image_df, other.image_df)
                and np.array_equal(self.image_df_captioned, other.image_df_captioned)
                and (self.word_image != other.word_image).nnz == 0 and (self.image_image != other.image_image).nnz == 0)

    # --- PPMI ------------------------------------------------------------------------------------
    def word_neighbours(self, word: int, *, min_count: int = DEFAULT_MIN_COUNT) -> list["Neighbour"]:
        """Image tokens co-occurring with caption word ``word``, by PPMI (highest first)."""
        row = self.word_image.getrow(int(word))
        return self._rank(row.indices, row.data, self.n_captioned, int(self.word_df[word]), self.image_df_captioned,
                          min_count, exclude=None)

    def image_neighbours(self, token: int, *, min_count: int = DEFAULT_MIN_COUNT) -> list["Neighbour"]:
        """Other image tokens co-occurring with image token ``token``, by PPMI (highest first)."""
        row = self.image_image.getrow(int(token))
        return self._rank(row.indices, row.data, self.n_docs, int(self.image_df[token]), self.image_df, min_count,
                          exclude=int(token))

    @staticmethod
    def _rank(ids, counts, n: int, n_x: int, df_y: np.ndarray, min_count: int, exclude: int | None) -> list["Neighbour"]:
        if n_x <= 0 or n <= 0 or ids.size == 0:
            return []
        ids = np.asarray(ids, np.int64)
        counts = np.asarray(counts, np.int64)
        keep = counts >= max(int(min_count), 1)
        if exclude is not None:
            keep &= ids != exclude
        ids, counts = ids[keep], counts[keep]
        pmi = np.log(counts * float(n) / (float(n_x) * df_y[ids].astype(np.float64)))
        pos = pmi > 0
        ids, counts, pmi = ids[pos], counts[pos], pmi[pos]
        npmi = pmi / -np.log(counts / float(n))  # counts < n whenever pmi > 0
        order = np.lexsort((ids, -counts, -pmi))
        return [Neighbour(int(ids[i]), float(pmi[i]), float(npmi[i]), int(counts[i]), int(n_x), int(df_y[ids[i]]))
                for i in order]


@dataclass
class Neighbour:
    token_id: int
    ppmi: float
    npmi: float  # PPMI / -log P(x, y): in (0, 1], 1 when the two always occur together
    count: int  # documents holding both
    count_x: int  # documents holding the asked token
    count_y: int  # documents holding this neighbour (same population as the PPMI)

    def to_dict(self, vocab: Vocabulary) -> dict[str, Any]:
        return {"token": vocab.token(self.token_id), "ppmi": round(self.ppmi, 4), "npmi": round(self.npmi, 4),
                "count": self.count, "count_token": self.count_x, "count_neighbour": self.count_y}


# --- storing (embedded backend) -------------------------------------------------------------------
def _stats_path(folder: Path) -> Path:
    return Path(folder) / STATS_FILE


def save_counts(folder: Path, counts: Cooccurrence, generation: int) -> Path:
    """Write ``counts`` (describing ``generation``) crash-safely beside an embedded index."""
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import write_arrays

    wi, ii = counts.word_image.tocsr(), counts.image_image.tocsr()
    arrays = {"word_df": counts.word_df, "image_df": counts.image_df, "image_df_captioned": counts.image_df_captioned,
              "wi_ptr": wi.indptr.astype(np.int64), "wi_idx": wi.indices.astype(np.int32), "wi_cnt": wi.data.astype(np.int64),
              "ii_ptr": ii.indptr.astype(np.int64), "ii_idx": ii.indices.astype(np.int32), "ii_cnt": ii.data.astype(np.int64)}
    meta = {"name": STATS_KIND, "kind": STATS_KIND, "version": STATS_VERSION, "generation": int(generation),
            "n_docs": counts.n_docs, "n_captioned": counts.n_captioned, "vocab_size": VOCAB_SIZE}
    path = _stats_path(folder)
    write_arrays(path, arrays, meta)
    return path


def load_counts(folder: Path) -> Cooccurrence | None:
    """The stored counts (their ``generation`` set), or None when there are none.

    The file's checksum is verified; a damaged or foreign file raises :class:`DamagedIndexError`
    (delete it: it is recomputed from the index)."""
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import read_arrays, verify_file

    path = _stats_path(folder)
    if not path.is_file():
        return None
    sp = _sparse()
    try:
        if not verify_file(path):
            raise DamagedIndexError(f"{path} has no checksum footer")
        arrays, meta = read_arrays(path)
        if meta.get("kind") != STATS_KIND or meta.get("version") != STATS_VERSION or meta.get("vocab_size") != VOCAB_SIZE:
            raise DamagedIndexError(f"{path} is not a stair_es neighbours file of version {STATS_VERSION}")
        a = {k: np.array(v) for k, v in arrays.items()}  # copies: the file may be replaced while in use
        shape = (VOCAB_SIZE, VOCAB_SIZE)
        return Cooccurrence(
            int(meta["n_docs"]), int(meta["n_captioned"]), a["word_df"], a["image_df"], a["image_df_captioned"],
            sp.csr_matrix((a["wi_cnt"], a["wi_idx"], a["wi_ptr"]), shape=shape),
            sp.csr_matrix((a["ii_cnt"], a["ii_idx"], a["ii_ptr"]), shape=shape), int(meta["generation"]))
    except DamagedIndexError as e:
        raise DamagedIndexError(f"the neighbour statistics of the index are damaged ({e}); delete {path} and they "
                                "are recomputed from the index on next use") from None
    except (KeyError, ValueError, TypeError) as e:
        raise DamagedIndexError(f"the neighbour statistics file {path} is damaged ({type(e).__name__}: {e}); delete it "
                                "and it is recomputed from the index on next use") from None


# --- one index's counts, from any backend ---------------------------------------------------------
_MEMO: dict[tuple, Cooccurrence] = {}


def _scan_counts(backend, index: str, vocab: Vocabulary) -> Cooccurrence:
    def docs() -> Iterator[tuple[np.ndarray, str | None]]:
        for ptr, tok, captions in backend.scan(index, "image"):
            for r, cap in enumerate(captions):
                yield tok[ptr[r]:ptr[r + 1]], cap

    return Cooccurrence.from_documents(docs(), vocab)


def index_counts(backend, index: str, *, vocab: Vocabulary | None = None, notes: list[str] | None = None) -> Cooccurrence:
    """The co-occurrence counts of ``index`` as it is now.

    Embedded: the stored file when it describes the index's current generation, else a scan
    (then stored). Clusters: a scan, kept in memory for this process. A backend that can
    not list its documents raises :class:`UnsupportedError`."""
    vocab = vocab or default_vocabulary()
    schema = backend.index_info(index).schema  # raises IndexNotFoundError with the backend's message
    if "image" not in schema.sparse_fields:
        raise InvalidInputError(f"index {index!r} has no 'image' sparse field to find neighbours in")
    folder = backend.index_folder(index)  # None: nowhere to keep the counts (a cluster); a scan it is
    if folder is not None:
        path = Path(folder)
        generation = backend.generation(index)
        try:
            stored = load_counts(path)
        except DamagedIndexError as e:
            log.warning("%s", e)
            stored = None
            if notes is not None:
                notes.append(f"{e}: recomputed")
        if stored is not None and stored.generation == generation:
            return stored
        counts = _scan_counts(backend, index, vocab)
        counts.generation = backend.generation(index, refresh=False)  # the one generation the scan read
        try:
            save_counts(path, counts, counts.generation)
        except OSError as e:  # a read-only folder: still answer, but say the counts could not be kept
            if notes is not None:
                notes.append(f"the neighbour statistics could not be stored in {path} ({e.strerror or e}); "
                             "they are recomputed on every use")
        return counts
    n_docs = backend.index_info(index).doc_count
    key = (backend.name, id(backend), index, n_docs)
    if key not in _MEMO:
        _MEMO[key] = _scan_counts(backend, index, vocab)
    if notes is not None:
        notes.append(f"neighbour statistics of the {backend.name} index {index!r} come from a scan of its {n_docs} "
                     "documents, kept in this process's memory only (recounted when the document count changes)")
    return _MEMO[key]


# --- incremental upkeep (embedded backend) ---------------------------------------------------------
class StatsUpdater:
    """Keeps an existing ``neighbours.stats`` current across one writer's commits.

    Used by the embedded backend for one ingest call (any number of batches), one delete or
    one optimize, while it holds the index's writer lock. Before each batch the old versions
    of the documents it may replace are read; after it, the batch's counts are added and the
    replaced ones' subtracted, in memory. :meth:`finish` then applies the sum to the stored
    counts -- if they describe the generation the change started from -- and stores them for
    the generation after it: one read and one write of the file per call, not per batch.
    When there is no stored file, or it describes another generation, or the call ends with
    an error (or a crash) before :meth:`finish`, nothing is stored and the file keeps
    describing an older generation, so the next use recomputes it. A failure here never
    fails the write.
    """

    #: documents held before they are counted (memory stays bounded on a long ingest)
    COUNT_EVERY = 4096

    def __init__(self, engine_index):
        self.ix = engine_index
        self.folder = Path(engine_index.path)
        self.active = _stats_path(self.folder).is_file()
        if self.active:
            engine_index.refresh()
        self._start: int | None = engine_index.generation if self.active else None
        self._old: dict[str, tuple[np.ndarray, str | None]] = {}
        self._plus: list[tuple[np.ndarray, str | None]] = []
        self._minus: list[tuple[np.ndarray, str | None]] = []
        self._plus_counts: Cooccurrence | None = None  # what is counted so far (bounded memory on a long ingest)
        self._minus_counts: Cooccurrence | None = None

    def _fail(self, e: Exception) -> None:
        log.warning("neighbour statistics not updated (they are recomputed on next use): %s", e)
        self.active = False

    def before(self, ids: Sequence[str]) -> None:
        """Read the current versions of ``ids`` (those the next change may replace or delete)."""
        if not self.active:
            return
        try:
            self._old = {}
            for i in self.ix.contains(list({i for i in ids if isinstance(i, str)})):
                doc = self.ix.get(i)
                v = doc.vectors.get("image")
                self._old[i] = (v.ids if v is not None else np.zeros(0, np.int32), doc.caption)
        except Exception as e:  # noqa: BLE001 - upkeep must never fail a write
            self._fail(e)

    def after(self, added: Sequence[tuple[np.ndarray, str | None]], replaced_or_deleted: Sequence[str]) -> None:
        """``added``: (image ids, caption) of the documents the change wrote; the ids whose old
        version it removed (replaced or deleted)."""
        if not self.active:
            return
        gone = [self._old[i] for i in dict.fromkeys(replaced_or_deleted) if i in self._old]
        if len(gone) != len(set(replaced_or_deleted)):
            self._fail(RuntimeError("an old document version was not read"))
            return
        self._plus.extend(added)
        self._minus.extend(gone)
        self._old = {}
        if len(self._plus) + len(self._minus) >= self.COUNT_EVERY:
            self._count()

    def _count(self) -> None:
        try:
            plus = Cooccurrence.from_documents(self._plus, self.ix.vocab)
            minus = Cooccurrence.from_documents(self._minus, self.ix.vocab)
        except Exception as e:  # noqa: BLE001 - upkeep must never fail a write
            self._fail(e)
            return
        self._plus_counts = plus if self._plus_counts is None else self._plus_counts + plus
        self._minus_counts = minus if self._minus_counts is None else self._minus_counts + minus
        self._plus, self._minus = [], []

    def finish(self) -> None:
        """Store the counts for the generation the index is at now (see the class docstring)."""
        if not self.active:
            return
        try:
            stored = load_counts(self.folder)
            if stored is None or stored.generation != self._start:
                return
            self._count()
            if not self.active:
                return
            save_counts(self.folder, stored + self._plus_counts - self._minus_counts, self.ix.generation)
        except Exception as e:  # noqa: BLE001 - upkeep must never fail a write
            self._fail(e)
        finally:
            self.active, self._plus, self._minus, self._plus_counts, self._minus_counts = False, [], [], None, None


# --- what a user asks -------------------------------------------------------------------------------
@dataclass
class NeighbourReport:
    """``stair-es neighbours``: the neighbours of one token, as a caption word and as an image token."""

    index: str
    token: str
    token_id: int | None
    as_word: list[Neighbour]
    as_image: list[Neighbour]
    n_docs: int
    n_captioned: int
    word_docs: int
    image_docs: int
    notes: list[str] = field(default_factory=list)

    def to_dict(self, vocab: Vocabulary | None = None) -> dict[str, Any]:
        vocab = vocab or default_vocabulary()
        return {"index": self.index, "token": self.token, "documents": self.n_docs, "captioned_documents": self.n_captioned,
                "caption_documents_with_token": self.word_docs, "image_documents_with_token": self.image_docs,
                "word_to_image": [n.to_dict(vocab) for n in self.as_word],
                "image_to_image": [n.to_dict(vocab) for n in self.as_image], "notes": self.notes}


def resolve_token(token: str, vocab: Vocabulary) -> int:
    """A vocabulary token, or a word that is exactly one WordPiece token; else a clear error."""
    if not isinstance(token, str) or not token.strip():
        raise InvalidInputError("give a token, e.g. `cat`")
    t = token.strip()
    if t.startswith('"') and t.endswith('"') and len(t) > 2:
        t = t[1:-1]
    i = vocab.get(t)
    if i is None:
        i = vocab.get(t.lower())
    if i is None:
        pieces = vocab.tokenize(t)
        if len(pieces) == 1 and pieces[0] in vocab:
            i = vocab.id(pieces[0])
        else:
            raise InvalidInputError(f"{token!r} is not one vocabulary token (it splits into {' '.join(pieces) or 'nothing'}); "
                                    "ask for one of those pieces")
    if vocab.is_special(i):
        raise InvalidInputError(f"{token!r} is a special token; it never occurs in captions or image vectors")
    return i


def neighbours(backend, index: str, token: str, *, top: int = 10, min_count: int = DEFAULT_MIN_COUNT,
               vocab: Vocabulary | None = None) -> NeighbourReport:
    """The ``top`` image tokens with the highest PPMI with ``token`` as a caption word, and
    with ``token`` as an image token, in ``index``; ``notes`` explain an empty answer."""
    if top < 1:
        raise InvalidInputError("--top must be at least 1")
    vocab = vocab or default_vocabulary()
    tid = resolve_token(token, vocab)
    notes: list[str] = []
    c = index_counts(backend, index, vocab=vocab, notes=notes)
    as_word = c.word_neighbours(tid, min_count=min_count)[:top]
    as_image = c.image_neighbours(tid, min_count=min_count)[:top]
    name = vocab.token(tid)
    if c.n_docs == 0:
        notes.append(f"index {index!r} has no documents: there is nothing to count")
    elif c.n_captioned == 0:
        notes.append(f"none of the {c.n_docs} documents of {index!r} has a caption, so there are no caption-word "
                     "neighbours (PPMI pairs caption words with image tokens); ingest documents with captions")
    elif c.word_df[tid] == 0:
        notes.append(f"{name!r} occurs in none of the {c.n_captioned} captions")
    elif not as_word:
        notes.append(f"{name!r} occurs in {int(c.word_df[tid])} captions, but no image token shares at least "
                     f"{min_count} of them with it more often than chance (PPMI > 0); try --min-count 1")
    if c.n_docs and c.image_df[tid] == 0:
        notes.append(f"{name!r} is the image token of no document")
    elif c.n_docs and not as_image:
        notes.append(f"{name!r} is an image token of {int(c.image_df[tid])} documents, but no other image token "
                     f"shares at least {min_count} of them with it more often than chance")
    return NeighbourReport(index, name, tid, as_word, as_image, c.n_docs, c.n_captioned, int(c.word_df[tid]),
                           int(c.image_df[tid]), notes)


# --- query expansion --------------------------------------------------------------------------------------
@dataclass
class ExpandedToken:
    token: str
    weight: float
    source: str  # the query token it expands
    ppmi: float
    npmi: float
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"token": self.token, "weight": round(self.weight, 6), "from": self.source, "ppmi": round(self.ppmi, 4),
                "npmi": round(self.npmi, 4), "count": self.count}


def expand_vector(qvec: SparseVector, counts: Cooccurrence, n: int, *, weight: float = DEFAULT_EXPAND_WEIGHT,
                  min_count: int = DEFAULT_MIN_COUNT, notes: list[str] | None = None,
                  ) -> tuple[SparseVector, dict[str, ExpandedToken]]:
    """``qvec`` plus, for each of its tokens ``t`` (weight ``q_t``), its ``n`` best image-token
    neighbours ``o`` by PPMI (not already in the query), weighted

        w_o = weight * q_t * NPMI(t, o),   NPMI = PPMI(t, o) / -log P(t, o)   (in (0, 1])

    A token reached from several query tokens keeps its largest weight. Returns the expanded
    vector and ``{token: ExpandedToken}`` of what was added; ``notes`` says which query tokens
    found nothing and why.
    """
    if n < 0:
        raise InvalidInputError("--expand takes a number of neighbours >= 0")
    if not (weight > 0 and math.isfinite(weight)):
        raise InvalidInputError("--expand-weight must be a positive number")
    added: dict[int, ExpandedToken] = {}
    if n == 0 or not qvec.nnz:
        return qvec, {}
    vocab = qvec.vocab
    own = set(int(i) for i in qvec.ids)
    missing, weak = [], []
    if counts.n_captioned == 0:
        if notes is not None:
            notes.append("no expansion: the index has no captioned documents, so no caption word has image-token "
                         "neighbours")
        return qvec, {}
    for t, qw in zip(qvec.ids, qvec.weights):
        t = int(t)
        if counts.word_df[t] == 0:
            missing.append(vocab.token(t))
            continue
        found = [nb for nb in counts.word_neighbours(t, min_count=min_count) if nb.token_id not in own][:n]
        if not found:
            weak.append(vocab.token(t))
        for nb in found:
            w = float(weight * qw * nb.npmi)
            if w > 0 and (nb.token_id not in added or added[nb.token_id].weight < w):
                added[nb.token_id] = ExpandedToken(vocab.token(nb.token_id), w, vocab.token(t), nb.ppmi, nb.npmi, nb.count)
    if notes is not None:
        if missing:
            notes.append(f"no expansion for {', '.join(repr(m) for m in missing)}: never seen in a caption of this index")
        if weak:
            notes.append(f"no expansion for {', '.join(repr(m) for m in weak)}: no image token shares >= {min_count} "
                         "captioned documents with it more often than chance")
    if not added:
        return qvec, {}
    ids = np.concatenate([qvec.ids.astype(np.int64), np.fromiter(added, np.int64, len(added))])
    wts = np.concatenate([qvec.weights.astype(np.float32), np.asarray([e.weight for e in added.values()], np.float32)])
    order = np.argsort(ids)
    out = SparseVector(ids[order].astype(np.int32), wts[order], vocab)
    return out, {e.token: e for e in sorted(added.values(), key=lambda e: -e.weight)}
