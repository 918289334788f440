"""The scale benchmark's corpus: generated in chunks of CSR arrays, deterministic by seed.

Same shape as :mod:`benchmarks.corpora` (its defaults): 100-300 distinct tokens per document
drawn from a Zipf-Mandelbrot law (s = 1, offset 10) over the non-special BERT WordPiece ids,
gamma(2, 0.4) weights, queries of 10-30 tokens of which 70 % are a random target document's
strongest tokens ("captions"). What differs is that nothing is ever whole in memory: chunk ``c``
is generated from the seed ``(seed, c)`` alone, so a 10M-document corpus is streamed chunk by
chunk into each system and any chunk can be regenerated on its own (the query targets are).

Two weightings of the same tokens:

* ``iid``: weights independent of token frequency (the worst case for exact pruning: the most
  frequent query tokens are as heavy as the rare ones);
* ``idf``: the same weights times ``min(1, sqrt(rank / 1000))`` of the token's frequency rank,
  documents and queries alike, as a FLOPS-regularised encoder (SPLADE, STAIR) produces.

A metadata column ``bucket`` (an integer in [0, 1000), a hash of the document number) gives
filters of known selectivity: ``bucket < 500`` keeps 50 %, ``< 50`` 5 %, ``< 1`` 0.1 %.
This module owns generation only; it knows nothing about the systems.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

import numpy as np
from numba import njit

from stair_es.vocab import VOCAB_SIZE, default_vocabulary

WEIGHTINGS = ("idf", "iid")
BUCKETS = 1000
# selectivity name -> exclusive upper bound on `bucket`
SELECTIVITY = {"50%": 500, "5%": 50, "0.1%": 1}
DENSE_DIM = 256


@dataclass(frozen=True)
class ScaleSpec:
    n_docs: int
    weights: str = "idf"  # "idf" | "iid"
    seed: int = 0
    chunk: int = 100_000
    n_queries: int = 200
    doc_nnz: tuple[int, int] = (100, 300)
    query_nnz: tuple[int, int] = (10, 30)
    zipf_s: float = 1.0
    zipf_offset: float = 10.0
    weight_shape: float = 2.0
    weight_scale: float = 0.4
    query_overlap: float = 0.7
    target_chunks: int = 8  # query targets come from this many random chunks (regenerated for it)

    def __post_init__(self) -> None:
        if self.weights not in WEIGHTINGS:
            raise ValueError(f"unknown weighting {self.weights!r}; use one of {', '.join(WEIGHTINGS)}")
        if self.n_docs < 1 or self.chunk < 1:
            raise ValueError(f"n_docs and chunk must be positive, got {self.n_docs} and {self.chunk}")

    @property
    def n_chunks(self) -> int:
        return -(-self.n_docs // self.chunk)

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.chunk, min(self.n_docs, (c + 1) * self.chunk)

    def to_dict(self) -> dict:
        return asdict(self)


def token_table(spec: ScaleSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token id of each frequency rank, cumulative rank probabilities, per-token weight factor)."""
    rng = np.random.default_rng(spec.seed)
    allowed = np.flatnonzero(~default_vocabulary().special_mask).astype(np.int32)
    by_rank = rng.permutation(allowed).astype(np.int32)
    ranks = np.arange(1, len(by_rank) + 1, dtype=np.float64)
    p = (ranks + spec.zipf_offset) ** -spec.zipf_s
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    factor = np.ones(VOCAB_SIZE, np.float32)
    if spec.weights == "idf":
        factor[by_rank] = np.minimum(1.0, np.sqrt(ranks / 1000.0)).astype(np.float32)
    return by_rank, cdf, factor


def alias_table(cdf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker's alias table of the rank law: one uniform draw per token instead of a binary
    search over 30k ranks (the generator's hot loop)."""
    p = np.diff(np.concatenate([[0.0], cdf])) * cdf.size
    prob = np.zeros(cdf.size)
    alias = np.zeros(cdf.size, np.int64)
    small = [i for i in range(cdf.size) if p[i] < 1.0]
    large = [i for i in range(cdf.size) if p[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = p[s], g
        p[g] -= 1.0 - p[s]
        (small if p[g] < 1.0 else large).append(g)
    for i in small + large:
        prob[i], alias[i] = 1.0, i
    return prob, alias


@njit(cache=True, inline="always")
def _next(state):
    """xorshift64* step on state[0]; a uniform float in [0, 1). Inline state instead of numpy's
    global generator: about 10x cheaper per draw, which is most of the generator's time."""
    x = state[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    state[0] = x
    return ((x * np.uint64(2685821657736338717)) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _gen_chunk(n, seed, prob, alias, by_rank, lo, hi, scale, wmin):
    """n documents: distinct Zipf tokens, sorted per row; iid gamma(2, scale) weights (before
    the per-token factor), drawn as -scale * ln(u1 * u2)."""
    state = np.zeros(1, np.uint64)
    state[0] = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1)
    for _ in range(4):
        _next(state)
    k = prob.size
    indptr = np.zeros(n + 1, np.int64)
    for i in range(n):
        indptr[i + 1] = indptr[i] + lo + min(hi - lo, int(_next(state) * (hi - lo + 1)))
    ids = np.empty(indptr[n], np.int32)
    w = np.empty(indptr[n], np.float32)
    seen = np.zeros(k, np.bool_)
    ranks = np.empty(hi, np.int64)
    row = np.empty(hi, np.int32)
    for i in range(n):
        m = indptr[i + 1] - indptr[i]
        c = 0
        while c < m:
            u = _next(state) * k
            r = min(int(u), k - 1)
            if u - r >= prob[r]:
                r = alias[r]
            if not seen[r]:
                seen[r] = True
                ranks[c] = r
                row[c] = by_rank[r]
                c += 1
        for j in range(c):
            seen[ranks[j]] = False
        srt = np.sort(row[:c])
        a = indptr[i]
        for j in range(c):
            ids[a + j] = srt[j]
            x = -scale * np.log(_next(state) * _next(state) + 1e-300)
            w[a + j] = max(x, wmin)
    return indptr, ids, w


class Generator:
    """Chunks of the corpus described by ``spec`` (and its queries), regenerated on demand."""

    def __init__(self, spec: ScaleSpec):
        self.spec = spec
        if spec.weight_shape != 2.0:
            raise ValueError("the streaming generator draws gamma(2, scale) weights; weight_shape must be 2.0")
        self.by_rank, self.cdf, self.factor = token_table(spec)
        self.prob, self.alias = alias_table(self.cdf)

    def chunk(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk ``c`` as CSR ``(indptr, token ids, weights)``; the same for both weightings
        except for the weights' per-token factor."""
        s = self.spec
        a, b = s.chunk_range(c)
        if a >= b:
            raise IndexError(f"chunk {c} is past the corpus end ({s.n_chunks} chunks)")
        seed = (s.seed * 1_000_003 + c * 7919 + 12345) % (2**31 - 1)
        indptr, ids, w = _gen_chunk(b - a, seed, self.prob, self.alias, self.by_rank, s.doc_nnz[0], s.doc_nnz[1],
                                    s.weight_scale, np.float32(1e-3))
        if s.weights == "idf":
            w *= self.factor[ids]
        return indptr, ids, w

    def chunks(self, n_docs: int | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """``(first document number, indptr, ids, weights)`` for every chunk, in order."""
        for c in range(self.spec.n_chunks):
            a, b = self.spec.chunk_range(c)
            if n_docs is not None and a >= n_docs:
                return
            yield (a, *self.chunk(c))

    def materialize(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole corpus as one CSR (numpy arrays, ~8 bytes per posting): for peers that
        need it in memory to build."""
        parts = list(self.chunks())
        nnz = sum(p[1][-1] for p in parts)
        indptr = np.zeros(self.spec.n_docs + 1, np.int64)
        ids = np.empty(nnz, np.int32)
        w = np.empty(nnz, np.float32)
        o = 0
        for a, ip, i, x in parts:
            indptr[a + 1 : a + ip.size] = ip[1:] + o
            ids[o : o + i.size] = i
            w[o : o + x.size] = x
            o += i.size
        return indptr, ids, w

    def queries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, ids, weights, target document numbers)`` of ``spec.n_queries`` captions.

        Targets are spread over ``target_chunks`` random chunks (only those are regenerated);
        70 % of a query's tokens are its target's, drawn in proportion to their weight."""
        s = self.spec
        rng = np.random.default_rng([s.seed, 2])
        chosen = np.sort(rng.choice(s.n_chunks, size=min(s.target_chunks, s.n_chunks), replace=False))
        per = np.bincount(rng.integers(0, chosen.size, s.n_queries), minlength=chosen.size)
        rows_t, rows_w, targets = [], [], []
        for c, m in zip(chosen, per):
            if not m:
                continue
            a, b = s.chunk_range(int(c))
            ip, ids, w = self.chunk(int(c))
            base = w / self.factor[ids] if s.weights == "idf" else w  # pick by the iid weights: same targets and tokens in both
            for t in rng.integers(0, b - a, size=m):
                lo_, hi_ = ip[t], ip[t + 1]
                n = int(rng.integers(s.query_nnz[0], s.query_nnz[1] + 1))
                n_doc = min(int(hi_ - lo_), int(round(n * s.query_overlap)))
                p = base[lo_:hi_] / base[lo_:hi_].sum()
                picked = rng.choice(ids[lo_:hi_], size=n_doc, replace=False, p=p)
                noise = self.by_rank[np.minimum(np.searchsorted(self.cdf, rng.random(n - n_doc)), self.cdf.size - 1)]
                q = np.unique(np.concatenate([picked, noise]).astype(np.int32))
                qw = np.maximum(rng.gamma(s.weight_shape, s.weight_scale, size=q.size), 1e-3).astype(np.float32)
                rows_t.append(q)
                rows_w.append(qw * self.factor[q])
                targets.append(a + int(t))
        order = rng.permutation(len(targets))  # not grouped by chunk
        indptr = np.zeros(len(order) + 1, np.int64)
        np.cumsum([rows_t[i].size for i in order], out=indptr[1:])
        return (indptr, np.concatenate([rows_t[i] for i in order]), np.concatenate([rows_w[i] for i in order]),
                np.asarray(targets, np.int64)[order])


def buckets(first: int, n: int) -> np.ndarray:
    """The ``bucket`` metadata of documents ``first .. first + n - 1`` (a multiplicative hash)."""
    d = np.arange(first, first + n, dtype=np.uint64)
    return ((d * np.uint64(2654435761)) % np.uint64(2**32) % np.uint64(BUCKETS)).astype(np.int64)


def projection(seed: int, dim: int = DENSE_DIM) -> np.ndarray:
    """A fixed Gaussian random projection (vocabulary x dim, scaled by 1/sqrt(dim)): the dense
    baseline indexes each document's sparse vector times this matrix."""
    rng = np.random.default_rng([seed, 3])
    return (rng.standard_normal((VOCAB_SIZE, dim), dtype=np.float32) / np.float32(np.sqrt(dim)))


def project(indptr: np.ndarray, ids: np.ndarray, w: np.ndarray, proj: np.ndarray) -> np.ndarray:
    import scipy.sparse as sp

    x = sp.csr_matrix((w, ids, indptr), shape=(indptr.size - 1, VOCAB_SIZE))
    return np.ascontiguousarray((x @ proj).astype(np.float32))
