"""The entry point of a segment search: the strategy per call (a cost model), then block-max
(:mod:`.blockmax`) or TAAT (:mod:`.taat`), each tested against the exhaustive ranking."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import STRATEGY_AUTO, STRATEGY_BLOCKMAX, STRATEGY_TAAT, SearchOptions, SegmentArrays, TopK
from .blockmax import _blockmax_segment
from .taat import _taat_segment


@njit(cache=True, nogil=True)
def search_segment(q_j, q_w, seg, allowed, ref_base, top, opts, scratch, chk):
    """Exact top-k over one segment (``seg``: a :class:`..layout.SegmentArrays`), merged into
    the heap ``top`` (a :class:`..layout.TopK` shared by the segments of one search; k is its
    size). Returns the strategy used.

    ``q_j``: term index of each query term in this segment (present terms only); ``q_w``:
    float32 query weights (clause weight applied). ``allowed``: uint8 per doc (filter and not
    deleted) or empty for "all"; ``ref_base``: added to a local doc number for the heap's refs.

    ``opts`` (a :class:`..layout.SearchOptions`): ``strategy`` :data:`STRATEGY_AUTO` (0) picks
    one per call with :func:`choose_strategy`; :data:`STRATEGY_BLOCKMAX` (1) forces
    :func:`.blockmax._blockmax_segment`; :data:`STRATEGY_TAAT` (2) forces
    :func:`.taat._taat_segment`. Every strategy returns the same hits with bit-identical scores
    (summed in query-term order, like ``explain``). Block-max searches only blocks
    [``block_lo``, ``block_hi``) (-1: to the end), so that one query can run on several threads
    over parts of a segment, each with its own heap; TAAT ignores them (the caller splits only
    block-max work).

    ``scratch``: float32 zeros, at least ``n_docs`` long, that TAAT uses as its accumulator and
    leaves all zeros (reuse it across calls), or None (TAAT allocates one).

    ``chk``: see :func:`.verify.check_run`. With it, the kernel verifies each postings run the
    first time it reads it (the block tables ``pair_*`` of the query terms must be verified by
    the caller); a run failing its checksum stops the search with ``top.state[7]`` = the bad
    chunk (-1 on entry), so no damaged byte ever reaches a score.

    ``seg``, ``top`` and ``opts`` may be plain tuples of the same fields: numba types a plain
    tuple from Python in a third of the time of a named one (~5 us less per call), and they
    are named again here.
    """
    seg, top, opts = SegmentArrays(*seg), TopK(*top), SearchOptions(*opts)
    s = opts.strategy
    if s == STRATEGY_AUTO:
        s = choose_strategy(q_j, seg, top)
    if s == STRATEGY_TAAT:
        need = seg.n_docs
        if scratch is None:
            acc = np.zeros(need, np.float32)
        else:
            acc = scratch
            if acc.size < need:
                acc = np.zeros(need, np.float32)
        _taat_segment(q_j, q_w, seg, allowed, ref_base, top, acc, chk)
        return STRATEGY_TAAT
    _blockmax_segment(q_j, q_w, seg, allowed, ref_base, top, opts, chk)
    return STRATEGY_BLOCKMAX


@njit(cache=True)
def choose_strategy(q_j, seg, top):
    """The cheaper exact strategy for this query on this segment: a cost model in nanoseconds,
    calibrated on 20k-1M document segments (docs/engine.md).

    TAAT reads every posting of the query terms (~1.4 ns each) and scans the documents hit
    (~0.5 ns each). Block-max reads at most as many postings, usually far fewer, but every hit
    that enters its top-k heap is rescored in query-term order (~50 ns per query term); about
    k (1 + ln(n / k)) hits enter a heap of k over n documents in scan order, fewer when earlier
    segments filled it already. Block-max is kept unless that rescoring alone would cost more
    than half of a TAAT pass: it wins by far whenever the weights let its bounds prune, which
    the model cannot see in advance. In practice TAAT is chosen for large k."""
    seg, top = SegmentArrays(*seg), TopK(*top)
    post_ptr, n_docs, k, state = seg.post_ptr, seg.n_docs, top.scores.size, top.state
    P = 0
    for i in range(q_j.size):
        P += post_ptr[q_j[i] + 1] - post_ptr[q_j[i]]
    if P == 0 or n_docs == 0:
        return STRATEGY_BLOCKMAX
    kk = float(max(k, 1))
    if state[0] >= k:  # the heap is full already: only docs beating earlier segments' hits enter
        seen = float(max(state[1], k))
        pushes = kk * np.log1p(n_docs / seen)
    else:
        pushes = kk * (1.0 + np.log(max(n_docs / kk, 1.0)))
    pushes = min(pushes, float(n_docs), float(P))
    rescoring = pushes * q_j.size * 50.0
    taat = 1.4 * P + 0.5 * n_docs
    if rescoring > 0.5 * taat:
        return STRATEGY_TAAT
    return STRATEGY_BLOCKMAX
