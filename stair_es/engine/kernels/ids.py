"""Id hashing and packed strings (an id column is a byte blob and its offsets)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def fnv1a64(blob, offsets):
    n = offsets.size - 1
    out = np.empty(n, np.uint64)
    prime = np.uint64(1099511628211)
    for i in range(n):
        h = np.uint64(14695981039346656037)
        for p in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(blob[p])) * prime
        out[i] = h
    return out


@njit(cache=True)
def gather_strings(blob, offs, rows):
    n = rows.size
    out_offs = np.zeros(n + 1, np.int64)
    for i in range(n):
        r = rows[i]
        out_offs[i + 1] = out_offs[i] + offs[r + 1] - offs[r]
    out = np.empty(out_offs[n], np.uint8)
    for i in range(n):
        r = rows[i]
        out[out_offs[i]:out_offs[i + 1]] = blob[offs[r]:offs[r + 1]]
    return out, out_offs


@njit(cache=True)
def same_strings(q_blob, q_offs, blob, offs, docs):
    out = np.zeros(docs.size, np.bool_)
    for i in range(docs.size):
        a0, a1 = q_offs[i], q_offs[i + 1]
        b0, b1 = offs[docs[i]], offs[docs[i] + 1]
        if a1 - a0 != b1 - b0:
            continue
        ok = True
        for k in range(a1 - a0):
            if q_blob[a0 + k] != blob[b0 + k]:
                ok = False
                break
        out[i] = ok
    return out
