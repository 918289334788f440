"""Exact top-k of one segment in numpy (the twin of :mod:`..kernels.search`): term at a time,
in query-term order, so scores are the numba kernels' bit for bit."""

from __future__ import annotations

import numpy as np

from ..layout import F16_TABLE
from .postings import term_postings

def postings_touched(q_j: np.ndarray, post_ptr: np.ndarray) -> int:
    """Number of postings of the terms ``q_j`` (what a full scan of them reads)."""
    q_j = np.asarray(q_j, np.int64)
    return int((post_ptr[q_j + 1] - post_ptr[q_j]).sum()) if q_j.size else 0


def search_segment(q_j, q_w, seg, allowed, ref_base, k) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Exact top-k of one segment (``seg``: a :class:`.layout.SegmentArrays`): (scores float32,
    seq uint64, refs int64, matched docs, postings read).

    The best ``k`` allowed documents with a positive score, best first (score descending, then
    older first), as the numba kernels rank them; ``matched`` counts every allowed document
    with a positive score. ``allowed``: uint8 per doc, or empty for all."""
    n_docs, seq = seg.n_docs, seg.seq
    docs, qidx, term = term_postings(q_j, seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.bshift)
    vals = np.asarray(q_w, np.float32)[term] * F16_TABLE[seg.post_w[qidx]]
    acc = np.zeros(max(n_docs, int(docs.max()) + 1 if docs.size else 0), np.float32)
    np.add.at(acc, docs, vals)  # unbuffered, in posting order: each doc's sum runs in query-term order
    hit = np.flatnonzero(acc[:n_docs] > 0)
    if allowed.size:
        hit = hit[allowed[hit] != 0]
    scores = acc[hit]
    sq = np.asarray(seq)[hit]
    order = np.lexsort((sq, -scores))[:k]
    return scores[order], sq[order], ref_base + hit[order], int(hit.size), int(qidx.size)
