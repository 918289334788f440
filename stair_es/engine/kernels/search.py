"""The entry point of a segment search: the strategy per call (a cost model), then block-max
(:mod:`.blockmax`) or TAAT (:mod:`.taat`), each tested against the exhaustive ranking."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..layout import (CHOSEN_COST_MODEL, CHOSEN_EMPTY, CHOSEN_FORCED, CHOSEN_RULE, PLAN, STRATEGY_AUTO, STRATEGY_BLOCKMAX,
                      STRATEGY_TAAT, SearchOptions, SegmentArrays, TopK)
from .blockmax import _blockmax_segment
from .taat import TAAT_WINDOW_DOCS, _taat_segment


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

    ``scratch``: float32 zeros, at least :data:`.taat.TAAT_WINDOW_DOCS` long, that TAAT uses as
    its accumulator window and leaves all zeros (reuse it across calls), or None (TAAT allocates
    one).

    ``chk``: see :func:`.verify.check_run`. With it, the kernel verifies each postings run the
    first time it reads it (the block tables ``pair_*`` of the query terms must be verified by
    the caller); a run failing its checksum stops the search with ``top.state[7]`` = the bad
    chunk (-1 on entry), so no damaged byte ever reaches a score.

    ``seg``, ``top`` and ``opts`` may be plain tuples of the same fields (all of them: numba
    fills no defaults): numba types a plain tuple from Python in a third of the time of a named
    one (~5 us less per call), and they are named again here.
    """
    seg, top, opts = SegmentArrays(*seg), TopK(*top), SearchOptions(*opts)
    s = opts.strategy
    if s == STRATEGY_AUTO:
        s = choose_strategy(q_j, seg, top, opts)
    else:  # the plan says so (``top.state[PLAN:]``: what ran and why, for explain and profiles)
        P, pairs = _query_counts(q_j, seg)
        _set_plan(top.state, s, CHOSEN_FORCED, P, pairs, -1, -1, -1, -1)
    if s == STRATEGY_TAAT:
        need = max(TAAT_WINDOW_DOCS, 1 << seg.bshift)
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


#: the cost model's nanoseconds: TAAT per posting of the query terms and per document of the
#: segment (the windows' count and zeroing passes); block-max per (term, block) pair of the query
#: terms (its set-up pass: bounds and visit order), per block scored and per posting streamed.
#: Refitted 2026-11-27 after TAAT's F16C and 8-lane adds (AMD EPYC, one thread; non-negative least
#: squares of relative errors, each corpus weighted alike, over (query, segment) pairs with both
#: kernels timed on the same incoming heap: 150 queries of the 100k Zipf corpus, 60 of the 1M
#: Zipf one, 40 of the 10M idf scale corpus x 10 segments). The constants before (1.0, 0.2, 25,
#: 410, 2.8) sent 15 % of the 10M segment searches to TAAT where block-max was faster (+31 %
#: kernel time there); these pick the faster kernel in 100 % / 96.7 % / 98.5 % of those pairs
#: (kernel time x1.000 / x1.008 / x1.005 of always the faster one)
TAAT_NS_POSTING = 0.53
TAAT_NS_DOC = 0.54
BM_NS_PAIR = 2.2
BM_NS_BLOCK = 305.0
BM_NS_STREAMED = 2.0


@njit(cache=True, inline="always")
def _query_counts(q_j, seg):
    """The postings of the query terms and their (term, block) pairs, from the pointers."""
    P = 0
    pairs = 0
    for i in range(q_j.size):
        P += seg.post_ptr[q_j[i] + 1] - seg.post_ptr[q_j[i]]
        pairs += seg.pair_ptr[q_j[i] + 1] - seg.pair_ptr[q_j[i]]
    return P, pairs


@njit(cache=True, inline="always")
def _set_plan(state, strategy, chosen, P, pairs, taat, bm, blocks, streamed):
    """The plan slots of ``state`` (see :data:`..layout.PLAN_FIELDS`; a caller's older 8-slot
    state has none)."""
    if state.size < PLAN + 8:
        return strategy
    state[PLAN] = strategy
    state[PLAN + 1] = chosen
    state[PLAN + 2] = P
    state[PLAN + 3] = pairs
    state[PLAN + 4] = np.int64(taat)
    state[PLAN + 5] = np.int64(bm)
    state[PLAN + 6] = np.int64(blocks)
    state[PLAN + 7] = np.int64(streamed)
    return strategy


@njit(cache=True)
def choose_strategy(q_j, seg, top, opts):
    """The cheaper exact strategy for this query on this segment, from a cost model in
    nanoseconds (the constants above).

    TAAT costs ``TAAT_NS_POSTING`` x the postings P of the query terms + ``TAAT_NS_DOC`` x the
    documents. Block-max costs its set-up pass (``BM_NS_PAIR`` x the query terms' (term, block)
    pairs, counted from their pointers) plus the blocks it scores and the postings it streams,
    which depend on how well the bounds prune: the weights decide that, not the counts. When
    ``opts`` carries what block-max did on this segment's recent queries (``streamed_share`` of
    P streamed, ``scored_share`` of the blocks scored; the searcher keeps them, see
    ``Searcher._auto_options``), those shares predict it for this query. Without them (-1: a
    segment's first queries) block-max is kept unless rescoring its heap's entries in query-term
    order (~50 ns per query term; about k (1 + ln(n / k)) hits enter a heap of k over n
    documents in scan order, fewer when earlier segments filled it already) would cost more than
    half of a TAAT pass: it wins by far whenever the weights let its bounds prune.

    The choice and its estimates are written to ``top.state[PLAN:]`` (:data:`..layout.PLAN_FIELDS`):
    a few stores, so explain and profiles show them at no extra pass."""
    seg, top, opts = SegmentArrays(*seg), TopK(*top), SearchOptions(*opts)
    n_docs, k, state = seg.n_docs, top.scores.size, top.state
    P, pairs = _query_counts(q_j, seg)
    if P == 0 or n_docs == 0:
        return _set_plan(state, STRATEGY_BLOCKMAX, CHOSEN_EMPTY, P, pairs, 0, 0, 0, 0)
    taat = TAAT_NS_POSTING * P + TAAT_NS_DOC * n_docs
    if opts.streamed_share >= 0:
        n_blocks = (n_docs + (1 << seg.bshift) - 1) >> seg.bshift
        blocks = opts.scored_share * n_blocks
        streamed = opts.streamed_share * P
        bm = BM_NS_PAIR * pairs + BM_NS_BLOCK * blocks + BM_NS_STREAMED * streamed
        return _set_plan(state, STRATEGY_TAAT if taat < bm else STRATEGY_BLOCKMAX, CHOSEN_COST_MODEL, P, pairs,
                         taat, bm, blocks, streamed)
    kk = float(max(k, 1))
    if state[0] >= k:  # the heap is full already: only docs beating earlier segments' hits enter
        seen = float(max(state[1], k))
        pushes = kk * np.log1p(n_docs / seen)
    else:
        pushes = kk * (1.0 + np.log(max(n_docs / kk, 1.0)))
    pushes = min(pushes, float(n_docs), float(P))
    rescoring = pushes * q_j.size * 50.0
    return _set_plan(state, STRATEGY_TAAT if rescoring > 0.5 * taat else STRATEGY_BLOCKMAX, CHOSEN_RULE, P, pairs,
                     taat, rescoring, -1, -1)
