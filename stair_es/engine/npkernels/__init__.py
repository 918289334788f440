"""Pure-numpy twins of the numba kernels (:mod:`..kernels`), for work too small to be worth starting numba.

numba costs a new process about 0.15 s to import and 0.4-0.5 s more for its first kernel
call (loading the cached machine code, initialising its CPU target): more than a whole
search of a small index takes. Searching a segment whose query terms have at most
:data:`NUMPY_MAX_POSTINGS` postings, looking ids up, reading a token filter and counting
document frequencies of small segments therefore run here, in numpy, and the numba module
(:mod:`..kernels`) is imported only when a larger segment needs it (:data:`K` is that lazy
handle).

Results are identical to the numba kernels, bit for bit: a document's score is the float32
sum of ``query weight x stored weight`` in query-term order (``np.add.at`` adds in index
order, never pairwise), ties go to the older document. The layout of the arrays is described
in :mod:`..kernels`. This package must not import numba, nor know about files or schemas.

Its modules follow the numba package's split: ``ids`` (hashing, packed strings), ``build``
(input checks, postings build, sub-block codes), ``postings`` (walking built postings) and
``search`` (exact top-k of a segment, term at a time); this module holds the thresholds that
choose between the two and :data:`K`, the lazy handle on the numba package.
"""

from __future__ import annotations

from ..layout import (F16_TABLE, STRATEGY_AUTO, STRATEGY_BLOCKMAX, STRATEGY_NAMES, STRATEGY_NUMPY,  # noqa: F401 - NP.*
                      STRATEGY_TAAT, SUB_BLOCKS, SUB_FRACTIONS, SUB_LEVELS)
from .build import block_subs, build_postings, check_pack_csr  # noqa: F401
from .ids import fnv1a64, gather_strings, same_strings  # noqa: F401
from .postings import doc_rows, term_docs, term_freqs, term_postings  # noqa: F401
from .search import postings_touched, search_segment  # noqa: F401

#: Up to this many postings of the query terms in one segment, numpy scores the segment. Measured
#: (``benchmarks/cold_search.py --threshold``, docs/engine.md "Cold start"): numpy reads about 8
#: postings per microsecond after a 0.3 ms fixed cost, so up to here it stays within about 2 ms
#: of the warm numba kernels, while a new process saves numba's 0.6 s start-up.
NUMPY_MAX_POSTINGS = 16_384
#: Up to this many postings, a token filter's documents and a segment's document frequencies
#: are read with numpy (at most about 8 ms).
NUMPY_MAX_SCAN = 65_536
#: Up to this many (term, block) pairs in a segment, one document's row (what ``get`` and re-ranking
#: read back) is found with numpy unless numba is already loaded: a pass over every pair costs
#: less than numba's start-up.
NUMPY_MAX_ROW_PAIRS = 262_144
#: Up to this many ids, lookups hash with numpy (ingest batches use the numba kernel).
NUMPY_MAX_IDS = 64
#: Up to this many postings, a new segment is built (inputs checked, postings inverted, ids
#: hashed) in numpy unless numba is already loaded: numba's start-up (about 0.6 s, up to 1.5 s
#: when it finds scipy) is more than a whole image ingest of hundreds of files, while numpy
#: inverts about 2 million postings in 0.3 s.
NUMPY_MAX_BUILD = 2_000_000


def numba_loaded() -> bool:
    """Whether the numba kernels are already imported in this process (then they cost nothing)."""
    import sys

    return "stair_es.engine.kernels" in sys.modules


def build_kernel(name: str, postings: int):
    """The numpy twin of kernel ``name`` for a build of up to :data:`NUMPY_MAX_BUILD` postings
    in a process that has not loaded numba, else the numba kernel (same results either way)."""
    if postings <= NUMPY_MAX_BUILD and not numba_loaded():
        return globals()[name]
    return getattr(K, name)


class _LazyKernels:
    """``K.name``: the numba kernel ``name``, importing :mod:`.kernels` on first use."""

    def __getattr__(self, name: str):
        from .. import kernels  # (lazy: numba's start-up is paid only when a kernel is needed)

        return getattr(kernels, name)


K = _LazyKernels()

