"""The one registry of compiled checksum helpers.

Storage verifies CRC-32 chunk checksums in Python and zlib (or isal) on its own, so a cold
process never starts numba for it. When the numba kernels are loaded (:mod:`.kernels`, on the
first search or build large enough to need them) they register two compiled helpers here, and
from then on storage and segments use them: chunk ranges verified without a Python call per
chunk, and the CRC-32 of every whole chunk of a large array in one call. Both paths give the
same verdict on the same bytes and raise the same error (the Python path names the damaged
chunk either way), so what a reader answers never depends on which modules were imported, or in
which order; only how long verification takes does.
"""

from __future__ import annotations

from typing import Callable

_RANGE_VERIFIER: Callable | None = None
_CHUNK_CRCS: Callable | None = None


def register_compiled(range_verifier: Callable, chunk_crcs: Callable) -> None:
    """Called once by :mod:`.kernels`: ``range_verifier(buf, table, ok, shift, content, starts,
    ends) -> first bad chunk or -1`` and ``chunk_crcs(uint8 buffer, shift) -> CRC-32 per chunk``."""
    global _RANGE_VERIFIER, _CHUNK_CRCS
    _RANGE_VERIFIER, _CHUNK_CRCS = range_verifier, chunk_crcs


def range_verifier() -> Callable | None:
    """The compiled chunk-range verifier, or None (verify with Python and zlib)."""
    return _RANGE_VERIFIER


def chunk_crcs() -> Callable | None:
    """The compiled per-chunk CRC-32, or None (compute with zlib)."""
    return _CHUNK_CRCS
