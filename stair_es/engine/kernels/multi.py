"""One compiled call for all the segments of one search: the query's terms looked up in each
segment, their block tables verified, ``auto``'s options and record, and each segment searched
(:func:`.search.search_segment`) into one heap, whose k-th score carries from segment to segment.

Before this, the searcher did those steps in Python around one kernel call per segment: ~0.1 ms
a segment (numpy lookups, verification bookkeeping, typing a dozen arrays for numba), ~1 ms of a
7.5 ms search at 10M documents in ten segments (docs/scale.md). The results are the same (the
same kernel runs on the same arrays, and every strategy's hits and scores are exact)."""

from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from ..layout import CHOSEN_RENEW, PLAN, PLAN_SLOTS, STRATEGY_AUTO, STRATEGY_BLOCKMAX, SegmentArrays, TopK
from .heap import push
from .search import _query_counts, search_segment
from .seed import PLACEHOLDER_SEQ, heaviest_docs, score_docs, top_pairs, _max_bits
from .verify import _verify_chunk_range

#: ``out[s, 0]`` of a segment the query's terms miss, and of one ``auto`` leaves to the numpy twin
#: (its query terms have at most ``numpy_max`` postings: the caller searches it, then calls again
#: from the next segment, so that the search state each segment sees is the one-by-one search's)
NO_TERMS = -1
WANTS_NUMPY = -2
#: what :func:`search_segments` returns first: every segment searched; a chunk failed its checksum;
#: a segment left to numpy
DONE = 0
DAMAGED = 1
#: columns of ``out``: the strategy run (or the two codes above), how it was chosen when decided
#: here (``CHOSEN_RENEW``, else -1), the kernel's plan slots (:data:`..layout.PLAN_FIELDS`), the
#: postings of the query terms
OUT_COLUMNS = 3 + PLAN_SLOTS


#: columns of a segment's row in the descriptor table (int64): its size and block shift, then
#: (address, length) of each array it is searched with, in this order (see :func:`describe`)
DESC_ARRAYS = ("post_ptr", "pair_ptr", "pair_block", "pair_cnt", "pair_max", "pair_sub", "post_off", "post_w", "seq",
               "terms")
DESC_COLUMNS = 2 + 2 * len(DESC_ARRAYS)
#: columns of a segment's row in the verification table: 1 when it has chunk checksums to verify,
#: then (address, length) of the file mapping, the chunk CRC table, the verified-chunk flags, the
#: verified-block-table flags and the block tables' layout rows (file offset, item size: flattened),
#: then the chunk shift, the content length and the file offsets of ``post_off`` and ``post_w``
CHECK_COLUMNS = 15


@intrinsic
def _pointer(typingctx, addr, like):
    """``addr`` (int64) as a pointer to ``like``'s item type (``like``: an array of that type)."""
    ptr = types.CPointer(like.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(types.int64, like), codegen


_I64 = np.zeros(0, np.int64)
_U64 = np.zeros(0, np.uint64)
_U32 = np.zeros(0, np.uint32)
_U16 = np.zeros(0, np.uint16)
_U8 = np.zeros(0, np.uint8)
_B1 = np.zeros(0, np.bool_)


@njit(cache=True, inline="always")
def _view(row, c, like):
    """The array at columns (c, c + 1) = (address, length) of a table row, as an array of ``like``'s type."""
    return carray(_pointer(row[c], like), (row[c + 1],))


@njit(cache=True, inline="always")
def _segment(d, f16):
    """A segment's :class:`..layout.SegmentArrays` (plain tuple) from its descriptor row."""
    return (d[0], d[1], _view(d, 2, _I64), _view(d, 4, _I64), _view(d, 6, _U16), _view(d, 8, _U8),
            _view(d, 10, _U16), _view(d, 12, _U8), _view(d, 14, _U8), _view(d, 16, _U16), _view(d, 18, _U64), f16)


@njit(cache=True, inline="always")
def _check(c):
    """A segment's ``check_run`` tuple, block-table flags and layout from its verification row."""
    chk = (_view(c, 1, _U8), _view(c, 3, _U32), _view(c, 5, _B1), c[11], c[12], c[13], c[14])
    layout = _view(c, 9, _I64).reshape((c[10] // 2, 2))
    return chk, _view(c, 7, _B1), layout


@njit(cache=True, inline="always")
def _verify_tables(chk, tables_ok, layout, q_j, pair_ptr):
    """Verify (once) the block tables of terms ``q_j``; the first bad chunk or -1."""
    buf, table, ok, shift, content = chk[0], chk[1], chk[2], chk[3], chk[4]
    base = buf.ctypes.data
    for i in range(q_j.size):
        j = q_j[i]
        if tables_ok[j]:
            continue
        lo = pair_ptr[j]
        hi = pair_ptr[j + 1]
        if hi > lo:
            for r in range(layout.shape[0]):
                a = layout[r, 0] + lo * layout[r, 1]
                b = layout[r, 0] + hi * layout[r, 1]
                bad = _verify_chunk_range(base, table, ok, shift, content, a >> shift, (b - 1) >> shift)
                if bad >= 0:
                    return bad
        tables_ok[j] = True
    return -1


def describe(arrays: dict, n_docs: int, bshift: int) -> np.ndarray:
    """A segment's descriptor row (:data:`DESC_COLUMNS`) from its arrays by name (those of
    :data:`DESC_ARRAYS`, C-contiguous, of the kernels' types). The arrays must outlive every
    call given the row: it holds their addresses, not references."""
    row = np.zeros(DESC_COLUMNS, np.int64)
    row[0], row[1] = n_docs, bshift
    for i, name in enumerate(DESC_ARRAYS):
        a = arrays[name]
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} is not contiguous")
        row[2 + 2 * i], row[3 + 2 * i] = a.ctypes.data, a.size
    return row


def address(a: np.ndarray) -> tuple[int, int]:
    """(address, length) of a contiguous 1-d array, for a descriptor or verification row."""
    if not a.flags.c_contiguous:
        raise ValueError("not a contiguous array")
    return a.ctypes.data, a.size


@njit(cache=True, inline="always")
def _present_terms(keys, weights, tt):
    """The query terms a segment holds, in query order: (their term indices in its term table
    ``tt``, their query weights)."""
    n = 0
    for i in range(keys.size):
        if keys[i] < tt.size and tt[keys[i]] >= 0:
            n += 1
    q_j = np.empty(n, np.int64)
    q_w = np.empty(n, np.float32)
    n = 0
    for i in range(keys.size):
        if keys[i] < tt.size and tt[keys[i]] >= 0:
            q_j[n] = tt[keys[i]]
            q_w[n] = weights[i]
            n += 1
    return q_j, q_w


@njit(cache=True, inline="always")
def _query_terms(keys, tt):
    """Per query term: its term index in a segment (term table ``tt``), -1 when absent."""
    q = np.full(keys.size, -1, np.int64)
    for i in range(keys.size):
        if keys[i] < tt.size:
            q[i] = tt[keys[i]]
    return q


@njit(cache=True)
def seed_bound(keys, weights, which, start, desc, allowed, checks, tmax, f16, k, n_terms, n_post, seg_best):
    """A lower bound of the k-th best score of the query over segments ``which[start:]`` (see
    :mod:`.seed`): the k-th best exact score of the documents of the ``n_post`` heaviest
    postings of each of the ``n_terms`` query terms of highest weight x maximum weight (``tmax[s]``:
    (address, length) of segment s's uint16 cache of each term's highest block maximum, 0: not
    known yet, filled here). 0 when
    fewer than k such documents were found, or a table or run read for it is damaged (the
    search proper then reports it). ``seg_best[x]``: the best candidate score of segment
    ``which[x]`` (left as it is where none)."""
    nq = keys.size
    ns = which.size - start
    if nq == 0 or ns <= 0 or k <= 0 or n_terms <= 0 or n_post <= 0:
        return np.float32(0.0)
    qj = np.full((ns, nq), -1, np.int64)
    heavy = np.zeros(nq, np.float32)  # per query term: query weight x its highest block maximum
    for x in range(ns):
        s = which[start + x]
        d = desc[s]
        seg = SegmentArrays(*_segment(d, f16))
        tt = _view(d, 20, _I64)
        row = _query_terms(keys, tt)
        c = checks[s]
        if c[0] != 0:
            chk, tables_ok, layout = _check(c)
            if _verify_tables(chk, tables_ok, layout, _present_terms(keys, weights, tt)[0], seg.pair_ptr) >= 0:
                return np.float32(0.0)
        for i in range(nq):
            j = row[i]
            qj[x, i] = j
            if j >= 0:
                cache = _view(tmax[s], 0, _U16)
                m = cache[j] if j < cache.size else np.uint16(0)
                if m == 0:
                    m = _max_bits(seg.pair_max, seg.pair_ptr[j], seg.pair_ptr[j + 1])
                    if j < cache.size:
                        cache[j] = m
                heavy[i] = max(heavy[i], weights[i] * f16[m])
    order = np.argsort(-heavy)
    # candidates: (segment position x, local doc)
    cx = np.empty(n_terms * n_post, np.int64)
    cd = np.empty(n_terms * n_post, np.int64)
    nc = 0
    bits = np.empty(n_post, np.uint16)
    segs = np.empty(n_post, np.int64)
    pairs = np.empty(n_post, np.int64)
    for t in range(min(n_terms, nq)):
        i = order[t]
        if heavy[i] <= 0:
            break
        n = 0
        for x in range(ns):
            j = qj[x, i]
            if j >= 0:
                seg = SegmentArrays(*_segment(desc[which[start + x]], f16))
                n = top_pairs(seg.pair_max, seg.pair_ptr[j], seg.pair_ptr[j + 1], x, bits, segs, pairs, n)
        sel = np.argsort((segs[:n] << 40) | pairs[:n])  # by segment, then pair
        y = 0
        while y < n:
            x = segs[sel[y]]
            z = y
            while z < n and segs[sel[z]] == x:
                z += 1
            ps = np.sort(pairs[sel[y:z]])
            s = which[start + x]
            seg = SegmentArrays(*_segment(desc[s], f16))
            got = np.empty(ps.size, np.int64)
            c = checks[s]
            if c[0] != 0:
                bad = heaviest_docs(qj[x, i], ps, seg, _check(c)[0], got)
            else:
                bad = heaviest_docs(qj[x, i], ps, seg, None, got)
            if bad >= 0:
                return np.float32(0.0)
            mask = _view(allowed[s], 0, _U8)
            for g in range(got.size):
                if got[g] >= 0 and (mask.size == 0 or mask[got[g]] != 0):
                    cx[nc] = x
                    cd[nc] = got[g]
                    nc += 1
            y = z
    if nc < k:
        return np.float32(0.0)
    key = np.unique((cx[:nc] << 32) | cd[:nc])
    if key.size < k:
        return np.float32(0.0)
    scores = np.empty(key.size, np.float32)
    y = 0
    while y < key.size:
        x = key[y] >> 32
        z = y
        while z < key.size and (key[z] >> 32) == x:
            z += 1
        s = which[start + x]
        seg = SegmentArrays(*_segment(desc[s], f16))
        q_j, q_w = _present_terms(keys, weights, _view(desc[s], 20, _I64))
        docs = key[y:z] & 0xFFFFFFFF
        c = checks[s]
        if c[0] != 0:
            bad = score_docs(q_j, q_w, seg, _check(c)[0], docs, scores[y:z])
        else:
            bad = score_docs(q_j, q_w, seg, None, docs, scores[y:z])
        if bad >= 0:
            return np.float32(0.0)
        seg_best[start + x] = max(seg_best[start + x], scores[y:z].max())
        y = z
    return np.sort(scores)[scores.size - k]


@njit(cache=True, nogil=True)
def search_segments(keys, weights, which, start, desc, allowed, checks, tmax, f16, rec, top, scratch, settings, ema, out):
    """Search segments ``which[start:]`` (in that order) into the heap ``top`` (a plain
    :class:`..layout.TopK` tuple). Returns (:data:`DONE`, ``which.size``); (:data:`DAMAGED`, x):
    a chunk of segment ``which[x]`` failed its checksum (``top.state[7]`` = the chunk; nothing
    of it reached a score); or (:data:`WANTS_NUMPY`, x): segment ``which[x]`` is the caller's to
    search with numpy, then to call again with ``start`` = x + 1.

    ``keys``: int64 term keys of the query terms (field index x vocabulary size + token), in query
    order; ``weights``: their float32 query weights. Per segment s, rows of int64 tables (no
    typed lists: making one costs a new process over a second of numba compilation): ``desc[s]``
    its arrays (:func:`describe`; its ``terms``: the term table, key -> term index or -1, keys
    past its end absent), ``allowed[s]`` (address, length) of its uint8 mask per doc (length 0:
    all docs), ``checks[s]`` its verification data (:data:`CHECK_COLUMNS`; column 0 = 0: none),
    ``tmax[s]`` (address, length) of its cache of term maxima (see :func:`seed_bound`).
    ``f16``: the float16 table. ``rec[s]``: ``auto``'s record of block-max on the segment (share
    of the postings streamed, of the blocks scored, queries since; share -1: none), updated here
    as ``Searcher._auto_record`` does. ``settings``: int64 (strategy, head blocks, numpy_max,
    auto_retry); ``ema``: the record's averaging weight. ``scratch``: TAAT's window.

    ``out[s]`` (see :data:`OUT_COLUMNS`): what ran on each segment of ``which``."""
    strategy, head_blocks, numpy_max, retry = settings[0], settings[1], settings[2], settings[3]
    state = top[3]
    k = top[0].size
    if start == 0 and state[0] == 0 and settings.size >= 6 and settings[4] > 0 and settings[5] > 0:
        # the heap starts full of placeholders at a lower bound of the k-th best score (see .seed)
        seg_best = np.zeros(which.size, np.float32)
        t = seed_bound(keys, weights, which, start, desc, allowed, checks, tmax, f16, k, settings[4], settings[5], seg_best)
        if t > 0:
            heap = TopK(*top)
            for _ in range(k):
                push(heap, t, PLACEHOLDER_SEQ, np.int64(-1))
            if settings.size >= 7 and settings[6] > 0:
                # the segments of the best candidates first: the k-th score rises sooner
                order = np.argsort(-seg_best[start:], kind="mergesort")
                which[start:] = which[start:][order]
    for x in range(start, which.size):
        s = which[x]
        out[s, 0] = NO_TERMS
        out[s, 1] = -1
        d = desc[s]
        q_j, q_w = _present_terms(keys, weights, _view(d, 20, _I64))
        if q_j.size == 0:
            continue
        seg = _segment(d, f16)
        P, _ = _query_counts(q_j, SegmentArrays(*seg))
        out[s, 2 + PLAN_SLOTS] = P
        if strategy == STRATEGY_AUTO and P <= numpy_max:
            out[s, 0] = WANTS_NUMPY
            return WANTS_NUMPY, x
        state[7] = -1
        c = checks[s]
        if c[0] != 0:
            chk, tables_ok, layout = _check(c)
            bad = _verify_tables(chk, tables_ok, layout, q_j, seg[3])
            if bad >= 0:
                state[7] = bad
                return DAMAGED, x
        r = rec[s]
        if strategy == STRATEGY_AUTO and r[0] >= 0:
            if r[2] >= retry:
                opts = (np.int64(STRATEGY_BLOCKMAX), head_blocks, np.int64(0), np.int64(-1), -1.0, -1.0)
                out[s, 1] = CHOSEN_RENEW
            else:
                opts = (strategy, head_blocks, np.int64(0), np.int64(-1), r[0], r[1])
        else:
            opts = (strategy, head_blocks, np.int64(0), np.int64(-1), -1.0, -1.0)
        blocks0 = state[3]
        streamed0 = state[5]
        mask = _view(allowed[s], 0, _U8)
        if c[0] != 0:
            ran = search_segment(q_j, q_w, seg, mask, np.int64(s) << 32, top, opts, scratch, _check(c)[0])
        else:
            ran = search_segment(q_j, q_w, seg, mask, np.int64(s) << 32, top, opts, scratch, None)
        if state[7] >= 0:
            return DAMAGED, x
        out[s, 0] = ran
        for y in range(PLAN_SLOTS):
            out[s, 2 + y] = state[PLAN + y]
        if strategy == STRATEGY_AUTO:
            if ran == STRATEGY_BLOCKMAX:
                n_docs, bshift = seg[0], seg[1]
                n_blocks = max((n_docs + (1 << bshift) - 1) >> bshift, 1)
                streamed = float(state[5] - streamed0) / max(P, 1)
                scored = float(state[3] - blocks0) / n_blocks
                if r[0] >= 0:
                    streamed = r[0] + ema * (streamed - r[0])
                    scored = r[1] + ema * (scored - r[1])
                r[0] = streamed
                r[1] = scored
                r[2] = 0.0
            elif r[0] >= 0:
                r[2] += 1.0
    return DONE, which.size
