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


@njit(cache=True)
def score_docs(q_j, q_w, seg, chk, docs, out):
    """Exact scores of local docs ``docs`` (ascending, distinct) into ``out``: per doc, the
    weights of the query terms ``q_j`` (query order) times ``q_w`` summed in that order in
    float32, as :func:`.blockmax._canonical_score` sums a hit's. Each term's (block, count)
    pairs are walked once for all the docs; a run not verified yet is left out of the sums (see
    the module's notes). Returns -1."""
    post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, f16 = (
        seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.post_w, seg.f16)
    bshift = seg.bshift
    mask = (np.int64(1) << bshift) - 1
    for y in range(docs.size):
        out[y] = np.float32(0.0)
    for i in range(q_j.size):
        j = q_j[i]
        p = pair_ptr[j]
        e = pair_ptr[j + 1]
        q = post_ptr[j]
        for y in range(docs.size):
            b = docs[y] >> bshift
            # the first pair at or after block b: binary search from p, the skipped postings summed
            lo = p
            hi = e
            while lo < hi:
                mid = (lo + hi) >> 1
                if np.int64(pair_block[mid]) < b:
                    lo = mid + 1
                else:
                    hi = mid
            q += _count_sum(pair_cnt, p, lo)
            p = lo
            if p >= e:
                break
            if np.int64(pair_block[p]) != b:
                continue
            c = np.int64(pair_cnt[p]) + 1
            if not run_verified(chk, q, c):
                continue
            w = _find_weight(post_off, post_w, f16, q, c, docs[y] & mask)
            if w > 0:
                out[y] += q_w[i] * w
    return -1
