"""Constants of the postings layout shared by the numba kernels (:mod:`.kernels`) and their
numpy twins (:mod:`.npkernels`): the float16 decoding table, the sub-block bounds of segment
format 2 and the exact search strategies. A leaf: it imports numpy only, so both kernel modules
read it without importing each other.
"""

from __future__ import annotations

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
