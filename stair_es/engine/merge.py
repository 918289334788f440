"""Segment merges: the live documents of several segments into one new segment file.

Owns: reading a segment back as a batch of documents (ids, sequence numbers, columns, strings),
the in-memory merge (:func:`merge_segments`: every merged posting held at once, kept as the
reference the streamed one is tested against) and the streamed merge the index uses
(:func:`merge_segments_to_file`: bounded memory, the same file byte for byte), and how
``optimize`` packs consecutive segments into groups (:func:`pack_groups`). It must not know about
manifests, locks or commits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .columns import Batch, concat_columns, concat_offsets, take_columns
from .npkernels import K
from .segment import SEGMENT_FORMAT, Segment, _doc_arrays
from .storage import write_arrays_streamed


def pack_groups(lives: Sequence[int], cap: int, max_groups: int | None = None) -> list[list[int]]:
    """Consecutive segments (``lives``: their live documents) packed into groups of at most
    ``cap`` live documents (a segment never split: one larger than ``cap`` is a group alone); with
    ``max_groups``, the smallest limit up to ``cap`` that gives at most that many groups (where
    ``cap`` allows), so that the groups come out about equal."""

    def pack(limit: int) -> list[list[int]]:
        groups, pick, total = [], [], 0
        for i, n in enumerate(lives):
            if pick and total + n > limit:
                groups.append(pick)
                pick, total = [], 0
            pick.append(i)
            total += n
        if pick:
            groups.append(pick)
        return groups

    if max_groups is not None and lives:
        lo, hi = max(-(-sum(lives) // max_groups), max(lives)), max(cap, max(lives))
        while lo < hi:  # fewer groups as the limit grows: the smallest limit giving at most max_groups
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if len(pack(mid)) > max_groups else (lo, mid)
        cap = min(lo, cap)
    return pack(cap)


def segment_to_batch(seg: Segment, keep: np.ndarray) -> Batch:
    """The live documents ``keep`` (sorted local ids) of a segment as a batch without vectors (for
    merging: the merges build the postings from the segments' own)."""
    seg.verify_all()  # a merge rewrites every byte it reads under a new checksum: verify them first
    keep = np.asarray(keep, np.int64)
    a = seg.a
    ib, io = K.gather_strings(a["id_blob"], a["id_offs"], keep)
    cb, co = K.gather_strings(a["cap_blob"], a["cap_offs"], keep)
    sb, so = K.gather_strings(a["src_blob"], a["src_offs"], keep)
    return Batch(ib, io, np.asarray(seg.seq)[keep], {}, take_columns(seg.columns(), keep),
                 (cb, co, np.asarray(a["cap_present"])[keep]), (sb, so, np.asarray(a["src_present"])[keep]))


def concat_batches(batches: list[Batch]) -> Batch:
    """Vector-less batches (:func:`segment_to_batch`) one after the other."""
    def cat(parts):  # each batch's (string blob, offsets[, present flags]) -> those of all of them
        blob, offs = np.concatenate([np.asarray(p[0]) for p in parts]), concat_offsets([p[1] for p in parts])
        return (blob, offs, np.concatenate([p[2] for p in parts])) if len(parts[0]) > 2 else (blob, offs)

    ib, io = cat([(b.id_blob, b.id_offs) for b in batches])
    return Batch(ib, io, np.concatenate([b.seq for b in batches]).astype(np.uint64), {},
                 concat_columns([(b.n_docs, b.columns) for b in batches]),
                 cat([b.captions for b in batches]), cat([b.sources for b in batches]))


def _merge_tables(segs: Sequence[Segment], keeps: Sequence[np.ndarray], *, concatenated: bool) -> tuple:
    """What both merges read their inputs by: the union of the segments' keys, per (segment, union
    key) the pair range and first posting of that key (offsets into the segments' arrays laid end
    to end when ``concatenated``, else into each segment's own), the old -> new doc map (-1:
    dropped), each segment's first doc in that map, and the number of docs kept."""
    keys_u = np.unique(np.concatenate([np.asarray(s.keys) for s in segs])).astype(np.uint32)
    S, U = len(segs), keys_u.size
    kstart = np.zeros((S, U), np.int64)
    kend = np.zeros((S, U), np.int64)
    pstart = np.zeros((S, U), np.int64)
    newdoc = np.full(sum(s.n_docs for s in segs), -1, np.int64)
    doc_base = np.zeros(S, np.int64)
    pair_base = post_base = doc_off = out_base = 0
    for i, (s, k) in enumerate(zip(segs, keeps)):
        j = np.searchsorted(keys_u, s.keys)
        kstart[i, j] = s.pair_ptr[:-1] + pair_base
        kend[i, j] = s.pair_ptr[1:] + pair_base
        pstart[i, j] = s.post_ptr[:-1] + post_base
        doc_base[i] = doc_off
        newdoc[doc_off + np.asarray(k, np.int64)] = out_base + np.arange(len(k))
        if concatenated:
            pair_base += s.pair_block.size
            post_base += s.post_w.size
        doc_off += s.n_docs
        out_base += len(k)
    return keys_u, kstart, kend, pstart, newdoc, doc_base, out_base


def merge_segments(segs: Sequence[Segment], keeps: Sequence[np.ndarray], bshift: int) -> tuple[Batch, tuple]:
    """Documents (as a vector-less batch) and merged postings of the kept docs of ``segs``, in order."""
    batch = concat_batches([segment_to_batch(s, k) for s, k in zip(segs, keeps)])
    keys_u, kstart, kend, pstart, newdoc, doc_base, _ = _merge_tables(segs, keeps, concatenated=True)
    bshifts = {s.bshift for s in segs}
    if len(bshifts) != 1:
        raise ValueError("cannot merge segments with different block sizes")
    cat = [np.concatenate([np.asarray(getattr(s, a)) for s in segs]) for a in ("pair_block", "pair_cnt", "post_off", "post_w")]
    postings = K.merge_postings(kstart, kend, keys_u, *cat, pstart, newdoc, doc_base, bshifts.pop(), bshift)
    return batch, postings


#: postings a streamed merge (:func:`merge_segments_to_file`) builds in memory at once, at most
#: (plus one term's when a single term has more): ~3 bytes each, and their pairs
MERGE_CHUNK_POSTINGS = 1 << 25


def merge_segments_to_file(path: Path, name: str, segs: Sequence[Segment], keeps: Sequence[np.ndarray],
                           fields: Sequence[str], bshift: int, *, sync_dir: bool = True,
                           chunk_postings: int = MERGE_CHUNK_POSTINGS) -> Segment | None:
    """Merge the kept docs ``keeps`` of ``segs`` (in order) into the new segment file ``path``
    with bounded memory, and open it (None when no doc is kept; nothing written then).

    The same file, byte for byte, as :func:`merge_segments` then :func:`build_segment` write,
    but the postings are never all in memory: a first pass counts each term's merged postings
    and pairs (reading the inputs' memory maps, nothing concatenated), which fixes the file's
    layout; then terms are merged ``chunk_postings`` at a time, with their sub-block codes,
    and written in place; the chunk checksums come from a read of the written file. Memory: the
    per-document arrays (ids, sequence numbers, columns: tens of bytes a document), a doc map
    (8 bytes a document) and one chunk (~4 bytes a posting)."""
    from numba.typed import List

    bshifts = {s.bshift for s in segs}
    if len(bshifts) != 1:
        raise ValueError("cannot merge segments with different block sizes")
    bshift_in = bshifts.pop()
    parts = []
    for s, k in zip(segs, keeps):
        parts.append(segment_to_batch(s, k))  # (verifies every byte of s)
        s.release_pages()  # (the merge reads the inputs whole: their pages are not kept mapped)
    batch = concat_batches(parts)
    del parts
    if batch.n_docs == 0:
        return None
    keys_u, kstart, kend, pstart, newdoc, doc_base, out_base = _merge_tables(segs, keeps, concatenated=False)
    U = keys_u.size
    ins = [List([np.asarray(getattr(s, a)) for s in segs]) for a in ("pair_block", "pair_cnt", "post_off", "post_w")]
    cnt_post, cnt_pair = K.merge_counts(kstart, kend, pstart, ins[0], ins[1], ins[2], newdoc, doc_base, bshift_in, bshift)
    for s in segs:
        s.release_pages()
    has = cnt_post > 0
    post_ptr = np.concatenate(([0], np.cumsum(cnt_post[has]))).astype(np.int64)
    pair_ptr = np.concatenate(([0], np.cumsum(cnt_pair[has]))).astype(np.int64)
    P, N = int(pair_ptr[-1]), int(post_ptr[-1])
    arrays: dict[str, Any] = {"keys": keys_u[has], "post_ptr": post_ptr, "pair_ptr": pair_ptr,
                              "pair_block": (np.uint16, P), "pair_cnt": (np.uint8, P), "pair_max": (np.uint16, P),
                              "pair_sub": (np.uint8, P), "post_off": (np.uint8, N), "post_w": (np.uint16, N)}
    col_types = _doc_arrays(batch, arrays)
    del batch
    meta = {"format": SEGMENT_FORMAT, "name": name, "n_docs": int(out_base), "bshift": bshift, "fields": list(fields),
            "columns": col_types}
    # union keys cut into runs of about chunk_postings postings (a run holds at least one key)
    ends = np.cumsum(cnt_post)
    cuts = [0]
    while cuts[-1] < U:
        base = ends[cuts[-1] - 1] if cuts[-1] > 0 else 0
        cuts.append(max(int(np.searchsorted(ends, base + chunk_postings, side="right")), cuts[-1] + 1))
    cuts[-1] = min(cuts[-1], U)

    def fill(put) -> None:
        for u0, u1 in zip(cuts[:-1], cuts[1:]):
            j0 = int(has[:u0].sum())
            j1 = j0 + int(has[u0:u1].sum())
            p0, p1, q0, q1 = int(pair_ptr[j0]), int(pair_ptr[j1]), int(post_ptr[j0]), int(post_ptr[j1])
            ob, oc, om = np.empty(p1 - p0, np.uint16), np.empty(p1 - p0, np.uint8), np.empty(p1 - p0, np.uint16)
            oo, ow = np.empty(q1 - q0, np.uint8), np.empty(q1 - q0, np.uint16)
            K.merge_range(u0, u1, cnt_post, kstart, kend, pstart, ins[0], ins[1], ins[2], ins[3], newdoc, doc_base,
                          bshift_in, bshift, ob, oc, om, oo, ow)
            put("pair_block", p0, ob)
            put("pair_cnt", p0, oc)
            put("pair_max", p0, om)
            put("pair_sub", p0, K.block_subs(oc, om, oo, ow, bshift))
            put("post_off", q0, oo)
            put("post_w", q0, ow)
            for s in segs:
                s.release_pages()

    write_arrays_streamed(path, arrays, meta, fill, sync_dir=sync_dir)
    return Segment.open(path)
