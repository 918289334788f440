"""Segment build: a CSR batch checked and packed to float16 bits, inverted into term-major block
postings (on one thread or several), and the sub-block codes of the pairs. The output arrays are
those described in :mod:`.` (the package docstring)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit

from ..layout import F16_TABLE, SUB_BLOCKS, SUB_LEVELS


@njit(cache=True, nogil=True)
def _first_bad_posting(indptr, indices, weights, vocab_size, special, w_max, d0, d1):
    """(status, row) of the first bad posting of documents ``d0:d1`` in CSR order (see
    :func:`check_pack_csr`); (0, -1) when there is none."""
    for d in range(d0, d1):
        last = -1
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            if t < 0 or t >= vocab_size:
                return 2, d
            w = weights[p]
            if not (w >= 0.0) or w == np.inf:
                return 3, d
            if w > w_max:
                return 5, d
            if w > 0.0 and special[t]:
                return 4, d
            if t <= last:
                return 1, d
            last = t
    return 0, -1


@njit(cache=True, nogil=True)
def check_pack_csr(indptr, indices, weights, vocab_size, special, w_max, out, d0, d1):
    """Check documents ``d0:d1`` of a CSR batch and write their weights' fp16 bits to ``out``.

    Returns (status, row, zeros): status 0 ok; 1 unsorted/duplicate ids; 2 bad id; 3 bad weight
    (NaN, infinite, negative); 4 special token; 5 weight above ``w_max`` (fp16's largest) -- of
    the first bad posting in CSR order, ``row`` its document; ``zeros`` counts the weights whose
    fp16 bits are 0 (zero, or too small for fp16), which are not indexed.

    The checks and the cast are flat loops without early exits, which the compiler vectorises
    (~10x numpy's scalar fp16 cast); only a batch with a problem is walked again posting by
    posting to name the first one.
    """
    lo, hi = indptr[d0], indptr[d1]
    # slices, so that loop indices are provably >= 0: numba's negative-index wraparound check
    # on ``range(lo, hi)`` indices stops vectorisation (measured 7x slower)
    ids, ws, bits, packed = indices[lo:hi], weights[lo:hi], weights[lo:hi].view(np.uint32), out[lo:hi]
    m = ids.size
    bad = False
    for p in range(m):
        t = ids[p]
        w = ws[p]
        bad |= (t < 0) | (t >= vocab_size) | (not (w >= 0.0)) | (w > w_max)
    if not bad:
        for p in range(m):
            bad |= special[ids[p]] & (ws[p] > 0.0)
    if not bad:  # ids must increase within a document; a document's first id may be anything
        falls = 0
        for p in range(1, m):
            falls += ids[p] <= ids[p - 1]
        for d in range(d0 + 1, d1):
            q = indptr[d] - lo
            if q > 0 and indptr[d + 1] - lo > q:  # the start of a non-empty document after the first posting
                falls -= ids[q] <= ids[q - 1]
        bad = falls != 0
    if bad:
        status, row = _first_bad_posting(indptr, indices, weights, vocab_size, special, w_max, d0, d1)
        if status:
            return status, row, 0
    # fp16 bits, rounded to nearest, ties to even, as numpy's astype(np.float16) (tested bit for
    # bit): fp16 subnormals and zero (below 2**-14) by exact scaling to units of 2**-24 and
    # rint; normal numbers by rebiasing the exponent and adding the rounding bias to the bits
    zeros = 0
    for p in range(m):
        u = bits[p]
        small = ws[p] if u < np.uint32(0x38800000) else np.float32(0.0)  # keeps the unused arm in range
        sub = np.uint32(np.rint(small * np.float32(16777216.0)))
        nrm = (u - np.uint32(0x38000000) + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        o = sub if u < np.uint32(0x38800000) else nrm
        packed[p] = np.uint16(o)
        zeros += o == 0
    return 0, -1, zeros


@njit(cache=True)
def build_postings(indptr, indices, wbits, n_docs, key_base, n_keys, bshift):
    """CSR (doc-major, sorted token ids, non-zero fp16 bits) -> term-major block postings.

    Returns keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w.
    """
    nnz = indptr[n_docs] - indptr[0]
    counts = np.zeros(n_keys, np.int64)
    for p in range(indptr[0], indptr[n_docs]):
        counts[indices[p]] += 1
    T = 0
    for t in range(n_keys):
        if counts[t] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.empty(T + 1, np.int64)
    pos = np.zeros(n_keys, np.int64)
    j = 0
    acc = 0
    for t in range(n_keys):
        if counts[t] > 0:
            keys[j] = key_base + t
            post_ptr[j] = acc
            pos[t] = acc
            acc += counts[t]
            j += 1
    post_ptr[T] = acc
    # two-pass radix scatter (256-key groups, then keys): a direct scatter to 30k positions
    # misses the cache on nearly every posting and is ~5x slower
    n_groups = (n_keys >> 8) + 1
    gpos = np.zeros(n_groups + 1, np.int64)
    for t in range(n_keys):
        gpos[(t >> 8) + 1] += counts[t]
    for g in range(n_groups):
        gpos[g + 1] += gpos[g]
    gstart = gpos[:-1].copy()
    tmp_doc = np.empty(nnz, np.uint32)
    tmp_key = np.empty(nnz, np.uint8)
    tmp_w = np.empty(nnz, np.uint16)
    for d in range(n_docs):
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            g = t >> 8
            q = gpos[g]
            tmp_doc[q] = d
            tmp_key[q] = t & 255
            tmp_w[q] = wbits[p]
            gpos[g] = q + 1
    post_doc = np.empty(nnz, np.uint32)
    post_w = np.empty(nnz, np.uint16)
    for g in range(n_groups):
        base = g << 8
        for q in range(gstart[g], gpos[g]):
            t = base + np.int64(tmp_key[q])
            r = pos[t]
            post_doc[r] = tmp_doc[q]
            post_w[r] = tmp_w[q]
            pos[t] = r + 1
    npairs = 0
    for j in range(T):
        last = -1
        for q in range(post_ptr[j], post_ptr[j + 1]):
            b = np.int64(post_doc[q] >> bshift)
            if b != last:
                npairs += 1
                last = b
    pair_ptr = np.empty(T + 1, np.int64)
    pair_block = np.empty(npairs, np.uint16)
    pair_cnt = np.empty(npairs, np.uint8)
    pair_max = np.empty(npairs, np.uint16)
    post_off = np.empty(nnz, np.uint8)
    mask = (1 << bshift) - 1
    k = -1
    for j in range(T):
        pair_ptr[j] = k + 1
        last = -1
        c = 0
        for q in range(post_ptr[j], post_ptr[j + 1]):
            d = np.int64(post_doc[q])
            b = d >> bshift
            post_off[q] = d & mask
            w = post_w[q]
            if b != last:
                if k >= 0 and last >= 0:
                    pair_cnt[k] = c - 1
                k += 1
                pair_block[k] = b
                pair_max[k] = w
                c = 0
                last = b
            elif w > pair_max[k]:  # positive fp16 bit patterns sort like their values
                pair_max[k] = w
            c += 1
        if last >= 0:
            pair_cnt[k] = c - 1
    pair_ptr[T] = k + 1
    return keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w


# --- threaded build ------------------------------------------------------------------------------
# The same arrays as :func:`build_postings`, built by chunks of documents on several threads.
# Chunks are runs of whole blocks, so no (term, block) pair spans two chunks: a first pass counts
# each chunk's postings and pairs per key, and their prefix sums give every (chunk, key) its final
# posting and pair positions. Each chunk is then scattered on its own (radix by 256-key group
# into a per-thread scratch buffer, then by key straight into the output, building the pairs on
# the way): no whole-input temporaries (:func:`build_postings` faults in 11 bytes of them a
# posting, which costs about as much as the work) and a scratch buffer that stays in the CPU
# caches or near. Threads take chunks as they free up, each writing its own positions. One
# thread is faster than :func:`build_postings` too.

#: most postings per chunk of a threaded build: a thread's scratch is 6 bytes a posting, reused
#: chunk after chunk; each chunk restarts every key's output run, so much smaller chunks cost
#: more (2M to 8M were alike on 200M postings)
BUILD_CHUNK_POSTINGS = 1 << 22


@njit(cache=True, nogil=True)
def _count_chunk(indptr, indices, d0, d1, bshift, cnt, pcnt, last):
    """Postings ``cnt[t]`` and (t, block) pairs ``pcnt[t]`` of each key t in docs [d0, d1)
    (added to; ``last`` is int32 scratch of one entry per key). Branch-free: a quarter of the
    postings start a pair, too many for the branch predictor."""
    last[:] = -1
    for d in range(d0, d1):
        b = np.int32(d >> bshift)
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            cnt[t] += 1
            pcnt[t] += np.int32(last[t] != b)
            last[t] = b


@njit(cache=True, nogil=True)
def _place_chunks(cnt, pcnt, key_base):
    """From the per-chunk counts of :func:`_count_chunk` (rows: chunks): keys, post_ptr, pair_ptr
    as :func:`build_postings`; the first posting and pair of each key (``key_post``,
    ``key_pair``); and ``goff[c]``, where each 256-key group starts in chunk c's scratch. ``cnt``
    and ``pcnt`` become the offset of chunk c's postings and pairs inside each key's run (no
    larger than the documents, so they fit in place)."""
    n_chunks, n_keys = cnt.shape
    n_groups = (n_keys + 255) >> 8
    goff = np.zeros((n_chunks, n_groups + 1), np.int64)
    run = np.zeros(n_keys, np.int64)
    prun = np.zeros(n_keys, np.int64)
    for c in range(n_chunks):
        for t in range(n_keys):
            n = cnt[c, t]
            goff[c, (t >> 8) + 1] += n
            cnt[c, t] = run[t]
            run[t] += n
            n = pcnt[c, t]
            pcnt[c, t] = prun[t]
            prun[t] += n
        for g in range(n_groups):
            goff[c, g + 1] += goff[c, g]
    T = 0
    for t in range(n_keys):
        if run[t] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.empty(T + 1, np.int64)
    pair_ptr = np.empty(T + 1, np.int64)
    key_post = np.zeros(n_keys, np.int64)
    key_pair = np.zeros(n_keys, np.int64)
    j = 0
    acc = 0
    pacc = 0
    for t in range(n_keys):
        if run[t] > 0:
            keys[j] = key_base + t
            post_ptr[j] = key_post[t] = acc
            pair_ptr[j] = key_pair[t] = pacc
            acc += run[t]
            pacc += prun[t]
            j += 1
    post_ptr[T] = acc
    pair_ptr[T] = pacc
    return keys, post_ptr, pair_ptr, key_post, key_pair, goff


@njit(cache=True, nogil=True, inline="always")
def _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max):
    """Write the pairs in block ``blk`` of the ``nt`` keys ``touched`` (of a 256-key group):
    each key's next pair, from its ``state`` (postings in the block << 16 | their top weight's
    fp16 bits), reset for the next block."""
    for j in range(nt):
        i = touched[j]
        k = cur[i] + 1
        cur[i] = k
        s = state[i]
        pair_block[k] = blk
        pair_cnt[k] = (s >> 16) - 1
        pair_max[k] = s & 0xFFFF
        state[i] = 0


@njit(cache=True, nogil=True)
def _scatter_chunk(indptr, indices, wbits, d0, d1, bshift, goff, chunk_post, chunk_pair, key_post, key_pair,
                   tmp_v, tmp_w, post_off, post_w, pair_block, pair_cnt, pair_max):
    """Write the postings and pairs of docs [d0, d1) (whole blocks) at their final positions
    (key t's start ``key_post[t]`` plus this chunk's offset ``chunk_post[t]``; pairs alike).
    Two radix passes through the scratch ``tmp_v`` (doc << 8 | low key byte; docs < 2**24) and
    ``tmp_w``, as a direct scatter to 30k keys would miss the cache on nearly every posting:
    by 256-key group, then by key. A group's postings come in doc order, so its pairs are
    complete at each change of block and are written then, one write per pair."""
    n_keys = chunk_post.size
    fill = goff[:-1].copy()
    for d in range(d0, d1):
        dv = np.uint32(d << 8)
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            q = fill[t >> 8]
            tmp_v[q] = dv | np.uint32(t & 255)
            tmp_w[q] = wbits[p]
            fill[t >> 8] = q + 1
    mask = (1 << bshift) - 1
    nxt = np.empty(256, np.int64)  # per key of the group: its next posting,
    cur = np.empty(256, np.int64)  # its last pair written,
    state = np.zeros(256, np.int64)  # its current pair (see _flush_pairs; one word: one load and store a posting)
    touched = np.empty(256, np.int64)  # keys seen in the current block
    for g in range(goff.size - 1):
        base = g << 8
        for i in range(min(256, n_keys - base)):
            nxt[i] = key_post[base + i] + chunk_post[base + i]
            cur[i] = key_pair[base + i] + chunk_pair[base + i] - 1
        blk = -1
        nt = 0
        for q in range(goff[g], goff[g + 1]):
            v = np.int64(tmp_v[q])
            d = v >> 8
            if d >> bshift != blk:
                _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max)
                blk = d >> bshift
                nt = 0
            i = v & 255
            w = np.int64(tmp_w[q])
            r = nxt[i]
            post_off[r] = d & mask
            post_w[r] = w
            nxt[i] = r + 1
            s = state[i]
            touched[nt] = i
            nt += s == 0  # branch-free, as in _count_chunk
            # positive fp16 bit patterns sort like their values
            state[i] = ((s >> 16) + 1) << 16 | max(s & 0xFFFF, w)
        _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max)


@njit(cache=True, nogil=True)
def _empty_outputs(n_post, n_pairs):
    """post_off, post_w, pair_block, pair_cnt, pair_max, uninitialised. From numba's allocator
    (malloc) because numpy's asks large arrays for transparent huge pages, whose first faults in
    a process can stall on memory compaction: seconds for a 200M-posting build."""
    return (np.empty(n_post, np.uint8), np.empty(n_post, np.uint16), np.empty(n_pairs, np.uint16),
            np.empty(n_pairs, np.uint8), np.empty(n_pairs, np.uint16))


def _chunk_bounds(indptr: np.ndarray, n_docs: int, bshift: int, target: int) -> np.ndarray:
    """Doc bounds of consecutive chunks of whole blocks, about ``target`` postings each."""
    starts = np.append(np.arange(0, n_docs, 1 << bshift), n_docs)  # of each block, and the end
    before = indptr[starts] - indptr[0]  # postings before each
    n_chunks = -(-int(before[-1]) // target)
    cuts = starts[np.searchsorted(before, np.arange(1, n_chunks) * target)]
    return np.unique(np.concatenate([[0], cuts, [n_docs]]).astype(np.int64))


def _for_each_chunk(n_chunks: int, threads: int, worker) -> None:
    """Call ``run(c)`` for each chunk c on up to ``threads`` threads at once, this one among them
    (the kernels release the GIL), each taking the next chunk as it frees up; ``worker()`` makes
    one thread's ``run`` (with its own scratch)."""
    lock = threading.Lock()
    todo = iter(range(n_chunks))

    def work() -> None:
        run = worker()
        while True:
            with lock:
                c = next(todo, -1)
            if c < 0:
                return
            run(c)

    threads = min(threads, n_chunks)
    if threads <= 1:
        work()
        return
    with ThreadPoolExecutor(threads - 1, thread_name_prefix="stair-es-build") as pool:
        others = [pool.submit(work) for _ in range(threads - 1)]
        work()
        for f in others:
            f.result()


def build_postings_threaded(indptr, indices, wbits, n_docs, key_base, n_keys, bshift, threads, chunk_postings=None):
    """:func:`build_postings` (byte-identical arrays) on ``threads`` threads; ``n_docs`` <= 2**24.
    ``chunk_postings``: postings per chunk (default: at least 4 chunks a thread, for balance)."""
    if n_docs > 1 << 24:
        raise ValueError(f"a threaded build takes at most {1 << 24} documents, got {n_docs}")
    if chunk_postings is None:
        chunk_postings = min(BUILD_CHUNK_POSTINGS, max(1, int(indptr[n_docs] - indptr[0]) // (4 * threads)))
    bounds = _chunk_bounds(indptr, n_docs, bshift, chunk_postings)
    n_chunks = bounds.size - 1
    cnt = np.zeros((n_chunks, n_keys), np.int32)
    pcnt = np.zeros((n_chunks, n_keys), np.int32)

    def counter():
        last = np.empty(n_keys, np.int32)
        return lambda c: _count_chunk(indptr, indices, bounds[c], bounds[c + 1], bshift, cnt[c], pcnt[c], last)

    _for_each_chunk(n_chunks, threads, counter)
    keys, post_ptr, pair_ptr, key_post, key_pair, goff = _place_chunks(cnt, pcnt, key_base)
    post_off, post_w, pair_block, pair_cnt, pair_max = _empty_outputs(post_ptr[-1], pair_ptr[-1])
    scratch = int(np.diff(indptr[bounds]).max(initial=0))

    def scatterer():
        tmp_v, tmp_w = np.empty(scratch, np.uint32), np.empty(scratch, np.uint16)
        return lambda c: _scatter_chunk(indptr, indices, wbits, bounds[c], bounds[c + 1], bshift, goff[c], cnt[c], pcnt[c],
                                        key_post, key_pair, tmp_v, tmp_w, post_off, post_w, pair_block, pair_cnt, pair_max)

    _for_each_chunk(n_chunks, threads, scatterer)
    return keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w


@njit(cache=True)
def block_subs(pair_cnt, pair_max, post_off, post_w, bshift):
    """Per (term, block) pair, the sub-block code byte of its postings (``npkernels.SUB_BLOCKS``:
    2 bits per sub-block, 0 = no posting there, else the sub-block maximum rounded up to a
    level of the block maximum). Computed from built postings (new or merged) when a segment
    is written; pairs are in posting order. ~4 ns per posting (0.8 s per million documents of
    the scale corpus), half of it saved by the shortcut for lone postings (54 % of its pairs)."""
    out = np.zeros(pair_cnt.size, np.uint8)
    _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out, 0, pair_cnt.size, 0)
    return out


@njit(cache=True, nogil=True)
def _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out, p0, p1, q0):
    """:func:`block_subs` of pairs ``p0:p1`` into ``out``; ``q0``: the first posting of pair p0."""
    smax = np.zeros(SUB_BLOCKS, np.int64)
    half = SUB_LEVELS[1]
    three_q = SUB_LEVELS[2]
    q = q0
    for p in range(p0, p1):
        c = np.int64(pair_cnt[p]) + 1
        if c == 1:  # a lone posting is its block's maximum: the top level in its sub-block
            out[p] = 3 << (2 * ((np.int64(post_off[q]) * SUB_BLOCKS) >> bshift))
            q += 1
            continue
        for y in range(SUB_BLOCKS):
            smax[y] = -1
        for qq in range(q, q + c):
            y = (np.int64(post_off[qq]) * SUB_BLOCKS) >> bshift
            smax[y] = max(smax[y], np.int64(post_w[qq]))  # positive fp16 bit patterns order like their values
        q += c
        m = F16_TABLE[pair_max[p]]
        code = 0
        for y in range(SUB_BLOCKS):
            if smax[y] >= 0:
                x = F16_TABLE[smax[y]]
                # m / 2 and 3m / 4 are exact in float32 (m has 11 significant bits): the level is exact
                code |= (1 + (x > m * half) + (x > m * three_q)) << (2 * y)
        out[p] = code


def block_subs_threaded(pair_ptr, post_ptr, pair_cnt, pair_max, post_off, post_w, bshift, threads):
    """:func:`block_subs` (the same bytes) on ``threads`` threads, in chunks of whole terms
    balanced by postings (a term's pairs and postings are contiguous)."""
    out = np.zeros(pair_cnt.size, np.uint8)
    n_keys = pair_ptr.size - 1
    targets = np.linspace(0, post_ptr[-1], 4 * threads + 1)[1:-1]
    cuts = np.unique(np.concatenate([[0], np.searchsorted(post_ptr[:-1], targets), [n_keys]]))

    def worker():
        return lambda c: _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out,
                                           pair_ptr[cuts[c]], pair_ptr[cuts[c + 1]], post_ptr[cuts[c]])

    _for_each_chunk(cuts.size - 1, threads, worker)
    return out
