"""Crash-safe file primitives of the embedded engine.

Owns: atomic file replacement (temp file, flush + fsync, rename, fsync of the directory),
checksums, and the single-file *array container* every segment is stored in (a JSON header
followed by 64-byte aligned raw little-endian arrays, read back through one read-only
memory map, then a 24-byte footer: ``STAIRSUM``, the CRC-32 of everything before it and
that length). Files written before footers existed still open (``checksum`` is then None).
It must not know what the arrays mean.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import numpy as np

from ..errors import DamagedIndexError

TMP_PREFIX = ".tmp-"
_MAGIC = b"STAIRSEG"
_HEAD = struct.Struct("<8sQ")
_ALIGN = 64
_FOOT_MAGIC = b"STAIRSUM"
_FOOT = struct.Struct("<8sIIQ")  # magic, crc32, reserved, length of the checksummed content
_CHUNK = 1 << 22


def crc32_of(data: bytes | memoryview | np.ndarray, start: int = 0) -> int:
    """CRC-32 (zlib) of a buffer, in 4 MiB steps so a memory map is not copied whole."""
    view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    crc = start
    for off in range(0, len(view), _CHUNK):
        crc = zlib.crc32(view[off : off + _CHUNK], crc)
    return crc & 0xFFFFFFFF


def file_crc32(path: Path, length: int | None = None) -> int:
    crc, left = 0, length
    with open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(_CHUNK if left is None else min(_CHUNK, left))
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            if left is not None:
                left -= len(chunk)
    return crc & 0xFFFFFFFF


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
    crc = 0
    with atomic_file(path, sync_dir=sync_dir) as f:

        def put(data) -> None:
            nonlocal crc
            f.write(data)
            crc = crc32_of(data, crc)

        put(_HEAD.pack(_MAGIC, len(header)))
        put(header)
        pos = _HEAD.size + len(header)
        for off, arr in items:
            target = data_start + off
            if target > pos:
                put(b"\0" * (target - pos))
                pos = target
            if arr.nbytes:
                put(memoryview(arr.reshape(-1).view(np.uint8)))
            pos += arr.nbytes
        end = data_start + offset
        if end > pos:
            put(b"\0" * (end - pos))
        f.write(_FOOT.pack(_FOOT_MAGIC, crc, 0, end))
    return end + _FOOT.size


def read_footer(path: Path, size: int) -> tuple[int, int] | None:
    """(crc32, content length) from a file's footer, or None for a file written without one."""
    if size < _FOOT.size:
        return None
    with open(path, "rb") as f:
        f.seek(size - _FOOT.size)
        magic, crc, _, length = _FOOT.unpack(f.read(_FOOT.size))
    if magic != _FOOT_MAGIC:
        return None
    if length != size - _FOOT.size:
        raise DamagedIndexError(f"{path}: the file is {size} bytes but its footer says {length + _FOOT.size}: "
                                "it was truncated or extended; the index is damaged")
    return crc, length


def verify_file(path: Path) -> bool:
    """Check a container file against its footer checksum. Returns False for a file without
    a footer (written by an older stair_es); raises DamagedIndexError on a mismatch."""
    size = path.stat().st_size
    foot = read_footer(path, size)
    if foot is None:
        return False
    crc, length = foot
    got = file_crc32(path, length)
    if got != crc:
        raise DamagedIndexError(f"{path}: checksum mismatch (stored {crc:08x}, computed {got:08x}): the file is "
                                "damaged; run `stair-es index check` to see what is affected")
    return True


def read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Memory-map a file written by :func:`write_arrays`; arrays are read-only views."""
    try:
        size = path.stat().st_size
        foot = read_footer(path, size)
        content = foot[1] if foot else size
        with open(path, "rb") as f:
            magic, hlen = _HEAD.unpack(f.read(_HEAD.size))
            if magic != _MAGIC:
                raise DamagedIndexError(f"{path} is not a stair_es segment file (bad magic); the index is damaged")
            if hlen > content - _HEAD.size:
                raise DamagedIndexError(f"{path}: header length {hlen} is larger than the file; the index is damaged")
            header = json.loads(f.read(hlen).decode("utf-8"))
        if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict) or not isinstance(header.get("meta"), dict):
            raise DamagedIndexError(f"{path}: the segment header is not a stair_es header; the index is damaged")
        data_start = (_HEAD.size + hlen + _ALIGN - 1) // _ALIGN * _ALIGN
        mm = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else np.zeros(0, np.uint8)
        arrays = {}
        for name, (dtype, shape, off) in header["arrays"].items():
            dt = np.dtype(dtype)
            n = int(np.prod(shape)) if shape else 1
            start = data_start + int(off)
            end = start + n * dt.itemsize
            if n < 0 or int(off) < 0 or end > content:
                raise DamagedIndexError(f"segment file {path} is truncated or its header is damaged; the index is damaged")
            arrays[name] = mm[start:end].view(dt).reshape(shape)
        return arrays, header["meta"]
    except (DamagedIndexError, FileNotFoundError):
        raise  # a missing file may be a writer's commit in progress: the caller retries or reports it
    except IsADirectoryError:
        raise DamagedIndexError(f"{path} is a folder, not a segment file; the index is damaged") from None
    except PermissionError:
        raise DamagedIndexError(f"{path}: permission denied; make the index files readable") from None
    except OSError as e:
        raise DamagedIndexError(f"{path}: cannot read the segment file ({e.strerror or e})") from None
    except (struct.error, ValueError, TypeError, UnicodeDecodeError, MemoryError) as e:
        raise DamagedIndexError(f"segment file {path} is damaged ({type(e).__name__}: {e}); the index is damaged") from None


_VERIFIED: dict[tuple[str, int, int, int], bool] = {}


def verify_on_open() -> bool:
    """Whether segments are checksummed when first opened in a process (``$STAIR_ES_VERIFY``:
    ``full``, the default, or ``size`` to check only sizes and footers)."""
    return os.environ.get("STAIR_ES_VERIFY", "full").strip().lower() != "size"


def verified_once(path: Path) -> bool:
    """:func:`verify_file`, remembered per (file, inode, size, mtime) for the process."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _VERIFIED:
        _VERIFIED[key] = verify_file(path)
    return _VERIFIED[key]
