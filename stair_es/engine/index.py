"""The embedded index: a directory of immutable segments, tombstones and one manifest.

Layout of ``path/``::

    manifest.json          commit point: format version, generation, schema, segments, tombstones
    seg-000001.seg         immutable segment files (see :mod:`.segment`)
    seg-000001.del.7       tombstone bitmap of a segment as of generation 7 (packed bits)
    write.lock             held (flock) by the one writer

A commit writes new segment / tombstone files atomically (temp file, fsync, rename), then
the manifest the same way; the manifest rename is the commit point, so a crash at any
moment leaves the previous or the new generation, never a mix. Readers take no lock: they
re-read the manifest when its inode changes (checked by one ``stat`` per search).

Segments: every commit of ``add``/``add_arrays`` writes one segment; when there are more
than ``max_segments`` (8), the writer merges the ``merge_factor`` (8) smallest into one
right after the commit (a tiered policy: each document is rewritten O(log n) times);
``optimize()`` merges everything and drops deleted documents.

Scores: weights are stored as IEEE float16 (relative error <= 2**-11, above 65504 clipped,
below ~6e-8 dropped); scores are the float32 sum of ``clause weight x query weight x stored weight`` in a fixed
order, exact with respect to the stored weights. Ties are broken by insertion order (older
first; an update counts as a new insertion).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from ..errors import (DamagedIndexError, DocumentNotFoundError, IndexWriteError, IncompatibleIndexError,
                      IndexExistsError, IndexNotFoundError, InvalidInputError, InvalidVectorError)
from ..query import SearchRequest
from ..schema import ColumnValueError, Document, Explanation, IndexSchema, ItemResult, TokenContribution
from ..sparse import SparseVector
from ..vocab import VOCAB_SIZE, Vocabulary, default_vocabulary
from . import npkernels as NP
from .npkernels import K
from .ids import HashedIds, locate_in
from .merge import merge_segments_to_file, pack_groups
from .searcher import Searcher
from .segment import (Batch, Segment, build_segment, column_arrays, columns_from_rows, encode_strings, segment_capacity,
                      take_columns)
from .manifest import (FORMAT_VERSION, LOCK, MANIFEST, PREV_MANIFEST, files_of, folder_bytes, manifest_checksum,
                       manifest_file, missing_manifest_error, read_tombstones, read_valid_manifest, take_writer_lock,
                       validate_manifest, writer_version)
from .storage import TMP_PREFIX, atomic_write_bytes, atomic_write_json, crc32_of, fsync_dir

log = logging.getLogger(__name__)

DEFAULT_BSHIFT = 8  # 256-document blocks: smaller and faster than 128 on the 1M benchmark
F16_MAX = 65504.0
#: add_arrays checks a field's postings on several threads from this many (~10 ms of work)
PARALLEL_CHECK_POSTINGS = 4_000_000


def _f16_bits(w: np.ndarray) -> np.ndarray:
    """float16 bit patterns of weights already checked to be finite, >= 0 and <= F16_MAX."""
    return np.asarray(w, np.float32).astype(np.float16).view(np.uint16)


@dataclass
class _SegState:
    seg: Segment
    deleted: np.ndarray | None  # bool per doc, None = no deletions
    del_file: str | None
    n_deleted: int

    _live_u8: np.ndarray | None = None

    @property
    def live(self) -> int:
        return self.seg.n_docs - self.n_deleted

    def mark_deleted(self, deleted: np.ndarray, del_file: str) -> None:
        """This state's new tombstones (bool per document) and the file holding them."""
        self.deleted, self.del_file, self.n_deleted = deleted, del_file, int(deleted.sum())
        self._live_u8 = None

    def live_docs(self) -> np.ndarray:
        """The local numbers of the segment's live documents."""
        return np.arange(self.seg.n_docs) if self.deleted is None else np.flatnonzero(~self.deleted)

    def live_mask(self) -> np.ndarray:
        """uint8 per doc (1 = not deleted), cached: searches on an index with deletes reuse it."""
        if self._live_u8 is None:
            self._live_u8 = (~self.deleted).view(np.uint8)
        return self._live_u8


@dataclass(frozen=True)
class Snapshot:
    """One commit of an index as its handle has loaded it: what sidecar indexes (dense vectors,
    BM25) read to stay keyed to the engine's documents. Each segment state gives ``seg`` (a
    :class:`~stair_es.engine.segment.Segment`: postings, metadata columns, stored fields),
    ``deleted`` (bool per document or None) and ``live`` (its live document count). Read only:
    a snapshot never changes, whatever the index commits afterwards."""

    generation: int
    checksum: int  # the manifest's checksum: (generation, checksum) names one commit
    next_seq: int  # the insertion number the next added document will get
    segments: tuple[_SegState, ...]

    @property
    def key(self) -> tuple[int, int]:
        return (self.generation, self.checksum)

    @property
    def live(self) -> int:
        """Live documents in the commit."""
        return sum(s.live for s in self.segments)

    def live_docs(self, position: int) -> np.ndarray:
        """The local numbers of the live documents of segment ``position``."""
        return self.segments[position].live_docs()

    def locate(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(segment position, local doc) of each live id; -1/-1 when absent."""
        return locate_in(self.segments, list(ids))


def _writes(method):
    """An OS error while writing (disk full, read-only folder, quota) becomes one clear
    :class:`IndexWriteError`: the commit protocol means the last commit is still intact, and
    the temporary files of the failed write are removed by the next writer."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except OSError as e:
            generation = self._manifest.get("generation", "?")
            raise IndexWriteError(
                f"cannot write to the index at {self.path}: {e.strerror or e}"
                f"{' (' + str(e.filename) + ')' if getattr(e, 'filename', None) else ''}. "
                f"Nothing of this change was committed; the last commit (generation {generation}) is intact. "
                "Free disk space or fix permissions, then run the same command again (ingest resumes)") from None
    return run


class EngineIndex(Searcher):
    """An on-disk sparse index with exact top-k by dot product. Use :meth:`create` / :meth:`open`."""

    def __init__(self, path: Path, writable: bool, lock: Any, vocab: Vocabulary):
        self.path = path
        self.writable = writable
        self._lock = lock
        self.vocab = vocab
        self._sig: tuple | None = None
        self._segs: list[_SegState] = []
        self._manifest: dict[str, Any] = {}
        self.schema: IndexSchema = IndexSchema()
        self.merge_factor = 8
        self.max_segments = 8
        self.bshift = DEFAULT_BSHIFT
        self.head_blocks = 64  # blocks visited best-bound-first before the sequential sweep (none when the heap is full on entry)
        # exact search strategy per segment: "auto" (numpy for small work, else a cost model per query and
        # segment), "blockmax", "taat" (numba kernels) or "numpy"
        self.strategy = "auto"
        # "auto" searches a segment with numpy when its query terms have at most this many postings
        self.numpy_max_postings = NP.NUMPY_MAX_POSTINGS
        self._scratch = threading.local()  # per-thread TAAT accumulator, reused across searches
        self._auto_seen: dict[str, np.ndarray] = {}  # see Searcher._auto_options, Searcher._auto_row
        #: threads one query may use (block-max work of a large segment is split by block ranges);
        #: ``search(..., threads=N)`` overrides it per call
        self.search_threads = 1
        self._pool, self._pool_size = None, 0  # threads that run the other parts of a split query
        self._pool_lock = threading.Lock()

    # --- opening --------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str | Path, schema: IndexSchema, *, bshift: int = DEFAULT_BSHIFT) -> "EngineIndex":
        path = Path(path)
        if (path / MANIFEST).exists() or (path / MANIFEST).is_symlink():
            raise IndexExistsError(f"an index already exists at {path}; open it, or delete it first")
        if (damaged := missing_manifest_error(path)) is not None:
            raise damaged
        if not 1 <= bshift <= 8:
            raise InvalidInputError("block size must be 2**1 .. 2**8 documents")
        path.mkdir(parents=True, exist_ok=True)
        manifest = {"format_version": FORMAT_VERSION, "generation": 0, "schema": schema.to_dict(), "segments": [],
                    "next_segment": 1, "next_seq": 0, "bshift": bshift, "writer": writer_version()}
        manifest["checksum"] = manifest_checksum(manifest)
        atomic_write_json(path / MANIFEST, manifest)
        fsync_dir(path.parent)
        return cls.open(path, writable=True)

    @classmethod
    def open(cls, path: str | Path, writable: bool = False, *, vocab: Vocabulary | None = None) -> "EngineIndex":
        path = Path(path)
        try:
            is_file = (path / MANIFEST).is_file()
        except OSError:  # e.g. a symlink loop
            is_file = False
        if not is_file:
            if (path / MANIFEST).exists() or (path / MANIFEST).is_symlink():
                raise DamagedIndexError(f"{path / MANIFEST} is not a readable file (a folder or a broken link); "
                                        "the index is damaged: restore it from a backup")
            raise missing_manifest_error(path) or IndexNotFoundError(
                f"no stair_es index at {path}; create one with `stair-es index create`")
        lock = take_writer_lock(path, "wait for it to finish, or open the index read-only") if writable else None
        idx = cls(path, writable, lock, vocab or default_vocabulary())
        try:
            idx._load()
            if writable:
                idx._clean_unreferenced()
            elif os.environ.get("STAIR_ES_WARM", "").strip().lower() in ("1", "true", "yes", "on"):
                idx.warm()  # $STAIR_ES_WARM: every reader ready for its first query (Searcher.warm)
        except BaseException:
            idx.close()
            raise
        return idx

    def close(self) -> None:
        self._segs = []
        self._stop_mapping()  # (Searcher: the background mapping of newly opened segments)
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> "EngineIndex":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- manifest ---------------------------------------------------------------------------------
    def _stat_sig(self) -> tuple:
        st = os.stat(manifest_file(self.path))
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _load(self) -> None:
        last: Exception | None = None
        for _ in range(20):
            try:
                sig = self._stat_sig()
                try:
                    raw = (self.path / MANIFEST).read_bytes()
                except FileNotFoundError:
                    raise
                except OSError as e:
                    raise DamagedIndexError(f"cannot read {self.path / MANIFEST} ({e.strerror or e}); "
                                            "check its permissions, or restore it from a backup") from None
                try:
                    m = json.loads(raw)
                except (ValueError, UnicodeDecodeError):
                    raise DamagedIndexError(f"the manifest of the index at {self.path} is not valid JSON; the index is "
                                            "damaged: restore manifest.json from a backup") from None
                if isinstance(m, dict):
                    self._check_version(m)
                m = validate_manifest(m, self.path)
                old = {s.seg.name: s.seg for s in self._segs}
                segs = []
                for e in m["segments"]:
                    seg = old.get(e["name"]) or self._opened(Segment.open(self.path / e["file"]))
                    deleted, n_del = None, 0
                    if seg.name != e["name"]:
                        raise DamagedIndexError(f"the file {e['file']} holds segment {seg.name}, not {e['name']}: files of "
                                                f"{self.path} were renamed or swapped; the index is damaged")
                    if seg.n_docs != e["docs"]:
                        raise DamagedIndexError(f"segment {e['name']} holds {seg.n_docs} documents but the manifest "
                                                f"says {e['docs']}: the files of {self.path} do not belong together")
                    if e.get("del_file"):
                        deleted, n_del = read_tombstones(self.path, e, seg.n_docs)
                    segs.append(_SegState(seg, deleted, e.get("del_file"), n_del))
                self._manifest, self._segs, self._sig = m, segs, sig
                self.schema = IndexSchema.from_dict(m["schema"])
                self.bshift = int(m.get("bshift", DEFAULT_BSHIFT))
                return
            except FileNotFoundError as e:  # a writer replaced files between our reads: retry
                last = e
                time.sleep(0.01)
        raise DamagedIndexError(f"the index at {self.path} misses a file its manifest lists ({last}), or keeps changing; "
                                "run `stair-es index check` on it")

    def _check_version(self, m: Mapping[str, Any]) -> None:
        v = m.get("format_version")
        if v != FORMAT_VERSION:
            raise IncompatibleIndexError(
                f"the index at {self.path} has format version {v!r} (written by {m.get('writer', 'an unknown stair_es')}); "
                f"this stair_es ({writer_version()}) reads format {FORMAT_VERSION}: rebuild the index "
                "(`stair-es index create` + ingest) or use the stair_es version that wrote it"
            )

    def refresh(self) -> bool:
        """Pick up commits made by another process/handle. Returns True if anything changed."""
        if self._sig == self._stat_sig():
            return False
        self._load()
        return True

    def _clean_unreferenced(self) -> None:
        """At a writable open: remove temporary files and segment files no valid manifest (current
        or previous) references."""
        prev = read_valid_manifest(self.path / PREV_MANIFEST, self.path)
        if prev is None and (self.path / PREV_MANIFEST).exists():
            return  # an unreadable previous commit: delete nothing it might reference
        self._delete_unreferenced(files_of(self._manifest) | files_of(prev or {}), every_tmp=True)

    def _delete_unreferenced(self, keep: set[str], *, every_tmp: bool = False) -> None:
        """Remove the index's files that neither the current nor the previous commit references
        (``keep``), as Lucene's IndexFileDeleter does: segments and tombstones only older commits
        used, and whatever a writer killed or failing between writing its files and committing
        left behind. Only the writer (it holds the lock) makes such files, and it has none in
        flight here, so nothing a commit needs can go. A reader still on an older commit keeps
        the files it has open (mapped files outlive their names); one loading a commit that went
        meanwhile retries with the newer commit. Temporary files: only the engine's own
        (``.tmp-seg-``, ``.tmp-manifest``) unless ``every_tmp`` (at open), as a reader process may
        be writing a statistics file of its own in the folder at any time."""
        keep = keep | {MANIFEST, PREV_MANIFEST, LOCK}
        mine = (f"{TMP_PREFIX}seg-", f"{TMP_PREFIX}manifest")
        for p in self.path.iterdir():
            name = p.name
            if name in keep or not (name.startswith("seg-") or name.startswith(TMP_PREFIX if every_tmp else mine)):
                continue
            if p.is_file():
                p.unlink(missing_ok=True)

    def _commit(self, segs: list[_SegState], schema: IndexSchema, next_seq: int) -> None:
        m = {**self._manifest, "generation": int(self._manifest["generation"]) + 1, "schema": schema.to_dict(),
             "next_seq": int(next_seq), "writer": writer_version(),
             "segments": [{"name": s.seg.name, "file": s.seg.path.name, "docs": s.seg.n_docs,
                           "del_file": s.del_file, "deleted": s.n_deleted} for s in segs]}
        for e, s in zip(m["segments"], segs):
            if s.del_file and s.deleted is not None:
                e["del_crc32"] = crc32_of(np.packbits(s.deleted).tobytes())
        m["checksum"] = manifest_checksum(m)
        # Write-once: the commit being replaced becomes the previous generation, and neither its
        # files nor the new ones are deleted; what the generations before it alone used goes, and
        # so does anything a killed or failed writer left (no manifest references it).
        prev = dict(self._manifest)  # its next_segment may have moved on since it was loaded: re-checksum
        prev["checksum"] = manifest_checksum(prev)
        atomic_write_json(self.path / PREV_MANIFEST, prev)
        atomic_write_json(self.path / MANIFEST, m)  # the commit point
        keep = files_of(m) | files_of(self._manifest)
        self._manifest, self._segs, self.schema = m, segs, schema
        self._sig = self._stat_sig()
        self._delete_unreferenced(keep)

    def _new_segment_name(self) -> str:
        n = int(self._manifest["next_segment"])
        live = {e["name"] for e in self._manifest["segments"]}
        while f"seg-{n:06d}" in live:  # never overwrite a committed segment, whatever the counter says
            n += 1
        self._manifest["next_segment"] = n + 1
        return f"seg-{n:06d}"

    def _require_writable(self) -> None:
        if not self.writable or self._lock is None:
            raise InvalidInputError(f"the index at {self.path} is open read-only; open it with writable=True to change it")

    # --- id lookup (ids.locate_in: segment position and local doc of each live id) --------------------
    def snapshot(self) -> Snapshot:
        """The commit this handle has loaded (call :meth:`refresh` first for the newest)."""
        m = self._manifest
        return Snapshot(int(m.get("generation", 0)), int(m.get("checksum", 0) or 0), int(m.get("next_seq", 0)),
                        tuple(self._segs))

    def contains(self, ids: Sequence[str]) -> set[str]:
        self.refresh()
        ids = list(ids)
        if not ids:
            return set()
        seg_of, _ = locate_in(self._segs, ids)
        return {i for i, s in zip(ids, seg_of) if s >= 0}

    # --- writing ----------------------------------------------------------------------------------------
    @_writes
    def add(self, docs: Sequence[Document]) -> list[ItemResult]:
        """Add or replace documents; one atomic commit. Returns one item per input document."""
        self._require_writable()
        self.refresh()
        fields = dict(self.schema.fields)
        results: list[ItemResult] = []
        accepted: dict[str, tuple[int, Document, dict[str, Any]]] = {}
        for i, doc in enumerate(docs):
            try:
                if not isinstance(doc, Document):
                    raise InvalidInputError(f"expected a Document, got {type(doc).__name__}")
                for f, v in doc.vectors.items():
                    if f not in self.schema.sparse_fields:
                        raise InvalidInputError(f"unknown sparse field {f!r}; this index has: {', '.join(self.schema.sparse_fields)}")
                    if not isinstance(v, SparseVector):
                        raise InvalidVectorError(f"vector of field {f!r} must be a SparseVector")
                    if v.weights.size and float(v.weights.max()) > F16_MAX:
                        raise InvalidVectorError(f"weights above {F16_MAX} cannot be stored (field {f!r})")
                tmp = IndexSchema(fields=fields, sparse_fields=self.schema.sparse_fields)
                meta, new = tmp.normalize_metadata(doc.metadata)
                if doc.caption is not None and not isinstance(doc.caption, str):
                    raise InvalidInputError("caption must be a string")
                fields.update(new)
                if doc.id in accepted:  # a later duplicate in the same batch wins
                    results[accepted[doc.id][0]].action = "skip"
                    results[accepted[doc.id][0]].error = "replaced by a later document with the same id in this batch"
                accepted[doc.id] = (i, doc, meta)
                results.append(ItemResult(doc.id, True, None, doc.source, "index"))
            except InvalidInputError as e:
                results.append(ItemResult(getattr(doc, "id", None), False, str(e), getattr(doc, "source", None), "index"))
        if not accepted:
            return results
        items = list(accepted.values())
        ids = [d.id for _, d, _ in items]
        vectors = {}
        for f in self.schema.sparse_fields:
            counts = np.zeros(len(items) + 1, np.int64)
            tok, wts = [np.zeros(0, np.int32)], [np.zeros(0, np.uint16)]
            for r, (_, d, _) in enumerate(items):
                v = d.vectors.get(f)
                if v is not None and v.nnz:
                    wb = _f16_bits(v.weights)
                    tok.append(v.ids[wb != 0])
                    wts.append(wb[wb != 0])
                    counts[r + 1] = wts[-1].size
            vectors[f] = (np.cumsum(counts), np.concatenate(tok).astype(np.int32),
                          np.concatenate(wts).astype(np.uint16))
        columns = columns_from_rows([m for _, _, m in items], fields)
        captions = encode_strings([d.caption for _, d, _ in items])
        sources = encode_strings([d.source for _, d, _ in items])
        updated = self._write_batch(ids, vectors, columns, captions, sources, IndexSchema(
            fields=fields, sparse_fields=self.schema.sparse_fields, vocab_name=self.schema.vocab_name,
            vocab_md5=self.schema.vocab_md5, encoder=self.schema.encoder))
        for (i, _, _), up in zip(items, updated):
            if up:
                results[i].action = "update"
        return results

    @_writes
    def add_arrays(self, ids: Sequence[str], vectors: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                   metadata: Sequence[Mapping[str, Any] | None] | None = None, *,
                   columns: Mapping[str, Any] | None = None, captions: Sequence[str | None] | None = None,
                   sources: Sequence[str | None] | None = None) -> int:
        """Fast path: add already-encoded CSR vectors ``{field: (indptr, token ids, weights)}``.

        Token ids must be sorted and unique per row, weights finite and >= 0 (zeros, and
        weights too small for fp16, are dropped), no special tokens. Metadata comes either per
        document (``metadata``: a dict or None each) or per field (``columns``: ``{name: one
        value or None per document}``, e.g. numpy arrays or a DataFrame's columns; NaN in a
        float array means missing), or both for different fields. All-or-nothing: invalid
        input raises, naming the document, before anything is written. Existing ids are
        replaced. ``captions``/``sources``: one string or None per document, stored as ``add``
        stores them (hits show them; BM25 reads captions). Returns the number of documents committed.
        """
        self._require_writable()
        self.refresh()
        ids = list(ids)
        n = len(ids)
        if n == 0:
            return 0
        hashed = HashedIds.checked(ids)
        clean = {f: self._checked_vectors(f, ids, *v) for f, v in vectors.items()}
        fields = dict(self.schema.fields)
        cols: dict = {}
        given = _metadata_columns(ids, metadata, columns)
        tmp = IndexSchema(fields=fields, sparse_fields=self.schema.sparse_fields)
        for name, (values, per_document) in given.items():
            try:
                ftype, vals = tmp.normalize_column(name, values, nan_missing=not per_document)
            except ColumnValueError as e:
                raise InvalidInputError(f"document {ids[e.row]!r}: {e}") from None
            if ftype is None:  # no document has a value
                continue
            if name not in fields:
                fields[name] = ftype
            cols[name] = (ftype, column_arrays(ftype, vals))
        schema = IndexSchema(fields=fields, sparse_fields=self.schema.sparse_fields, vocab_name=self.schema.vocab_name,
                             vocab_md5=self.schema.vocab_md5, encoder=self.schema.encoder)
        for what, given_strings in (("captions", captions), ("sources", sources)):
            if given_strings is not None and len(given_strings) != n:
                raise InvalidInputError(f"add_arrays: {what} must have one entry per id ({len(given_strings)} for {n} ids)")
        self._write_batch(ids, clean, cols, encode_strings(list(captions)) if captions is not None else None,
                          encode_strings(list(sources)) if sources is not None else None, schema, hashed)
        return n

    def _checked_vectors(self, f: str, ids: list[str], indptr, indices, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One sparse field of ``add_arrays`` checked, as (indptr, token ids, fp16 bits) without zeros."""
        n = len(ids)
        self.schema.check_sparse_field(f)
        indptr = np.ascontiguousarray(indptr, np.int64)
        indices = np.ascontiguousarray(indices, np.int32)
        weights = np.ascontiguousarray(weights, np.float32)
        if indptr.shape != (n + 1,) or indptr[0] != 0 or indptr[-1] != indices.size or indices.size != weights.size:
            raise InvalidVectorError(f"field {f!r}: indptr must have len(ids)+1 entries from 0 to nnz, and ids/weights the same length")
        if np.any(np.diff(indptr) < 0):
            raise InvalidVectorError(f"field {f!r}: indptr must be non-decreasing")
        wb = np.empty(indices.size, np.uint16)
        kernel = NP.build_kernel("check_pack_csr", indices.size)
        args = (indptr, indices, weights, VOCAB_SIZE, self.vocab.special_mask, F16_MAX, wb)
        parts = min(os.cpu_count() or 1, 4) if indices.size >= PARALLEL_CHECK_POSTINGS and kernel is K.check_pack_csr else 1
        cuts = np.searchsorted(indptr, np.linspace(0, indices.size, parts + 1)[1:-1]).tolist()
        bounds = list(zip([0] + cuts, cuts + [n]))
        found = self._run_parallel([(lambda lo=lo, hi=hi: kernel(*args, lo, hi)) for lo, hi in bounds])
        status, row = next(((st, r) for st, r, _ in found if st), (0, -1))
        if status:
            why = {1: "token ids must be sorted and unique within a document", 2: f"token ids must lie in [0, {VOCAB_SIZE})",
                   3: "weights must be finite and non-negative", 4: "special tokens are never indexed",
                   5: f"weights above {F16_MAX} cannot be stored"}[status]
            raise InvalidVectorError(f"field {f!r}, document {ids[row]!r}: {why}")
        if sum(z for _, _, z in found):
            keep = wb != 0
            counts = np.bincount(np.repeat(np.arange(n), np.diff(indptr))[keep], minlength=n)
            indptr = np.zeros(n + 1, np.int64)
            np.cumsum(counts, out=indptr[1:])
            indices, wb = indices[keep], wb[keep]
        return indptr, indices, wb

    def _write_batch(self, ids, vectors, columns, captions, sources, schema: IndexSchema,
                     hashed: HashedIds | None = None) -> np.ndarray:
        """Write one new segment, tombstone replaced ids, commit. Returns 'was an update' per id."""
        n = len(ids)
        seq0 = int(self._manifest.get("next_seq", 0))
        h = hashed or HashedIds.of(ids)
        batch = Batch(h.blob, h.offs, np.arange(seq0, seq0 + n, dtype=np.uint64), vectors, columns, captions, sources,
                      id_hash=h.sorted_hashes, id_order=h.order)
        seg_of, doc_of = locate_in(self._segs, ids, h)
        segs = self._tombstoned(seg_of, doc_of)
        cap = segment_capacity(self.bshift)
        chunks = [(lo, min(lo + cap, n)) for lo in range(0, n, cap)]
        for lo, hi in chunks:
            part = batch if (lo, hi) == (0, n) else _slice_batch(batch, lo, hi)
            name = self._new_segment_name()
            seg = build_segment(self.path / f"{name}.seg", name, part, self.schema.sparse_fields, self.bshift, sync_dir=False)
            segs.append(_SegState(seg, None, None, 0))
        fsync_dir(self.path)
        self._commit(segs, schema, seq0 + n)
        self._maybe_merge()
        return seg_of >= 0

    def _tombstoned(self, seg_of: np.ndarray, doc_of: np.ndarray) -> list[_SegState]:
        """The segment states of the next commit with documents ``doc_of`` of segments ``seg_of``
        (-1: none) deleted: a new tombstone file per segment touched."""
        segs = [_SegState(s.seg, s.deleted, s.del_file, s.n_deleted) for s in self._segs]
        gen = int(self._manifest["generation"]) + 1
        for si in np.unique(seg_of[seg_of >= 0]):
            s = segs[si]
            deleted = np.zeros(s.seg.n_docs, bool) if s.deleted is None else s.deleted.copy()
            deleted[doc_of[seg_of == si]] = True
            name = f"{s.seg.name}.del.{gen}"
            atomic_write_bytes(self.path / name, np.packbits(deleted).tobytes(), sync_dir=False)
            s.mark_deleted(deleted, name)
        return segs

    @_writes
    def delete(self, ids: Sequence[str]) -> list[ItemResult]:
        """Delete documents by id (one atomic commit); unknown ids give ok=False items."""
        self._require_writable()
        self.refresh()
        ids = list(ids)
        if not ids:
            return []
        seg_of, doc_of = locate_in(self._segs, ids)
        results = [ItemResult(i, bool(s >= 0), None if s >= 0 else f"no document with id {i!r} in the index at {self.path}",
                              None, "delete") for i, s in zip(ids, seg_of)]
        if (seg_of >= 0).any():
            segs = self._tombstoned(seg_of, doc_of)
            fsync_dir(self.path)
            self._commit(segs, self.schema, int(self._manifest.get("next_seq", 0)))
        return results

    # --- merging ----------------------------------------------------------------------------------------
    def _maybe_merge(self) -> None:
        while len(self._segs) > self.max_segments:
            order = sorted(range(len(self._segs)), key=lambda i: self._segs[i].live)
            pick = sorted(order[: self.merge_factor])
            if sum(self._segs[i].live for i in pick) > segment_capacity(self.bshift):
                return
            self._merge(pick)

    @_writes
    def optimize(self, max_segments: int | None = None) -> None:
        """Merge all segments into as few as possible, dropping deleted documents; a segment in an
        older file format is rewritten in the current one even when it is alone.

        ``max_segments``: merge consecutive segments into at most that many instead (where the
        segments' sizes allow: a segment is never split), each group as small as that allows,
        e.g. ten of 1M documents into two of 5M with 2. Merges are streamed
        (:func:`.merge.merge_segments_to_file`): memory stays a few hundred bytes a document
        plus a fixed chunk of postings, whatever the merged segment's size."""
        self._require_writable()
        self.refresh()
        if max_segments is not None and (isinstance(max_segments, bool) or not isinstance(max_segments, int)
                                         or max_segments < 1):
            raise InvalidInputError(f"max_segments must be a positive integer, got {max_segments!r}")
        groups = pack_groups([s.live for s in self._segs], segment_capacity(self.bshift), max_segments)
        for g in reversed(groups):  # from the end: a merge replaces its group in place, earlier indices hold
            if len(g) > 1 or any(self._segs[i].n_deleted or self._segs[i].seg.outdated for i in g):
                self._merge(g)

    def _merge(self, pick: list[int]) -> None:
        segs = [self._segs[i].seg for i in pick]
        keeps = [self._segs[i].live_docs() for i in pick]
        kept = [s for i, s in enumerate(self._segs) if i not in set(pick)]
        if sum(len(k) for k in keeps):
            name = self._new_segment_name()
            # streamed: the merged postings are never all in memory (merge.merge_segments_to_file)
            seg = merge_segments_to_file(self.path / f"{name}.seg", name, segs, keeps, self.schema.sparse_fields,
                                         self.bshift)
            # the merged segment takes the place of the first merged one: segment order stays insertion order
            kept.insert(pick[0], _SegState(seg, None, None, 0))
        self._commit(kept, self.schema, int(self._manifest.get("next_seq", 0)))

    # --- reading ------------------------------------------------------------------------------------------
    def _find(self, doc_id: str) -> tuple[_SegState, int]:
        seg_of, doc_of = locate_in(self._segs, [doc_id])
        if seg_of[0] < 0:
            raise DocumentNotFoundError(f"no document with id {doc_id!r} in the index at {self.path}")
        return self._segs[int(seg_of[0])], int(doc_of[0])

    def get(self, doc_id: str) -> Document:
        self.refresh()
        s, d = self._find(doc_id)
        s.seg.verify_docs([d])
        vecs = {f: SparseVector(ids, w.astype(np.float32), self.vocab) for f, (ids, w) in s.seg.vectors(d).items() if ids.size}
        return Document(doc_id, vecs, s.seg.metadata(d), s.seg.caption(d), s.seg.source(d))

    def vectors_of(self, doc_ids: Sequence[str], field: str) -> list[SparseVector | None]:
        """Each live document's sparse vector of ``field`` (None when absent), ids looked up together."""
        self.refresh()
        seg_of, doc_of = locate_in(self._segs, list(doc_ids))
        out: list[SparseVector | None] = [None] * len(seg_of)
        for si in np.unique(seg_of[seg_of >= 0]).tolist():  # each segment's docs read together
            at = np.flatnonzero(seg_of == si)
            for i, vecs in zip(at.tolist(), self._segs[si].seg.vectors_of_docs(doc_of[at])):
                found = vecs.get(field)
                if found is not None and found[0].size:
                    out[i] = SparseVector(found[0], found[1].astype(np.float32), self.vocab)
        return out

    def explain(self, doc_id: str, request: SearchRequest) -> Explanation:
        self.refresh()
        req = request.prepared(self.schema, self.vocab)
        s, d = self._find(doc_id)
        vecs = s.seg.vectors(d)
        contributions = []
        score = np.float32(0.0)
        for fi, field, tok, w in self._query_terms(req):
            ids, dw = vecs.get(field, (np.zeros(0, np.int32), np.zeros(0, np.float32)))
            pos = np.searchsorted(ids, tok)
            posc = np.minimum(pos, max(ids.size - 1, 0))
            for t, qw, p in zip(tok, w, posc):
                if ids.size and ids[p] == t:
                    c = np.float32(qw * dw[p])
                    score = np.float32(score + c)  # same order and precision as the search kernel
                    contributions.append(TokenContribution(field, self.vocab.token(int(t)), float(qw), float(dw[p]), float(c)))
        matched = True
        if req.filter is not None:
            matched = bool(s.seg.filter_mask(req.filter, self.schema, self.vocab)[d])
        notes = list(req.notes)
        if not matched:
            notes.append("the document does not pass the filter: search would not return it")
        return Explanation(doc_id, float(score), contributions, matched, notes)

    def doc_freqs(self, field: str) -> tuple[np.ndarray, int]:
        self.refresh()
        fi = self.schema.sparse_fields.index(self.schema.check_sparse_field(field))
        out = np.zeros(VOCAB_SIZE, np.int64)
        live = 0
        for s in self._segs:
            lv = np.zeros(0, np.uint8) if s.deleted is None else (~s.deleted).view(np.uint8)
            scan = s.deleted is None or s.seg.n_postings <= NP.NUMPY_MAX_SCAN
            if s.deleted is not None:  # counting live postings reads every posting
                s.seg.verify_arrays(("pair_block", "pair_cnt", "post_off"))
            (NP.term_freqs if scan else K.term_freqs)(s.seg.keys, s.seg.post_ptr, s.seg.pair_ptr, s.seg.pair_block, s.seg.pair_cnt, s.seg.post_off,
                         s.seg.bshift, lv, fi * VOCAB_SIZE, (fi + 1) * VOCAB_SIZE, out)
            live += s.live
        return out, live

    @property
    def generation(self) -> int:
        """The commit generation this handle currently sees (it grows with every commit)."""
        return int(self._manifest["generation"])

    def scan(self, field: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[str | None]]]:
        """The live documents, one segment at a time, as ``(indptr, token ids, captions)``:
        the sparse ``field``'s token ids in CSR form and each document's caption (None if it
        has none). Read through the verified segments of one generation (the one
        :attr:`generation` reports after the call to :meth:`refresh` made here)."""
        self.refresh()
        fi = self.schema.sparse_fields.index(self.schema.check_sparse_field(field))
        for s in list(self._segs):
            keep = s.live_docs()
            if not keep.size:
                continue
            keep_map = np.full(s.seg.n_docs, -1, np.int64)
            keep_map[keep] = np.arange(keep.size)
            seg = s.seg
            ptr, tok, _ = K.postings_to_csr(seg.n_docs, seg.keys, seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt,
                                            seg.post_off, seg.post_w, fi * VOCAB_SIZE, (fi + 1) * VOCAB_SIZE, seg.bshift,
                                            keep_map)
            captions = [seg.caption(int(d)) for d in keep]
            yield ptr, tok, captions

    @property
    def doc_count(self) -> int:
        self.refresh()
        return sum(s.live for s in self._segs)

    def stats(self) -> dict[str, Any]:
        self.refresh()
        per_field: dict[str, int] = {f: 0 for f in self.schema.sparse_fields}
        for s in self._segs:
            for f, c in s.seg.postings_per_field().items():
                per_field[f] = per_field.get(f, 0) + c
        postings = sum(s.seg.n_postings for s in self._segs)
        size = folder_bytes(self.path)  # a writer's temporary files may come and go meanwhile
        posting_bytes = sum(
            sum(s.seg.a[n].nbytes for n in ("keys", "post_ptr", "pair_ptr", "pair_block", "pair_cnt", "pair_max", "pair_sub",
                                            "post_off", "post_w") if n in s.seg.a)
            for s in self._segs)
        return {
            "docs": sum(s.live for s in self._segs),
            "deleted": sum(s.n_deleted for s in self._segs),
            "segments": len(self._segs),
            "generation": int(self._manifest["generation"]),
            "postings": postings,
            "postings_per_field": per_field,
            "bytes_on_disk": size,
            "posting_bytes": posting_bytes,
            "bytes_per_posting": posting_bytes / postings if postings else None,
            "block_docs": 1 << self.bshift,
        }


def _metadata_columns(ids: list[str], metadata, columns) -> dict[str, Any]:
    """``add_arrays``' metadata as ``{field: (one value or None per document, from dicts?)}``: the
    per-document dicts transposed (so that each field is checked as one column), and the given
    columns."""
    n = len(ids)
    out: dict[str, Any] = {}
    if metadata is not None:
        if len(metadata) != n:
            raise InvalidInputError(f"metadata must have one entry (or None) per id: {len(metadata)} for {n} ids")
        if not set(map(type, metadata)) <= {dict, type(None)}:
            for i, md in zip(ids, metadata):
                if md is not None and not isinstance(md, Mapping):
                    raise InvalidInputError(f"document {i!r}: metadata must be a JSON object, got {type(md).__name__}")
        names = set().union(*filter(None, metadata))  # iterating a mapping gives its keys
        for name in sorted(names, key=str):
            out[name] = ([None if md is None else md.get(name) for md in metadata], True)
    for name, values in (columns or {}).items():
        if name in out:
            raise InvalidInputError(f"metadata field {name!r} is given both per document and as a column; give it once")
        if len(values) != n:
            raise InvalidInputError(f"metadata column {name!r} has {len(values)} values for {n} ids; give one (or None) per id")
        out[name] = (values, False)
    return out


def _slice_batch(b: Batch, lo: int, hi: int) -> Batch:
    rows = np.arange(lo, hi)
    gather = NP.build_kernel("gather_strings", int(b.id_offs[-1]))
    ib, io = gather(b.id_blob, b.id_offs, rows)
    vectors = {f: (indptr[lo:hi + 1] - indptr[lo], ids[indptr[lo]:indptr[hi]], wb[indptr[lo]:indptr[hi]])
               for f, (indptr, ids, wb) in b.vectors.items()}
    caps, srcs = ((*gather(t[0], t[1], rows), t[2][lo:hi]) if t is not None else None for t in (b.captions, b.sources))
    return Batch(ib, io, b.seq[lo:hi], vectors, take_columns(b.columns, rows), caps, srcs)
