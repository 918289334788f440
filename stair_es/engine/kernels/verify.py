"""Checksum verification in compiled code: a C CRC-32 (ISA-L's or zlib's) callable from numba,
chunk ranges, block tables and stored fields verified once each, and the postings runs a search
kernel checks as it reads them (:func:`check_run`, :func:`prepare_terms`). Registers its two
helpers with :mod:`..checksum` on import (the one registry; nothing else is replaced)."""

from __future__ import annotations

import ctypes
import ctypes.util

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from .. import checksum


def _register_crc32() -> bool:
    """Make a C CRC-32 (zlib's polynomial) callable from compiled code as ``stair_es_crc32``:
    ISA-L's (the ``fast-checksums`` extra, ~3x zlib's speed) or else the system zlib's. The
    compiled code names the symbol, not an address, so numba's on-disk cache stays valid."""
    fn = None
    try:
        import isal.isal_zlib as _isal

        fn = ctypes.CDLL(_isal.__file__).crc32_gzip_refl  # uint32 (uint32 crc, const uint8 *buf, uint64 len)
    except (ImportError, OSError, AttributeError):
        try:
            fn = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1").crc32  # uLong (uLong, const Bytef *, uInt)
        except (OSError, AttributeError):  # pragma: no cover - no zlib shared library: chunks are verified in Python
            return False
    llvm.add_symbol("stair_es_crc32", ctypes.cast(fn, ctypes.c_void_p).value)
    return True


HAVE_CRC32 = _register_crc32()


@intrinsic
def _crc32(typingctx, crc, addr, n):
    """CRC-32 of ``n`` bytes at address ``addr``, continuing ``crc`` (both C functions above take
    the arguments in these registers; only the low 32 bits of the result are kept)."""
    sig = types.int64(types.int64, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i8p = ir.IntType(8).as_pointer()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64, i8p, i64]), "stair_es_crc32")
        r = builder.call(fn, [args[0], builder.inttoptr(args[1], i8p), args[2]])
        return builder.and_(r, i64(0xFFFFFFFF))

    return sig, codegen


def _zeros_operators(lo: int = 9, hi: int = 26) -> np.ndarray:
    """``OPS[s - lo]``: the CRC-32 register's advance over ``2**s`` zero bytes, a linear map of 32
    bits given as 4 tables of 256 (``op(x) = T[0][x & 255] ^ T[1][(x >> 8) & 255] ^ ...``), for
    chunk sizes ``2**lo`` to ``2**hi``. With it the CRC-32 of chunks A then B is ``op(crc(A)) ^
    crc(B)`` (zlib's ``crc32_combine`` with a fixed length), so the expected CRC-32 of a run of
    whole chunks follows from their table entries in a few operations a chunk. Made from zlib's
    CRC-32 of ``2**lo`` zero bytes, then squared."""
    import zlib

    zeros = bytes(1 << lo)
    z0 = zlib.crc32(zeros)
    x = (np.arange(256, dtype=np.uint64)[None, :] << (8 * np.arange(4, dtype=np.uint64))[:, None]).astype(np.uint32)
    t = np.array([[zlib.crc32(zeros, int(v)) ^ z0 for v in row] for row in x], np.uint32)
    out = [t]
    for _ in range(lo, hi):
        y = out[-1][0][x & 255] ^ out[-1][1][(x >> 8) & 255] ^ out[-1][2][(x >> 16) & 255] ^ out[-1][3][x >> 24]
        out.append(out[-1][0][y & 255] ^ out[-1][1][(y >> 8) & 255] ^ out[-1][2][(y >> 16) & 255] ^ out[-1][3][y >> 24])
    return np.ascontiguousarray(np.stack(out), np.uint32)


_OPS_LO = 9
_OPS = _zeros_operators(_OPS_LO)
_OPS.flags.writeable = False


@njit(cache=True, nogil=True, inline="always")
def _advance(op, x):
    """``op`` (4 x 256 tables, see :func:`_zeros_operators`) applied to the CRC-32 register ``x``."""
    return (op[0, x & 255] ^ op[1, (x >> 8) & 255] ^ op[2, (x >> 16) & 255] ^ op[3, (x >> 24) & 255])


@njit(cache=True, nogil=True, inline="always")
def _verify_chunk_range(base, table, ok, shift, content, lo, hi):
    """Verify chunks [lo, hi] of the container at address ``base``; the first bad chunk, or -1.

    A run of unverified whole chunks is checked with one CRC-32 over all of it against the CRC
    its table entries combine to (:func:`_zeros_operators`): the C function runs at 2-3x its
    speed on one 4 KiB chunk (20-27 against 9 GB/s here). A damaged chunk changes the run's CRC
    whatever the others hold (the operator is invertible), so the run is then verified chunk by
    chunk, which names the first bad one as before; only damage in two or more chunks of a run
    that cancels out (odds 2**-32, as for one chunk's CRC) passes the run's check."""
    c = lo
    full = content >> shift  # chunks [0, full) are whole
    while c <= hi:
        if ok[c]:
            c += 1
            continue
        e = c + 1
        while e <= hi and e < full and not ok[e]:
            e += 1
        if e - c >= 2 and c < full and _OPS_LO <= shift < _OPS_LO + _OPS.shape[0]:  # [c, e): a run of whole chunks
            op = _OPS[shift - _OPS_LO]
            want = np.uint32(table[c])
            for d in range(c + 1, e):
                want = _advance(op, want) ^ np.uint32(table[d])
            if _crc32(0, base + (c << shift), (e - c) << shift) == np.int64(want):
                for d in range(c, e):
                    ok[d] = True
                c = e
                continue
        for d in range(c, e):  # one chunk, or a run that failed: chunk by chunk
            a = d << shift
            b = min(a + (1 << shift), content)
            if _crc32(0, base + a, b - a) != table[d]:
                return d
            ok[d] = True
        c = e
    return -1


@njit(cache=True, nogil=True)
def verify_ranges(buf, table, ok, shift, content, starts, ends):
    """Verify (once: ``ok`` marks verified chunks) every chunk holding a byte of the ranges
    [starts[i], ends[i]) of a checksummed container memory-mapped as ``buf``. Returns the first
    chunk whose CRC-32 differs from ``table``, or -1. Ranges lie inside the content (checked
    when the container was opened)."""
    base = buf.ctypes.data
    for i in range(starts.size):
        if ends[i] > starts[i]:
            bad = _verify_chunk_range(base, table, ok, shift, content, starts[i] >> shift, (ends[i] - 1) >> shift)
            if bad >= 0:
                return bad
    return -1


@njit(cache=True, nogil=True)
def chunk_crcs(buf, shift):
    """CRC-32 of each whole ``2**shift``-byte chunk of ``buf`` (a writer's checksum table)."""
    size = 1 << shift
    n = buf.size >> shift
    out = np.empty(n, np.uint32)
    base = buf.ctypes.data
    for c in range(n):
        out[c] = _crc32(0, base + (c << shift), size)
    return out


@njit(cache=True, nogil=True)
def verify_rows(buf, table, ok, shift, content, rows, ptr, layout):
    """Verify (once) entries [ptr[j], ptr[j + 1]) of each array of ``layout`` (rows of: file offset,
    item size) for each j in ``rows``: e.g. the block tables of some terms in one call, ranges
    computed here rather than by a dozen numpy operations per query. Returns the first bad chunk
    or -1. ``ptr`` must be verified and checked (monotonic, in range) already."""
    base = buf.ctypes.data
    for i in range(rows.size):
        lo = ptr[rows[i]]
        hi = ptr[rows[i] + 1]
        if hi <= lo:
            continue
        for r in range(layout.shape[0]):
            a = layout[r, 0] + lo * layout[r, 1]
            b = layout[r, 0] + hi * layout[r, 1]
            bad = _verify_chunk_range(base, table, ok, shift, content, a >> shift, (b - 1) >> shift)
            if bad >= 0:
                return bad
    return -1


@njit(cache=True, nogil=True, inline="always")
def _read_le(buf, pos, size):
    """The little-endian unsigned integer of ``size`` (<= 8) bytes at ``buf[pos]``."""
    v = np.int64(0)
    for k in range(size):
        v |= np.int64(buf[pos + k]) << (8 * k)
    return v


@njit(cache=True, nogil=True)
def verify_docs(buf, table, ok, shift, content, docs, fixed, strings, optional):
    """Verify (once) what reading the stored fields of local docs ``docs`` reads, each byte before
    it is read here or by the caller: per doc, the fixed-size entries (``fixed`` rows: file offset,
    item size, bytes per doc; the string offsets and presence flags below among them), then the
    strings every doc has (``strings`` rows: blob offset, blob item size, offsets array offset,
    its item size), then the optional ones (``optional`` rows: presence flag array offset (1 byte
    per doc), then as ``strings``) of the docs whose flag is set. Returns the first bad chunk or -1."""
    base = buf.ctypes.data
    for i in range(docs.size):
        d = docs[i]
        for r in range(fixed.shape[0]):
            a = fixed[r, 0] + d * fixed[r, 1]
            bad = _verify_chunk_range(base, table, ok, shift, content, a >> shift, (a + fixed[r, 2] - 1) >> shift)
            if bad >= 0:
                return bad
        for r in range(strings.shape[0] + optional.shape[0]):
            if r < strings.shape[0]:
                row = strings[r]
            else:
                row = optional[r - strings.shape[0], 1:]
                if buf[optional[r - strings.shape[0], 0] + d] == 0:
                    continue  # no caption (source): its offsets are never read
                o = row[2] + d * row[3]
                bad = _verify_chunk_range(base, table, ok, shift, content, o >> shift, (o + 2 * row[3] - 1) >> shift)
                if bad >= 0:
                    return bad
            o = row[2] + d * row[3]
            a = row[0] + _read_le(buf, o, row[3]) * row[1]
            b = min(row[0] + _read_le(buf, o + row[3], row[3]) * row[1], content)
            if 0 <= a < b:  # (a verified file's offsets are in range; never read outside the content)
                bad = _verify_chunk_range(base, table, ok, shift, content, a >> shift, (b - 1) >> shift)
                if bad >= 0:
                    return bad
    return -1


if HAVE_CRC32:
    checksum.register_compiled(verify_ranges, chunk_crcs)


def check_run(chk, q0, cnt):
    """Verify the chunks holding postings [q0, q0 + cnt) of a segment before a kernel reads them.

    ``chk`` = (file buffer, chunk CRC table, verified-chunk flags, log2 chunk size, content
    length, byte offset of ``post_off``, byte offset of ``post_w``), or None (nothing to verify:
    a segment without chunked checksums, or already verified). Returns the first bad chunk or -1.
    Compiled only (see the overload below)."""
    raise NotImplementedError  # pragma: no cover


@overload(check_run)
def _check_run_impl(chk, q0, cnt):
    if isinstance(chk, types.NoneType):
        return lambda chk, q0, cnt: -1

    def impl(chk, q0, cnt):
        if cnt <= 0:
            return -1
        buf, table, ok, shift, content, off_po, off_pw = chk
        base = buf.ctypes.data
        a = off_po + q0
        bad = _verify_chunk_range(base, table, ok, shift, content, a >> shift, (a + cnt - 1) >> shift)
        if bad >= 0:
            return bad
        a = off_pw + 2 * q0
        return _verify_chunk_range(base, table, ok, shift, content, a >> shift, (a + 2 * cnt - 1) >> shift)

    return impl


#: A query term whose postings span at most this many unverified-or-not chunks is verified whole
#: before a search reads it (one pass, no per-run checks); longer ones run by run as read.
EAGER_CHUNKS = 16


def prepare_terms(chk, q_j, post_ptr):
    """Per query term: True when its postings runs must be checked as read (:func:`check_run`),
    False when verified (now, if short, or before); and the first bad chunk found now, or -1.
    Compiled only (see the overload below)."""
    raise NotImplementedError  # pragma: no cover


@overload(prepare_terms)
def _prepare_terms_impl(chk, q_j, post_ptr):
    if isinstance(chk, types.NoneType):
        return lambda chk, q_j, post_ptr: (np.zeros(q_j.size, np.bool_), -1)

    def impl(chk, q_j, post_ptr):
        buf, table, ok, shift, content, off_po, off_pw = chk
        base = buf.ctypes.data
        lazy = np.zeros(q_j.size, np.bool_)
        for i in range(q_j.size):
            q0 = post_ptr[q_j[i]]
            n = post_ptr[q_j[i] + 1] - q0
            if n <= 0:
                continue
            a0, a1 = (off_po + q0) >> shift, (off_po + q0 + n - 1) >> shift
            w0, w1 = (off_pw + 2 * q0) >> shift, (off_pw + 2 * (q0 + n) - 1) >> shift
            if a1 - a0 + w1 - w0 + 2 > EAGER_CHUNKS:
                done = True
                for c in range(a0, a1 + 1):
                    done &= ok[c]
                for c in range(w0, w1 + 1):
                    done &= ok[c]
                lazy[i] = not done
                continue
            bad = _verify_chunk_range(base, table, ok, shift, content, a0, a1)
            if bad < 0:
                bad = _verify_chunk_range(base, table, ok, shift, content, w0, w1)
            if bad >= 0:
                return lazy, bad
        return lazy, -1

    return impl
