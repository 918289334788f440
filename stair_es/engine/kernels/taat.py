"""Exact term-at-a-time search of one segment: every posting of the query terms into a dense
float32 accumulator, in query-term order, then one pass keeps the top k."""

from __future__ import annotations

import numpy as np
from numba import njit

from .heap import push
from .verify import check_run


@njit(cache=True)
def _taat_segment(q_j, q_w, seg, allowed, ref_base, top, acc, chk):
    """Exact term-at-a-time: every posting of the query terms, in query-term order, into the dense
    float32 accumulator ``acc`` (so each doc's sum is its canonical score bit for bit), then one
    pass over the documents hit keeps the allowed top k and zeroes ``acc`` again."""
    n_docs, bshift, seq, f16 = seg.n_docs, seg.bshift, seg.seq, seg.f16
    post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.post_w)
    hs, state = top.scores, top.state
    k = hs.size
    lo = n_docs
    hi = 0
    streamed = 0
    for i in range(q_j.size):
        j = q_j[i]
        w = q_w[i]
        q = post_ptr[j]
        p0 = pair_ptr[j]
        p1 = pair_ptr[j + 1]
        if p1 > p0:
            b0 = np.int64(pair_block[p0]) << bshift
            if b0 < lo:
                lo = b0
            b1 = (np.int64(pair_block[p1 - 1]) + 1) << bshift
            if b1 > hi:
                hi = b1
        streamed += post_ptr[j + 1] - q
        bad = check_run(chk, q, post_ptr[j + 1] - q)
        if bad >= 0:
            state[7] = bad
            acc[:] = 0.0  # left all zeros for the next caller
            return
        for p in range(p0, p1):
            base = np.int64(pair_block[p]) << bshift
            c = np.int64(pair_cnt[p]) + 1
            for qq in range(q, q + c):
                acc[base + post_off[qq]] += w * f16[post_w[qq]]
            q += c
    if hi > n_docs:
        hi = n_docs
    use_mask = allowed.size > 0
    matched = 0
    full = state[0] >= k
    thr = hs[0] if full else np.float32(0.0)
    for d in range(lo, hi):
        s = acc[d]
        if s > 0:
            acc[d] = 0.0
            if use_mask and not allowed[d]:
                continue
            matched += 1
            if full and s < thr:
                continue
            push(top, s, seq[d], ref_base + d)
            if not full and state[0] >= k:
                full = True
            if full:
                thr = hs[0]
    state[1] += matched
    nb = (hi - lo + (1 << bshift) - 1) >> bshift if hi > lo else 0
    state[3] += nb
    state[4] += nb
    state[5] += streamed
