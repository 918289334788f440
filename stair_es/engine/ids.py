"""Document ids: a batch's ids packed and hashed once (duplicate check, lookup, the new segment's
id table) and the lookup of ids across a commit's segments (live documents only)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInputError
from ..schema import check_text
from . import npkernels as NP
from .npkernels import K
from .columns import encode_ids


@dataclass
class HashedIds:
    """A batch's ids packed (blob, offsets) and hashed (fnv1a64), with the order that sorts the
    hashes: computed once per batch for the duplicate check, the lookup of ids already indexed
    and the new segment's id table."""

    blob: np.ndarray
    offs: np.ndarray
    order: np.ndarray
    sorted_hashes: np.ndarray

    @classmethod
    def of(cls, ids: list[str]) -> "HashedIds":
        blob, offs = encode_ids(ids)
        hashes = (NP.fnv1a64 if len(ids) <= NP.NUMPY_MAX_IDS else K.fnv1a64)(blob, offs)
        order = np.argsort(hashes, kind="stable")
        return cls(blob, offs, order, hashes[order])

    @classmethod
    def checked(cls, ids: list[str]) -> "HashedIds":
        """:meth:`of` for ``add_arrays``' ids, refusing (InvalidInputError naming one) any that is
        not a non-empty string of at most 512 characters without newlines and valid Unicode, or
        that is given twice. A few passes in C for a million ids: packing them is the newline and
        Unicode check, equal sorted hashes (compared as strings) the duplicate check; the slow
        loop runs only to name a bad id."""
        h = None
        if all(type(i) is str for i in ids) and min(map(len, ids)) >= 1 and max(map(len, ids)) <= 512:
            with contextlib.suppress(ValueError):  # a newline, or a lone surrogate (UnicodeEncodeError)
                h = cls.of(ids)
        if h is None:
            for i in ids:
                if not isinstance(i, str) or not i or len(i) > 512 or "\n" in i:
                    raise InvalidInputError(f"document id must be a non-empty string of at most 512 chars without newlines, got {i!r}")
                check_text(i, "a document id")
        sh = h.sorted_hashes
        for i in np.flatnonzero(sh[1:] == sh[:-1]).tolist():
            a, b = ids[h.order[i]], ids[h.order[i + 1]]
            if a == b:
                raise InvalidInputError(f"add_arrays needs unique ids within one call; {a!r} is given twice")
        return h



def locate_in(segs: Sequence[Any], ids: Sequence[str], hashed: "HashedIds | None" = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """(segment position, local doc) of each live id among ``segs``; -1/-1 when absent."""
    seg_of = np.full(len(ids), -1, np.int64)
    doc_of = np.full(len(ids), -1, np.int64)
    if not segs:
        return seg_of, doc_of
    h = hashed or HashedIds.of(list(ids))
    order = h.order
    by_hash, ids_by_hash = h.sorted_hashes, [ids[i] for i in order]
    for si, s in enumerate(segs):
        d = np.empty(len(ids), np.int64)
        d[order] = s.seg.lookup(by_hash, ids_by_hash)
        hit = d >= 0
        if s.deleted is not None:
            hit &= ~s.deleted[np.maximum(d, 0)]
        seg_of[hit] = si
        doc_of[hit] = d[hit]
    return seg_of, doc_of
