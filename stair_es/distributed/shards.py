"""The shard folder that ``stair-es encode-catalog`` writes and ``stair-es ingest`` reads.

Layout of OUT_DIR::

    _stair_shards.json            what the folder holds: format, source, shard size, encoder config
    part-00000.parquet            encoded documents of shard 0 (one row per document)
    failures-00000.parquet        inputs of shard 0 that could not be used, and why (only if any)
    _manifest/part-00000.json     shard 0 is finished: rows, failures, bytes, a hash of its ids

A shard file has the columns ``id``, ``source`` (image path or URL), ``caption``, ``metadata``
(a JSON object as text: metadata differ in fields and types from one document to the next),
``warning`` and, for each sparse field F, ``F_ids`` (list<int32>, sorted token ids) and
``F_weights`` (list<float32>, exactly the encoder's weights). Its Parquet key-value metadata
``stair_es`` holds ``{"format", "encoder", "sparse_fields", "shard", "rows"}``: every shard
says which encoder made it, so a folder that mixes encoders is caught shard by shard.

Commit protocol: a worker writes its shard files under temporary names, renames them, then
writes the manifest entry (also by rename). A shard without a manifest entry is unfinished
(a crash came between) and is encoded again by the next run, over the same file name, so no
id is ever written twice; one whose size no longer matches its entry (truncated, replaced)
is refused by ``ingest`` and encoded again by ``encode-catalog``.
Paths go through pyarrow's filesystems, so OUT_DIR may be ``s3://`` or ``gs://`` too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import InvalidInputError, MissingDependencyError

FORMAT = 1
HEADER = "_stair_shards.json"
MANIFEST_DIR = "_manifest"
META_KEY = b"stair_es"


def pyarrow_modules():
    """(pyarrow, pyarrow.parquet, pyarrow.fs), or a one-line error naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingDependencyError("Parquet shards (encode-catalog, ingest of a shard folder)", "distributed",
                                     "pyarrow") from None
    return pa, pq, pafs


def is_remote(location: str) -> bool:
    return "://" in str(location) and not str(location).startswith("file://")


def is_shard_folder(location: str | os.PathLike) -> bool:
    """Whether ``location`` is a folder written by ``encode-catalog`` (it has the header file)."""
    text = str(location)
    if is_remote(text):
        try:
            fs, path = open_fs(text)
            return fs.get_file_info(f"{path}/{HEADER}").is_file
        except Exception:  # noqa: BLE001 - not reachable or not ours: not a shard folder
            return False
    return (Path(text).expanduser() / HEADER).is_file()


def open_fs(location: str):
    """(pyarrow filesystem, path inside it) for a local path or a URI (s3://, gs://, file://)."""
    _, _, pafs = pyarrow_modules()
    if is_remote(location) or str(location).startswith("file://"):
        try:
            return pafs.FileSystem.from_uri(str(location))
        except Exception as e:  # noqa: BLE001 - pyarrow has no filesystem for it: try fsspec's
            try:
                import fsspec

                fs, path = fsspec.core.url_to_fs(str(location))
                return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path
            except Exception:  # noqa: BLE001
                raise InvalidInputError(f"{location}: cannot open this location ({e})") from None
    return pafs.LocalFileSystem(), str(Path(location).expanduser().resolve())


def shard_name(k: int) -> str:
    return f"part-{k:05d}.parquet"


def failures_name(k: int) -> str:
    return f"failures-{k:05d}.parquet"


def ids_digest(ids: Iterable[str]) -> str:
    """A hash of a shard's ids in order: a re-run checks that a finished shard still covers the
    same inputs (a catalog that changed would otherwise shift ids between shards)."""
    h = hashlib.sha1()
    for i in ids:
        h.update(i.encode("utf-8", "surrogatepass"))
        h.update(b"\n")
    return h.hexdigest()


# --- writing --------------------------------------------------------------------------------------

def _write_atomic(fs, path: str, write) -> None:
    """``write(fs, tmp)`` under a temporary name, then renamed to ``path`` (never read half-written)."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    write(fs, tmp)
    fs.move(tmp, path)


def write_json_atomic(fs, path: str, obj: Any) -> None:
    data = json.dumps(obj, indent=1, ensure_ascii=False, sort_keys=True).encode("utf-8")

    def write(fs, tmp):
        with fs.open_output_stream(tmp) as out:
            out.write(data)
    _write_atomic(fs, path, write)


def read_json(fs, path: str) -> Any | None:
    if not fs.get_file_info(path).is_file:
        return None
    with fs.open_input_stream(path) as fh:
        return json.loads(fh.read().decode("utf-8"))


@dataclass
class ShardRows:
    """One shard's encoded documents as columns (built by the worker, written once)."""

    ids: list[str] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    captions: list[str | None] = field(default_factory=list)
    metadata: list[str] = field(default_factory=list)
    warnings: list[str | None] = field(default_factory=list)
    vectors: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = field(default_factory=dict)

    def add(self, doc: Any, warning: str | None, sparse_fields: Sequence[str]) -> None:
        self.ids.append(doc.id)
        self.sources.append(doc.source)
        self.captions.append(doc.caption)
        self.metadata.append(json.dumps(doc.metadata or {}, ensure_ascii=False, sort_keys=True))
        self.warnings.append(warning)
        for f in sparse_fields:
            ids, ws = self.vectors.setdefault(f, ([], []))
            v = doc.vectors.get(f)
            ids.append(v.ids if v is not None else np.zeros(0, np.int32))
            ws.append(v.weights if v is not None else np.zeros(0, np.float32))


def _list_column(pa, parts: list[np.ndarray], dtype) -> Any:
    lens = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


def write_shard(fs, folder: str, k: int, rows: ShardRows, encoder: dict[str, Any], sparse_fields: Sequence[str]) -> int:
    """Write shard ``k`` (atomically: temporary name, then rename). Returns its size in bytes."""
    pa, pq, _ = pyarrow_modules()
    cols = {
        "id": pa.array(rows.ids, pa.string()),
        "source": pa.array(rows.sources, pa.string()),
        "caption": pa.array(rows.captions, pa.string()),
        "metadata": pa.array(rows.metadata, pa.string()),
        "warning": pa.array(rows.warnings, pa.string()),
    }
    for f in sparse_fields:
        ids, ws = rows.vectors.get(f, ([], []))
        cols[f"{f}_ids"] = _list_column(pa, ids, np.int32)
        cols[f"{f}_weights"] = _list_column(pa, ws, np.float32)
    meta = {"format": FORMAT, "encoder": encoder, "sparse_fields": list(sparse_fields), "shard": k, "rows": len(rows.ids)}
    table = pa.table(cols).replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode("utf-8")})
    path = f"{folder}/{shard_name(k)}"
    _write_atomic(fs, path, lambda fs, tmp: pq.write_table(table, tmp, filesystem=fs, compression="zstd"))
    return fs.get_file_info(path).size


def write_failures(fs, folder: str, k: int, items: Sequence[Any]) -> None:
    """The failures file of shard ``k``: one row per input that could not be used (or was skipped), and why."""
    pa, pq, _ = pyarrow_modules()
    table = pa.table({
        "id": pa.array([i.id for i in items], pa.string()),
        "origin": pa.array([i.source for i in items], pa.string()),
        "action": pa.array(["skipped" if i.ok else "failed" for i in items], pa.string()),
        "reason": pa.array([(i.error if not i.ok else i.warning) or "" for i in items], pa.string()),
    })
    _write_atomic(fs, f"{folder}/{failures_name(k)}", lambda fs, tmp: pq.write_table(table, tmp, filesystem=fs))


def remove_failures(fs, folder: str, k: int) -> None:
    """Remove shard ``k``'s failures file, if any (left by an attempt that was given up on)."""
    path = f"{folder}/{failures_name(k)}"
    if fs.get_file_info(path).is_file:
        fs.delete_file(path)


# --- reading --------------------------------------------------------------------------------------

@dataclass
class ShardInfo:
    """One shard of a folder as its manifest entry and the file on disk describe it."""

    k: int
    path: str
    entry: dict[str, Any] | None  # the manifest entry, None: unfinished
    size: int | None  # bytes on disk, None: missing
    has_failures: bool = False  # a failures file is there

    @property
    def finished(self) -> bool:
        return self.entry is not None

    def problem(self) -> str | None:
        """Why this shard cannot be read as finished, or None."""
        if self.entry is None and self.size is None and self.has_failures:
            return (f"{self.path}: not written (encode-catalog gave up on this shard; the reason is given for each of "
                    "its inputs); run encode-catalog again to retry it")
        if self.entry is None:
            return (f"{self.path}: unfinished shard (no manifest entry: encode-catalog stopped while writing it); "
                    "run encode-catalog again to finish it")
        if self.size is None:
            return f"{self.path}: the manifest lists this shard but the file is missing; run encode-catalog again to rewrite it"
        if self.size != self.entry.get("bytes"):
            return (f"{self.path}: the file has {self.size} bytes but its manifest entry says {self.entry.get('bytes')} "
                    "(truncated or replaced after it was written); run encode-catalog again to rewrite it")
        return None


_SHARD_FILE = re.compile(r"(part|failures)-(\d+)\.parquet")


def list_shards(fs, folder: str) -> list[ShardInfo]:
    """Every shard of the folder: finished ones (with a manifest entry) and leftovers."""
    _, _, pafs = pyarrow_modules()
    sizes: dict[int, int] = {}
    failures: set[int] = set()
    for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
        m = _SHARD_FILE.fullmatch(info.base_name) if info.is_file else None
        if m and m[1] == "part":
            sizes[int(m[2])] = info.size
        elif m:
            failures.add(int(m[2]))
    entries: dict[int, dict[str, Any]] = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{folder}/{MANIFEST_DIR}", allow_not_found=True)):
        base = info.base_name
        if info.is_file and base.startswith("part-") and base.endswith(".json"):
            try:
                k = int(base[5:-5])
                with fs.open_input_stream(info.path) as fh:
                    entries[k] = json.loads(fh.read().decode("utf-8"))
            except (ValueError, OSError):
                continue  # a manifest entry cut by a crash counts as absent: the shard is redone
    return [ShardInfo(k, f"{folder}/{shard_name(k)}", entries.get(k), sizes.get(k), k in failures)
            for k in sorted(set(sizes) | set(entries) | failures)]


def shard_metadata(pf) -> dict[str, Any]:
    """The ``stair_es`` metadata of a shard (a ``ParquetFile`` or a table read from one)."""
    schema = pf.schema_arrow if hasattr(pf, "schema_arrow") else pf.schema
    meta = (schema.metadata or {}).get(META_KEY)
    if meta is None:
        raise InvalidInputError("not a stair_es shard (no 'stair_es' metadata in the Parquet file)")
    out = json.loads(meta.decode("utf-8"))
    if out.get("format") != FORMAT:
        raise InvalidInputError(f"shard format {out.get('format')!r}; this stair_es reads format {FORMAT}: "
                                "encode the catalog again with this version")
    return out


def read_failures(fs, folder: str, k: int) -> list[dict[str, Any]]:
    _, pq, _ = pyarrow_modules()
    path = f"{folder}/{failures_name(k)}"
    if not fs.get_file_info(path).is_file:
        return []
    return pq.read_table(path, filesystem=fs).to_pylist()


def csr(column) -> tuple[np.ndarray, np.ndarray]:
    """(indptr from 0, values) of a Parquet list column, without per-row Python objects."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    values = np.asarray(arr.values)  # the batch's slice of values starts at offsets[0]
    return offsets - offsets[0], values[offsets[0]:offsets[-1]] if offsets.size else values[:0]
