"""Constants of the postings layout shared by the numba kernels (:mod:`.kernels`) and their
numpy twins (:mod:`.npkernels`): the float16 decoding table, the sub-block bounds of segment
format 2, the exact search strategies, and the two tuples the search kernels take (a segment's
arrays, the top-k heap). A leaf: it imports numpy only, so both kernel packages read it without
importing each other.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
F16_TABLE[~np.isfinite(F16_TABLE)] = 0.0
F16_TABLE.flags.writeable = False

# Sub-block bounds (segment format 2). Each block is cut into SUB_BLOCKS sub-blocks of equal size
# (64 documents in a 256-document block; a document at block offset o is in sub-block
# (o * SUB_BLOCKS) >> bshift). Per (term, block) pair one byte holds a 2-bit code per sub-block
# (bits 2s, 2s + 1): 0 = no posting of the term there, else the smallest of SUB_LEVELS[1:] (times
# the block maximum) that is at least the term's maximum in the sub-block, i.e. rounded up, so
# every bound stays an upper bound. With the scale benchmark's idf queries a (term, block) pair
# usually holds one to three postings of a rare heavy term, so most of its sub-blocks hold none:
# a sub-block's bound is far below its block's, and block-max opens 2.4x fewer blocks at 10M
# documents (docs/scale.md, "Sub-block bounds"). 1/2 and 3/4 were the best two middle levels
# measured (docs/engine.md, "Postings and precision"); 4 sub-blocks of 2 bits keep the cost at
# one byte per pair (~0.28 bytes per posting).
SUB_BLOCKS = 4
SUB_LEVELS = np.array([0.0, 0.5, 0.75, 1.0], np.float32)
# per code byte: the level of each sub-block (float32, for the kernels' bound pass)
SUB_FRACTIONS = SUB_LEVELS[(np.arange(256)[:, None] >> (2 * np.arange(SUB_BLOCKS))[None, :]) & 3].astype(np.float32)
SUB_FRACTIONS.flags.writeable = False

STRATEGY_AUTO = 0
STRATEGY_BLOCKMAX = 1
STRATEGY_TAAT = 2
STRATEGY_NUMPY = 3
STRATEGY_NAMES = ("auto", "blockmax", "taat", "numpy")

#: how a segment's strategy was chosen (``TopK.state[PLAN + 1]``): forced by the caller; ``auto``'s
#: cost model fed with block-max's record on the segment; ``auto`` with no record yet, by the
#: heap-rescoring rule (block-max kept, or TAAT); the query terms have no postings here
CHOSEN_FORCED = 0
CHOSEN_COST_MODEL = 1
CHOSEN_RULE = 2
CHOSEN_EMPTY = 3
#: (set by the searcher, not the kernels) ``auto`` re-running block-max to renew its record; ``auto``
#: giving small work to the numpy twin
CHOSEN_RENEW = 4
CHOSEN_NUMPY = 5
#: where the plan starts in ``TopK.state``, its slots, and what each holds (int64; estimates in
#: nanoseconds, -1 where not computed): the strategy run, how it was chosen (``CHOSEN_*``), the
#: postings of the query terms, their (term, block) pairs, the TAAT estimate, the block-max
#: estimate (with the cost model: set-up + blocks + postings; by the rule: the heap rescoring
#: cost it compares with half the TAAT estimate), block-max's predicted blocks scored and
#: postings streamed (from its record)
PLAN = 8
PLAN_FIELDS = ("strategy", "chosen", "postings", "pairs", "taat_ns", "blockmax_ns", "blocks_scored", "postings_streamed")
PLAN_SLOTS = len(PLAN_FIELDS)

#: documents per window of the TAAT kernel: 4,096 float32 sums = 16 KiB, half of a 32 KiB L1
#: data cache (the postings stream past it); a caller's accumulator is at least this long.
#: 4,096 and 16,384 ran alike on the 100k Zipf corpus (2026-11-27, AMD EPYC)
TAAT_WINDOW_DOCS = 4096


class SegmentArrays(NamedTuple):
    """What a search kernel reads of one segment (numba takes it as one named tuple: attribute
    access in compiled code, one argument instead of a dozen). The layout of the postings is
    described in :mod:`.kernels`; ``pair_sub`` is empty for a segment without sub-block codes
    (format 1); ``f16`` decodes the stored float16 bits (:data:`F16_TABLE`)."""

    n_docs: int
    bshift: int
    post_ptr: np.ndarray  # int64, per term: its first posting (and the end)
    pair_ptr: np.ndarray  # int64, per term: its first (block, count) pair (and the end)
    pair_block: np.ndarray  # uint16, per pair: the block
    pair_cnt: np.ndarray  # uint8, per pair: postings in the block - 1
    pair_max: np.ndarray  # uint16, per pair: the block maximum's float16 bits
    pair_sub: np.ndarray  # uint8, per pair: the sub-block code (empty: none)
    post_off: np.ndarray  # uint8, per posting: the doc's offset in its block
    post_w: np.ndarray  # uint16, per posting: the weight's float16 bits
    seq: np.ndarray  # uint64, per doc: its sequence number (ties go to the lower)
    f16: np.ndarray  # float32[65536]: float16 bits -> value


class TopK(NamedTuple):
    """The top-k heap a search kernel merges its hits into (root = the worst kept hit: lowest
    score, then highest sequence number), shared by the segments of one search.

    ``state`` = [heap size, matched docs, 1 if matched is exact, blocks scored, candidate blocks,
    postings streamed, lookups, first damaged chunk or -1], then the *plan* of the last segment
    searched (:data:`PLAN_SLOTS`, written by ``kernels.search.search_segment``, overwritten by each
    segment): which strategy ran and why, with the cost model's estimates (see :data:`PLAN_FIELDS`)."""

    scores: np.ndarray  # float32[k]
    seqs: np.ndarray  # uint64[k]
    refs: np.ndarray  # int64[k]: segment << 32 | local doc
    state: np.ndarray  # int64[8]

    @classmethod
    def empty(cls, k: int) -> "TopK":
        state = np.zeros(8 + PLAN_SLOTS, np.int64)
        state[2], state[7] = 1, -1
        return cls(np.zeros(k, np.float32), np.zeros(k, np.uint64), np.zeros(k, np.int64), state)


class SearchOptions(NamedTuple):
    """How a search kernel searches one segment: the strategy (``STRATEGY_*``), the head size of
    block-max's visit order, the block range [block_lo, block_hi) (-1: to the end) that
    block-max searches (one query split over threads by block ranges), and for ``auto``'s cost
    model what block-max did on this segment's recent queries: the share of the query terms'
    postings it streamed and of the blocks it scored (-1: not known)."""

    strategy: int = 0
    head_blocks: int = 64
    block_lo: int = 0
    block_hi: int = -1
    streamed_share: float = -1.0
    scored_share: float = -1.0
