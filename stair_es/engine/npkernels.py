"""Pure-numpy twins of the query-path kernels, for work too small to be worth starting numba.

numba costs a new process about 0.15 s to import and 0.4-0.5 s more for its first kernel
call (loading the cached machine code, initialising its CPU target): more than a whole
search of a small index takes. Searching a segment whose query terms have at most
:data:`NUMPY_MAX_POSTINGS` postings, looking ids up, reading a token filter and counting
document frequencies of small segments therefore run here, in numpy, and the numba module
(:mod:`.kernels`) is imported only when a larger segment needs it (:data:`K` is that lazy
handle).

Results are identical to the numba kernels, bit for bit: a document's score is the float32
sum of ``query weight x stored weight`` in query-term order (``np.add.at`` adds in index
order, never pairwise), ties go to the older document. The layout of the arrays is described
in :mod:`.kernels`. This module must not import numba, nor know about files or schemas.
"""

from __future__ import annotations

import numpy as np

from ..errors import DamagedIndexError

from .layout import (F16_TABLE, STRATEGY_AUTO, STRATEGY_BLOCKMAX, STRATEGY_NAMES, STRATEGY_NUMPY,  # noqa: F401 - NP.*
                     STRATEGY_TAAT, SUB_BLOCKS, SUB_FRACTIONS, SUB_LEVELS)

#: Up to this many postings of the query terms in one segment, numpy scores the segment. Measured
#: (``benchmarks/cold_search.py --threshold``, docs/engine.md "Cold start"): numpy reads about 8
#: postings per microsecond after a 0.3 ms fixed cost, so up to here it stays within about 2 ms
#: of the warm numba kernels, while a new process saves numba's 0.6 s start-up.
NUMPY_MAX_POSTINGS = 16_384
#: Up to this many postings, a token filter's documents and a segment's document frequencies
#: are read with numpy (at most about 8 ms).
NUMPY_MAX_SCAN = 65_536
#: Up to this many ids, lookups hash with numpy (ingest batches use the numba kernel).
NUMPY_MAX_IDS = 64
#: Up to this many postings, a new segment is built (inputs checked, postings inverted, ids
#: hashed) in numpy unless numba is already loaded: numba's start-up (about 0.6 s, up to 1.5 s
#: when it finds scipy) is more than a whole image ingest of hundreds of files, while numpy
#: inverts about 2 million postings in 0.3 s.
NUMPY_MAX_BUILD = 2_000_000


def numba_loaded() -> bool:
    """Whether the numba kernels are already imported in this process (then they cost nothing)."""
    import sys

    return "stair_es.engine.kernels" in sys.modules


def build_kernel(name: str, postings: int):
    """The numpy twin of kernel ``name`` for a build of up to :data:`NUMPY_MAX_BUILD` postings
    in a process that has not loaded numba, else the numba kernel (same results either way)."""
    if postings <= NUMPY_MAX_BUILD and not numba_loaded():
        return globals()[name]
    return getattr(K, name)


class _LazyKernels:
    """``K.name``: the numba kernel ``name``, importing :mod:`.kernels` on first use."""

    def __getattr__(self, name: str):
        from . import kernels

        return getattr(kernels, name)


K = _LazyKernels()


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, e)`` for each pair, in order (int64)."""
    starts = np.asarray(starts, np.int64)
    lens = np.asarray(ends, np.int64) - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.zeros(lens.size, np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return np.repeat(starts - offs, lens) + np.arange(total, dtype=np.int64)


def postings_touched(q_j: np.ndarray, post_ptr: np.ndarray) -> int:
    """Number of postings of the terms ``q_j`` (what a full scan of them reads)."""
    q_j = np.asarray(q_j, np.int64)
    return int((post_ptr[q_j + 1] - post_ptr[q_j]).sum()) if q_j.size else 0


def term_postings(q_j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local doc, posting index, query-term position) of every posting of the terms ``q_j``,
    term after term, docs ascending within a term."""
    q_j = np.asarray(q_j, np.int64)
    pidx = _ranges(pair_ptr[q_j], pair_ptr[q_j + 1])
    qidx = _ranges(post_ptr[q_j], post_ptr[q_j + 1])
    runs = pair_cnt[pidx].astype(np.int64) + 1
    if int(runs.sum()) != qidx.size:
        raise DamagedIndexError("the block counts of a segment's postings do not add up to its postings pointers; "
                                "the index is damaged: run `stair-es index check`")
    docs = np.repeat(pair_block[pidx].astype(np.int64) << bshift, runs) + post_off[qidx]
    term = np.repeat(np.arange(q_j.size), post_ptr[q_j + 1] - post_ptr[q_j])
    return docs, qidx, term


def search_segment(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w,
                   allowed, seq, ref_base, k) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Exact top-k of one segment: (scores float32, seq uint64, refs int64, matched docs, postings read).

    The best ``k`` allowed documents with a positive score, best first (score descending, then
    older first), as the numba kernels rank them; ``matched`` counts every allowed document
    with a positive score. ``allowed``: uint8 per doc, or empty for all."""
    docs, qidx, term = term_postings(q_j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift)
    vals = np.asarray(q_w, np.float32)[term] * F16_TABLE[post_w[qidx]]
    acc = np.zeros(max(n_docs, int(docs.max()) + 1 if docs.size else 0), np.float32)
    np.add.at(acc, docs, vals)  # unbuffered, in posting order: each doc's sum runs in query-term order
    hit = np.flatnonzero(acc[:n_docs] > 0)
    if allowed.size:
        hit = hit[allowed[hit] != 0]
    scores = acc[hit]
    sq = np.asarray(seq)[hit]
    order = np.lexsort((sq, -scores))[:k]
    return scores[order], sq[order], ref_base + hit[order], int(hit.size), int(qidx.size)


def term_docs(j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift) -> np.ndarray:
    """Local docs of term ``j``'s postings."""
    return term_postings(np.array([j]), post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift)[0]


def term_freqs(keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, live, key_lo, key_hi, out) -> None:
    """Live document frequency per key in [key_lo, key_hi) added into ``out[key - key_lo]``."""
    lo, hi = np.searchsorted(keys, [key_lo, key_hi])
    if hi <= lo:
        return
    js = np.arange(lo, hi)
    if live.size == 0:
        np.add.at(out, keys[js].astype(np.int64) - key_lo, post_ptr[js + 1] - post_ptr[js])
        return
    docs, _, term = term_postings(js, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift)
    counts = np.bincount(term[live[docs] != 0], minlength=js.size)
    np.add.at(out, keys[js].astype(np.int64) - key_lo, counts)


_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


def fnv1a64(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a of each string ``blob[offsets[i]:offsets[i + 1]]`` (as the numba kernel)."""
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    h = np.full(n, _FNV_OFFSET, np.uint64)
    lens = offsets[1:] - offsets[:-1]
    with np.errstate(over="ignore"):
        for p in range(int(lens.max()) if n else 0):
            rows = np.flatnonzero(lens > p)
            h[rows] = (h[rows] ^ blob[offsets[rows] + p].astype(np.uint64)) * _FNV_PRIME
    return h


def same_strings(q_blob, q_offs, blob, offs, docs) -> np.ndarray:
    """Whether query string i equals stored string ``docs[i]``."""
    out = np.zeros(len(docs), bool)
    for i, d in enumerate(docs):
        out[i] = bytes(q_blob[q_offs[i]:q_offs[i + 1]]) == bytes(blob[offs[d]:offs[d + 1]])
    return out


def gather_strings(blob: np.ndarray, offs: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings ``rows`` of (blob, offs) packed into a new (blob, offsets) pair, in ``rows`` order."""
    rows = np.asarray(rows, np.int64)
    offs = np.asarray(offs, np.int64)
    starts, ends = offs[rows], offs[rows + 1]
    out_offs = np.zeros(rows.size + 1, np.int64)
    np.cumsum(ends - starts, out=out_offs[1:])
    return np.asarray(blob, np.uint8)[_ranges(starts, ends)], out_offs


def check_pack_csr(indptr, indices, weights, vocab_size, special, w_max, out, d0, d1) -> tuple[int, int, int]:
    """As the numba kernel: checks documents ``d0:d1``, writes their weights' fp16 bits to
    ``out`` when they are all good; returns (status, row, zeros) as the kernel."""
    indptr = np.asarray(indptr, np.int64)
    lo, hi = int(indptr[d0]), int(indptr[d1])
    t = np.asarray(indices[lo:hi], np.int64)
    w = np.asarray(weights[lo:hi], np.float32)
    rows = np.repeat(np.arange(d0, d1), np.diff(indptr[d0:d1 + 1]))
    bad_id = (t < 0) | (t >= vocab_size)
    bad_w = ~(w >= 0.0) | (w == np.inf)
    spec = np.zeros(t.size, bool)
    ok = ~bad_id
    spec[ok] = (w[ok] > 0.0) & np.asarray(special)[t[ok]]
    prev = np.full(t.size, -1, np.int64)
    if t.size > 1:
        prev[1:] = t[:-1]
        prev[1:][rows[1:] != rows[:-1]] = -1
    unsorted = t <= prev
    code = np.select([bad_id, bad_w, w > w_max, spec, unsorted], [2, 3, 5, 4, 1], 0)
    first = np.flatnonzero(code)
    if first.size:
        return int(code[first[0]]), int(rows[first[0]]), 0
    bits = w.astype(np.float16).view(np.uint16)
    out[lo:hi] = bits
    return 0, -1, int(np.count_nonzero(bits == 0))


def block_subs(pair_cnt, pair_max, post_off, post_w, bshift) -> np.ndarray:
    """Per (term, block) pair, the sub-block code byte (see :data:`SUB_BLOCKS`) of its postings,
    as the numba kernel (identical bytes). Pairs are in posting order: pair p's postings follow
    those of pairs 0 .. p - 1."""
    n = pair_cnt.size
    if n == 0:
        return np.zeros(0, np.uint8)
    cnt = np.asarray(pair_cnt, np.int64) + 1
    sub = (np.asarray(post_off, np.int64) * SUB_BLOCKS) >> bshift
    key = np.repeat(np.arange(n, dtype=np.int64) * SUB_BLOCKS, cnt) + sub  # ascending: offsets ascend in a pair
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    # positive fp16 bit patterns order like their values
    smax = np.maximum.reduceat(np.asarray(post_w, np.uint16), starts)
    x = F16_TABLE[smax]
    m = F16_TABLE[np.asarray(pair_max, np.uint16)][key[starts] // SUB_BLOCKS]
    # m * 0.5 and m * 0.75 are exact in float32 (m has 11 significant bits): exact comparisons
    code = np.where(x > m * SUB_LEVELS[2], 3, np.where(x > m * SUB_LEVELS[1], 2, 1)).astype(np.int64)
    out = np.bincount(key[starts] // SUB_BLOCKS, weights=code << (2 * (key[starts] % SUB_BLOCKS)), minlength=n)
    return out.astype(np.uint8)


def build_postings(indptr, indices, wbits, n_docs, key_base, n_keys, bshift) -> tuple:
    """CSR (doc-major, sorted token ids, non-zero fp16 bits) -> term-major block postings, as
    the numba kernel (identical arrays): keys, post_ptr, pair_ptr, pair_block, pair_cnt,
    pair_max, post_off, post_w."""
    indptr = np.asarray(indptr, np.int64)
    lo, hi = int(indptr[0]), int(indptr[n_docs])
    t = np.asarray(indices[lo:hi], np.int64)
    rows = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(indptr[:n_docs + 1]))
    order = np.argsort(t, kind="stable")  # term-major; docs stay ascending within a term
    st, post_doc, post_w = t[order], rows[order], np.asarray(wbits[lo:hi], np.uint16)[order]
    counts = np.bincount(t, minlength=n_keys)[:n_keys]
    present = np.flatnonzero(counts)
    keys = (present + key_base).astype(np.uint32)
    post_ptr = np.zeros(present.size + 1, np.int64)
    np.cumsum(counts[present], out=post_ptr[1:])
    block = post_doc >> bshift
    new = np.ones(st.size, bool)
    if st.size > 1:
        new[1:] = (st[1:] != st[:-1]) | (block[1:] != block[:-1])
    starts = np.flatnonzero(new)
    pair_block = block[starts].astype(np.uint16)
    pair_cnt = (np.diff(np.append(starts, st.size)) - 1).astype(np.uint8)
    # positive fp16 bit patterns order like their values
    pair_max = np.maximum.reduceat(post_w, starts).astype(np.uint16) if starts.size else np.zeros(0, np.uint16)
    pair_idx = np.cumsum(new) - 1
    pair_ptr = np.empty(present.size + 1, np.int64)
    pair_ptr[:-1] = pair_idx[post_ptr[:-1]] if st.size else 0
    pair_ptr[-1] = starts.size
    post_off = (post_doc & ((1 << bshift) - 1)).astype(np.uint8)
    return keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w
