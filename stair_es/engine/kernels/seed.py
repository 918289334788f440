"""A safe starting threshold for a search: a lower bound of its k-th best score, found before
any segment is swept, so that block-max prunes from its first block.

Any k real documents that the query may return (allowed by its filter, not deleted) bound the
k-th best score from below by the k-th best of their exact scores. The candidates are the
documents of the heaviest postings of the query's heaviest terms (the ``n_post`` (term, block)
pairs of highest block maximum over all segments, for each of the ``n_terms`` query terms of
highest query weight x maximum weight): a document with a heavy posting of a heavy term is
likely among the top k (on the scale benchmark's 10M idf queries, the 10th best of ~40 such
documents is ~98 % of the final 10th best score, docs/scale.md). Each candidate's score is
summed exactly as the search kernels sum a hit's (:func:`.blockmax._canonical_score`: query-term
order, float32), so the bound is a score the search itself would reach.

The caller puts the bound into the heap as k *placeholders*: entries with that score, the
highest sequence number and ref -1. A placeholder ranks below every real document of the same
score (ties go to the lower sequence number), so the k candidates, whose scores are at least
the bound, push every placeholder out: the hits, their order and their scores are those of a
search without it (``tests/engine/test_seed.py``). Nothing here changes a kernel's pruning
rule: they compare bounds with the heap's k-th score as before, it is only higher sooner.

Block tables are verified before they are read (as the search verifies them); a damaged one
ends the seed with no bound, and the search proper then finds and reports it. A postings run is
read only once its chunks are verified (by an earlier search, or the reader's background
verification): a candidate in an unverified run is left out, a term whose run is unverified is
left out of a candidate's sum. A sum over some of the query terms, in query-term order, is at
most the full sum (the weights are >= 0 and float32 addition is monotone), so the bound stays a
lower bound, and a first query pays no checksums for runs its search may never read.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.extending import overload

from .blockmax import _find_weight
from .simd import _prefetch

#: placeholders' sequence number: higher than any document's, so they lose every tie
PLACEHOLDER_SEQ = np.uint64(0xFFFFFFFFFFFFFFFF)


def run_verified(chk, q0, cnt):
    """Whether the chunks holding postings [q0, q0 + cnt) are verified already (``chk``: see
    :func:`.verify.check_run`; None: nothing to verify). Compiled only."""
    raise NotImplementedError  # pragma: no cover


@overload(run_verified)
def _run_verified_impl(chk, q0, cnt):
    if isinstance(chk, types.NoneType):
        return lambda chk, q0, cnt: True

    def impl(chk, q0, cnt):
        if cnt <= 0:
            return True
        ok, shift, off_po, off_pw = chk[2], chk[3], chk[5], chk[6]
        a = off_po + q0
        for c in range(a >> shift, ((a + cnt - 1) >> shift) + 1):
            if not ok[c]:
                return False
        a = off_pw + 2 * q0
        for c in range(a >> shift, ((a + 2 * cnt - 1) >> shift) + 1):
            if not ok[c]:
                return False
        return True

    return impl


@njit(cache=True)
def _max_bits(pair_max, lo, hi):
    """The highest stored float16 bits in ``pair_max[lo:hi]`` (positive float16 values order
    like their bits), 0 when empty."""
    m = np.uint16(0)
    for v in pair_max[lo:hi]:  # (a slice's items: vectorized; indexing by a signed range is not, 12x slower)
        m = max(m, v)
    return m


@njit(cache=True)
def _count_sum(pair_cnt, lo, hi):
    """Postings of pairs [lo, hi): their counts - 1 summed, plus one each."""
    s = np.uint64(0)
    for v in pair_cnt[lo:hi]:  # (a slice's items: vectorized; indexing by a signed range is not, 20x slower)
        s += np.uint64(v)
    return np.int64(s) + (hi - lo)


@njit(cache=True)
def _lowest(bits):
    """(the smallest of ``bits``, its first position)."""
    lowest = bits[0]
    at = 0
    for y in range(1, bits.size):
        if bits[y] < lowest:
            lowest = bits[y]
            at = y
    return lowest, at


@njit(cache=True)
def top_pairs(pair_max, lo, hi, seg_no, bits, segs, pairs, n):
    """Merge the pairs [lo, hi) of one term in segment ``seg_no`` into the ``bits.size`` pairs of
    highest block maximum kept so far (``bits``, ``segs``, ``pairs``, the first ``n`` filled);
    returns the new ``n``."""
    cap = bits.size
    lowest = np.uint16(0)
    at = 0
    if n == cap:
        lowest, at = _lowest(bits)
    for p in range(lo, hi):
        v = pair_max[p]
        if n < cap:
            bits[n], segs[n], pairs[n] = v, seg_no, p
            n += 1
            if n == cap:
                lowest, at = _lowest(bits)
        elif v > lowest:
            bits[at], segs[at], pairs[at] = v, seg_no, p
            lowest, at = _lowest(bits)
    return n


@njit(cache=True)
def heaviest_docs(j, sel, seg, chk, docs):
    """The local doc of the heaviest posting of each pair in ``sel`` (ascending pair numbers of
    term j in segment ``seg``) into ``docs`` (-1: none found, or its run not verified yet).
    Returns -1."""
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.pair_max, seg.post_off, seg.post_w)
    p = pair_ptr[j]
    q = post_ptr[j]
    for y in range(sel.size):
        t = sel[y]
        q += _count_sum(pair_cnt, p, t)
        p = t
        c = np.int64(pair_cnt[t]) + 1
        docs[y] = -1
        if not run_verified(chk, q, c):
            continue
        for r in range(q, q + c):
            if post_w[r] == pair_max[t]:
                docs[y] = (np.int64(pair_block[t]) << seg.bshift) | np.int64(post_off[r])
                break
    return -1


@njit(cache=True, inline="always")
def _first_pair_at(pair_block, lo, hi, b, n_blocks):
    """The first pair of [lo, hi) whose block is >= b (``hi``: none), one term's pairs (blocks
    ascending, below ``n_blocks``). Interpolation first: the pair at the position b would have if
    the term's remaining pairs were spread evenly over the blocks from ``pair_block[lo]`` to the
    last, then a gallop from there and a binary search inside the bracket. The query terms of a
    large segment are mostly in a large share of its blocks, so the guess lands within a few pairs
    of the answer: one or two cache lines of ``pair_block`` read, where a binary search over
    thousands of pairs read a dozen, each a likely miss (the seed's lookups read cold tables:
    ~650 ns a (term, document) before this, docs/scale.md)."""
    if lo >= hi:
        return hi
    b0 = np.int64(pair_block[lo])
    if b0 >= b:
        return lo
    # pair_block[lo] < b <= n_blocks - 1, so the divisor is positive
    g = lo + ((b - b0) * (hi - lo)) // max(n_blocks - b0, 1)
    g = min(max(g, lo + 1), hi - 1)
    if g <= lo:
        return hi  # (hi == lo + 1: the one pair is below b)
    if np.int64(pair_block[g]) < b:
        a = g  # pair_block[a] < b; gallop forward for the first at or after b
        step = 1
        z = g + 1
        while z < hi and np.int64(pair_block[z]) < b:
            a = z
            step <<= 1
            z = g + step
        z = min(z, hi)
    else:
        z = g  # pair_block[z] >= b; gallop back for one below b
        step = 1
        a = g - 1
        while a > lo and np.int64(pair_block[a]) >= b:
            z = a
            step <<= 1
            a = max(g - step, lo)
    while z - a > 1:  # pair_block[a] < b; z == hi or pair_block[z] >= b
        mid = (a + z) >> 1
        if np.int64(pair_block[mid]) < b:
            a = mid
        else:
            z = mid
    return z


@njit(cache=True)
def score_docs(q_j, q_w, seg, chk, docs, out):
    """Exact scores of local docs ``docs`` (ascending, distinct) into ``out``: per doc, the
    weights of the query terms ``q_j`` (query order) times ``q_w`` summed in that order in
    float32, as :func:`.blockmax._canonical_score` sums a hit's. A run not verified yet is left
    out of the sums (see the module's notes). Returns -1.

    Two passes: the first finds each (term, doc)'s run (:func:`_first_pair_at` from the last pair
    found, the postings before it counted) and asks for its first lines of offsets and weights at
    once; the second reads the weights. Every table read here is cold (a few documents of each
    term in each segment), so the misses are what costs: the next term's first guesses are
    requested while this term is searched, and the runs' lines all come in while the searches go
    on, instead of one miss after the other."""
    post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, f16 = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.post_w, seg.f16)
    bshift = seg.bshift
    mask = (np.int64(1) << bshift) - 1
    n_blocks = (seg.n_docs + mask) >> bshift
    nq = q_j.size
    nd = docs.size
    runs = np.full((nq, nd), -1, np.int64)  # per (term, doc): posting start << 9 | count, -1: none
    for y in range(nd):
        out[y] = np.float32(0.0)
    for i in range(nq):
        if i + 1 < nq:  # where _first_pair_at will look first for the next term (a term from block 0)
            a = pair_ptr[q_j[i + 1]]
            n = pair_ptr[q_j[i + 1] + 1] - a
            if n > 0:
                for y in range(nd):
                    _prefetch(pair_block, a + min(((docs[y] >> bshift) * n) // n_blocks, n - 1))
        j = q_j[i]
        p = pair_ptr[j]  # the posting start of pair p is q
        e = pair_ptr[j + 1]
        q = post_ptr[j]
        for y in range(nd):
            b = docs[y] >> bshift
            lo = _first_pair_at(pair_block, p, e, b, n_blocks)
            if lo >= e:
                break
            if np.int64(pair_block[lo]) != b:
                continue
            # the run's first posting: the skipped pairs' postings counted from p forward, or from
            # the term's end backward when that is nearer (fewer counts read)
            if lo - p <= e - lo:
                q += _count_sum(pair_cnt, p, lo)
            else:
                q = post_ptr[j + 1] - _count_sum(pair_cnt, lo, e)
            p = lo
            c = np.int64(pair_cnt[p]) + 1
            if not run_verified(chk, q, c):
                continue
            runs[i, y] = (q << 9) | c
            _prefetch(post_off, q)
            _prefetch(post_w, q)
    for i in range(nq):  # query order: the canonical sums
        for y in range(nd):
            sl = runs[i, y]
            if sl >= 0:
                w = _find_weight(post_off, post_w, f16, sl >> 9, sl & 511, docs[y] & mask)
                if w > 0:
                    out[y] += q_w[i] * w
    return -1
