"""Optional dense vectors: the third retriever of hybrid search.

Owns: checking a vector against the index's dense field (:class:`~stair_es.schema.DenseSpec`,
a schema type: dimension, similarity, storage type, the model that makes the vectors), the
query vector (given, or the index's dense model's text side), the dense encoder (a checkpoint
trained with ``stair-es train --head dense``) and, on the embedded engine, the store that keeps
the vectors beside the segments and the exact flat search over it. It must not know about the
Elasticsearch/OpenSearch DSL (:mod:`stair_es.hybrid` builds that).

The embedded store, ``<index>/dense/``:

* ``spec.json``: the :class:`DenseSpec` (written once, when the index is created);
* ``part-<seq>.stair``: one file per ingested batch holding the vectors of that batch, keyed by
  the engine's per-document insertion sequence number (``seq``, unique per insertion and kept
  by merges), written with the engine's discipline (temporary file, fsync, atomic rename,
  CRC-32 chunk checksums), memory-mapped to read;
* ``pending.stair``: the vectors of a batch being ingested, keyed by document id, written
  before the engine's commit of that batch and turned into a part file right after it.

The engine's live documents decide what exists: a deleted or replaced document's vector is
simply no longer looked up (an update gets a new ``seq``), so deletes, updates and merges need
no change here. A crash between the pending file and the engine commit leaves a pending file
whose documents were never committed (no live ``seq`` in its range): it is discarded. A crash
after the commit leaves a pending file whose documents are live: the next reader uses it, the
next writer turns it into a part file. Part files are merged in tiers (the smallest first, as
the engine merges segments), dropping the vectors of dead documents.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import DamagedIndexError, InvalidInputError, InvalidVectorError, ModelError, StairError
from .lexical import commit_key, filter_rows
from .schema import DENSE_FIELD, DTYPES, MAX_DIMS, SIMILARITIES, DenseSpec, as_vector  # noqa: F401 - the dense API

log = logging.getLogger(__name__)

FOLDER = "dense"
SPEC_FILE = "spec.json"
PENDING = "pending.stair"
FORMAT = 1
F16_MAX = 65504.0
MAX_PARTS = 16  # more part files than this: the MERGE_PARTS smallest are merged into one
MERGE_PARTS = 8


def no_dense_error(index: str) -> InvalidInputError:
    return InvalidInputError(
        f"index {index!r} has no dense vectors (no {DENSE_FIELD!r} field), so the dense retriever cannot run: create an "
        f"index with a dense field (`stair-es index create NAME --dense-dims N`, or `stair-es ingest NAME CATALOG "
        "--dense-model PATH` into a new index) and ingest with --dense-model PATH or a \"dense\" array per JSONL line"
    )


# --- vectors -----------------------------------------------------------------------------------
def prepare(vector: Any, spec: DenseSpec, what: str) -> np.ndarray:
    """Check ``vector`` against ``spec`` (dimension, finite) and bring it to its stored form."""
    if isinstance(vector, np.ndarray) and vector.dtype == np.float32 and vector.ndim == 1 and vector.size \
            and np.isfinite(vector).all():
        v = vector  # already checked (a Document's vector): skip the float64 round trip
    else:
        v = as_vector(vector, what)
    if v.size != spec.dims:
        raise InvalidVectorError(f"{what} has {v.size} dimensions but the index's dense field has {spec.dims}: "
                                 "use vectors from the model the index was built with")
    if spec.similarity == "cosine":
        n = float(np.linalg.norm(v.astype(np.float64)))
        if n == 0.0:
            raise InvalidVectorError(f"{what} is all zeros: it has no direction, so no cosine similarity")
        v = (v / n).astype(np.float32)
    elif spec.dtype == "float16" and float(np.abs(v).max()) > F16_MAX:
        raise InvalidVectorError(f"{what} has a value above {F16_MAX}, which float16 storage cannot hold: "
                                 "create the index with float32 dense storage")
    return v


def read_vector_file(path: str | Path) -> np.ndarray:
    """A query vector from a file: ``.npy``, or JSON (a list of numbers, or {"vector": [...]})."""
    p = Path(path).expanduser()
    try:
        if p.suffix.lower() == ".npy":
            data = np.load(p, allow_pickle=False).ravel()
        else:
            data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidInputError(f"--vector-file {p}: no such file") from None
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"--vector-file {p}: cannot read a vector ({e}); give a JSON list of numbers or a .npy file") from None
    if isinstance(data, Mapping):
        data = data.get("vector", data.get("dense"))
    return as_vector(data, f"the vector in {p}")


# --- the dense encoder (a `--head dense` checkpoint) ---------------------------------------------
class DenseEncoder:
    """Images and texts to dense vectors in one space, from a checkpoint trained with
    ``stair-es train --head dense`` (a local folder or a hub id)."""

    name = "stair-dense"

    def __init__(self, model: str, device: str | None = None):
        # lazy: torch takes seconds to import; loaded only when a model runs
        import torch

        from .stair.model import StairModel

        self._torch = torch
        # a local folder is recorded as an absolute path, so queries from another folder find it
        self.model_name = str(Path(model).expanduser().resolve()) if Path(model).expanduser().is_dir() else str(model)
        self.model = StairModel.from_pretrained(self.model_name, device=device)
        if self.model.is_sparse:
            raise ModelError(f"{model} has the {self.model.head!r} head, not a dense one: a dense model is trained with "
                             "`stair-es train DATA -o DIR --head dense`; sparse models go in --encoder stair --model")
        self.model.eval()

    @property
    def dims(self) -> int:
        return int(self.model.config.dense_dim)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model_name}

    def spec(self, dtype: str = "float16") -> DenseSpec:
        return DenseSpec(self.dims, "cosine", dtype, self.config())

    def encode_images(self, images: Sequence[Any], batch_size: int = 32) -> np.ndarray:
        return self._batched(images, batch_size, lambda b: self.model.encode_image(self.model.preprocess_images(b)))

    def encode_texts(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self._batched(texts, batch_size, lambda b: self.model.encode_text(*self.model.tokenize(list(b))[:2]))

    def _batched(self, items: Sequence[Any], batch_size: int, encode: Any) -> np.ndarray:
        """``encode`` over ``items`` ``batch_size`` at a time, without gradients: one float32 matrix."""
        with self._torch.no_grad():
            out = [encode(items[i : i + batch_size]).cpu().numpy() for i in range(0, len(items), batch_size)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, self.dims), np.float32)


_encoders: dict[str, DenseEncoder] = {}


def dense_encoder(config: Mapping[str, Any]) -> DenseEncoder:
    """The dense encoder a spec records (cached per model for the process)."""
    if config.get("name") != DenseEncoder.name or not config.get("model"):
        raise InvalidInputError(f"unknown dense encoder {dict(config)!r}; stair_es makes dense vectors with "
                                f"{{'name': {DenseEncoder.name!r}, 'model': PATH}}")
    key = str(config["model"])
    if key not in _encoders:
        _encoders[key] = DenseEncoder(key)
    return _encoders[key]


def query_vector(spec: DenseSpec, index: str, *, text: str | None = None, vector: Any = None) -> np.ndarray:
    """The dense query: ``vector`` if given, else ``text`` through the index's dense model's text side."""
    if vector is not None:
        return prepare(vector, spec, "the query vector")
    if not spec.encoder:
        raise InvalidInputError(
            f"index {index!r} records no dense model to encode the query text (its vectors came with the catalog): "
            "give the query vector with --vector-file FILE (API: vector=...)")
    if not text or not text.strip():
        raise InvalidInputError("the dense retriever needs a query TEXT (encoded by the index's dense model) or --vector-file")
    return prepare(dense_encoder(spec.encoder).encode_texts([text])[0], spec, "the query's dense vector")


# --- the embedded store ------------------------------------------------------------------------
def folder(index_path: str | Path) -> Path:
    return Path(index_path) / FOLDER


def read_spec(index_path: str | Path) -> DenseSpec | None:
    f = folder(index_path) / SPEC_FILE
    if not f.is_file():
        return None
    try:
        return DenseSpec.from_dict(json.loads(f.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError, InvalidInputError) as e:
        raise DamagedIndexError(f"{f} cannot be read ({e}); the index's dense field is damaged") from None


def write_spec(index_path: str | Path, spec: DenseSpec) -> None:
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import atomic_write_json, fsync_dir

    d = folder(index_path)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_json(d / SPEC_FILE, spec.to_dict())
    fsync_dir(d.parent)


def _ids_arrays(ids: Sequence[str]) -> dict[str, np.ndarray]:
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.segment import encode_ids

    blob, offs = encode_ids(list(ids))
    return {"id_blob": blob, "id_offs": offs}


def _ids_from(arrays: Mapping[str, np.ndarray]) -> list[str]:
    blob, offs = bytes(arrays["id_blob"]), arrays["id_offs"]
    return [blob[int(offs[i]) : int(offs[i + 1])].decode("utf-8") for i in range(offs.size - 1)]


def _load(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import read_arrays, verified_once

    try:
        verified_once(path)
        return read_arrays(path)
    except (StairError, OSError, ValueError) as e:
        raise DamagedIndexError(
            f"the dense vector file {path} is damaged ({str(e).splitlines()[0][:160]}); its vectors cannot be "
            "recovered from the segments: ingest the catalog again with --reindex (or restore a backup)") from None


def _live(ix: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment position, local doc, seq) of every live document of the engine commit ``ix`` has loaded."""
    pos, loc, seq = [], [], []
    snap = ix.snapshot()
    for si, s in enumerate(snap.segments):
        docs = snap.live_docs(si)
        pos.append(np.full(docs.size, si, np.int32))
        loc.append(docs.astype(np.int64))
        seq.append(np.asarray(s.seg.seq, np.uint64)[docs])
    if not pos:
        return np.zeros(0, np.int32), np.zeros(0, np.int64), np.zeros(0, np.uint64)
    return np.concatenate(pos), np.concatenate(loc), np.concatenate(seq)


def _resolve_pending(ix: Any, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(seqs, rows) of a pending file's vectors whose documents the engine committed."""
    ids = _ids_from(arrays)
    if not ids:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    seq0 = int(meta["seq0"])
    snap = ix.snapshot()
    seg_of, doc_of = snap.locate(ids)
    seqs, rows = [], []
    next_seq = snap.next_seq
    for r, (si, d) in enumerate(zip(seg_of, doc_of)):
        if si < 0:
            continue
        sq = int(snap.segments[int(si)].seg.seq[int(d)])
        if seq0 <= sq < next_seq:  # written by the commit that followed this pending file
            seqs.append(sq)
            rows.append(r)
    return np.asarray(seqs, np.uint64), np.asarray(rows, np.int64)


class DenseStore:
    """The dense vectors of one embedded index (see the module docstring for the files)."""

    def __init__(self, index_path: str | Path, spec: DenseSpec):
        self.dir = folder(index_path)
        self.spec = spec

    # --- writing (by the index's one writer) ----------------------------------------------------
    def begin(self, ix: Any, ids: Sequence[str], vectors: Sequence[np.ndarray]) -> None:
        """Before the engine commit of a batch: save its vectors under their ids."""
        # lazy: the engine (numba) loads only when an embedded index is opened
        from .engine.storage import write_arrays

        self.recover(ix)
        if not ids:
            return  # nothing to keep for this batch: no pending file, no part file
        last = {i: k for k, i in enumerate(ids)}  # an id twice in a batch: the later document wins, as in the engine
        keep = sorted(last.values())
        ids, vectors = [ids[k] for k in keep], [vectors[k] for k in keep]
        self.dir.mkdir(exist_ok=True)
        mat = np.stack(vectors).astype(self.spec.dtype)
        arrays = {**_ids_arrays(ids), "vectors": mat}
        meta = {"format": FORMAT, "kind": "pending", "seq0": ix.snapshot().next_seq,
                "dims": self.spec.dims, "dtype": self.spec.dtype}
        write_arrays(self.dir / PENDING, arrays, meta)
        self._batch = (arrays, meta)  # finish() needs not read back what it just wrote

    def finish(self, ix: Any) -> None:
        """After the engine commit: the pending vectors become a part file keyed by ``seq``."""
        batch, self._batch = getattr(self, "_batch", None), None
        self.recover(ix, batch)
        self.maybe_compact(ix)

    def recover(self, ix: Any, batch: tuple | None = None) -> None:
        """Turn a pending file into a part file (the vectors of its committed documents) and remove it.
        ``batch``: the pending file's (arrays, meta) when the caller has them in memory."""
        # lazy: the engine (numba) loads only when an embedded index is opened
        from .engine.storage import write_arrays

        p = self.dir / PENDING
        if not p.is_file():
            return
        ix.refresh()
        try:
            arrays, meta = batch if batch is not None else _load(p)
            seqs, rows = _resolve_pending(ix, arrays, meta)
        except DamagedIndexError as e:
            # written atomically, so never torn by a crash; damaged on disk afterwards: say so, then drop it
            log.warning("%s; its documents have no dense vector now (stair-es index check lists them)", e)
            seqs, rows = np.zeros(0, np.uint64), np.zeros(0, np.int64)
            arrays = None
        if seqs.size:
            order = np.argsort(seqs, kind="stable")
            write_arrays(self.dir / f"part-{int(seqs[order[0]]):012d}.stair",
                         {"seqs": seqs[order], "vectors": np.asarray(arrays["vectors"])[rows[order]]},
                         {"format": FORMAT, "kind": "part", "dims": self.spec.dims, "dtype": self.spec.dtype})
        p.unlink(missing_ok=True)

    def parts(self) -> list[Path]:
        return sorted(self.dir.glob("part-*.stair")) if self.dir.is_dir() else []

    def maybe_compact(self, ix: Any, *, force: bool = False) -> bool:
        """Merge part files, dropping the vectors of dead documents (deleted or replaced).

        Tiered, as the engine merges segments: when there are more than :data:`MAX_PARTS` files,
        the :data:`MERGE_PARTS` smallest become one, so each vector is rewritten O(log n) times;
        when the files hold more than twice as many rows as the index has live documents, or
        with ``force``, all of them become one. A crash between writing the merged file and
        removing the old ones leaves the same vectors twice under the same ``seq``: harmless."""
        # lazy: the engine (numba) loads only when an embedded index is opened
        from .engine.storage import fsync_dir, write_arrays

        parts = self.parts()
        if not parts:
            return False
        sizes = {p: int(_load(p)[0]["seqs"].size) for p in parts}
        live_docs = ix.snapshot().live
        if force or (len(parts) > 1 and sum(sizes.values()) > 2 * live_docs + 1000):
            pick = parts
        elif len(parts) > MAX_PARTS:
            pick = sorted(parts, key=lambda p: (sizes[p], p.name))[:MERGE_PARTS]
        else:
            return False
        live = np.sort(_live(ix)[2])
        seqs, vecs = [], []
        for p in pick:
            arrays, _ = _load(p)
            sq = np.asarray(arrays["seqs"], np.uint64)
            at = np.minimum(np.searchsorted(live, sq), max(live.size - 1, 0))
            keep = (live[at] == sq) if live.size else np.zeros(sq.size, bool)
            seqs.append(sq[keep])
            vecs.append(np.asarray(arrays["vectors"])[keep])
        seq = np.concatenate(seqs)
        order = np.argsort(seq, kind="stable")
        merged = np.concatenate(vecs)[order]
        uniq, idx = np.unique(seq[order], return_index=True)  # a seq twice (an earlier crashed merge): once
        name = f"part-{int(uniq[0]) if uniq.size else 0:012d}-m{time.time_ns():x}.stair"
        write_arrays(self.dir / name, {"seqs": uniq, "vectors": merged[idx].astype(self.spec.dtype)},
                     {"format": FORMAT, "kind": "part", "dims": self.spec.dims, "dtype": self.spec.dtype})
        for p in pick:
            p.unlink(missing_ok=True)
        fsync_dir(self.dir)
        return True


class DenseView:
    """The dense vectors of the live documents of one engine commit: per part file, which of its
    rows are live and where they are (segment position, local doc)."""

    def __init__(self, spec: DenseSpec, chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]], key: tuple):
        self.spec = spec
        self.chunks = chunks  # (vectors (memory-mapped), live rows, segment position, local doc)
        self.key = key
        self.seq = np.concatenate([c[4] for c in chunks]) if chunks else np.zeros(0, np.uint64)

    @property
    def n(self) -> int:
        return int(sum(c[1].size for c in self.chunks))

    @classmethod
    def build(cls, ix: Any, store: DenseStore) -> "DenseView":
        pos, loc, seq = _live(ix)
        order = np.argsort(seq, kind="stable")
        live_sorted = seq[order]
        claimed = np.zeros(seq.size, bool)  # a document's vector comes from one file (the newest part wins)
        sources: list[tuple[np.ndarray, np.ndarray]] = []
        for p in reversed(store.parts()):
            arrays, _ = _load(p)
            sources.append((arrays["seqs"], arrays["vectors"]))
        pend = store.dir / PENDING
        if pend.is_file():
            try:
                arrays, meta = _load(pend)
                s, r = _resolve_pending(ix, arrays, meta)
                if s.size:
                    sources.insert(0, (s, np.asarray(arrays["vectors"])[r]))
            except DamagedIndexError as e:
                log.warning("%s", e)  # written atomically: damaged on disk, not by a crash
        chunks = []
        for sq, vecs in sources:
            if vecs.ndim != 2 or vecs.shape[1] != store.spec.dims:
                raise DamagedIndexError(f"a dense vector file in {store.dir} has vectors of shape {vecs.shape}, "
                                        f"not (n, {store.spec.dims}); the index's dense field is damaged")
            at = np.searchsorted(live_sorted, sq)
            at_c = np.minimum(at, max(live_sorted.size - 1, 0))
            hit = (at < live_sorted.size) & (live_sorted[at_c] == sq) if live_sorted.size else np.zeros(sq.size, bool)
            rows = np.flatnonzero(hit)
            li = order[at_c[rows]]
            fresh = ~claimed[li]
            rows, li = rows[fresh], li[fresh]
            li, first = np.unique(li, return_index=True)  # one row per document even if a file repeats a seq
            rows = rows[first]
            claimed[li] = True
            if rows.size:
                chunks.append((vecs, rows, pos[li], loc[li], seq[li]))
        return cls(store.spec, chunks, commit_key(ix))

    def matrix(self) -> np.ndarray:
        """The live vectors as one float32 matrix (rows in chunk order), built once per view.

        A single float32 part file whose every row is live is used as it is (memory-mapped, no
        copy); otherwise the live rows are gathered once into memory (n x dims x 4 bytes): numpy
        converts float16 and gathers rows slowly, so doing it per query would cost 10-20x more."""
        m = getattr(self, "_mat", None)
        if m is None:
            if len(self.chunks) == 1 and self.chunks[0][0].dtype == np.float32 and \
                    self.chunks[0][1].size == self.chunks[0][0].shape[0] and \
                    np.array_equal(self.chunks[0][1], np.arange(self.chunks[0][1].size)):
                m = self.chunks[0][0]
            elif self.chunks:
                m = np.concatenate([np.asarray(c[0][c[1]], np.float32) for c in self.chunks])
            else:
                m = np.zeros((0, self.spec.dims), np.float32)
            self._mat = m
            self._pos = np.concatenate([c[2] for c in self.chunks]) if self.chunks else np.zeros(0, np.int32)
            self._loc = np.concatenate([c[3] for c in self.chunks]) if self.chunks else np.zeros(0, np.int64)
        return m

    def scores(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(score, segment position, local doc, seq) of every live document with a vector."""
        m = self.matrix()
        # einsum, not ``m @ q``: a matrix-vector product gains nothing from BLAS threads, and on a
        # busy machine OpenBLAS's threads made it 10-30x slower here (20 ms vs 0.6 ms at 20k x 64)
        return np.einsum("ij,j->i", m, np.asarray(q, np.float32)), self._pos, self._loc, self.seq


_views: dict[str, tuple[tuple, DenseView]] = {}  # index folder -> (commit and files key, view)
_views_lock = threading.Lock()


def _files_key(store: DenseStore) -> tuple:
    files = store.parts() + ([store.dir / PENDING] if (store.dir / PENDING).is_file() else [])
    out = []
    for f in files:
        try:
            st = f.stat()
        except FileNotFoundError:
            continue
        out.append((f.name, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def view_of(ix: Any, spec: DenseSpec) -> DenseView:
    """The dense view of ``ix``'s current commit (cached per commit and set of vector files)."""
    ix.refresh()
    store = DenseStore(ix.path, spec)
    key = (ix.snapshot().key, _files_key(store))
    with _views_lock:
        got = _views.get(str(ix.path))
        if got is not None and got[0] == key:
            return got[1]
    v = DenseView.build(ix, store)
    with _views_lock:
        _views[str(ix.path)] = (key, v)
    return v


def search_embedded(ix: Any, spec: DenseSpec, q: np.ndarray, top_k: int, flt: Any = None,
                    notes: list[str] | None = None) -> list[tuple[Any, int, float]]:
    """Exact top ``top_k`` by the spec's similarity after ``flt``: ``[(segment state, local doc, score)]``."""
    view = view_of(ix, spec)
    segs = ix.snapshot().segments  # the commit the view was built from
    score, pos, loc, seq = view.scores(np.asarray(q, np.float32))
    if flt is not None and score.size:
        keep = filter_rows(ix, segs, flt, pos, loc)
        score, pos, loc, seq = score[keep], pos[keep], loc[keep], seq[keep]
    live = sum(s.live for s in segs)
    if notes is not None and view.n < live:
        notes.append(f"{live - view.n} of {live} documents have no dense vector: the dense retriever cannot find them")
    if not score.size:
        return []
    k = min(top_k, score.size)
    cand = np.argpartition(-score, k - 1)[:k] if k < score.size else np.arange(score.size)
    # ties: older insertion first, as the sparse engine breaks them
    cand = cand[np.lexsort((seq[cand], -score[cand]))]
    return [(segs[int(pos[i])], int(loc[i]), float(score[i])) for i in cand]


def vector_of(ix: Any, spec: DenseSpec, doc_id: str) -> np.ndarray | None:
    """The stored dense vector of live document ``doc_id`` (float32), or None when it has none."""
    seg_of, doc_of = ix.snapshot().locate([doc_id])
    if seg_of[0] < 0:
        return None
    view = view_of(ix, spec)
    for vecs, rows, pos, loc, _ in view.chunks:
        hit = np.flatnonzero((pos == seg_of[0]) & (loc == doc_of[0]))
        if hit.size:
            return np.asarray(vecs[rows[hit[0]]], np.float32)
    return None


# --- `stair-es index check` ----------------------------------------------------------------------
def check_files(index_path: str | Path, *, repair: bool = False) -> dict[str, Any] | None:
    """Verify every dense vector file of an embedded index (checksums, shape, dimension).

    With ``repair``, damaged part files are removed (a damaged pending file is always
    discardable: its batch is in a part file or was never committed); the documents left
    without a vector are listed by id (ingest them again with ``--reindex``). None when the
    index has no dense field."""
    # lazy: the engine (numba) loads only when an embedded index is opened
    from .engine.storage import verify_file

    spec = read_spec(index_path)
    if spec is None:
        return None
    d = folder(index_path)
    files = sorted(d.glob("part-*.stair")) + ([d / PENDING] if (d / PENDING).is_file() else [])
    rows, damaged = [], []
    for f in files:
        err, n = None, None
        try:
            verify_file(f)
            arrays, meta = _load(f)
            vecs = arrays["vectors"]
            n = int(vecs.shape[0])
            if vecs.ndim != 2 or vecs.shape[1] != spec.dims:
                err = f"vectors of shape {tuple(vecs.shape)}, not (n, {spec.dims})"
        except (StairError, OSError, ValueError, KeyError) as e:
            err = str(e).splitlines()[0][:200]
        rows.append({"file": f.name, "rows": n, "error": err})
        if err:
            damaged.append(f)
    out: dict[str, Any] = {"dims": spec.dims, "dtype": spec.dtype, "files": rows, "ok": not damaged, "repaired": False}
    if damaged and repair:
        # lazy: the engine (numba) loads only when an embedded index is opened
        from .engine import EngineIndex

        for f in damaged:
            f.unlink(missing_ok=True)
        ix = EngineIndex.open(Path(index_path), writable=False)
        try:
            view = DenseView.build(ix, DenseStore(index_path, spec))
            have = {(int(p), int(lo)) for c in view.chunks for p, lo in zip(c[2], c[3])}
            pos, loc, _ = _live(ix)
            segs = ix.snapshot().segments
            out["docs_without_vector"] = [segs[int(p)].seg.doc_id(int(lo))
                                          for p, lo in zip(pos, loc) if (int(p), int(lo)) not in have]
        finally:
            ix.close()
        out["repaired"] = True
    return out
