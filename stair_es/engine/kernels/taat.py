"""Exact term-at-a-time search of one segment, document-blocked: the documents are taken in
windows whose float32 accumulator stays in the L1 cache; in each window every query term's
postings there are added in query-term order (so each doc's sum is its canonical score bit for
bit), then the window is scanned for the top k (skipped when the window's bound cannot reach the
k-th score) and zeroed while it is still in cache."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import TAAT_WINDOW_DOCS
from .heap import push
from .simd import HAVE_F16C, SCATTER_LANES, _scatter_add8, f16_value
from .verify import check_run

#: documents per branch-free count of the heap pass (see :func:`_taat_segment`)
SCAN_DOCS = 256


@njit(cache=True, nogil=True)
def _taat_segment(q_j, q_w, seg, allowed, ref_base, top, acc, chk):
    """Exact term-at-a-time over windows of :data:`TAAT_WINDOW_DOCS` documents (``acc``: float32
    zeros at least that long, left all zeros).

    Per window and query term (in query-term order) the term's (block, count) pairs in the
    window are walked with one cursor per term and their postings added into ``acc``: no branch
    per posting, unsigned indices (numba adds a negative-index check to every signed one: with
    them this loop took 1.7x as long). The float16 weights are widened by the CPU's conversion
    instruction (:func:`.simd.f16_value`, F16C): 0.85x the time of lookups in the 256 KiB table,
    which miss the L1 cache (the table stays where the CPU has no such instruction); widening them
    in integer registers (exponent re-bias, subnormal scaling, selects) took 2.3x as long (AMD
    EPYC, 2026-11-27), and a run's postings are taken 8 at a time (:func:`.simd._scatter_add8`:
    offsets and weights loaded and widened as vectors, 0.92x the scalar loop's time). Each window's bound (the sum over terms of
    query weight x the term's highest block maximum there) is summed on the way; when it is below
    the k-th score no doc of the window can enter the heap and the window is only counted (hit
    docs) and zeroed, else a branch-free count of the docs at or above the k-th score decides
    whether the window is walked for the heap at all."""
    n_docs, bshift, seq, f16 = seg.n_docs, seg.bshift, seg.seq, seg.f16
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.pair_max, seg.post_off, seg.post_w)
    hs, state = top.scores, top.state
    k = hs.size
    nq = q_j.size
    cp = np.empty(nq, np.int64)  # per term: next pair,
    pe = np.empty(nq, np.int64)  # the end of its pairs,
    cq = np.empty(nq, np.int64)  # and the first posting of the next pair
    b_lo = n_docs
    b_hi = 0
    streamed = 0
    for i in range(nq):
        j = q_j[i]
        cp[i] = pair_ptr[j]
        pe[i] = pair_ptr[j + 1]
        cq[i] = post_ptr[j]
        n = post_ptr[j + 1] - post_ptr[j]
        streamed += n
        bad = check_run(chk, post_ptr[j], n)  # every posting is read: verified first (once per process)
        if bad >= 0:
            state[7] = bad
            return
        if pe[i] > cp[i]:
            b_lo = min(b_lo, np.int64(pair_block[cp[i]]))
            b_hi = max(b_hi, np.int64(pair_block[pe[i] - 1]) + 1)
    use_mask = allowed.size > 0
    matched = 0
    full = state[0] >= k
    thr = hs[0] if full else np.float32(0.0)
    slack = np.float32(1.0001)  # (the bound is summed in the scores' order; a margin all the same)
    wb = max(TAAT_WINDOW_DOCS >> bshift, 1)  # blocks per window
    for w0 in range(b_lo, b_hi, wb):
        w1 = min(w0 + wb, b_hi)
        bound = np.float32(0.0)
        for i in range(nq):
            p = cp[i]
            e = pe[i]
            q = cq[i]
            w = q_w[i]
            mx = np.uint16(0)  # the term's highest block maximum in the window (positive float16 bits order like values)
            while p < e and np.int64(pair_block[p]) < w1:
                base = np.uint64((np.int64(pair_block[p]) - w0) << bshift)
                c = np.int64(pair_cnt[p]) + 1
                qq = np.uint64(q)
                qe = np.uint64(q + c)
                if HAVE_F16C:  # 8 postings at a time (the offsets in a run are distinct)
                    while qq + np.uint64(SCATTER_LANES) <= qe:
                        _scatter_add8(acc, base, post_off, post_w, qq, w)
                        qq += np.uint64(SCATTER_LANES)
                for r in range(qq, qe):
                    acc[base + np.uint64(post_off[r])] += w * f16_value(f16, post_w[r])
                mx = max(mx, pair_max[p])
                q += c
                p += 1
            cp[i] = p
            cq[i] = q
            bound += w * f16[mx]
        d0 = w0 << bshift
        m = min(w1 << bshift, n_docs) - d0
        if not full or bound * slack >= thr:
            # the heap pass, 256 docs at a time: one branch-free pass counts the docs hit (for the
            # total) and those that may enter the heap (most runs of 256 have none once it is
            # full), the runs with some are walked, then each run is zeroed while in cache
            for o0 in range(0, m, SCAN_DOCS):
                part = acc[o0:min(o0 + SCAN_DOCS, m)]
                hit = 0
                if use_mask:
                    ok = allowed[d0 + o0:d0 + o0 + part.size]
                    for o in range(part.size):
                        s = part[o]
                        matched += (s > 0) & (ok[o] != 0)
                        hit += (s > 0) & (s >= thr)
                else:
                    for o in range(part.size):
                        s = part[o]
                        matched += s > 0
                        hit += (s > 0) & (s >= thr)
                if hit > 0:
                    for o in range(part.size):
                        s = part[o]
                        if s <= 0 or (full and s < thr):
                            continue
                        d = d0 + o0 + o
                        if use_mask and not allowed[d]:
                            continue
                        push(top, s, seq[d], ref_base + d)
                        if not full and state[0] >= k:
                            full = True
                        if full:
                            thr = hs[0]
                for o in range(part.size):
                    part[o] = 0.0
        else:
            # no doc of the window can enter the heap: count the hit docs and zero it (branch-free)
            win = acc[:m]
            if use_mask:
                ok = allowed[d0:d0 + m]
                for o in range(m):
                    matched += (win[o] > 0) & (ok[o] != 0)
                    win[o] = 0.0
            else:
                for o in range(m):
                    matched += win[o] > 0
                    win[o] = 0.0
    state[1] += matched
    nb = b_hi - b_lo if b_hi > b_lo else 0
    state[3] += nb
    state[4] += nb
    state[5] += streamed
