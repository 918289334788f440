"""Page hints for memory-mapped segment files: ``madvise(2)`` through the C library.

A process's first read of a memory-mapped range faults it in page by page (a trap and a page
table update each, even when the file is in the page cache; a disk read when it is not). Asking
for a whole range at once -- ``MADV_POPULATE_READ`` (Linux 5.14+: the pages are mapped now, in
one call) or else ``MADV_WILLNEED`` (read-ahead started, mapped on first touch) -- replaces those
faults by one system call. Only a hint: where ``madvise`` is missing (not Linux, no libc) the
calls do nothing and reads fault as before. Knows nothing about segments.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys

import numpy as np

MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22
PAGE = mmap.PAGESIZE

_libc = None  # loaded on the first hint (ctypes.CDLL(None): the C library Python runs on, no ldconfig call)
_populate = True  # until the kernel says it does not know MADV_POPULATE_READ


def _madvise():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None, use_errno=True)
                lib.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
                lib.madvise.restype = ctypes.c_int
                lib.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
                lib.mincore.restype = ctypes.c_int
                _libc = lib
            except (OSError, AttributeError):  # pragma: no cover - no madvise: hints are no-ops
                _libc = False
    return _libc


def advise(addr: int, nbytes: int) -> bool:
    """Ask for the ``nbytes`` bytes at address ``addr`` (of a read-only file mapping) to be
    mapped now (or read ahead). Returns whether a hint was given."""
    global _populate
    lib = _madvise()
    if not lib or nbytes <= 0:
        return False
    a = addr & ~(PAGE - 1)
    n = addr + nbytes - a
    if _populate:
        if lib.madvise(a, n, MADV_POPULATE_READ) == 0:
            return True
        if ctypes.get_errno() == 22:  # EINVAL: a kernel without it; read-ahead below from now on
            _populate = False
    return lib.madvise(a, n, MADV_WILLNEED) == 0


def map_resident(addr: int, nbytes: int, stop=None, step: int = 32 << 20, on_run=None) -> int:
    """Map now the pages of [addr, addr + nbytes) (a read-only file mapping) that are in the page
    cache already, ``step`` bytes at a time (``mincore`` says which; each run of resident pages is
    one ``MADV_POPULATE_READ``), so that later reads of them do not fault. Pages not in the page
    cache are left alone: this never reads the disk. Stops early once ``stop`` (a
    ``threading.Event``) is set. ``on_run(address, nbytes)``, if given, is called after each run is
    mapped (e.g. to verify its checksums while it is in cache). Returns the bytes mapped (0 where
    the calls are missing)."""
    lib = _madvise()
    if not lib or nbytes <= 0 or not _populate:
        return 0
    a0 = addr & ~(PAGE - 1)
    end = addr + nbytes
    done = 0
    vec = np.empty(step // PAGE, np.uint8)
    while a0 < end:
        if stop is not None and stop.is_set():
            break
        n = min(step, end - a0)
        pages = (n + PAGE - 1) // PAGE
        if lib.mincore(a0, n, vec.ctypes.data) != 0:
            break  # (the mapping went away, or no mincore here)
        res = (vec[:pages] & 1).astype(np.int8)
        edges = np.flatnonzero(np.diff(np.concatenate(([0], res, [0]))))
        for lo, hi in zip(edges[0::2].tolist(), edges[1::2].tolist()):
            if lib.madvise(a0 + lo * PAGE, (hi - lo) * PAGE, MADV_POPULATE_READ) != 0:
                return done  # (a kernel without MADV_POPULATE_READ: faults as before)
            done += (hi - lo) * PAGE
            if on_run is not None:
                on_run(a0 + lo * PAGE, (hi - lo) * PAGE)
        a0 += n
    return done


def release(addr: int, nbytes: int) -> bool:
    """Unmap the pages of the ``nbytes`` bytes at address ``addr`` of a read-only file mapping
    from this process (``MADV_DONTNEED``; they stay in the page cache, and a later read maps them
    again): what a pass over a whole file (a merge) does so that its resident memory does not
    grow with the file. Whole pages inside the range only. Returns whether a hint was given."""
    lib = _madvise()
    a = (addr + PAGE - 1) & ~(PAGE - 1)
    b = (addr + nbytes) & ~(PAGE - 1)
    if not lib or b <= a:
        return False
    return lib.madvise(a, b - a, MADV_DONTNEED) == 0


def huge_pages_enabled() -> bool:
    """Whether transparent huge pages can back a mapping that asks for them (``madvise``):
    ``/sys/kernel/mm/transparent_hugepage/enabled`` says ``[always]`` or ``[madvise]`` (Linux)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def pmd_mapped(addr: int, nbytes: int) -> int:
    """Bytes of the file mappings overlapping [addr, addr + nbytes) that this process maps with
    2 MiB page table entries (``FilePmdMapped`` of ``/proc/self/smaps``: the page cache holds them
    as 2 MiB folios); 0 where that is not known (not Linux)."""
    end = addr + nbytes
    total = 0
    inside = False
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and not line.startswith(("FilePmdMapped", "Anon", "Shmem")) and ":" not in head:
                    lo, _, hi = head.partition("-")
                    try:
                        inside = int(lo, 16) < end and int(hi, 16) > addr
                    except ValueError:
                        inside = False
                elif inside and line.startswith("FilePmdMapped:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def reread_huge(addr: int, nbytes: int, fd: int, offset: int) -> bool:
    """Have the file range mapped at [addr, addr + nbytes) (read-only; ``offset`` in the file open
    as ``fd``) held by the page cache in 2 MiB folios, then map it: the mapping asks for huge pages
    (``MADV_HUGEPAGE``), this process's pages of it are unmapped (``MADV_DONTNEED``), the file's
    cached pages of the range dropped (``POSIX_FADV_DONTNEED``: clean pages no other process maps;
    they are read again from the file), then ``MADV_POPULATE_READ`` reads it back in 2 MiB folios
    and maps them with one page table entry each. A first read of the range then costs one fault per
    2 MiB rather than per 64 KiB (fault-around), and a TLB entry covers 2 MiB -- in this process and
    in every later one while the page cache keeps the folios. Costs a read of the range from the
    disk. Returns False where the calls are missing (nothing changed then)."""
    lib = _madvise()
    if not lib or nbytes <= 0 or not _populate or not hasattr(os, "posix_fadvise"):
        return False
    a = addr & ~(PAGE - 1)
    n = addr + nbytes - a
    off = offset - (addr - a)
    if lib.madvise(a, n, MADV_HUGEPAGE) != 0:
        return False
    lib.madvise(a, n, MADV_DONTNEED)
    os.posix_fadvise(fd, off, n, os.POSIX_FADV_DONTNEED)
    return lib.madvise(a, n, MADV_POPULATE_READ) == 0
