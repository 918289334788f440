"""Numba kernels of the embedded engine, one job a module (numpy twins of the same names in
:mod:`..npkernels`). This package must not know about files, schemas or ids.

Posting layout of one segment (all fields in one structure, term key = field * V + token):

* documents are cut into fixed *blocks* of ``2**bshift`` (<= 256) consecutive local doc ids;
* per term key: its postings in doc order, split into (term, block) *pairs*; a pair stores
  the block number (uint16), the posting count - 1 (uint8) and the maximum weight in the
  block (float16 bits); since segment format 2 also one byte of sub-block bounds
  (:func:`.build.block_subs`, an empty array for older segments);
* a posting is the doc offset inside its block (uint8) and the weight (float16 bits).

A search kernel takes the segment's arrays as one :class:`..layout.SegmentArrays` and merges
its hits into one :class:`..layout.TopK` heap. Search is exact: block-max ranking with MaxScore
inside blocks (:mod:`.blockmax`) or term-at-a-time (:mod:`.taat`), chosen per call
(:mod:`.search`); every pruning decision compares an upper bound with the current k-th score,
so results are those of a full scan.

Modules:

* ``simd``: LLVM intrinsics (prefetch, a 4-lane multiply-add);
* ``verify``: CRC-32 chunk verification in compiled code, registered with :mod:`..checksum`;
* ``ids``: id hashing and packed strings;
* ``build``: input checks, postings build (one thread or several), sub-block codes;
* ``postings``: merge, postings to CSR, one doc's row, term documents and frequencies;
* ``heap``: the top-k heap;
* ``taat``, ``blockmax``: the two exact search algorithms;
* ``search``: the entry point and the strategy cost model;
* ``multi``: every segment of one search in one call (one heap, its threshold carried along);
* ``_cache``: numba's on-disk cache stamped with all of the package's sources at once.
"""

from __future__ import annotations

from . import _cache

_cache.install()  # before any kernel is defined: one freshness stamp for the whole package

from ..layout import (F16_TABLE, STRATEGY_AUTO, STRATEGY_BLOCKMAX, STRATEGY_NAMES, STRATEGY_TAAT,  # noqa: E402, F401
                      SUB_BLOCKS, SUB_FRACTIONS, SUB_LEVELS, SearchOptions, SegmentArrays, TopK)
from .blockmax import GATHER_MAX, LOOKUP_COST  # noqa: E402, F401
from .build import (BUILD_CHUNK_POSTINGS, block_subs, block_subs_threaded, build_postings,  # noqa: E402, F401
                    build_postings_threaded, check_pack_csr)
from .ids import fnv1a64, gather_strings, same_strings  # noqa: E402, F401
from .postings import (doc_rows, merge_counts, merge_postings, merge_range, postings_to_csr, term_docs,  # noqa: E402, F401
                       term_freqs)
from .search import choose_strategy, search_segment  # noqa: E402, F401
from .multi import DAMAGED as MULTI_DAMAGED, DONE as MULTI_DONE, NO_TERMS as MULTI_NO_TERMS  # noqa: E402, F401
from .multi import OUT_COLUMNS as MULTI_OUT_COLUMNS, WANTS_NUMPY as MULTI_WANTS_NUMPY  # noqa: E402, F401
from .multi import search_segments  # noqa: E402, F401
from .verify import (EAGER_CHUNKS, HAVE_CRC32, check_run, chunk_crcs, prepare_terms, verify_docs,  # noqa: E402, F401
                     verify_ranges, verify_rows)
