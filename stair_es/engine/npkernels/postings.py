"""Walking built postings in numpy (twins of :mod:`..kernels.postings`): every posting of some
terms, a term's documents, document frequencies, documents' rows."""

from __future__ import annotations

import numpy as np

from ...errors import DamagedIndexError

def concat_ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, e)`` for each pair, in order (int64)."""
    starts = np.asarray(starts, np.int64)
    lens = np.asarray(ends, np.int64) - starts
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offs = np.zeros(lens.size, np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return np.repeat(starts - offs, lens) + np.arange(total, dtype=np.int64)


def term_postings(q_j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(local doc, posting index, query-term position) of every posting of the terms ``q_j``,
    term after term, docs ascending within a term."""
    q_j = np.asarray(q_j, np.int64)
    pidx = concat_ranges(pair_ptr[q_j], pair_ptr[q_j + 1])
    qidx = concat_ranges(post_ptr[q_j], post_ptr[q_j + 1])
    runs = pair_cnt[pidx].astype(np.int64) + 1
    if int(runs.sum()) != qidx.size:
        raise DamagedIndexError("the block counts of a segment's postings do not add up to its postings pointers; "
                                "the index is damaged: run `stair-es index check`")
    docs = np.repeat(pair_block[pidx].astype(np.int64) << bshift, runs) + post_off[qidx]
    term = np.repeat(np.arange(q_j.size), post_ptr[q_j + 1] - post_ptr[q_j])
    return docs, qidx, term


def term_docs(j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift) -> np.ndarray:
    """Local docs of term ``j``'s postings."""
    return term_postings(np.array([j]), post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift)[0]


def term_freqs(keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, live, key_lo, key_hi, out) -> None:
    """Live document frequency per key in [key_lo, key_hi) added into ``out[key - key_lo]``."""
    lo, hi = np.searchsorted(keys, [key_lo, key_hi])
    if hi <= lo:
        return
    js = np.arange(lo, hi)
    if live.size == 0:
        np.add.at(out, keys[js].astype(np.int64) - key_lo, post_ptr[js + 1] - post_ptr[js])
        return
    docs, _, term = term_postings(js, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift)
    counts = np.bincount(term[live[docs] != 0], minlength=js.size)
    np.add.at(out, keys[js].astype(np.int64) - key_lo, counts)


def doc_rows(docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, bshift
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All (position in ``docs``, key, fp16 bits) of the local docs ``docs`` (ascending,
    distinct), term by term: the (term, block) pairs of the docs' blocks, then
    in each pair's run of postings those at the docs' offsets (a doc appears at most once per
    term). Reads every pair once: for small segments (``NUMPY_MAX_ROW_PAIRS``)."""
    docs = np.asarray(docs, np.int64)
    empty = (np.zeros(0, np.int32), np.zeros(0, np.uint32), np.zeros(0, np.uint16))
    pairs = np.flatnonzero(np.isin(pair_block, np.unique(docs >> bshift)))
    if pairs.size == 0:
        return empty
    terms = np.searchsorted(pair_ptr, pairs, side="right") - 1
    runs = pair_cnt.astype(np.int64) + 1
    before = np.cumsum(runs) - runs  # a term's runs follow each other: a pair's starts after the earlier ones
    start = post_ptr[terms] + before[pairs] - before[pair_ptr[terms]]
    idx = concat_ranges(start, start + runs[pairs])
    owner = np.repeat(np.arange(pairs.size), runs[pairs])
    local = (pair_block[pairs[owner]].astype(np.int64) << bshift) + post_off[idx]
    pos = np.minimum(np.searchsorted(docs, local), docs.size - 1)
    hit = docs[pos] == local
    return pos[hit].astype(np.int32), keys[terms[owner[hit]]].astype(np.uint32), post_w[idx[hit]].astype(np.uint16)
