"""Segment build in numpy (twins of :mod:`..kernels.build`): input checks, postings build,
sub-block codes; identical arrays."""

from __future__ import annotations

import numpy as np

from ..layout import F16_TABLE, SUB_BLOCKS, SUB_LEVELS

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
