"""Exact block-max search of one segment with MaxScore inside blocks: the per-query block plan
(bounds, visit order), the block sweep, and the canonical rescoring of the hits it keeps."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import SUB_BLOCKS, SUB_FRACTIONS
from .heap import push
from .simd import (BOUND_LANES, HAVE_F16C, SCATTER_LANES, _add_scaled4, _bound_add8, _prefetch, _scatter_add8,
                   f16_value)
from .verify import check_run, prepare_terms

LOOKUP_COST = 64  # one binary-search lookup in a cold (term, block) run costs about this many streamed postings
GATHER_MAX = 32  # see _blockmax_segment: survivors are gathered from the runs read when they hold at most this many postings
# (no software prefetch of the next block's runs: 1 line of its first runs cost 4-6 % more CPU time
# at 1M idf documents (2026-11-26), and locating and prefetching the runs of the first 1-3 terms
# looked up after the survivors 1-4 % more at 10M (2026-11-27; docs/scale.md))
# the work of one term's visit to a block in postings streamed (see _blockmax_segment's term order):
# 0 (bound per posting, before) visited 4.4 terms a block to stream 26 postings at 10M idf
# documents, 2 visits 2.8 to stream 34 (same run, CPU p50 x0.89-0.96; 4: x0.92, 8: x0.97, 32: x1.01;
# against 2: 1 x1.02, 3 x1.05)
VISIT_POSTINGS = 2
_SUB_FRACTIONS_FLAT = np.ascontiguousarray(SUB_FRACTIONS).ravel()  # row c: code c's 4 levels (see _add_scaled4)
assert SUB_BLOCKS == 4  # the bound pass adds a pair's sub-block levels as one 4-lane vector


@njit(cache=True)
def _block_plan(q_j, q_w, seg, allowed, head_blocks, block_lo, block_hi):
    """Per-query block bounds, visit order, and the runs of the few blocks visited out of order.

    ``ub[b]``: the bound of block b. Without sub-block codes (``pair_sub`` empty: segment format
    1) the sum over query terms of query weight x the term's maximum in block b; with them
    ``ubs[b * SUB_BLOCKS + s]``, the same sum over sub-block s with each term's maximum there
    (rounded up to a level of its block maximum), and ``ub[b]`` the highest of its sub-blocks'
    (a term heavy in one sub-block and a term heavy in another no longer add up). ``tsum[i]``:
    sum of term i's block-level bounds (for the term order). Candidate blocks (in [block_lo,
    block_hi), a positive bound and, with a filter, an allowed doc) are visited in two phases:

    * the *head*, ``head`` (best bound first): every candidate whose bound falls in the top bins
      of a 1024-bin histogram of the bounds holding at least ``max(head_blocks, nc / 16)`` of them
      (they raise the k-th score quickly). Every other candidate's bound is strictly lower than
      every head block's, so once a head block's bound is below the k-th score nothing left can
      reach it. Their runs are in ``hslot[i, h]`` (posting start << 9 | count of term i in head
      block h, -1: none), ``hbmc[i, h]`` (query weight x block max) and ``hsub[i, h]`` (its
      sub-block code; 255 without codes);
    * the *tail*, ``tail`` (block order: sequential reads), whose runs the kernel finds with one
      cursor per term walking that term's (block, count) table: no per-(block, term) table is
      built, so this set-up pass costs one read of the query terms' block tables (~2 ns per
      (term, block) pair as first written, ~0.8 since it adds 8 pairs a call: 2026-11-28) instead
      of a scattered write per pair.

    ``dense`` (returned last): no head and no filter, so the tail is every block of [block_lo,
    block_hi) with a positive bound, in order: ``tail`` is then left empty and the sweep walks
    the range (``nc`` counts those blocks).

    ``head_blocks`` = 0: no head, every candidate in the tail. The kernel asks for that when the
    top-k heap is already full on entry (an earlier segment set the k-th score): the head's run
    table then costs more (a second read of the block tables) than the earlier rise of the k-th
    score saves (measured over ten 1M-document segments: -5 % CPU per query).
    """
    n_docs, bshift, f16 = seg.n_docs, seg.bshift, seg.f16
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.pair_max, seg.pair_sub)
    nq = q_j.size
    bs = 1 << bshift
    n_blocks = (n_docs + bs - 1) >> bshift
    ub = np.zeros(n_blocks, np.float32)
    tsum = np.zeros(nq, np.float64)  # per term: sum of its block bounds
    has_sub = pair_sub.size > 0
    ubs = np.zeros(n_blocks * SUB_BLOCKS if has_sub else 0, np.float32)
    for i in range(nq):
        j = q_j[i]
        w = q_w[i]
        t = 0.0
        if i + 1 < nq:
            # the next term's first pairs, requested now: a term's pairs are read in order, which the
            # CPU prefetches once under way, but each of the ~20 terms a segment starts cold (3 arrays;
            # at 10M documents the pass took 0.90x the time with this, 256 pairs ahead: 128 x0.92,
            # 1024 x0.94)
            a = pair_ptr[q_j[i + 1]]
            for r in range(a, min(a + 256, pair_ptr[q_j[i + 1] + 1]), 32):
                _prefetch(pair_block, r)
                _prefetch(pair_max, r)
                if has_sub and ((r - a) & 32) == 0:  # (1 byte a pair: a line every 64)
                    _prefetch(pair_sub, r)
        if has_sub:
            p0 = pair_ptr[j]
            e = pair_ptr[j + 1]
            # (t only orders the terms below: summed 8 at a time, its rounding changes no result)
            if HAVE_F16C:  # 8 pairs a call: the same adds in the same order (see _bound_add8)
                while p0 + BOUND_LANES <= e:
                    t += _bound_add8(ubs, _SUB_FRACTIONS_FLAT, pair_block, pair_max, pair_sub, p0, w)
                    p0 += BOUND_LANES
            for p in range(p0, e):
                m = w * f16_value(f16, pair_max[p])
                # ubs[block's 4 sub-blocks] += m x the code's 4 levels
                _add_scaled4(ubs, np.int64(pair_block[p]) * SUB_BLOCKS, _SUB_FRACTIONS_FLAT,
                             np.int64(pair_sub[p]) * SUB_BLOCKS, m)
                t += m
        else:
            for p in range(pair_ptr[j], pair_ptr[j + 1]):
                m = w * f16[pair_max[p]]
                ub[np.int64(pair_block[p])] += m
                t += m
        tsum[i] = t
    if has_sub:
        for b in range(n_blocks):
            v = ubs[b * SUB_BLOCKS]
            for y in range(1, SUB_BLOCKS):
                v = max(v, ubs[b * SUB_BLOCKS + y])
            ub[b] = v
    use_mask = allowed.size > 0
    lo = max(block_lo, 0)
    hi = n_blocks if block_hi < 0 else min(block_hi, n_blocks)
    nc = 0
    if head_blocks <= 0 and not use_mask:
        # no head and no filter: the tail is every block of [lo, hi) with a positive bound, in
        # block order, and the sweep walks that range itself (no list of candidates written here
        # and read back there: ~39k blocks a query at 10M documents)
        for b in range(lo, hi):
            nc += ub[b] > 0
        return (ub, ubs, tsum, np.empty(0, np.int64), np.empty((nq, 0), np.int64), np.empty((nq, 0), np.float32),
                np.empty((nq, 0), np.uint8), np.empty(0, np.int64), nc, True)
    cand = np.empty(max(hi - lo, 0), np.int64)
    vmax = np.float32(0.0)
    for b in range(lo, hi):
        if ub[b] <= 0:
            continue
        if use_mask:
            found = False
            for d in range(b * bs, min((b + 1) * bs, n_docs)):
                if allowed[d]:
                    found = True
                    break
            if not found:
                continue
        cand[nc] = b
        nc += 1
        if ub[b] > vmax:
            vmax = ub[b]
    cand = cand[:nc]
    n_first = min(nc, max(head_blocks, nc >> 4)) if head_blocks > 0 else 0
    # head = the candidates in the top histogram bins (a monotone binning: a lower bin holds only
    # strictly lower bounds); at least n_first of them
    if n_first <= 0:
        return (ub, ubs, tsum, np.empty(0, np.int64), np.empty((nq, 0), np.int64), np.empty((nq, 0), np.float32),
                np.empty((nq, 0), np.uint8), cand, nc, False)
    nbins = 1024
    scale = np.float32(nbins) / vmax if vmax > 0 else np.float32(0.0)
    bins = np.empty(nc, np.int64)
    hist = np.zeros(nbins, np.int64)
    for c in range(nc):
        x = min(np.int64(ub[cand[c]] * scale), nbins - 1)
        bins[c] = x
        hist[x] += 1
    cut = nbins
    got = 0
    while got < n_first and cut > 0:
        cut -= 1
        got += hist[cut]
    head = np.empty(got, np.int64)
    tail = np.empty(nc - got, np.int64)
    h = 0
    t = 0
    for c in range(nc):
        if bins[c] >= cut:
            head[h] = cand[c]
            h += 1
        else:
            tail[t] = cand[c]
            t += 1
    head = head[np.argsort(-ub[head])]
    nh = head.size
    hrow = np.full(n_blocks, -1, np.int64)
    for x in range(nh):
        hrow[head[x]] = x
    hslot = np.full((nq, nh), -1, np.int64)
    hbmc = np.zeros((nq, nh), np.float32)
    hsub = np.full((nq, nh), 255, np.uint8)  # 255: every sub-block at the block bound
    if nh > 0:
        for i in range(nq):
            j = q_j[i]
            w = q_w[i]
            q = post_ptr[j]
            for p in range(pair_ptr[j], pair_ptr[j + 1]):
                c = np.int64(pair_cnt[p]) + 1
                r = hrow[np.int64(pair_block[p])]
                if r >= 0:
                    hslot[i, r] = (q << 9) | c  # posting start and count (<= 256) in one word
                    hbmc[i, r] = w * f16[pair_max[p]]
                    if has_sub:
                        hsub[i, r] = pair_sub[p]
                q += c
    return ub, ubs, tsum, head, hslot, hbmc, hsub, tail, nc, False


@njit(cache=True, inline="always")
def _find_weight(post_off, post_w, f16, q0, cnt, o):
    """Weight of block offset ``o`` in one (term, block) run (offsets ascending), or 0."""
    lo = q0
    n = cnt
    while n > 1:  # branch-free lower bound
        half = n >> 1
        lo = lo + half if post_off[lo + half - 1] < o else lo
        n -= half
    if n == 1 and post_off[lo] < o:
        lo += 1
    if lo < q0 + cnt and post_off[lo] == o:
        return f16_value(f16, post_w[lo])
    return np.float32(0.0)


@njit(cache=True)
def _canonical_score(slot_row, q_w, post_off, post_w, f16, o):
    """The score of one doc summed in query-term order (what explain reproduces)."""
    s = np.float32(0.0)
    for i in range(q_w.size):
        sl = slot_row[i]
        if sl >= 0:
            w = _find_weight(post_off, post_w, f16, sl >> 9, sl & 511, o)
            if w > 0:
                s += q_w[i] * w
    return s


@njit(cache=True, inline="always")
def _check_block(chk, slot_row, lazy):
    """Verify every postings run of one block (before canonical scores read them)."""
    for i in range(slot_row.size):
        sl = slot_row[i]
        if sl >= 0 and lazy[i]:
            bad = check_run(chk, sl >> 9, sl & 511)
            if bad >= 0:
                return bad
    return -1


@njit(cache=True, inline="always")
def _block_run(i, oi, b, in_head, head_runs, cursors, seg, q_w, runs):
    """Term i's run in block b, the oi-th block visited, into ``row[i]`` (posting start << 9 |
    count, -1: none), its bound into ``rbm[i]`` and its sub-block code into ``rsub[i]`` (255:
    none stored, every sub-block at ``rbm[i]``). Head blocks read the plan's table; tail blocks
    (visited in block order) move term i's cursor forward to b, only when the block needs the
    term: a long light term is skipped over many blocks at once (galloping search for the block,
    then the posting start by summing the skipped counts).

    ``head_runs`` = (hslot, hbmc, hsub) of the plan (:func:`_block_plan`); ``cursors`` = per
    term (next pair, end of its pairs, first posting of that pair); ``runs`` = (row, rbm, rsub,
    stamp), ``stamp[i]`` = oi once term i's run in block oi is there. The one copy of this step:
    the block sweep calls it (inlined) wherever it needs a term's run."""
    hslot, hbmc, hsub = head_runs
    cp, pe, cq = cursors
    row, rbm, rsub, stamp = runs
    pair_block, pair_cnt, pair_max, pair_sub, f16 = seg.pair_block, seg.pair_cnt, seg.pair_max, seg.pair_sub, seg.f16
    stamp[i] = oi
    if in_head:
        row[i] = hslot[i, oi]
        rbm[i] = hbmc[i, oi]
        rsub[i] = hsub[i, oi]
        return
    p = cp[i]
    e = pe[i]
    q = cq[i]
    if p < e and np.int64(pair_block[p]) < b:
        # first pair at or after block b: gallop from p, then binary search
        lo = p  # pair_block[lo] < b
        step = 1
        hi = p + 1
        while hi < e and np.int64(pair_block[hi]) < b:
            lo = hi
            step <<= 1
            hi = p + step
        if hi > e:
            hi = e
        while hi - lo > 1:  # pair_block[lo] < b; hi == e or pair_block[hi] >= b
            mid = (lo + hi) >> 1
            if np.int64(pair_block[mid]) < b:
                lo = mid
            else:
                hi = mid
        s = hi - p
        for t in range(p, hi):
            s += np.int64(pair_cnt[t])
        q += s
        p = hi
    if p < e and np.int64(pair_block[p]) == b:
        c = np.int64(pair_cnt[p]) + 1
        row[i] = (q << 9) | c
        rbm[i] = q_w[i] * f16[pair_max[p]]
        rsub[i] = pair_sub[p] if pair_sub.size > 0 else 255
        cp[i] = p + 1
        cq[i] = q + c
    else:
        row[i] = -1
        rbm[i] = 0.0
        cp[i] = p
        cq[i] = q


@njit(cache=True, inline="always")
def _take_off(rem4, rb, code):
    """Take a streamed term's bound off the remaining bound of each sub-block (``rb`` x its level
    there, ``code``: see ``npkernels.SUB_BLOCKS``; one 4-lane operation, no branch: this runs for
    every term streamed in every block) and return the highest. A dead sub-block (-inf: no doc
    there can reach the k-th score) stays dead. The products are those the bound pass added, so
    only the order of the sums differs, which the margin on the block's bound covers: a live
    sub-block's bound never falls below the true bound of its terms not yet streamed (>= 0)."""
    _add_scaled4(rem4, 0, _SUB_FRACTIONS_FLAT, np.int64(code) * SUB_BLOCKS, -rb)
    return max(max(rem4[0], rem4[1]), max(rem4[2], rem4[3]))


@njit(cache=True)
def _blockmax_segment(q_j, q_w, seg, allowed, ref_base, top, opts, chk):
    """Exact block-max top-k with progressive pruning inside blocks.

    Every decision compares a true upper bound with the current k-th score ``thr``:

    * block-max: a block whose bound (sum over terms of query weight x block max; with
      sub-block codes the highest such sum over its sub-blocks) is below ``thr`` is skipped
      (visit order: see :func:`_block_plan`: the head blocks best bound first, then the others
      in block order, their runs found by one cursor per term);
    * inside a block, the terms are streamed into a 256-float accumulator in decreasing order
      of (bound / postings in the block), so the bound ``rem`` of the terms not yet streamed
      falls fastest per posting read. With sub-block codes it is kept per sub-block (a
      sub-block whose bound is below ``thr`` is dead from the start) and ``rem`` is the highest
      live one. Once ``rem`` < ``thr``, a doc no streamed term hit is out, and a hit doc is out
      when its partial sum + its sub-block's ``rem`` < ``thr``: when the highest
      partial sum ``mx`` + ``rem`` < ``thr`` the block is done; otherwise the survivors are
      gathered from the runs streamed so far (at most :data:`GATHER_MAX` postings) or, after
      long runs, from the accumulator when at most ``bs / LOOKUP_COST`` can survive (else the
      next run is streamed). The remaining terms, in decreasing order of the bound they take
      off a block on average (not per posting: what a visit costs now is finding the term's
      run, not its length), are then looked up for them (binary search in its run) where that
      is cheaper than streaming the run, and when no doc is left the block's remaining terms
      are never read.

    Heap entries are rescored in query-term order, so scores are identical to explain's.
    """
    n_docs, bshift, seq, f16 = seg.n_docs, seg.bshift, seg.seq, seg.f16
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, post_off, post_w = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.pair_max, seg.pair_sub, seg.post_off, seg.post_w)
    hs, state = top.scores, top.state
    k = hs.size
    nq = q_j.size
    bs = 1 << bshift
    lazy, bad = prepare_terms(chk, q_j, post_ptr)  # short terms verified now, long ones run by run
    if bad >= 0:
        state[7] = bad
        return
    ub, ubs, tsum, head, hslot, hbmc, hsub, tail, nc, dense = _block_plan(
        q_j, q_w, seg, allowed, opts.head_blocks if state[0] < k else 0, opts.block_lo, opts.block_hi)
    head_runs = (hslot, hbmc, hsub)
    has_sub = pair_sub.size > 0
    # the remaining bound is kept per sub-block (one "sub-block", the whole block, without codes):
    # the doc at block offset o is in sub-block (o * nsub) >> bshift
    nsub = SUB_BLOCKS if has_sub else 1
    rem4 = np.full(SUB_BLOCKS, -np.inf, np.float32)  # (4 lanes for _take_off; those past nsub stay -inf)
    use_mask = allowed.size > 0
    # term order inside blocks: decreasing bound taken off a block per unit of work, on average
    # over the blocks: (sum of block bounds) / (postings + VISIT_POSTINGS x blocks), a term's visit
    # to a block (finding its run there, or that it has none) costing about VISIT_POSTINGS
    # postings streamed: rare heavy terms first, long light ones last
    n_blocks = (n_docs + bs - 1) >> bshift
    gkey = np.zeros(nq, np.float64)
    for i in range(nq):
        n_post = post_ptr[q_j[i] + 1] - post_ptr[q_j[i]]
        if n_post > 0:
            gkey[i] = -tsum[i] / (n_post + VISIT_POSTINGS * n_blocks)
    gorder = np.argsort(gkey)
    # the terms left once a block's few survivors are known are looked up (or their runs read)
    # for those docs alone: a visit costs about the same whatever the run's length (moving the
    # term's cursor to the block, a cache miss or two), so they are taken in decreasing order
    # of the bound they take off a block on average (sum of block bounds): the survivors drop
    # out after fewer visits
    lorder = np.argsort(-tsum)
    # tail cursors, per term: next (block, count) pair, its end, and the first posting of that pair
    cp = np.empty(nq, np.int64)
    pe = np.empty(nq, np.int64)
    cq = np.empty(nq, np.int64)
    for i in range(nq):
        cp[i] = pair_ptr[q_j[i]]
        pe[i] = pair_ptr[q_j[i] + 1]
        cq[i] = post_ptr[q_j[i]]
    acc = np.zeros(bs, np.float32)
    cands = np.empty(bs, np.int64)
    limit = bs // LOOKUP_COST  # more survivors than this: streaming the rest is cheaper
    mark = np.zeros(bs, np.uint8)  # docs already in cands (left all zeros)
    row = np.full(nq, -1, np.int64)  # per term: its run in the current block (-1: none) ...
    rbm = np.zeros(nq, np.float32)  # ... its bound there ...
    rsub = np.full(nq, 255, np.uint8)  # ... and its sub-block code (see _block_run), valid when stamp[i] == oi
    stamp = np.full(nq, -1, np.int64)
    cursors = (cp, pe, cq)
    runs = (row, rbm, rsub, stamp)
    exact_total = True
    matched = 0
    scored = 0
    n_look = 0
    n_stream = 0
    full = state[0] >= k
    thr = hs[0] if full else np.float32(0.0)
    slack = np.float32(1.0001)  # float32 sums in different orders differ in the last bits
    # rem starts at the block's (sub-blocks') bound (summed in another order than the terms are
    # taken off): this margin keeps it above the exact remaining bound whatever the rounding
    margin = np.float32(1.00001)
    nh = head.size
    lo_dense = max(opts.block_lo, 0)  # dense: the tail is [lo_dense, hi_dense) (see _block_plan)
    hi_dense = ub.size if opts.block_hi < 0 else min(opts.block_hi, ub.size)
    total = nh + (max(hi_dense - lo_dense, 0) if dense else tail.size)
    oi = -1
    while oi + 1 < total:
        oi += 1
        if oi < nh:
            b = head[oi]
            if full and ub[b] * slack < thr:
                exact_total = False
                break  # the head is sorted and every tail bound is below it: nothing left can reach thr
        else:
            if dense:
                b = lo_dense + oi  # (nh == 0)
                if ub[b] <= 0:  # no query term here (a candidate in no list)
                    continue
            else:
                b = tail[oi - nh]
            if full and ub[b] * slack < thr:
                exact_total = False
                continue
        scored += 1
        base = b << bshift
        # per sub-block: the bound of the terms not streamed yet (-inf: dead, its bound cannot
        # reach thr); rem, the highest, bounds every doc of the block that can still make it
        if has_sub:
            for y in range(SUB_BLOCKS):  # (a constant trip count: unrolled)
                v = ubs[b * SUB_BLOCKS + y]
                rem4[y] = v * margin if not full or v * slack >= thr else -np.inf
        else:
            rem4[0] = ub[b] * margin
        rem = ub[b] * margin
        ns = 0  # terms streamed
        blk_stream = 0  # postings streamed in this block
        mx = np.float32(0.0)  # the highest partial sum in acc
        x = 0  # next term (position in gorder)
        nca = -1  # -1: every term streamed; >= 0: only cands[:nca] can still reach thr
        while x < nq:
            i = gorder[x]
            x += 1
            if stamp[i] != oi:
                # _block_run, written out on this hot path: calling it here (inlined, its arrays in
                # tuples) cost 1.5x the CPU time per query (same-run A/B at 1M idf documents, 200
                # queries, 5 rounds: x1.44-1.77; benchmarks/engine_ab.py, docs/scale.md): the
                # reference counts of the arrays it is passed cost more than the cursor step itself
                stamp[i] = oi
                if oi < nh:
                    row[i] = hslot[i, oi]
                    rbm[i] = hbmc[i, oi]
                    rsub[i] = hsub[i, oi]
                else:
                    p = cp[i]
                    e = pe[i]
                    q = cq[i]
                    while p < e and np.int64(pair_block[p]) < b:  # usually a step or two: see _block_run
                        q += np.int64(pair_cnt[p]) + 1
                        p += 1
                    if p < e and np.int64(pair_block[p]) == b:
                        c = np.int64(pair_cnt[p]) + 1
                        row[i] = (q << 9) | c
                        rbm[i] = q_w[i] * f16[pair_max[p]]
                        rsub[i] = pair_sub[p] if has_sub else 255
                        cp[i] = p + 1
                        cq[i] = q + c
                    else:
                        row[i] = -1
                        rbm[i] = 0.0
                        cp[i] = p
                        cq[i] = q
            sl = row[i]
            if sl < 0:
                continue
            w = q_w[i]
            q0 = sl >> 9
            cnt = sl & 511
            if lazy[i]:
                bad = check_run(chk, q0, cnt)
                if bad >= 0:
                    state[7] = bad
                    return
            for q in range(q0, q0 + cnt):
                o = np.int64(post_off[q])
                s = acc[o] + w * f16_value(f16, post_w[q])
                acc[o] = s
                mx = max(mx, s)
            n_stream += cnt
            blk_stream += cnt
            if has_sub:
                rem = _take_off(rem4, rbm[i], rsub[i])
            else:  # format 1: one bound for the whole block
                rem -= rbm[i]
                rem4[0] = rem
            ns += 1
            if full and x < nq and rem * slack < thr:
                # untouched docs are out (their sum is at most rem); a hit doc is out when its partial
                # sum + rem < thr. mx, the highest partial sum, settles most blocks here
                if (mx + rem) * slack < thr:
                    nca = 0
                    break
                if blk_stream <= GATHER_MAX:
                    # few postings read: gather the survivors from the runs streamed so far (each doc
                    # once, ``mark``), cheaper than a pass over the block's accumulator
                    nca = 0
                    for y in range(x):  # the terms visited in this block; those with a run were streamed
                        sx = row[gorder[y]]
                        if sx < 0:
                            continue
                        for q in range(sx >> 9, (sx >> 9) + (sx & 511)):
                            o = np.int64(post_off[q])
                            s = acc[o]
                            ok = (s > 0) & ((s + rem4[(o * nsub) >> bshift]) * slack >= thr) & (mark[o] == 0)
                            if use_mask:
                                ok &= allowed[base + o] != 0
                            cands[nca] = o
                            nca += ok
                            if ok:
                                mark[o] = 1
                    for c in range(nca):
                        mark[cands[c]] = 0
                    break
                # many postings read (weights that do not fall with frequency): roughly count the hit
                # docs that may still reach thr (branch-free; the count only decides the switch to
                # lookups, survivors are picked exactly): with more than a handful, streaming the
                # next runs is cheaper than looking them up
                cut = thr / slack - rem
                c = 0
                for o in range(bs):
                    c += acc[o] >= cut
                if c <= limit:
                    nca = 0
                    for y in range(nsub):  # sub-block by sub-block: dead ones hold no survivor
                        r = rem4[y]
                        if r == -np.inf:
                            continue
                        o0 = (y * bs + nsub - 1) // nsub  # its offsets: (o * nsub) >> bshift == y
                        o1 = ((y + 1) * bs + nsub - 1) // nsub
                        if use_mask:
                            for o in range(o0, o1):
                                s = acc[o]
                                a = allowed[base + o] != 0 if base + o < n_docs else False
                                cands[nca] = o
                                nca += (s > 0) & ((s + r) * slack >= thr) & a
                        else:
                            for o in range(o0, o1):  # branch-free compaction
                                s = acc[o]
                                cands[nca] = o
                                nca += (s > 0) & ((s + r) * slack >= thr)
                    break
        if nca >= 0:
            exact_total = False
            x = 0
            while x < nq and nca > 0:
                i = lorder[x]
                x += 1
                if stamp[i] == oi:  # streamed before the survivors were gathered (or no run here)
                    continue
                # _block_run written out, as above
                stamp[i] = oi
                if oi < nh:
                    row[i] = hslot[i, oi]
                    rbm[i] = hbmc[i, oi]
                    rsub[i] = hsub[i, oi]
                else:
                    p = cp[i]
                    e = pe[i]
                    q = cq[i]
                    while p < e and np.int64(pair_block[p]) < b:  # usually a step or two: see _block_run
                        q += np.int64(pair_cnt[p]) + 1
                        p += 1
                    if p < e and np.int64(pair_block[p]) == b:
                        c = np.int64(pair_cnt[p]) + 1
                        row[i] = (q << 9) | c
                        rbm[i] = q_w[i] * f16[pair_max[p]]
                        rsub[i] = pair_sub[p] if has_sub else 255
                        cp[i] = p + 1
                        cq[i] = q + c
                    else:
                        row[i] = -1
                        rbm[i] = 0.0
                        cp[i] = p
                        cq[i] = q
                sl = row[i]
                if sl < 0:
                    continue
                w = q_w[i]
                q0 = sl >> 9
                cnt = sl & 511
                if lazy[i]:
                    bad = check_run(chk, q0, cnt)
                    if bad >= 0:
                        state[7] = bad
                        return
                if nca * LOOKUP_COST < cnt:
                    n_look += nca
                    for c in range(nca):
                        o = cands[c]
                        y = _find_weight(post_off, post_w, f16, q0, cnt, o)
                        if y > 0:
                            acc[o] += w * y
                else:  # stream the run: the dead docs' sums are never read again
                    n_stream += cnt
                    q = q0
                    if HAVE_F16C:  # 8 postings at a time, as TAAT (offsets in a run are distinct)
                        while q + SCATTER_LANES <= q0 + cnt:
                            _scatter_add8(acc, 0, post_off, post_w, q, w)
                            q += SCATTER_LANES
                    for r in range(q, q0 + cnt):
                        acc[post_off[r]] += w * f16_value(f16, post_w[r])
                # never below 0 here, whatever the rounding (a dead sub-block at 0 still keeps none of
                # its docs: their sums are below thr on their own)
                if has_sub:
                    _take_off(rem4, rbm[i], rsub[i])
                    for y in range(SUB_BLOCKS):
                        rem4[y] = max(rem4[y], np.float32(0.0))
                else:
                    rem4[0] = max(rem4[0] - rbm[i], np.float32(0.0))
                keep = 0
                for c in range(nca):
                    o = cands[c]
                    cands[keep] = o
                    keep += (acc[o] + rem4[(o * nsub) >> bshift]) * slack >= thr
                nca = keep
            filled = False
            for c in range(nca):
                o = cands[c]
                s = acc[o]
                if s * slack < thr:
                    continue
                if not filled:  # every term's run in this block, then verified, before the scores read them
                    for y in range(nq):
                        if stamp[y] != oi:
                            _block_run(y, oi, b, oi < nh, head_runs, cursors, seg, q_w, runs)
                    bad = _check_block(chk, row, lazy)
                    if bad >= 0:
                        state[7] = bad
                        return
                    filled = True
                s = _canonical_score(row, q_w, post_off, post_w, f16, o)
                if s < thr:
                    continue
                d = base + o
                push(top, s, seq[d], ref_base + d)
                thr = hs[0]
            acc[:] = 0.0
            continue
        # every term streamed: count the hit docs and look for possible hits without branching
        # (cut is a hair below thr / slack: the exact test follows for what passes it)
        cut = thr / slack * np.float32(0.99999) if full else np.float32(0.0)
        c = 0
        if use_mask:
            for o in range(bs):
                a = allowed[base + o] != 0 if base + o < n_docs else False
                matched += (acc[o] > 0) & a
                c += (acc[o] >= cut) & (acc[o] > 0) & a
        else:
            for o in range(bs):
                matched += acc[o] > 0
                c += (acc[o] >= cut) & (acc[o] > 0)
        if c == 0:
            acc[:] = 0.0
            continue
        # every run of the block was streamed (row is complete), so verified (check_run) before the
        # scores below read them
        for o in range(bs):
            s = acc[o]
            if s <= 0:
                continue
            acc[o] = 0.0
            d = base + o
            if use_mask and not allowed[d]:
                continue
            if full and s * slack < thr:
                continue
            s = _canonical_score(row, q_w, post_off, post_w, f16, o)
            if full and s < thr:
                continue
            push(top, s, seq[d], ref_base + d)
            if not full and state[0] >= k:
                full = True
            if full:
                thr = hs[0]
    state[1] += matched
    state[3] += scored
    state[4] += nc
    state[5] += n_stream
    state[6] += n_look
    if not exact_total:
        state[2] = 0
