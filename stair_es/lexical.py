"""BM25 over a document's text (its caption plus its keyword metadata values) for hybrid search.

The analyzer is the same on every backend (Elasticsearch and OpenSearch get it as the custom
analyzer :data:`CLUSTER_ANALYZER` on the ``bm25_text`` field):

* tokenisation: runs of Unicode letters, digits and ``_``, keeping inner apostrophes
  (``dog's``); Lucene's ``standard`` tokenizer (Unicode UAX#29 word breaks) gives the same
  tokens on ordinary text, but keeps e.g. ``3.14`` or ``U.S.A`` whole where this splits them;
* lowercasing (Unicode ``str.lower``; Lucene's ``lowercase`` filter);
* stopwords: Lucene's 33-word ``_english_`` list (:data:`ENGLISH_STOPWORDS`);
* stemming: Snowball English ("porter2", PyStemmer; the ``stemmer`` filter with
  ``language: porter2`` on the clusters), after the stopwords.

Scoring is Lucene's BM25 (``k1`` 1.2, ``b`` 0.75, idf ``ln(1 + (N - df + 0.5) / (df + 0.5))``,
no ``(k1 + 1)`` factor): the ``bm25s`` library precomputes every (term, document) score at build
time; a search sums its terms' columns with numpy (bm25s is not imported to search a saved file). Lucene stores each document's
length in one byte (a lossy norm), so cluster scores differ from these in the third digit;
rankings agree except near ties.

On the embedded engine the BM25 index is *derived* data: it lives in ``<index>/lexical/bm25.stair``,
a single file written with the engine's discipline (temporary file, fsync, atomic rename,
CRC-32 footer) and tagged with the engine commit (generation + manifest checksum) it was built
from. The engine's segments stay the only copy of the documents: a crash while the BM25 file
is written leaves the old file or none, never touches a segment, and the next hybrid query
rebuilds it from the segments. A stale, missing or damaged file is rebuilt the same way.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .errors import InvalidInputError, StairError, optional_import

#: Lucene's ``_english_`` stop set (``EnglishAnalyzer.ENGLISH_STOP_WORDS_SET``).
ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split()
)
ANALYZER_VERSION = "stair-es-text-1: word runs, lowercase, lucene _english_ stopwords, snowball english (porter2)"
K1, B = 1.2, 0.75
TEXT_FIELD = "bm25_text"
FILE = "bm25.stair"
FOLDER = "lexical"

#: The same analyzer for Elasticsearch/OpenSearch index settings (``settings.analysis``).
CLUSTER_ANALYZER = {
    "filter": {"stair_es_stemmer": {"type": "stemmer", "language": "porter2"}},
    "analyzer": {"stair_es_text": {"type": "custom", "tokenizer": "standard",
                                   "filter": ["lowercase", "stop", "stair_es_stemmer"]}},
}

_WORD = re.compile(r"\w+(?:['\u2019]\w+)*", re.UNICODE)
_stemmer_lock = threading.Lock()
_stemmer: Any = None


def _stem_words(words: list[str]) -> list[str]:
    global _stemmer
    if _stemmer is None:
        with _stemmer_lock:
            if _stemmer is None:
                Stemmer = optional_import("Stemmer", "BM25 (hybrid search)", "hybrid", "PyStemmer bm25s")
                _stemmer = Stemmer.Stemmer("english")
    return _stemmer.stemWords(words)


def analyze(text: str) -> list[str]:
    """Text -> BM25 terms: words, lowercased, English stopwords removed, Snowball-stemmed."""
    words = [w.replace("\u2019", "'") for w in _WORD.findall(text.lower())]
    words = [w for w in words if w not in ENGLISH_STOPWORDS]
    return _stem_words(words) if words else []


def document_text(caption: str | None, metadata: dict[str, Any] | None) -> str:
    """The text BM25 indexes for a document: its caption and its keyword (string) metadata values."""
    parts = [caption] if caption else []
    for _, v in sorted((metadata or {}).items()):
        if isinstance(v, str):
            parts.append(v)
        elif isinstance(v, (list, tuple)):
            parts.extend(x for x in v if isinstance(x, str))
    return "\n".join(parts)


def _bm25s():
    bm25s = optional_import("bm25s", "BM25 (hybrid search)", "hybrid", "bm25s PyStemmer")
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG
    return bm25s


@dataclass
class LexicalHit:
    row: int
    score: float


class BM25Index:
    """BM25 over a fixed list of documents (rows): per term, the rows holding it and their
    precomputed BM25 term scores (CSC, built by ``bm25s``; a query sums its terms' columns, so
    searching needs numpy only). ``seg_pos``/``local`` locate row i in the engine commit it was
    built from."""

    def __init__(self, vocab: dict[str, int], data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                 seg_pos: np.ndarray, local: np.ndarray, key: tuple):
        self.vocab = vocab
        self.data, self.indices, self.indptr = data, indices, indptr
        self.seg_pos = seg_pos
        self.local = local
        self.key = key

    @classmethod
    def build(cls, texts: Sequence[str], seg_pos: np.ndarray, local: np.ndarray, key: tuple) -> "BM25Index":
        terms = [analyze(t) for t in texts]
        # as in Lucene, a document without terms is not in the field's statistics (N, avgdl)
        keep = [i for i, t in enumerate(terms) if t]
        terms = [terms[i] for i in keep]
        seg_pos, local = np.asarray(seg_pos, np.int32)[keep], np.asarray(local, np.int32)[keep]
        vocab: dict[str, int] = {}
        ids = [[vocab.setdefault(w, len(vocab)) for w in ts] for ts in terms]
        if not terms:
            return cls({}, np.zeros(0, np.float32), np.zeros(0, np.int32), np.zeros(1, np.int64), seg_pos, local, key)
        bm25s = _bm25s()
        r = bm25s.BM25(k1=K1, b=B, method="lucene")
        r.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)
        words = {i: w for w, i in vocab.items()}
        # bm25s may renumber the terms: map its ids back to our words
        vocab = {words[int(orig)] if isinstance(orig, (int, np.integer)) else orig: int(j)
                 for orig, j in r.vocab_dict.items() if orig != ""} if r.vocab_dict else vocab
        sc = r.scores
        return cls(vocab, np.asarray(sc["data"], np.float32), np.asarray(sc["indices"], np.int32),
                   np.asarray(sc["indptr"], np.int64), seg_pos, local, key)

    @property
    def n_docs(self) -> int:
        return int(self.seg_pos.size)

    def scores(self, text: str) -> np.ndarray:
        """BM25 score of every row for ``text`` (a repeated query term counts again, as in Lucene's ``match``)."""
        out = np.zeros(self.n_docs, np.float32)
        for t in analyze(text):
            j = self.vocab.get(t)
            if j is None:
                continue
            lo, hi = int(self.indptr[j]), int(self.indptr[j + 1])
            out[self.indices[lo:hi]] += self.data[lo:hi]  # a term's rows are distinct
        return out

    def top(self, text: str, k: int, mask: np.ndarray | None = None) -> list[LexicalHit]:
        """The ``k`` best rows with a score > 0 (among ``mask`` if given), best first, ties by row."""
        s = self.scores(text)
        if mask is not None:
            s = np.where(mask, s, 0.0)
        nz = np.flatnonzero(s > 0)
        order = nz[np.lexsort((nz, -s[nz]))][:k]
        return [LexicalHit(int(i), float(s[i])) for i in order]

    # --- persistence -----------------------------------------------------------------------
    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        words = sorted(self.vocab.items(), key=lambda kv: kv[1])
        if [j for _, j in words] != list(range(len(words))):
            raise StairError("BM25 term ids are not 0..n-1")
        blob = "\n".join(w for w, _ in words).encode("utf-8")
        arrays = {"data": self.data, "indices": self.indices, "indptr": self.indptr, "seg_pos": self.seg_pos,
                  "local": self.local, "vocab": np.frombuffer(blob, np.uint8)}
        meta = {"analyzer": ANALYZER_VERSION, "k1": K1, "b": B, "n_words": len(words), "key": list(self.key)}
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> "BM25Index":
        blob = bytes(arrays["vocab"]).decode("utf-8")
        words = blob.split("\n") if meta["n_words"] else []
        if len(words) != meta["n_words"] or arrays["indptr"].size != len(words) + 1:
            raise StairError("BM25 vocabulary does not match its count")
        return cls({w: i for i, w in enumerate(words)}, np.array(arrays["data"]), np.array(arrays["indices"]),
                   np.array(arrays["indptr"]), np.array(arrays["seg_pos"]), np.array(arrays["local"]), tuple(meta["key"]))


# --- the embedded engine's BM25 side ---------------------------------------------------------
_cache: dict[str, BM25Index] = {}
_cache_lock = threading.Lock()


def filter_rows(ix: Any, segs: Sequence[Any], flt: Any, seg_pos: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Which rows (each a segment position and a local document of the commit ``segs``) pass ``flt``."""
    mask = np.zeros(seg_pos.size, bool)
    for p, s in enumerate(segs):
        rows = np.flatnonzero(seg_pos == p)
        if rows.size:
            mask[rows] = np.asarray(s.seg.filter_mask(flt, ix.schema, ix.vocab), bool)[local[rows]]
    return mask


def commit_key(ix: Any) -> tuple:
    """The engine commit a BM25 index belongs to: (generation, manifest checksum)."""
    return ix.snapshot().key


def _collect(ix: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    texts, seg_pos, local = [], [], []
    snap = ix.snapshot()
    for si, s in enumerate(snap.segments):
        docs = snap.live_docs(si)
        s.seg.verify_docs(docs)  # checksummed segments: a damaged caption is an error, never BM25 text
        for d in docs:
            texts.append(document_text(s.seg.caption(int(d)), s.seg.metadata(int(d), display=False)))
            seg_pos.append(si)
            local.append(int(d))
    return texts, np.asarray(seg_pos, np.int32), np.asarray(local, np.int32)


def load_or_build(ix: Any, notes: list[str] | None = None) -> BM25Index:
    """The BM25 index of the engine index ``ix`` at its current commit: from memory, from its
    file (checksum verified), or rebuilt from the segments and saved (best effort)."""
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import read_arrays, verify_file, write_arrays

    ix.refresh()
    key = commit_key(ix)
    path = Path(ix.path) / FOLDER / FILE
    with _cache_lock:
        got = _cache.get(str(path))
        if got is not None and got.key == key:
            return got
    bm: BM25Index | None = None
    if path.is_file():
        try:
            verify_file(path)
            arrays, meta = read_arrays(path)
            if tuple(meta.get("key", ())) == key and meta.get("analyzer") == ANALYZER_VERSION:
                bm = BM25Index.from_arrays(arrays, meta)
        except (StairError, OSError, ValueError, KeyError) as e:
            if notes is not None:
                notes.append(f"the BM25 file {path} could not be used ({str(e).splitlines()[0][:120]}); "
                             "it was rebuilt from the index's documents")
    if bm is None:
        texts, seg_pos, local = _collect(ix)
        bm = BM25Index.build(texts, seg_pos, local, key)
        try:
            path.parent.mkdir(exist_ok=True)
            arrays, meta = bm.to_arrays()
            write_arrays(path, arrays, meta)
        except OSError as e:
            if notes is not None:
                notes.append(f"the BM25 index could not be saved in {path.parent} ({e.strerror or e}); "
                             "it is kept in memory and rebuilt by the next process")
    with _cache_lock:
        _cache[str(path)] = bm
    return bm


def search_embedded(ix: Any, text: str, top_k: int, flt: Any = None, notes: list[str] | None = None) -> list[tuple[Any, int, float]]:
    """BM25 top ``top_k`` on an engine index after ``flt`` (a resolved filter or None):
    ``[(segment state, local doc, score), ...]`` best first."""
    bm = load_or_build(ix, notes)
    if bm.n_docs == 0:  # rows without terms are left out at build: no row, no text
        raise InvalidInputError(
            f"the index at {ix.path} has no text for BM25: hybrid search needs documents with a caption or keyword "
            "metadata (a NAME.txt caption beside each image, or \"caption\"/\"metadata\" in a JSONL manifest), then ingest again"
        )
    segs = ix.snapshot().segments  # the commit bm was built from (keys match)
    mask = filter_rows(ix, segs, flt, bm.seg_pos, bm.local) if flt is not None else None
    return [(segs[int(bm.seg_pos[h.row])], int(bm.local[h.row]), h.score) for h in bm.top(text, top_k, mask)]
