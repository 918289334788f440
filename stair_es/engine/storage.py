"""Crash-safe file primitives of the embedded engine.

Owns: atomic file replacement (temp file, flush + fsync, rename, fsync of the directory)
and the single-file *array container* every segment is stored in (a JSON header followed
by 64-byte aligned raw little-endian arrays, read back through one read-only memory map).
It must not know what the arrays mean.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import numpy as np

from ..errors import IncompatibleIndexError

TMP_PREFIX = ".tmp-"
_MAGIC = b"STAIRSEG"
_HEAD = struct.Struct("<8sQ")
_ALIGN = 64


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_file(directory: Path, name: str):
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{name}.", dir=directory)
    return os.fdopen(fd, "wb"), Path(tmp)


@contextmanager
def atomic_file(path: Path, *, sync_dir: bool = True) -> Iterator[BinaryIO]:
    """A file to write that replaces ``path`` only when the block ends without error.

    Written to a temporary name, flushed and fsynced, renamed over ``path``, then the directory
    is fsynced: a crash at any moment leaves either the old or the new file, never a mix.
    """
    f, tmp = _tmp_file(path.parent, path.name)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes | memoryview, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    with atomic_file(path, sync_dir=sync_dir) as f:
        f.write(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1, sort_keys=True).encode("utf-8"))


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], *, sync_dir: bool = True) -> int:
    """Write named arrays + JSON-able ``meta`` atomically into one file; returns its size."""
    layout: dict[str, list] = {}
    offset = 0
    items = []
    for name, arr in arrays.items():
        arr = np.ascontiguousarray(arr)
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        arr = arr.astype(dt, copy=False)
        layout[name] = [arr.dtype.str, list(arr.shape), offset]
        items.append((offset, arr))
        offset += arr.nbytes
        offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
    header = json.dumps({"arrays": layout, "meta": dict(meta)}, separators=(",", ":")).encode("utf-8")
    data_start = (_HEAD.size + len(header) + _ALIGN - 1) // _ALIGN * _ALIGN
    with atomic_file(path, sync_dir=sync_dir) as f:
        f.write(_HEAD.pack(_MAGIC, len(header)))
        f.write(header)
        pos = _HEAD.size + len(header)
        for off, arr in items:
            target = data_start + off
            if target > pos:
                f.write(b"\0" * (target - pos))
                pos = target
            if arr.nbytes:
                f.write(memoryview(arr.reshape(-1).view(np.uint8)))
            pos += arr.nbytes
        end = data_start + offset
        if end > pos:
            f.write(b"\0" * (end - pos))
    return data_start + offset


def read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Memory-map a file written by :func:`write_arrays`; arrays are read-only views."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic, hlen = _HEAD.unpack(f.read(_HEAD.size))
            if magic != _MAGIC:
                raise IncompatibleIndexError(f"{path} is not a stair_es segment file (bad magic); the index is damaged")
            header = json.loads(f.read(hlen).decode("utf-8"))
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise IncompatibleIndexError(f"segment file {path} is damaged ({e}); rebuild the index") from None
    data_start = (_HEAD.size + hlen + _ALIGN - 1) // _ALIGN * _ALIGN
    mm = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else np.zeros(0, np.uint8)
    arrays = {}
    for name, (dtype, shape, off) in header["arrays"].items():
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) if shape else 1
        start = data_start + off
        end = start + n * dt.itemsize
        if end > size:
            raise IncompatibleIndexError(f"segment file {path} is truncated; the index is damaged: rebuild it")
        arrays[name] = mm[start:end].view(dt).reshape(shape)
    return arrays, header["meta"]
