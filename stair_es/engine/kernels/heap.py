"""The top-k heap of a search (root = worst kept hit: lowest score, then highest sequence
number, so ties go to the older document). A :class:`..layout.TopK` holds its arrays."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _worse(s1, q1, s2, q2):
    return s1 < s2 or (s1 == s2 and q1 > q2)


@njit(cache=True)
def _sift_down(hs, hq, hr, n, i):
    while True:
        l = 2 * i + 1
        if l >= n:
            return
        m = l
        r = l + 1
        if r < n and _worse(hs[r], hq[r], hs[l], hq[l]):
            m = r
        if _worse(hs[m], hq[m], hs[i], hq[i]):
            hs[i], hs[m] = hs[m], hs[i]
            hq[i], hq[m] = hq[m], hq[i]
            hr[i], hr[m] = hr[m], hr[i]
            i = m
        else:
            return


@njit(cache=True)
def push(top, s, sq, ref):
    """Offer hit (score ``s``, sequence number ``sq``, ref) to the heap ``top`` (a
    :class:`..layout.TopK`): kept while it holds fewer than k hits or when it beats the root."""
    hs, hq, hr, state = top.scores, top.seqs, top.refs, top.state
    k = hs.size
    n = state[0]
    if n < k:
        i = n
        hs[i] = s
        hq[i] = sq
        hr[i] = ref
        while i > 0:
            par = (i - 1) >> 1
            if _worse(hs[i], hq[i], hs[par], hq[par]):
                hs[i], hs[par] = hs[par], hs[i]
                hq[i], hq[par] = hq[par], hq[i]
                hr[i], hr[par] = hr[par], hr[i]
                i = par
            else:
                break
        state[0] = n + 1
    elif _worse(hs[0], hq[0], s, sq):
        hs[0] = s
        hq[0] = sq
        hr[0] = ref
        _sift_down(hs, hq, hr, n, 0)


@njit(cache=True, inline="always")
def threshold(top):
    """(heap full, its k-th score: the score a new hit must beat; 0 while not full)."""
    full = top.state[0] >= top.scores.size
    return full, top.scores[0] if full else np.float32(0.0)
