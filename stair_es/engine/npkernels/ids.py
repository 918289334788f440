"""Id hashing and packed strings in numpy (twins of :mod:`..kernels.ids`)."""

from __future__ import annotations

import numpy as np

from .postings import concat_ranges

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)


def fnv1a64(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """64-bit FNV-1a of each string ``blob[offsets[i]:offsets[i + 1]]`` (as the numba kernel)."""
    offsets = np.asarray(offsets, np.int64)
    n = offsets.size - 1
    h = np.full(n, _FNV_OFFSET, np.uint64)
    lens = offsets[1:] - offsets[:-1]
    with np.errstate(over="ignore"):
        for p in range(int(lens.max()) if n else 0):
            rows = np.flatnonzero(lens > p)
            h[rows] = (h[rows] ^ blob[offsets[rows] + p].astype(np.uint64)) * _FNV_PRIME
    return h


def same_strings(q_blob, q_offs, blob, offs, docs) -> np.ndarray:
    """Whether query string i equals stored string ``docs[i]``."""
    out = np.zeros(len(docs), bool)
    for i, d in enumerate(docs):
        out[i] = bytes(q_blob[q_offs[i]:q_offs[i + 1]]) == bytes(blob[offs[d]:offs[d + 1]])
    return out


def gather_strings(blob: np.ndarray, offs: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Strings ``rows`` of (blob, offs) packed into a new (blob, offsets) pair, in ``rows`` order."""
    rows = np.asarray(rows, np.int64)
    offs = np.asarray(offs, np.int64)
    starts, ends = offs[rows], offs[rows + 1]
    out_offs = np.zeros(rows.size + 1, np.int64)
    np.cumsum(ends - starts, out=out_offs[1:])
    return np.asarray(blob, np.uint8)[concat_ranges(starts, ends)], out_offs
