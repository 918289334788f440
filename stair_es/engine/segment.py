"""One immutable segment of an embedded index: postings, ids, metadata columns, strings.

A segment is written once (atomically, see :mod:`.storage`) and then only memory-mapped.
Deletions never touch it: the index keeps a tombstone bitmap per segment.

Owns: the segment file format -- building a segment file from a :class:`~.columns.Batch`,
reading one back, verifying what is read, id lookup by sorted 64-bit hashes, stored fields, and
the per-document arrays a merge writes (the merges themselves: :mod:`.merge`). The batch and its metadata columns are in :mod:`.columns`, filter evaluation in
:mod:`.filters` (a mixin of :class:`Segment`). It must not know about manifests, locks or commits.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..schema import format_date
from ..vocab import VOCAB_SIZE
from . import checksum, pages
from . import npkernels as NP
from .npkernels import F16_TABLE, K
from .columns import (DATE_MISSING, Batch, column_arrays, columns_from_rows, concat_columns,  # noqa: F401 - segment's API
                      concat_offsets, encode_ids, encode_strings, str_at, take_columns)
from .filters import SegmentFilters
from .layout import SegmentArrays
from .storage import CHUNK_SHIFT, ChunkVerifier, read_container, verified_once, verify_on_open, write_arrays

# 2 (2026-11-26): adds ``pair_sub``, one byte of sub-block bounds per (term, block) pair (see
# npkernels.SUB_BLOCKS). Format 1 segments are still read and searched exactly, with block bounds
# only; `index optimize` rewrites them.
SEGMENT_FORMAT = 2
_NO_SUBS = np.zeros(0, np.uint8)  # what a format 1 segment gives the kernels for pair_sub
MAX_SEGMENT_DOCS = 1 << 24  # uint16 block numbers x 256-doc blocks


def segment_capacity(bshift: int) -> int:
    """Documents one segment can hold with blocks of ``2**bshift``: block numbers are uint16."""
    return min(MAX_SEGMENT_DOCS, 65536 << bshift)

#: a field with more postings than this is built on several threads (fewer: they cost more than they save)
THREADED_BUILD_MIN = NP.NUMPY_MAX_BUILD
#: most threads a segment build uses by default
BUILD_THREADS_MAX = 4


# --- segment -----------------------------------------------------------------------------------
def _compiled_verifier():
    """The numba kernels module when it is loaded with its compiled CRC-32 (else None: verify
    with numpy and Python, never importing numba for it)."""
    if checksum.range_verifier() is None:
        return None
    from . import kernels  # loaded already: it registered the verifier

    return kernels


class Segment(SegmentFilters):
    """A memory-mapped, read-only segment file."""

    def __init__(self, path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any], *,
                 offsets: dict[str, int] | None = None, verifier: ChunkVerifier | None = None):
        self.path = path
        self.name = meta["name"]
        self.a = arrays
        self.meta = meta
        self.n_docs = int(meta["n_docs"])
        self.bshift = int(meta["bshift"])
        self.n_blocks = (self.n_docs + (1 << self.bshift) - 1) >> self.bshift
        self.fields: list[str] = list(meta["fields"])
        self.column_types: dict[str, str] = dict(meta["columns"])
        self.keys = arrays["keys"]
        self.post_ptr = arrays["post_ptr"]
        self.pair_ptr = arrays["pair_ptr"]
        self.pair_block = arrays["pair_block"]
        self.pair_cnt = arrays["pair_cnt"]
        self.pair_max = arrays["pair_max"]
        self.pair_sub = arrays.get("pair_sub", _NO_SUBS)
        self.post_off = arrays["post_off"]
        self.post_w = arrays["post_w"]
        self.seq = arrays["seq"]
        self._kw_cache: dict[str, tuple[dict[str, int], np.ndarray]] = {}
        self.offsets = offsets or {}
        self.verifier = verifier  # chunked checksums (format 2), verified as they are read; else None
        self._whole: set[str] = set()  # arrays verified whole
        self._terms_ok: np.ndarray | None = None  # per term: its postings verified
        self._tables_ok: np.ndarray | None = None  # per term: its block table verified
        self._docs_ok: np.ndarray | None = None  # per doc: its stored fields verified
        self._terms: np.ndarray | None = None  # per (field, token): its index into keys, or -1 (see term_index)
        self._doc_plan: tuple | None = None  # see _doc_layout
        self._doc_rows: tuple | None = None  # the same as int64 tables, for kernels.verify_docs
        self._chk: tuple | None = None  # see kernel_check
        self._arrays: SegmentArrays | None = None  # see kernel_arrays
        self._table_layout: tuple | None = None  # see verify_term_tables
        self._term_max: np.ndarray | None = None  # see term_max
        self.outdated = False  # written in an older container or segment format (set by open)

    @classmethod
    def open(cls, path: Path, *, verify: bool | None = None) -> "Segment":
        """Memory-map a segment, so that a damaged file is an error, never an answer.

        With ``verify`` (default: ``$STAIR_ES_VERIFY`` != ``size``) a segment with chunked
        checksums has its chunk table, header and term tables verified now and every other
        byte the first time something reads it (see the ``verify_*`` methods, called by the
        index before it reads); an older segment with one whole-file checksum is verified in
        full once per process."""
        verify = verify if verify is not None else verify_on_open()
        c = read_container(path, verify=verify)
        seg = cls(path, c.arrays, c.meta, offsets=c.offsets, verifier=c.verifier)
        # an older container (no footer, one whole-file CRC, or larger chunks) or segment format (no
        # sub-block bounds): `optimize` rewrites it
        seg.outdated = (c.footer.kind != "chunks" or c.footer.shift != CHUNK_SHIFT
                        or int(c.meta.get("format", 1)) < SEGMENT_FORMAT)
        if c.footer.kind == "chunks":
            seg.verify_arrays(("keys", "post_ptr", "pair_ptr"))
            seg.check_structure(full=not verify)
        else:
            if verify:
                verified_once(path)  # the whole file, once per process
            seg.check_structure()
        return seg

    # --- lazy verification (format 2): call before reading, never after -----------------------
    def verify_arrays(self, names) -> None:
        """Verify whole arrays (once per process)."""
        v = self.verifier
        if v is None:
            return
        todo = [n for n in names if n not in self._whole and n in self.a]
        if todo:
            v.verify_ranges(np.array([self.offsets[n] for n in todo], np.int64),
                            np.array([self.offsets[n] + self.a[n].nbytes for n in todo], np.int64))
            self._whole.update(todo)

    def verify_all(self) -> None:
        """Verify every byte (before a merge rewrites the documents elsewhere)."""
        if self.verifier is not None:
            self.verifier.verify_all()
            self._whole.update(self.a)

    def _elem_ranges(self, name: str, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        item = self.a[name].itemsize
        base = self.offsets[name]
        return base + np.asarray(lo, np.int64) * item, base + np.asarray(hi, np.int64) * item

    def verify_terms(self, js: np.ndarray) -> None:
        """Verify the postings of terms ``js`` (their block table runs and postings)."""
        v = self.verifier
        if v is None or len(js) == 0:
            return
        if self._terms_ok is None:
            self._terms_ok = np.zeros(self.keys.size, bool)
        js = np.asarray(js, np.int64)
        js = js[~self._terms_ok[js]]  # the steady state: every term verified already, two operations
        if js.size == 0:
            return
        p0, p1 = self.pair_ptr[js], self.pair_ptr[js + 1]
        q0, q1 = self.post_ptr[js], self.post_ptr[js + 1]
        parts = [self._elem_ranges(n, p0, p1) for n in self._table_names()]
        parts += [self._elem_ranges(n, q0, q1) for n in ("post_off", "post_w")]
        v.verify_ranges(np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts]))
        self._terms_ok[js] = True

    def _table_names(self) -> tuple[str, ...]:
        """The per-(term, block) arrays of this segment (its block tables)."""
        return ("pair_block", "pair_cnt", "pair_max") + (("pair_sub",) if "pair_sub" in self.a else ())

    def verify_term_tables(self, js: np.ndarray) -> None:
        """Verify the block tables (``pair_*``) of terms ``js``: what a kernel reads of a term before
        it knows which of its postings runs it needs (see :meth:`kernel_check` for those)."""
        v = self.verifier
        if v is None or len(js) == 0:
            return
        self.table_check()
        js = np.asarray(js, np.int64)
        js = js[~self._tables_ok[js]]
        if js.size == 0:
            return
        base, item, rows = self._table_layout  # one row per array
        K = _compiled_verifier()
        if K is not None and v.content:  # numba is loaded: one compiled call, no numpy per query
            bad = K.verify_rows(v.mm, v.table, v.ok, np.int64(v.shift), np.int64(v.content), js, self.pair_ptr, rows)
            if bad >= 0:
                self.raise_damaged_chunk(bad)
        else:
            v.verify_ranges((base + self.pair_ptr[js].astype(np.int64) * item).ravel(),
                            (base + self.pair_ptr[js + 1].astype(np.int64) * item).ravel())
        self._tables_ok[js] = True

    def table_check(self) -> tuple[np.ndarray, np.ndarray]:
        """What a compiled search verifies block tables with (as :meth:`verify_term_tables`, which
        shares its flags): per term whether its block table is verified (bool, written by the
        kernel), and rows (file offset, item size) of the block tables' arrays."""
        if self._tables_ok is None:
            self._tables_ok = np.zeros(self.keys.size, bool)
        if self._table_layout is None:
            names = self._table_names()
            base = np.array([[self.offsets[n]] for n in names], np.int64)
            item = np.array([[self.a[n].itemsize] for n in names], np.int64)
            self._table_layout = (base, item, np.hstack([base, item]))
        return self._tables_ok, self._table_layout[2]

    def kernel_check(self) -> tuple | None:
        """What the numba search kernels need to verify each postings run the first time they
        read it (``kernels.check_run``), or None when there is nothing to verify that way (no
        chunked checksums, verification off, or no compiled CRC-32: then verify whole terms
        with :meth:`verify_terms` before searching)."""
        v = self.verifier
        if v is None or checksum.range_verifier() is None or not v.content:
            return None
        if self._chk is None or self._chk[0] is not v:  # built once per verifier (the same arrays)
            self._chk = (v, (v.mm, v.table, v.ok, np.int64(v.shift), np.int64(v.content),
                             np.int64(self.offsets["post_off"]), np.int64(self.offsets["post_w"])))
        return self._chk[1]

    def release_pages(self) -> None:
        """Unmap this segment's pages from the process (:func:`.pages.release`; they stay in the
        page cache): after a merge read it whole, its resident memory falls back."""
        mm = self.verifier.mm if self.verifier is not None else None
        for arr in ([mm] if mm is not None else self.a.values()):
            if arr.size:
                pages.release(arr.ctypes.data, arr.nbytes)

    def prefetch_all(self) -> None:
        """Map every array of the segment now (a warm-up)."""
        for arr in self.a.values():
            if arr.size:
                pages.advise(arr.ctypes.data, arr.nbytes)

    def term_max(self) -> np.ndarray:
        """Per term, the stored float16 bits of its highest block maximum in this segment (0: not
        known yet; one slot more than terms): what the search's safe starting threshold
        (``kernels.multi.seed_bound``) ranks the query terms by. It fills slots itself on first use
        of a term (a pass over the term's block maxima); :meth:`fill_term_max` fills all at once."""
        if self._term_max is None:
            self._term_max = np.zeros(self.pair_ptr.size, np.uint16)
        return self._term_max

    def fill_term_max(self) -> bool:
        """Fill :meth:`term_max` for every term in one pass over the block maxima (``pair_max``), if
        their chunks are verified already (nothing is read before it is verified). A first query
        otherwise computes the slots of its terms itself: at 10M documents that was most of what it
        took beyond the steady state once its pages were mapped and verified (docs/scale.md).
        Returns whether it was filled."""
        tm = self.term_max()
        pm = self.pair_max
        v = self.verifier
        if v is not None:
            if "pair_max" in self.offsets and pm.size:
                lo = self.offsets["pair_max"] >> v.shift
                hi = (self.offsets["pair_max"] + pm.nbytes - 1) >> v.shift
                if not v.ok[lo:hi + 1].all():
                    return False
        pp = self.pair_ptr
        ne = np.flatnonzero(pp[1:] > pp[:-1])
        if ne.size and pm.size:
            tm[ne] = np.maximum.reduceat(pm, pp[ne])  # (positive float16 values order like their bits)
        return True

    def file_mapping(self) -> np.ndarray | None:
        """The whole file as mapped (uint8), or None when its arrays are not views of one mapping."""
        mm = self.verifier.mm if self.verifier is not None else None
        return mm if mm is not None and mm.size else None

    def huge_share(self) -> float:
        """The share of this segment's mapping this process maps with 2 MiB page table entries
        (:func:`.pages.pmd_mapped`; 0 where not known)."""
        mm = self.file_mapping()
        if mm is None:
            return 0.0
        return min(1.0, pages.pmd_mapped(mm.ctypes.data, mm.nbytes) / max(mm.nbytes, 1))

    def reread_huge(self) -> bool:
        """Read this segment's file back into the page cache as 2 MiB folios and map it
        (:func:`.pages.reread_huge`): its first reads in this and later processes fault once per
        2 MiB. The bytes come from the same immutable file, as after any eviction; chunks verified
        before stay verified (the once-per-process rule, as when the kernel evicts and re-reads
        pages). Returns whether it was done."""
        mm = self.file_mapping()
        if mm is None:
            return False
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return pages.reread_huge(mm.ctypes.data, mm.nbytes, fd, 0)
        finally:
            os.close(fd)

    #: the arrays :meth:`map_resident` maps first: what every search reads (block tables, postings,
    #: then the sequence numbers of the hits)
    MAP_FIRST = ("pair_block", "pair_cnt", "pair_max", "pair_sub", "post_off", "post_w", "seq")

    def map_resident(self, stop=None, verify: bool = False, names=None) -> int:
        """Map the pages of this segment's arrays (``names``; default: all, :data:`MAP_FIRST` first)
        that are in the page cache already (never a disk read;
        :func:`.pages.map_resident`); stops once ``stop`` is set. Returns the bytes mapped. What a
        reader does in the background after it opens (see ``EngineIndex``): the first queries then
        fault no page that was cached. With ``verify`` (and chunk checksums, and the compiled CRC-32
        loaded: else nothing more) the chunks of each mapped run are verified too, right after it is
        mapped, so that searches find them verified; a damaged chunk is left unverified (a search
        reading it then raises, naming it)."""
        v = self.verifier
        on_run = None
        if verify and v is not None and v.content and checksum.range_verifier() is not None:
            base = v.mm.ctypes.data

            def on_run(addr: int, nbytes: int) -> None:
                lo = max(addr - base, 0)
                v.verify_ranges(np.array([lo], np.int64), np.array([min(addr + nbytes - base, v.content)], np.int64))

        if names is None:
            names = [n for n in self.MAP_FIRST if n in self.a] + sorted(n for n in self.a if n not in self.MAP_FIRST)
        done = 0
        for n in names:
            arr = self.a[n]
            if arr.size:
                done += pages.map_resident(arr.ctypes.data, arr.nbytes, stop, on_run=on_run)
            if stop is not None and stop.is_set():
                break
        return done

    def kernel_arrays(self) -> SegmentArrays:
        """The arrays the search kernels read, as the one tuple they take (made once)."""
        if self._arrays is None:
            self._arrays = SegmentArrays(self.n_docs, self.bshift, self.post_ptr, self.pair_ptr, self.pair_block,
                                         self.pair_cnt, self.pair_max, self.pair_sub, self.post_off, self.post_w,
                                         self.seq, F16_TABLE)
        return self._arrays

    def raise_damaged_chunk(self, chunk: int) -> None:
        """Raise the DamagedIndexError of a chunk a kernel found damaged (naming its byte range)."""
        from ..errors import DamagedIndexError

        self.verifier.verify_chunks(np.array([chunk], np.int64))  # raises, naming the byte range
        raise DamagedIndexError(f"{self.path}: chunk {chunk} failed its checksum in a search but not when read again "
                                "(the file is changing under the reader?); run `stair-es index check`")

    def _doc_layout(self) -> tuple:
        """Where the stored fields of a doc start: the fixed-size per-doc arrays read for every doc
        (base offset, item size, bytes read per doc; one row each), the arrays read whole (keyword
        dictionaries) and the strings read for every doc (blob, offsets)."""
        if self._doc_plan is None:
            fixed = [("id_offs", 2), ("cap_present", 1), ("src_present", 1)]
            whole, strings = [], [("id_blob", "id_offs")]
            for name, ftype in self.column_types.items():
                if ftype == "keyword":
                    fixed += [(f"m.{name}.ptr", 2), (f"m.{name}.list", 1)]
                    whole += [f"m.{name}.dict", f"m.{name}.dict_offs"]
                    strings.append((f"m.{name}.codes", f"m.{name}.ptr"))
                else:
                    fixed.append((f"m.{name}.v", 1))
            fixed = [(n, w) for n, w in fixed if n in self.a]
            base = np.array([[self.offsets[n]] for n, _ in fixed], np.int64).reshape(-1, 1)
            item = np.array([[self.a[n].itemsize] for n, _ in fixed], np.int64).reshape(-1, 1)
            width = np.array([[w] for _, w in fixed], np.int64).reshape(-1, 1) * item
            strings = [(b, o) for b, o in strings if b in self.a and o in self.a]
            self._doc_plan = (base, item, width, whole, strings)
        return self._doc_plan

    def verify_docs(self, docs) -> None:
        """Verify what :meth:`doc_id`, :meth:`metadata`, :meth:`caption` and :meth:`source`
        read for local docs ``docs``, each step before the next reads it: the fixed-size entries
        (id offsets, caption/source presence flags, metadata values), then the offsets of the
        captions and sources the docs have (those of absent ones are never read), then the
        strings they all point to."""
        v = self.verifier
        if v is None or len(docs) == 0:
            return
        if self._docs_ok is not None and len(docs) <= 16 and all(self._docs_ok[x] for x in docs):
            return  # (a search's few hits, verified before: no numpy call per segment and search)
        if self._docs_ok is None:
            self._docs_ok = np.zeros(self.n_docs, bool)
        d = np.asarray(docs, np.int64)
        d = d[~self._docs_ok[d]]
        if d.size == 0:
            return
        a = self.a
        base, item, width, whole, strings = self._doc_layout()
        self.verify_arrays(whole)
        K = _compiled_verifier()
        if K is not None and v.content and self._doc_rows is None:
            opt = [(present, blob, offs) for blob, offs, present in
                   (("cap_blob", "cap_offs", "cap_present"), ("src_blob", "src_offs", "src_present")) if present in a]
            if all(b in a and o in a and a[p].itemsize == 1 for p, b, o in opt):
                row = lambda blob, offs: [self.offsets[blob], a[blob].itemsize, self.offsets[offs], a[offs].itemsize]  # noqa: E731
                self._doc_rows = (np.hstack([base, item, width]),
                                  np.array([row(b, o) for b, o in strings], np.int64).reshape(-1, 4),
                                  np.array([[self.offsets[p]] + row(b, o) for p, b, o in opt], np.int64).reshape(-1, 5))
            else:  # (not what a writer makes: the numpy path below handles it)
                self._doc_rows = ()
        if K is not None and v.content and self._doc_rows:  # numba is loaded: one compiled call, no numpy per query
            bad = K.verify_docs(v.mm, v.table, v.ok, np.int64(v.shift), np.int64(v.content), d, *self._doc_rows)
            if bad >= 0:
                self.raise_damaged_chunk(bad)
            self._docs_ok[d] = True
            return
        lo = base + d * item
        v.verify_ranges(lo.ravel(), (lo + width).ravel())
        optional = []  # (blob, offsets, docs that have one): captions and sources
        for blob, offs, present in (("cap_blob", "cap_offs", "cap_present"), ("src_blob", "src_offs", "src_present")):
            if present in a and offs in a and blob in a:
                has = d[a[present][d] != 0]
                if has.size:
                    optional.append((blob, offs, has))
        parts = [self._elem_ranges(offs, has, has + 2) for _, offs, has in optional]
        parts += [self._elem_ranges(blob, a[offs][d], a[offs][d + 1]) for blob, offs in strings]
        if parts:
            v.verify_ranges(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
        if optional:
            parts = [self._elem_ranges(blob, a[offs][has], a[offs][has + 1]) for blob, offs, has in optional]
            v.verify_ranges(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))
        self._docs_ok[d] = True

    def verify_column(self, name: str) -> None:
        prefix = f"m.{name}."
        self.verify_arrays([k for k in self.a if k.startswith(prefix)])

    def check_structure(self, full: bool = True) -> None:
        """Cheap invariants of the arrays the kernels index with (sizes and pointer ranges), so a
        damaged but checksum-less (old) file cannot make a kernel read out of bounds. ``full``
        also reads every block count and number (a pass over the postings tables: skipped for
        checksummed files, whose bytes are verified before they are read)."""
        a = self.a
        n_keys, n_pairs, n_post = self.keys.size, self.pair_block.size, self.post_w.size
        problems = []

        def ptr_ok(ptr: np.ndarray, last: int) -> bool:
            return ptr.size == n_keys + 1 and int(ptr[0]) == 0 and int(ptr[-1]) == last and bool(np.all(np.diff(ptr) >= 0))

        if not ptr_ok(self.post_ptr, n_post):
            problems.append("term postings pointers")
        if not ptr_ok(self.pair_ptr, n_pairs):
            problems.append("term block pointers")
        if (self.post_off.size != n_post or self.pair_cnt.size != n_pairs or self.pair_max.size != n_pairs
                or ("pair_sub" in a and self.pair_sub.size != n_pairs)):
            problems.append("postings array sizes")
        elif full and n_pairs and int(self.pair_cnt.sum(dtype=np.int64)) + n_pairs != n_post:
            problems.append("block posting counts")
        if full and n_pairs and int(self.pair_block.max()) > (max(self.n_docs - 1, 0) >> self.bshift):
            problems.append("block numbers")
        if n_keys > 1 and not bool(np.all(np.diff(self.keys.astype(np.int64)) > 0)):
            problems.append("term keys order")
        if self.seq.size != self.n_docs or (a.get("id_offs") is not None and a["id_offs"].size != self.n_docs + 1):
            problems.append("document arrays")
        if problems:
            from ..errors import DamagedIndexError

            raise DamagedIndexError(f"segment file {self.path} is damaged ({', '.join(problems)} out of range); "
                                    "run `stair-es index check` to see what is affected")

    @property
    def nbytes(self) -> int:
        return self.path.stat().st_size

    @property
    def n_postings(self) -> int:
        return int(self.post_w.size)

    def postings_per_field(self) -> dict[str, int]:
        out = {}
        for fi, f in enumerate(self.fields):
            lo, hi = np.searchsorted(self.keys, [fi * VOCAB_SIZE, (fi + 1) * VOCAB_SIZE])
            out[f] = int(self.post_ptr[hi] - self.post_ptr[lo])
        return out

    # --- ids ---------------------------------------------------------------------------------
    def doc_id(self, d: int) -> str:
        return str_at(self.a["id_blob"], self.a["id_offs"], d)

    def lookup(self, hashes: np.ndarray, ids: Sequence[str]) -> np.ndarray:
        """Local doc of each id (-1 if absent); ``hashes`` = fnv1a64 of ``ids``, sorted ascending
        (numpy's binary search narrows from the previous answer when its keys ascend: ~5x
        faster for a million ids, which pays off over the segments of a big index)."""
        self.verify_arrays(("id_hash", "id_order", "id_offs", "id_blob"))
        hs = self.a["id_hash"]
        out = np.full(len(ids), -1, np.int64)
        if hs.size == 0 or len(ids) == 0:
            return out
        pos = np.searchsorted(hs, hashes)
        pos_c = np.minimum(pos, hs.size - 1)
        cand = np.flatnonzero(hs[pos_c] == hashes)
        if cand.size == 0:
            return out
        order = self.a["id_order"]
        docs = np.asarray(order[pos_c[cand]], np.int64)
        q_blob, q_offs = encode_ids([ids[i] for i in cand])
        same = (NP.same_strings if cand.size <= NP.NUMPY_MAX_IDS else K.same_strings)(q_blob, q_offs, self.a["id_blob"], self.a["id_offs"], docs)
        out[cand[same]] = docs[same]
        for ci in np.flatnonzero(~same):  # 64-bit hash collisions: try the other equal hashes
            i = int(cand[ci])
            p = int(pos_c[i]) + 1
            while p < hs.size and hs[p] == hashes[i]:
                d = int(order[p])
                if self.doc_id(d) == ids[i]:
                    out[i] = d
                    break
                p += 1
        return out

    # --- stored fields ------------------------------------------------------------------------
    def caption(self, d: int) -> str | None:
        return str_at(self.a["cap_blob"], self.a["cap_offs"], d) if self.a["cap_present"][d] else None

    def source(self, d: int) -> str | None:
        return str_at(self.a["src_blob"], self.a["src_offs"], d) if self.a["src_present"][d] else None

    def column(self, name: str) -> dict[str, np.ndarray]:
        prefix = f"m.{name}."
        return {k[len(prefix):]: v for k, v in self.a.items() if k.startswith(prefix)}

    def columns(self) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
        return {name: (t, self.column(name)) for name, t in self.column_types.items()}

    def metadata(self, d: int, *, display: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {}
        cols = self.__dict__.get("_meta_columns")
        if cols is None:  # (each hit's metadata read from the same arrays: found once, not per hit)
            cols = self.__dict__["_meta_columns"] = {name: self.column(name) for name in self.column_types}
        for name, ftype in self.column_types.items():
            c = cols[name]
            if ftype == "number":
                v = float(c["v"][d])
                if not np.isnan(v):
                    out[name] = v
            elif ftype == "date":
                v = int(c["v"][d])
                if v != DATE_MISSING:
                    out[name] = format_date(v) if display else v
            elif ftype == "boolean":
                v = int(c["v"][d])
                if v >= 0:
                    out[name] = bool(v)
            else:
                lo, hi = int(c["ptr"][d]), int(c["ptr"][d + 1])
                words = [str_at(c["dict"], c["dict_offs"], int(k)) for k in c["codes"][lo:hi]]
                if c["list"][d]:
                    out[name] = words
                elif words:
                    out[name] = words[0]
        return out

    def vectors(self, d: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Local doc ``d``'s (token ids, float weights) per field."""
        return self.vectors_of_docs(np.array([d], np.int64))[0]

    def vectors_of_docs(self, docs: np.ndarray) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
        """:meth:`vectors` of each local doc of ``docs``, read together: a doc's row touches every
        term, and one walk over the terms' tables serves every doc (100 hits of a 100k-document
        segment: one walk instead of 100)."""
        self.verify_arrays(("pair_block", "pair_cnt", "post_off", "post_w"))
        uniq, back = np.unique(np.asarray(docs, np.int64), return_inverse=True)
        small = self.pair_block.size <= NP.NUMPY_MAX_ROW_PAIRS and not NP.numba_loaded()
        pos, keys, wb = (NP.doc_rows if small else K.doc_rows)(uniq, self.keys, self.post_ptr, self.pair_ptr,
                                                              self.pair_block, self.pair_cnt, self.post_off,
                                                              self.post_w, self.bshift)
        order = np.argsort(pos, kind="stable")  # by doc, each doc's keys ascending (the kernels go term by term)
        bounds = np.searchsorted(pos[order], np.arange(uniq.size + 1))
        keys, wb = keys[order], wb[order]
        rows = []
        for u in range(uniq.size):
            k, w = keys[bounds[u]:bounds[u + 1]], wb[bounds[u]:bounds[u + 1]]
            fidx = k // VOCAB_SIZE
            rows.append({f: ((k[fidx == fi] - fi * VOCAB_SIZE).astype(np.int32), F16_TABLE[w[fidx == fi]])
                         for fi, f in enumerate(self.fields)})
        return [rows[i] for i in back.reshape(-1)]

    def term_table(self) -> np.ndarray:
        """Per term key (field index x vocabulary size + token, vocabulary tokens only) its index
        into ``keys``, or -1 (what :meth:`term_index` reads; made on first use)."""
        if self._terms is None:
            t = np.full(len(self.fields) * VOCAB_SIZE, -1, np.int64)
            t[self.keys[self.keys < t.size]] = np.flatnonzero(self.keys < t.size)
            self._terms = t
        return self._terms

    def term_index(self, field_idx: int, tokens: np.ndarray) -> np.ndarray:
        """Index into ``keys`` of each token of a field, -1 when the segment lacks it.

        Vocabulary tokens are looked up in a table of every (field, token) (made on first use: 8
        bytes each, 244 KB per field): one numpy call, where the binary search over ``keys`` took
        eight (~25 us of a 0.5 ms search, 2026-11-27); other values take the binary search."""
        tok = np.asarray(tokens, np.int64)
        if 0 <= field_idx < len(self.fields) and (tok.size == 0 or tok.view(np.uint64).max() < VOCAB_SIZE):  # (negatives: huge)
            return self.term_table()[tok + field_idx * VOCAB_SIZE]
        want = (tok + field_idx * VOCAB_SIZE).astype(np.uint32)
        j = np.searchsorted(self.keys, want)
        jc = np.minimum(j, max(self.keys.size - 1, 0))
        ok = (j < self.keys.size) & (self.keys[jc] == want) if self.keys.size else np.zeros(want.size, bool)
        return np.where(ok, j, -1)


def build_segment(path: Path, name: str, batch: Batch, fields: Sequence[str], bshift: int, *, sync_dir: bool = True,
                  postings: tuple | None = None, threads: int | None = None) -> Segment:
    """Write ``batch`` as segment file ``path`` (atomically) and open it.

    ``postings`` (as returned by ``kernels.build_postings``/``merge_postings``) replaces
    ``batch.vectors`` when given (segment merges). ``threads``: threads that build the postings
    of a field, and the sub-block codes of a segment, of more than :data:`THREADED_BUILD_MIN`
    postings (default: the machine's cores, at most :data:`BUILD_THREADS_MAX`); the arrays are
    the same whatever the number.
    """
    n = batch.n_docs
    if n > segment_capacity(bshift):
        raise ValueError(f"a segment with {1 << bshift}-document blocks holds at most {segment_capacity(bshift)} documents")
    if threads is None:
        threads = min(os.cpu_count() or 1, BUILD_THREADS_MAX)
    elif threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    if postings is not None:
        return _write_segment(path, name, batch, fields, bshift, postings, sync_dir, threads)
    parts = []
    for fi, f in enumerate(fields):
        if f in batch.vectors:
            indptr, ids, wb = batch.vectors[f]
        else:
            indptr, ids, wb = np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.uint16)
        parts.append(_field_postings(indptr, ids, wb, n, fi * VOCAB_SIZE, bshift, threads))
    nonempty = [p for p in parts if p[0].size]
    if len(nonempty) <= 1:  # one field: no copies
        p = nonempty[0] if nonempty else parts[0]
    else:
        keys = np.concatenate([p[0] for p in nonempty])
        post_ptr, pair_ptr = (concat_offsets([p[i] for p in nonempty]) for i in (1, 2))
        pb, pc, pm, po, pw = (np.concatenate([p[i] for p in nonempty]) for i in range(3, 8))
        p = (keys, post_ptr, pair_ptr, pb, pc, pm, po, pw)
    return _write_segment(path, name, batch, fields, bshift, p, sync_dir, threads)


def _field_postings(indptr, ids, wb, n: int, key_base: int, bshift: int, threads: int) -> tuple:
    """The block postings of one field's CSR vectors (as ``kernels.build_postings``)."""
    nnz = int(indptr[-1] - indptr[0])
    args = (np.ascontiguousarray(indptr, np.int64), np.ascontiguousarray(ids, np.int32),
            np.ascontiguousarray(wb, np.uint16), n, key_base, VOCAB_SIZE, bshift)
    if nnz > THREADED_BUILD_MIN:
        return K.build_postings_threaded(*args, threads)
    return NP.build_kernel("build_postings", nnz)(*args)


def _write_segment(path, name, batch, fields, bshift, postings, sync_dir, threads: int = 1) -> Segment:
    n = batch.n_docs
    keys, post_ptr, pair_ptr, pb, pc, pm, po, pw = postings
    # sub-block bounds from the built postings (new or merged alike): a pass over the postings
    if po.size > THREADED_BUILD_MIN:
        psub = K.block_subs_threaded(pair_ptr, post_ptr, pc, pm, po, pw, bshift, threads)
    else:
        psub = NP.build_kernel("block_subs", int(po.size))(pc, pm, po, pw, bshift)
    arrays: dict[str, Any] = {
        "keys": keys.astype(np.uint32),
        "post_ptr": post_ptr,
        "pair_ptr": pair_ptr,
        "pair_block": pb,
        "pair_cnt": pc,
        "pair_max": pm,
        "pair_sub": psub,
        "post_off": po,
        "post_w": pw,
    }
    col_types = _doc_arrays(batch, arrays)
    meta = {"format": SEGMENT_FORMAT, "name": name, "n_docs": n, "bshift": bshift, "fields": list(fields),
            "columns": col_types}
    write_arrays(path, arrays, meta, sync_dir=sync_dir)
    return Segment.open(path)


def _doc_arrays(batch: Batch, arrays: dict[str, Any]) -> dict[str, str]:
    """Add the per-document arrays of a segment file (after the postings) to ``arrays``: sequence
    numbers, ids and their sorted hashes, captions, sources, metadata columns. Returns the
    columns' types."""
    n = batch.n_docs
    if batch.id_hash is not None:
        sorted_hashes, order = batch.id_hash, batch.id_order
    else:
        hashes = NP.build_kernel("fnv1a64", int(batch.id_offs[-1]))(batch.id_blob, batch.id_offs)  # work: id bytes
        order = np.argsort(hashes, kind="stable")
        sorted_hashes = hashes[order]
    none = (np.zeros(0, np.uint8), np.zeros(n + 1, np.int64), np.zeros(n, np.uint8))  # no document has one
    caps, srcs = batch.captions or none, batch.sources or none
    arrays.update({"seq": batch.seq.astype(np.uint64), "id_blob": batch.id_blob, "id_offs": batch.id_offs,
                   "id_hash": sorted_hashes, "id_order": order.astype(np.uint32), "cap_blob": caps[0],
                   "cap_offs": caps[1], "cap_present": caps[2], "src_blob": srcs[0], "src_offs": srcs[1],
                   "src_present": srcs[2]})
    col_types = {}
    for cname, (ftype, cols) in batch.columns.items():
        col_types[cname] = ftype
        for part, arr in cols.items():
            arrays[f"m.{cname}.{part}"] = arr
    return col_types
