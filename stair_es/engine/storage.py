"""Crash-safe file primitives of the embedded engine.

Owns: atomic file replacement (temp file, flush + fsync, rename, fsync of the directory),
checksums, and the single-file *array container* every segment is stored in: a JSON header
followed by 64-byte aligned raw little-endian arrays (the *content*, read back through one
read-only memory map), then a table of CRC-32s, one per chunk of the content (4 KiB; the footer
records the size, so files written with 16 KiB chunks read the same), then a
32-byte footer (``STAIRCK2``, the CRC-32 of the table, the chunk size, the content length and
the number of chunks).

Chunked checksums let a reader verify only what it reads, once per process
(:class:`ChunkVerifier`): the table and the header on open, each chunk the first time
something is read from it. Older containers still open: a 24-byte ``STAIRSUM`` footer holds
the CRC-32 of the whole content (verified in full on first open), and files written before
footers existed have none. It must not know what the arrays mean.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Mapping

import numpy as np

from ..errors import DamagedIndexError
from . import checksum

try:  # ISA-L computes the same CRC-32 as zlib, about 4x faster (the `fast-checksums` extra)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - depends on the installation
    from zlib import crc32 as _crc32

TMP_PREFIX = ".tmp-"
_MAGIC = b"STAIRSEG"
_HEAD = struct.Struct("<8sQ")
_ALIGN = 64
_FOOT_MAGIC = b"STAIRSUM"  # format 1: one CRC-32 of the whole content
_FOOT = struct.Struct("<8sIIQ")  # magic, crc32, reserved, length of the checksummed content
_FOOT2_MAGIC = b"STAIRCK2"  # format 2: one CRC-32 per chunk, in a table after the content
_FOOT2 = struct.Struct("<8sIIQQ")  # magic, crc32 of the table, log2(chunk bytes), content length, chunks
CHUNK_SHIFT = 12  # 4 KiB chunks (a page): a table of 0.1 % of the file; a query verifies little more than it reads
_CHUNK = 1 << 22


def crc32_of(data: bytes | memoryview | np.ndarray, start: int = 0) -> int:
    """CRC-32 (zlib) of a buffer, in 4 MiB steps so a memory map is not copied whole."""
    view = memoryview(data).cast("B") if not isinstance(data, np.ndarray) else memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    crc = start
    for off in range(0, len(view), _CHUNK):
        crc = _crc32(view[off : off + _CHUNK], crc)
    return crc & 0xFFFFFFFF


def file_crc32(path: Path, length: int | None = None) -> int:
    crc, left = 0, length
    with open(path, "rb") as f:
        while left is None or left > 0:
            chunk = f.read(_CHUNK if left is None else min(_CHUNK, left))
            if not chunk:
                break
            crc = _crc32(chunk, crc)
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


def _plan(arrays: Mapping[str, Any], meta: Mapping[str, Any]) -> tuple[dict[str, list], list, bytes, int, int]:
    """Where each array goes in a container file: (the header's layout, ``(name, offset, array or
    None)`` in file order, the header, where the arrays start, where they end). An array given as
    ``(dtype, length)`` (:func:`write_arrays_streamed`) comes as None."""
    layout: dict[str, list] = {}
    offset = 0
    items = []
    for name, arr in arrays.items():
        if isinstance(arr, tuple):
            dt, n = np.dtype(arr[0]), int(arr[1])
            dt = dt.newbyteorder("<") if dt.byteorder == ">" else dt
            layout[name] = [dt.str, [n], offset]
            items.append((name, offset, None))
            nbytes = n * dt.itemsize
        else:
            arr = np.ascontiguousarray(arr)
            dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
            arr = arr.astype(dt, copy=False)
            layout[name] = [arr.dtype.str, list(arr.shape), offset]
            items.append((name, offset, arr))
            nbytes = arr.nbytes
        offset += nbytes
        offset = (offset + _ALIGN - 1) // _ALIGN * _ALIGN
    header = json.dumps({"arrays": layout, "meta": dict(meta)}, separators=(",", ":")).encode("utf-8")
    data_start = (_HEAD.size + len(header) + _ALIGN - 1) // _ALIGN * _ALIGN
    return layout, items, header, data_start, data_start + offset


def write_arrays(path: Path, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], *, sync_dir: bool = True) -> int:
    """Write named arrays + JSON-able ``meta`` atomically into one file; returns its size."""
    _, items, header, data_start, end = _plan(arrays, meta)
    chunks = _ChunkCrcs(CHUNK_SHIFT)
    with atomic_file(path, sync_dir=sync_dir) as f:

        def put(data) -> None:
            f.write(data)
            chunks.update(data)

        put(_HEAD.pack(_MAGIC, len(header)))
        put(header)
        pos = _HEAD.size + len(header)
        for _, off, arr in items:
            target = data_start + off
            if target > pos:
                put(b"\0" * (target - pos))
                pos = target
            if arr.nbytes:
                put(memoryview(arr.reshape(-1).view(np.uint8)))
            pos += arr.nbytes
        if end > pos:
            put(b"\0" * (end - pos))
        table = chunks.table()
        f.write(table.tobytes())
        f.write(_FOOT2.pack(_FOOT2_MAGIC, crc32_of(table), CHUNK_SHIFT, end, table.size))
    return end + table.nbytes + _FOOT2.size


def write_arrays_streamed(path: Path, arrays: Mapping[str, Any], meta: Mapping[str, Any], fill, *,
                          sync_dir: bool = True) -> int:
    """:func:`write_arrays` for arrays too large to hold in memory at once: the same file, byte
    for byte, when the same arrays are given. ``arrays`` maps names (in file order) to an array,
    or to ``(dtype, length)`` of a 1-d array written in pieces by ``fill(put)``: ``put(name,
    start, piece)`` writes ``piece`` at element ``start`` of that array (any order, each element
    once; elements never written stay zero). The chunk checksums are computed from a read of the
    written content (from the page cache), so memory stays what the pieces take. Atomic as
    :func:`write_arrays`; returns the file size."""
    layout, items, header, data_start, end = _plan(arrays, meta)
    with atomic_file(path, sync_dir=sync_dir) as f:
        fd = f.fileno()
        os.ftruncate(fd, end)  # (a sparse file: the gaps read as zeros)
        os.pwrite(fd, _HEAD.pack(_MAGIC, len(header)) + header, 0)
        for name, off, arr in items:
            if arr is not None and arr.nbytes:
                os.pwrite(fd, memoryview(arr.reshape(-1).view(np.uint8)), data_start + off)
        where = {name: (data_start + off, np.dtype(layout[name][0]), layout[name][1][0]) for name, off, arr in items if arr is None}

        def put(name: str, start: int, piece: np.ndarray) -> None:
            at, dt, n = where[name]
            piece = np.ascontiguousarray(piece, dt)
            if start < 0 or start + piece.size > n:
                raise ValueError(f"{name}[{start}:{start + piece.size}] is outside its {n} elements")
            view = memoryview(piece.reshape(-1).view(np.uint8))
            pos = at + start * dt.itemsize
            while len(view):
                done = os.pwrite(fd, view, pos)
                view, pos = view[done:], pos + done

        fill(put)
        chunks = _ChunkCrcs(CHUNK_SHIFT)
        for pos in range(0, end, _CHUNK):  # (the temporary file's descriptor is open for reading too: mkstemp)
            data = os.pread(fd, min(_CHUNK, end - pos), pos)
            if len(data) != min(_CHUNK, end - pos):
                raise OSError(f"short read of {path.name} while checksumming it")
            chunks.update(data)
        table = chunks.table()
        f.seek(end)
        f.write(table.tobytes())
        f.write(_FOOT2.pack(_FOOT2_MAGIC, crc32_of(table), CHUNK_SHIFT, end, table.size))
    return end + table.nbytes + _FOOT2.size


class _ChunkCrcs:
    """CRC-32 of each ``2**shift``-byte chunk of a stream written in pieces of any size."""

    def __init__(self, shift: int):
        self.size = 1 << shift
        self.crcs: list[int] = []
        self.crc = 0
        self.fill = 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        pos = 0
        crcs = checksum.chunk_crcs()  # compiled when the numba kernels are loaded (:mod:`.checksum`)
        if crcs is not None and len(view) >= 4 * self.size:
            # a segment's large arrays: whole chunks in one compiled call, no Python per chunk
            if self.fill:
                pos = self.size - self.fill
                self.crcs.append(_crc32(view[:pos], self.crc))
                self.crc, self.fill = 0, 0
            whole = (len(view) - pos) // self.size * self.size
            self.crcs.extend(crcs(np.frombuffer(view[pos:pos + whole], np.uint8), self.size.bit_length() - 1).tolist())
            pos += whole
        while pos < len(view):
            take = min(self.size - self.fill, len(view) - pos)
            self.crc = _crc32(view[pos:pos + take], self.crc)
            self.fill += take
            pos += take
            if self.fill == self.size:
                self.crcs.append(self.crc)
                self.crc, self.fill = 0, 0

    def table(self) -> np.ndarray:
        crcs = self.crcs + ([self.crc] if self.fill else [])
        return np.array(crcs, dtype="<u4")


@dataclass
class Footer:
    """What a container's end says: ``kind`` "chunks" (format 2: ``table`` of per-chunk CRCs,
    verified against ``crc``), "whole" (format 1: ``crc`` of the whole content) or "none"."""

    kind: str
    content: int  # bytes of header + arrays
    crc: int = 0
    shift: int = CHUNK_SHIFT
    table: np.ndarray | None = None


def read_footer(path: Path, size: int, *, check_table: bool = True) -> Footer:
    """The footer of a container file of ``size`` bytes; a format-2 chunk table is read and
    (``check_table``) verified. Raises DamagedIndexError when the footer contradicts the file."""
    with open(path, "rb") as f:
        if size >= _FOOT2.size:
            f.seek(size - _FOOT2.size)
            magic, tcrc, shift, content, n = _FOOT2.unpack(f.read(_FOOT2.size))
            if magic == _FOOT2_MAGIC:
                if not (10 <= shift <= 30 and n == -(-content // (1 << shift)) and content + 4 * n + _FOOT2.size == size):
                    raise DamagedIndexError(f"{path}: the checksum footer does not match the file's {size} bytes (content "
                                            f"{content}, {n} chunks of 2^{shift}): the file was truncated, extended or "
                                            "damaged; the index is damaged")
                f.seek(content)
                table = np.frombuffer(f.read(4 * n), dtype="<u4")
                if check_table and crc32_of(table) != tcrc:
                    raise DamagedIndexError(f"{path}: the chunk checksum table fails its own checksum: the file is "
                                            "damaged; run `stair-es index check` to see what is affected")
                return Footer("chunks", content, tcrc, shift, table)
        if size >= _FOOT.size:
            f.seek(size - _FOOT.size)
            magic, crc, _, length = _FOOT.unpack(f.read(_FOOT.size))
            if magic == _FOOT_MAGIC:
                if length != size - _FOOT.size:
                    raise DamagedIndexError(f"{path}: the file is {size} bytes but its footer says {length + _FOOT.size}: "
                                            "it was truncated or extended; the index is damaged")
                return Footer("whole", length, crc)
    return Footer("none", size)


def verify_file(path: Path) -> bool:
    """Check a container file against its checksums, every byte. Returns False for a file
    without a footer (written by an older stair_es); raises DamagedIndexError on a mismatch."""
    size = path.stat().st_size
    foot = read_footer(path, size)
    if foot.kind == "none":
        return False
    if foot.kind == "chunks":
        mm = np.memmap(path, dtype=np.uint8, mode="r") if foot.content else np.zeros(0, np.uint8)
        ChunkVerifier(path, mm, foot).verify_all()
        return True
    got = file_crc32(path, foot.content)
    if got != foot.crc:
        raise DamagedIndexError(f"{path}: checksum mismatch (stored {foot.crc:08x}, computed {got:08x}): the file is "
                                "damaged; run `stair-es index check` to see what is affected")
    return True


class ChunkVerifier:
    """Verifies a format-2 container chunk by chunk, each chunk once per process.

    ``ok[c]`` marks chunk c verified. It is shared by every reader of the same file in the
    process (see :func:`chunk_verifier`); concurrent readers at worst verify a chunk twice
    (setting a flag that is already set is harmless), so no lock is needed on the read path."""

    def __init__(self, path: Path, mm: np.ndarray, foot: Footer, ok: np.ndarray | None = None):
        self.path = path
        self.mm = mm.view(np.ndarray) if isinstance(mm, np.memmap) else mm  # slicing a memmap costs ~10 us
        self.shift = foot.shift
        self.content = foot.content
        self.table = foot.table if foot.table is not None else np.zeros(0, "<u4")
        self.ok = ok if ok is not None else np.zeros(self.table.size, bool)

    def verify_chunks(self, chunks: np.ndarray) -> None:
        """Verify these chunks now (verified or not before), marking each one verified; the
        first damaged one raises DamagedIndexError naming its byte range."""
        size = 1 << self.shift
        for c in chunks.tolist():
            lo = c << self.shift
            got = _crc32(memoryview(self.mm[lo:min(lo + size, self.content)])) & 0xFFFFFFFF
            if got != int(self.table[c]):
                raise DamagedIndexError(
                    f"{self.path}: checksum mismatch in bytes {lo}-{min(lo + size, self.content) - 1} (chunk {c}: stored "
                    f"{int(self.table[c]):08x}, computed {got:08x}): the file is damaged, so nothing read from it is "
                    "answered; run `stair-es index check` to see what is affected")
            self.ok[c] = True

    def verify_ranges(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Verify the chunks holding the byte ranges [starts[i], ends[i]) (empty ranges: none)."""
        starts = np.asarray(starts, np.int64)
        ends = np.asarray(ends, np.int64)
        keep = ends > starts
        if not keep.all():
            starts, ends = starts[keep], ends[keep]
        if starts.size == 0:
            return
        verify = checksum.range_verifier()
        if verify is not None and self.content:
            while True:
                bad = verify(self.mm, self.table, self.ok, self.shift, self.content, starts, ends)
                if bad < 0:
                    return
                self.verify_chunks(np.array([bad], np.int64))  # raises, naming the byte range
        first = starts >> self.shift
        last = (ends - 1) >> self.shift
        if starts.size == 1:
            chunks = np.arange(first[0], last[0] + 1)
        elif bool((last - first <= 1).all()):
            chunks = np.concatenate([first, last])
        else:
            from .npkernels.postings import concat_ranges

            chunks = concat_ranges(first, last + 1)
        need = np.sort(chunks[~self.ok[chunks]])
        if need.size:  # sorted, each once (np.unique would import numpy.ma: ~20 ms of a cold search)
            self.verify_chunks(need[np.concatenate(([True], need[1:] != need[:-1]))])

    def verify_all(self) -> None:
        if checksum.range_verifier() is not None and self.content:
            self.verify_ranges(np.zeros(1, np.int64), np.array([self.content], np.int64))  # compiled
        else:
            self.verify_chunks(np.flatnonzero(~self.ok))


_CHUNK_STATE: dict[tuple[str, int, int, int], np.ndarray] = {}


def chunk_verifier(path: Path, mm: np.ndarray, foot: Footer) -> ChunkVerifier:
    """The process-wide verifier of one file version (path, inode, size, mtime)."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    ok = _CHUNK_STATE.get(key)
    if ok is None or ok.size != (foot.table.size if foot.table is not None else 0):
        ok = _CHUNK_STATE[key] = np.zeros(foot.table.size if foot.table is not None else 0, bool)
    return ChunkVerifier(path, mm, foot, ok)


@dataclass
class Container:
    """A memory-mapped container: its arrays, meta, each array's first byte in the file, the footer."""

    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    offsets: dict[str, int]
    footer: Footer
    mm: np.ndarray
    verifier: ChunkVerifier | None = None


def read_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Memory-map a file written by :func:`write_arrays`; arrays are read-only views."""
    c = read_container(path)
    return c.arrays, c.meta


def read_container(path: Path, *, verify: bool = False) -> Container:
    """Memory-map a file written by :func:`write_arrays` (any format).

    The footer is always checked against the file size. With ``verify`` and a format-2 file,
    the chunk table is checked and so are the chunks of the header before it is parsed;
    ``Container.verifier`` then verifies the rest as it is read. Nothing else is verified here
    (format 1: see :func:`verified_once`)."""
    try:
        size = path.stat().st_size
        foot = read_footer(path, size, check_table=verify)
        content = foot.content
        mm = np.memmap(path, dtype=np.uint8, mode="r") if size > 0 else np.zeros(0, np.uint8)
        verifier = chunk_verifier(path, mm, foot) if verify and foot.kind == "chunks" else None
        if verifier is not None:
            verifier.verify_ranges(np.array([0]), np.array([min(_HEAD.size, content)]))
        with open(path, "rb") as f:
            magic, hlen = _HEAD.unpack(f.read(_HEAD.size))
            if magic != _MAGIC:
                raise DamagedIndexError(f"{path} is not a stair_es segment file (bad magic); the index is damaged")
            if hlen > content - _HEAD.size:
                raise DamagedIndexError(f"{path}: header length {hlen} is larger than the file; the index is damaged")
            if verifier is not None:
                verifier.verify_ranges(np.array([0]), np.array([_HEAD.size + hlen]))
            header = json.loads(f.read(hlen).decode("utf-8"))
        if not isinstance(header, dict) or not isinstance(header.get("arrays"), dict) or not isinstance(header.get("meta"), dict):
            raise DamagedIndexError(f"{path}: the segment header is not a stair_es header; the index is damaged")
        data_start = (_HEAD.size + hlen + _ALIGN - 1) // _ALIGN * _ALIGN
        arrays, offsets = {}, {}
        for name, (dtype, shape, off) in header["arrays"].items():
            dt = np.dtype(dtype)
            n = int(np.prod(shape)) if shape else 1
            start = data_start + int(off)
            end = start + n * dt.itemsize
            if n < 0 or int(off) < 0 or end > content:
                raise DamagedIndexError(f"segment file {path} is truncated or its header is damaged; the index is damaged")
            arrays[name] = mm[start:end].view(np.ndarray).view(dt).reshape(shape)  # plain arrays: no memmap subclass cost per operation
            offsets[name] = start
        return Container(arrays, header["meta"], offsets, foot, mm, verifier)
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
    """:func:`verify_file`, remembered per (file, inode, size, mtime) for the process (for
    format-1 files; format 2 is verified lazily, see :class:`ChunkVerifier`)."""
    st = path.stat()
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _VERIFIED:
        _VERIFIED[key] = verify_file(path)
    return _VERIFIED[key]
