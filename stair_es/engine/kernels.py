"""Numba kernels of the embedded engine: postings build, exact block-max top-k, lookups.

Posting layout of one segment (all fields in one structure, term key = field * V + token):

* documents are cut into fixed *blocks* of ``2**bshift`` (<= 256) consecutive local doc ids;
* per term key: its postings in doc order, split into (term, block) *pairs*; a pair stores
  the block number (uint16), the posting count - 1 (uint8) and the maximum weight in the
  block (float16 bits); since segment format 2 also one byte of sub-block bounds
  (:func:`block_subs`, an empty array for older segments);
* a posting is the doc offset inside its block (uint8) and the weight (float16 bits).

Search is exact *block-max* ranking with MaxScore inside blocks (see :func:`search_segment`);
every pruning decision compares an upper bound with the current k-th score, so results are
those of a full scan. This module must not know about files, schemas or ids.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from concurrent.futures import ThreadPoolExecutor

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import checksum
from .layout import (F16_TABLE, STRATEGY_AUTO, STRATEGY_BLOCKMAX, STRATEGY_NAMES, STRATEGY_TAAT,  # noqa: F401
                     SUB_BLOCKS, SUB_FRACTIONS, SUB_LEVELS)


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the CPU to load the cache line of ``arr[idx]`` (no effect on results)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _add_scaled4(typingctx, dst, di, src, si, a):
    """``dst[di:di + 4] += a * src[si:si + 4]`` (float32) as one 4-lane vector operation, each lane
    rounded as the scalar ``x + a * y`` (a multiply, then an add). The block-max bound pass adds
    a (term, block) pair's 4 sub-block levels this way: LLVM leaves the scalar loop unvectorised,
    and 4 scalar read-modify-writes per pair took 2x its time (2026-11-26: 0.14 against 0.076 ms
    per 1M-document segment and query)."""
    sig = types.void(dst, di, src, si, a)

    def codegen(context, builder, signature, args):
        dty, _, sty, _, _ = signature.args
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[2])
        vty = ir.VectorType(ir.FloatType(), 4)
        dp = builder.bitcast(cgutils.get_item_pointer(context, builder, dty, d, [args[1]]), vty.as_pointer())
        sp = builder.bitcast(cgutils.get_item_pointer(context, builder, sty, s, [args[3]]), vty.as_pointer())
        i32 = ir.IntType(32)
        av = builder.insert_element(ir.Constant(vty, ir.Undefined), args[4], i32(0))
        av = builder.shuffle_vector(av, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(i32, 4), [0, 0, 0, 0]))
        x = builder.load(dp, align=4)
        builder.store(builder.fadd(x, builder.fmul(av, builder.load(sp, align=4))), dp, align=4)
        return context.get_dummy_value()

    return sig, codegen


# --- checksums ----------------------------------------------------------------------------------
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


@njit(cache=True, nogil=True, inline="always")
def _verify_chunk_range(base, table, ok, shift, content, lo, hi):
    """Verify chunks [lo, hi] of the container at address ``base``; the first bad chunk, or -1."""
    for c in range(lo, hi + 1):
        if ok[c]:
            continue
        a = c << shift
        b = min(a + (1 << shift), content)
        if _crc32(0, base + a, b - a) != table[c]:
            return c
        ok[c] = True
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


# --- hashing ---------------------------------------------------------------------------------
@njit(cache=True)
def fnv1a64(blob, offsets):
    n = offsets.size - 1
    out = np.empty(n, np.uint64)
    prime = np.uint64(1099511628211)
    for i in range(n):
        h = np.uint64(14695981039346656037)
        for p in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(blob[p])) * prime
        out[i] = h
    return out


# --- strings ---------------------------------------------------------------------------------------
@njit(cache=True)
def gather_strings(blob, offs, rows):
    n = rows.size
    out_offs = np.zeros(n + 1, np.int64)
    for i in range(n):
        r = rows[i]
        out_offs[i + 1] = out_offs[i] + offs[r + 1] - offs[r]
    out = np.empty(out_offs[n], np.uint8)
    for i in range(n):
        r = rows[i]
        out[out_offs[i]:out_offs[i + 1]] = blob[offs[r]:offs[r + 1]]
    return out, out_offs


@njit(cache=True)
def same_strings(q_blob, q_offs, blob, offs, docs):
    out = np.zeros(docs.size, np.bool_)
    for i in range(docs.size):
        a0, a1 = q_offs[i], q_offs[i + 1]
        b0, b1 = offs[docs[i]], offs[docs[i] + 1]
        if a1 - a0 != b1 - b0:
            continue
        ok = True
        for k in range(a1 - a0):
            if q_blob[a0 + k] != blob[b0 + k]:
                ok = False
                break
        out[i] = ok
    return out


# --- input checks ------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _first_bad_posting(indptr, indices, weights, vocab_size, special, w_max, d0, d1):
    """(status, row) of the first bad posting of documents ``d0:d1`` in CSR order (see
    :func:`check_pack_csr`); (0, -1) when there is none."""
    for d in range(d0, d1):
        last = -1
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            if t < 0 or t >= vocab_size:
                return 2, d
            w = weights[p]
            if not (w >= 0.0) or w == np.inf:
                return 3, d
            if w > w_max:
                return 5, d
            if w > 0.0 and special[t]:
                return 4, d
            if t <= last:
                return 1, d
            last = t
    return 0, -1


@njit(cache=True, nogil=True)
def check_pack_csr(indptr, indices, weights, vocab_size, special, w_max, out, d0, d1):
    """Check documents ``d0:d1`` of a CSR batch and write their weights' fp16 bits to ``out``.

    Returns (status, row, zeros): status 0 ok; 1 unsorted/duplicate ids; 2 bad id; 3 bad weight
    (NaN, infinite, negative); 4 special token; 5 weight above ``w_max`` (fp16's largest) -- of
    the first bad posting in CSR order, ``row`` its document; ``zeros`` counts the weights whose
    fp16 bits are 0 (zero, or too small for fp16), which are not indexed.

    The checks and the cast are flat loops without early exits, which the compiler vectorises
    (~10x numpy's scalar fp16 cast); only a batch with a problem is walked again posting by
    posting to name the first one.
    """
    lo, hi = indptr[d0], indptr[d1]
    # slices, so that loop indices are provably >= 0: numba's negative-index wraparound check
    # on ``range(lo, hi)`` indices stops vectorisation (measured 7x slower)
    ids, ws, bits, packed = indices[lo:hi], weights[lo:hi], weights[lo:hi].view(np.uint32), out[lo:hi]
    m = ids.size
    bad = False
    for p in range(m):
        t = ids[p]
        w = ws[p]
        bad |= (t < 0) | (t >= vocab_size) | (not (w >= 0.0)) | (w > w_max)
    if not bad:
        for p in range(m):
            bad |= special[ids[p]] & (ws[p] > 0.0)
    if not bad:  # ids must increase within a document; a document's first id may be anything
        falls = 0
        for p in range(1, m):
            falls += ids[p] <= ids[p - 1]
        for d in range(d0 + 1, d1):
            q = indptr[d] - lo
            if q > 0 and indptr[d + 1] - lo > q:  # the start of a non-empty document after the first posting
                falls -= ids[q] <= ids[q - 1]
        bad = falls != 0
    if bad:
        status, row = _first_bad_posting(indptr, indices, weights, vocab_size, special, w_max, d0, d1)
        if status:
            return status, row, 0
    # fp16 bits, rounded to nearest, ties to even, as numpy's astype(np.float16) (tested bit for
    # bit): fp16 subnormals and zero (below 2**-14) by exact scaling to units of 2**-24 and
    # rint; normal numbers by rebiasing the exponent and adding the rounding bias to the bits
    zeros = 0
    for p in range(m):
        u = bits[p]
        small = ws[p] if u < np.uint32(0x38800000) else np.float32(0.0)  # keeps the unused arm in range
        sub = np.uint32(np.rint(small * np.float32(16777216.0)))
        nrm = (u - np.uint32(0x38000000) + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        o = sub if u < np.uint32(0x38800000) else nrm
        packed[p] = np.uint16(o)
        zeros += o == 0
    return 0, -1, zeros


# --- build -------------------------------------------------------------------------------------
@njit(cache=True)
def build_postings(indptr, indices, wbits, n_docs, key_base, n_keys, bshift):
    """CSR (doc-major, sorted token ids, non-zero fp16 bits) -> term-major block postings.

    Returns keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w.
    """
    nnz = indptr[n_docs] - indptr[0]
    counts = np.zeros(n_keys, np.int64)
    for p in range(indptr[0], indptr[n_docs]):
        counts[indices[p]] += 1
    T = 0
    for t in range(n_keys):
        if counts[t] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.empty(T + 1, np.int64)
    pos = np.zeros(n_keys, np.int64)
    j = 0
    acc = 0
    for t in range(n_keys):
        if counts[t] > 0:
            keys[j] = key_base + t
            post_ptr[j] = acc
            pos[t] = acc
            acc += counts[t]
            j += 1
    post_ptr[T] = acc
    # two-pass radix scatter (256-key groups, then keys): a direct scatter to 30k positions
    # misses the cache on nearly every posting and is ~5x slower
    n_groups = (n_keys >> 8) + 1
    gpos = np.zeros(n_groups + 1, np.int64)
    for t in range(n_keys):
        gpos[(t >> 8) + 1] += counts[t]
    for g in range(n_groups):
        gpos[g + 1] += gpos[g]
    gstart = gpos[:-1].copy()
    tmp_doc = np.empty(nnz, np.uint32)
    tmp_key = np.empty(nnz, np.uint8)
    tmp_w = np.empty(nnz, np.uint16)
    for d in range(n_docs):
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            g = t >> 8
            q = gpos[g]
            tmp_doc[q] = d
            tmp_key[q] = t & 255
            tmp_w[q] = wbits[p]
            gpos[g] = q + 1
    post_doc = np.empty(nnz, np.uint32)
    post_w = np.empty(nnz, np.uint16)
    for g in range(n_groups):
        base = g << 8
        for q in range(gstart[g], gpos[g]):
            t = base + np.int64(tmp_key[q])
            r = pos[t]
            post_doc[r] = tmp_doc[q]
            post_w[r] = tmp_w[q]
            pos[t] = r + 1
    npairs = 0
    for j in range(T):
        last = -1
        for q in range(post_ptr[j], post_ptr[j + 1]):
            b = np.int64(post_doc[q] >> bshift)
            if b != last:
                npairs += 1
                last = b
    pair_ptr = np.empty(T + 1, np.int64)
    pair_block = np.empty(npairs, np.uint16)
    pair_cnt = np.empty(npairs, np.uint8)
    pair_max = np.empty(npairs, np.uint16)
    post_off = np.empty(nnz, np.uint8)
    mask = (1 << bshift) - 1
    k = -1
    for j in range(T):
        pair_ptr[j] = k + 1
        last = -1
        c = 0
        for q in range(post_ptr[j], post_ptr[j + 1]):
            d = np.int64(post_doc[q])
            b = d >> bshift
            post_off[q] = d & mask
            w = post_w[q]
            if b != last:
                if k >= 0 and last >= 0:
                    pair_cnt[k] = c - 1
                k += 1
                pair_block[k] = b
                pair_max[k] = w
                c = 0
                last = b
            elif w > pair_max[k]:  # positive fp16 bit patterns sort like their values
                pair_max[k] = w
            c += 1
        if last >= 0:
            pair_cnt[k] = c - 1
    pair_ptr[T] = k + 1
    return keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w


# --- threaded build ------------------------------------------------------------------------------
# The same arrays as :func:`build_postings`, built by chunks of documents on several threads.
# Chunks are runs of whole blocks, so no (term, block) pair spans two chunks: a first pass counts
# each chunk's postings and pairs per key, and their prefix sums give every (chunk, key) its final
# posting and pair positions. Each chunk is then scattered on its own (radix by 256-key group
# into a per-thread scratch buffer, then by key straight into the output, building the pairs on
# the way): no whole-input temporaries (:func:`build_postings` faults in 11 bytes of them a
# posting, which costs about as much as the work) and a scratch buffer that stays in the CPU
# caches or near. Threads take chunks as they free up, each writing its own positions. One
# thread is faster than :func:`build_postings` too.

#: most postings per chunk of a threaded build: a thread's scratch is 6 bytes a posting, reused
#: chunk after chunk; each chunk restarts every key's output run, so much smaller chunks cost
#: more (2M to 8M were alike on 200M postings)
BUILD_CHUNK_POSTINGS = 1 << 22


@njit(cache=True, nogil=True)
def _count_chunk(indptr, indices, d0, d1, bshift, cnt, pcnt, last):
    """Postings ``cnt[t]`` and (t, block) pairs ``pcnt[t]`` of each key t in docs [d0, d1)
    (added to; ``last`` is int32 scratch of one entry per key). Branch-free: a quarter of the
    postings start a pair, too many for the branch predictor."""
    last[:] = -1
    for d in range(d0, d1):
        b = np.int32(d >> bshift)
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            cnt[t] += 1
            pcnt[t] += np.int32(last[t] != b)
            last[t] = b


@njit(cache=True, nogil=True)
def _place_chunks(cnt, pcnt, key_base):
    """From the per-chunk counts of :func:`_count_chunk` (rows: chunks): keys, post_ptr, pair_ptr
    as :func:`build_postings`; the first posting and pair of each key (``key_post``,
    ``key_pair``); and ``goff[c]``, where each 256-key group starts in chunk c's scratch. ``cnt``
    and ``pcnt`` become the offset of chunk c's postings and pairs inside each key's run (no
    larger than the documents, so they fit in place)."""
    n_chunks, n_keys = cnt.shape
    n_groups = (n_keys + 255) >> 8
    goff = np.zeros((n_chunks, n_groups + 1), np.int64)
    run = np.zeros(n_keys, np.int64)
    prun = np.zeros(n_keys, np.int64)
    for c in range(n_chunks):
        for t in range(n_keys):
            n = cnt[c, t]
            goff[c, (t >> 8) + 1] += n
            cnt[c, t] = run[t]
            run[t] += n
            n = pcnt[c, t]
            pcnt[c, t] = prun[t]
            prun[t] += n
        for g in range(n_groups):
            goff[c, g + 1] += goff[c, g]
    T = 0
    for t in range(n_keys):
        if run[t] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.empty(T + 1, np.int64)
    pair_ptr = np.empty(T + 1, np.int64)
    key_post = np.zeros(n_keys, np.int64)
    key_pair = np.zeros(n_keys, np.int64)
    j = 0
    acc = 0
    pacc = 0
    for t in range(n_keys):
        if run[t] > 0:
            keys[j] = key_base + t
            post_ptr[j] = key_post[t] = acc
            pair_ptr[j] = key_pair[t] = pacc
            acc += run[t]
            pacc += prun[t]
            j += 1
    post_ptr[T] = acc
    pair_ptr[T] = pacc
    return keys, post_ptr, pair_ptr, key_post, key_pair, goff


@njit(cache=True, nogil=True, inline="always")
def _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max):
    """Write the pairs in block ``blk`` of the ``nt`` keys ``touched`` (of a 256-key group):
    each key's next pair, from its ``state`` (postings in the block << 16 | their top weight's
    fp16 bits), reset for the next block."""
    for j in range(nt):
        i = touched[j]
        k = cur[i] + 1
        cur[i] = k
        s = state[i]
        pair_block[k] = blk
        pair_cnt[k] = (s >> 16) - 1
        pair_max[k] = s & 0xFFFF
        state[i] = 0


@njit(cache=True, nogil=True)
def _scatter_chunk(indptr, indices, wbits, d0, d1, bshift, goff, chunk_post, chunk_pair, key_post, key_pair,
                   tmp_v, tmp_w, post_off, post_w, pair_block, pair_cnt, pair_max):
    """Write the postings and pairs of docs [d0, d1) (whole blocks) at their final positions
    (key t's start ``key_post[t]`` plus this chunk's offset ``chunk_post[t]``; pairs alike).
    Two radix passes through the scratch ``tmp_v`` (doc << 8 | low key byte; docs < 2**24) and
    ``tmp_w``, as a direct scatter to 30k keys would miss the cache on nearly every posting:
    by 256-key group, then by key. A group's postings come in doc order, so its pairs are
    complete at each change of block and are written then, one write per pair."""
    n_keys = chunk_post.size
    fill = goff[:-1].copy()
    for d in range(d0, d1):
        dv = np.uint32(d << 8)
        for p in range(indptr[d], indptr[d + 1]):
            t = indices[p]
            q = fill[t >> 8]
            tmp_v[q] = dv | np.uint32(t & 255)
            tmp_w[q] = wbits[p]
            fill[t >> 8] = q + 1
    mask = (1 << bshift) - 1
    nxt = np.empty(256, np.int64)  # per key of the group: its next posting,
    cur = np.empty(256, np.int64)  # its last pair written,
    state = np.zeros(256, np.int64)  # its current pair (see _flush_pairs; one word: one load and store a posting)
    touched = np.empty(256, np.int64)  # keys seen in the current block
    for g in range(goff.size - 1):
        base = g << 8
        for i in range(min(256, n_keys - base)):
            nxt[i] = key_post[base + i] + chunk_post[base + i]
            cur[i] = key_pair[base + i] + chunk_pair[base + i] - 1
        blk = -1
        nt = 0
        for q in range(goff[g], goff[g + 1]):
            v = np.int64(tmp_v[q])
            d = v >> 8
            if d >> bshift != blk:
                _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max)
                blk = d >> bshift
                nt = 0
            i = v & 255
            w = np.int64(tmp_w[q])
            r = nxt[i]
            post_off[r] = d & mask
            post_w[r] = w
            nxt[i] = r + 1
            s = state[i]
            touched[nt] = i
            nt += s == 0  # branch-free, as in _count_chunk
            # positive fp16 bit patterns sort like their values
            state[i] = ((s >> 16) + 1) << 16 | max(s & 0xFFFF, w)
        _flush_pairs(blk, touched, nt, cur, state, pair_block, pair_cnt, pair_max)


@njit(cache=True, nogil=True)
def _empty_outputs(n_post, n_pairs):
    """post_off, post_w, pair_block, pair_cnt, pair_max, uninitialised. From numba's allocator
    (malloc) because numpy's asks large arrays for transparent huge pages, whose first faults in
    a process can stall on memory compaction: seconds for a 200M-posting build."""
    return (np.empty(n_post, np.uint8), np.empty(n_post, np.uint16), np.empty(n_pairs, np.uint16),
            np.empty(n_pairs, np.uint8), np.empty(n_pairs, np.uint16))


def _chunk_bounds(indptr: np.ndarray, n_docs: int, bshift: int, target: int) -> np.ndarray:
    """Doc bounds of consecutive chunks of whole blocks, about ``target`` postings each."""
    starts = np.append(np.arange(0, n_docs, 1 << bshift), n_docs)  # of each block, and the end
    before = indptr[starts] - indptr[0]  # postings before each
    n_chunks = -(-int(before[-1]) // target)
    cuts = starts[np.searchsorted(before, np.arange(1, n_chunks) * target)]
    return np.unique(np.concatenate([[0], cuts, [n_docs]]).astype(np.int64))


def _for_each_chunk(n_chunks: int, threads: int, worker) -> None:
    """Call ``run(c)`` for each chunk c on up to ``threads`` threads at once, this one among them
    (the kernels release the GIL), each taking the next chunk as it frees up; ``worker()`` makes
    one thread's ``run`` (with its own scratch)."""
    lock = threading.Lock()
    todo = iter(range(n_chunks))

    def work() -> None:
        run = worker()
        while True:
            with lock:
                c = next(todo, -1)
            if c < 0:
                return
            run(c)

    threads = min(threads, n_chunks)
    if threads <= 1:
        work()
        return
    with ThreadPoolExecutor(threads - 1, thread_name_prefix="stair-es-build") as pool:
        others = [pool.submit(work) for _ in range(threads - 1)]
        work()
        for f in others:
            f.result()


def build_postings_threaded(indptr, indices, wbits, n_docs, key_base, n_keys, bshift, threads, chunk_postings=None):
    """:func:`build_postings` (byte-identical arrays) on ``threads`` threads; ``n_docs`` <= 2**24.
    ``chunk_postings``: postings per chunk (default: at least 4 chunks a thread, for balance)."""
    if n_docs > 1 << 24:
        raise ValueError(f"a threaded build takes at most {1 << 24} documents, got {n_docs}")
    if chunk_postings is None:
        chunk_postings = min(BUILD_CHUNK_POSTINGS, max(1, int(indptr[n_docs] - indptr[0]) // (4 * threads)))
    bounds = _chunk_bounds(indptr, n_docs, bshift, chunk_postings)
    n_chunks = bounds.size - 1
    cnt = np.zeros((n_chunks, n_keys), np.int32)
    pcnt = np.zeros((n_chunks, n_keys), np.int32)

    def counter():
        last = np.empty(n_keys, np.int32)
        return lambda c: _count_chunk(indptr, indices, bounds[c], bounds[c + 1], bshift, cnt[c], pcnt[c], last)

    _for_each_chunk(n_chunks, threads, counter)
    keys, post_ptr, pair_ptr, key_post, key_pair, goff = _place_chunks(cnt, pcnt, key_base)
    post_off, post_w, pair_block, pair_cnt, pair_max = _empty_outputs(post_ptr[-1], pair_ptr[-1])
    scratch = int(np.diff(indptr[bounds]).max(initial=0))

    def scatterer():
        tmp_v, tmp_w = np.empty(scratch, np.uint32), np.empty(scratch, np.uint16)
        return lambda c: _scatter_chunk(indptr, indices, wbits, bounds[c], bounds[c + 1], bshift, goff[c], cnt[c], pcnt[c],
                                        key_post, key_pair, tmp_v, tmp_w, post_off, post_w, pair_block, pair_cnt, pair_max)

    _for_each_chunk(n_chunks, threads, scatterer)
    return keys, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, post_off, post_w


@njit(cache=True)
def merge_postings(kstart, kend, keys_u, pair_block, pair_cnt, post_off, post_w, post_start, newdoc, doc_base, bshift_in, bshift):
    """Merge the postings of several segments term by term (streaming, no transposition).

    ``kstart[s, u]`` / ``kend[s, u]``: pair range of union key u in segment s (concatenated
    arrays; kstart = kend when absent); ``post_start[s, u]``: its first posting. Local doc
    d of segment s becomes ``newdoc[doc_base[s] + d]`` (-1 = deleted). Output as
    :func:`build_postings`.
    """
    S = kstart.shape[0]
    U = keys_u.size
    cnt_post = np.zeros(U, np.int64)
    cnt_pair = np.zeros(U, np.int64)
    for u in range(U):
        last = -1
        for s in range(S):
            q = post_start[s, u]
            for p in range(kstart[s, u], kend[s, u]):
                base = np.int64(pair_block[p]) << bshift_in
                for _ in range(np.int64(pair_cnt[p]) + 1):
                    nd = newdoc[doc_base[s] + base + post_off[q]]
                    q += 1
                    if nd >= 0:
                        cnt_post[u] += 1
                        b = nd >> bshift
                        if b != last:
                            cnt_pair[u] += 1
                            last = b
    T = 0
    for u in range(U):
        if cnt_post[u] > 0:
            T += 1
    keys = np.empty(T, np.uint32)
    post_ptr = np.zeros(T + 1, np.int64)
    pair_ptr = np.zeros(T + 1, np.int64)
    j = 0
    for u in range(U):
        if cnt_post[u] > 0:
            keys[j] = keys_u[u]
            post_ptr[j + 1] = post_ptr[j] + cnt_post[u]
            pair_ptr[j + 1] = pair_ptr[j] + cnt_pair[u]
            j += 1
    o_block = np.empty(pair_ptr[T], np.uint16)
    o_cnt = np.empty(pair_ptr[T], np.uint8)
    o_max = np.empty(pair_ptr[T], np.uint16)
    o_off = np.empty(post_ptr[T], np.uint8)
    o_w = np.empty(post_ptr[T], np.uint16)
    mask = (1 << bshift) - 1
    j = 0
    for u in range(U):
        if cnt_post[u] == 0:
            continue
        k = pair_ptr[j] - 1
        r = post_ptr[j]
        last = -1
        c = 0
        for s in range(S):
            q = post_start[s, u]
            for p in range(kstart[s, u], kend[s, u]):
                base = np.int64(pair_block[p]) << bshift_in
                for _ in range(np.int64(pair_cnt[p]) + 1):
                    nd = newdoc[doc_base[s] + base + post_off[q]]
                    w = post_w[q]
                    q += 1
                    if nd < 0:
                        continue
                    b = nd >> bshift
                    if b != last:
                        if k >= pair_ptr[j]:
                            o_cnt[k] = c - 1
                        k += 1
                        o_block[k] = b
                        o_max[k] = w
                        c = 0
                        last = b
                    elif w > o_max[k]:
                        o_max[k] = w
                    o_off[r] = nd & mask
                    o_w[r] = w
                    r += 1
                    c += 1
        o_cnt[k] = c - 1
        j += 1
    return keys, post_ptr, pair_ptr, o_block, o_cnt, o_max, o_off, o_w


@njit(cache=True)
def postings_to_csr(n_docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, key_lo, key_hi, bshift, keep_map):
    """Term-major postings of keys in [key_lo, key_hi) -> doc-major CSR over kept docs.

    ``keep_map[d]`` is the new row of local doc d (-1 = dropped). Returns indptr, token ids
    (key - key_lo), fp16 weight bits; token ids within a row come out sorted.
    """
    n_out = 0
    for d in range(n_docs):
        if keep_map[d] >= 0:
            n_out += 1
    counts = np.zeros(n_out + 1, np.int64)
    for j in range(keys.size):
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        q = post_ptr[j]
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                r = keep_map[base + post_off[q]]
                if r >= 0:
                    counts[r + 1] += 1
                q += 1
    indptr = np.cumsum(counts)
    pos = indptr[:-1].copy()
    ids = np.empty(indptr[n_out], np.int32)
    wb = np.empty(indptr[n_out], np.uint16)
    for j in range(keys.size):  # keys ascending -> ids ascending within each row
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        tok = np.int32(keys[j] - key_lo)
        q = post_ptr[j]
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                r = keep_map[base + post_off[q]]
                if r >= 0:
                    ids[pos[r]] = tok
                    wb[pos[r]] = post_w[q]
                    pos[r] += 1
                q += 1
    return indptr, ids, wb


@njit(cache=True)
def doc_row(doc, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, bshift):
    """All (key, fp16 bits) of one local doc, keys ascending."""
    b = doc >> bshift
    off = doc & ((1 << bshift) - 1)
    out_k = np.empty(keys.size, np.uint32)
    out_w = np.empty(keys.size, np.uint16)
    n = 0
    for j in range(keys.size):
        lo = pair_ptr[j]
        hi = pair_ptr[j + 1]
        # binary search of block b in this term's pairs
        while lo < hi:
            mid = (lo + hi) >> 1
            if pair_block[mid] < b:
                lo = mid + 1
            else:
                hi = mid
        if lo < pair_ptr[j + 1] and pair_block[lo] == b:
            q = post_ptr[j]
            for p in range(pair_ptr[j], lo):
                q += np.int64(pair_cnt[p]) + 1
            for qq in range(q, q + np.int64(pair_cnt[lo]) + 1):
                if post_off[qq] == off:
                    out_k[n] = keys[j]
                    out_w[n] = post_w[qq]
                    n += 1
                    break
    return out_k[:n], out_w[:n]


@njit(cache=True)
def term_docs(j, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, out_mask):
    """Set ``out_mask[d] = 1`` for every local doc in term j's postings."""
    q = post_ptr[j]
    for p in range(pair_ptr[j], pair_ptr[j + 1]):
        base = np.int64(pair_block[p]) << bshift
        for _ in range(np.int64(pair_cnt[p]) + 1):
            out_mask[base + post_off[q]] = 1
            q += 1


@njit(cache=True)
def term_freqs(keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, bshift, live, key_lo, key_hi, out):
    """Live document frequency per key in [key_lo, key_hi) added into out[key - key_lo]."""
    all_live = live.size == 0
    for j in range(keys.size):
        if keys[j] < key_lo or keys[j] >= key_hi:
            continue
        if all_live:
            out[keys[j] - key_lo] += post_ptr[j + 1] - post_ptr[j]
            continue
        q = post_ptr[j]
        c = 0
        for p in range(pair_ptr[j], pair_ptr[j + 1]):
            base = np.int64(pair_block[p]) << bshift
            for _ in range(np.int64(pair_cnt[p]) + 1):
                if live[base + post_off[q]]:
                    c += 1
                q += 1
        out[keys[j] - key_lo] += c


@njit(cache=True)
def block_subs(pair_cnt, pair_max, post_off, post_w, bshift):
    """Per (term, block) pair, the sub-block code byte of its postings (``npkernels.SUB_BLOCKS``:
    2 bits per sub-block, 0 = no posting there, else the sub-block maximum rounded up to a
    level of the block maximum). Computed from built postings (new or merged) when a segment
    is written; pairs are in posting order. ~4 ns per posting (0.8 s per million documents of
    the scale corpus), half of it saved by the shortcut for lone postings (54 % of its pairs)."""
    out = np.zeros(pair_cnt.size, np.uint8)
    _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out, 0, pair_cnt.size, 0)
    return out


@njit(cache=True, nogil=True)
def _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out, p0, p1, q0):
    """:func:`block_subs` of pairs ``p0:p1`` into ``out``; ``q0``: the first posting of pair p0."""
    smax = np.zeros(SUB_BLOCKS, np.int64)
    half = SUB_LEVELS[1]
    three_q = SUB_LEVELS[2]
    q = q0
    for p in range(p0, p1):
        c = np.int64(pair_cnt[p]) + 1
        if c == 1:  # a lone posting is its block's maximum: the top level in its sub-block
            out[p] = 3 << (2 * ((np.int64(post_off[q]) * SUB_BLOCKS) >> bshift))
            q += 1
            continue
        for y in range(SUB_BLOCKS):
            smax[y] = -1
        for qq in range(q, q + c):
            y = (np.int64(post_off[qq]) * SUB_BLOCKS) >> bshift
            smax[y] = max(smax[y], np.int64(post_w[qq]))  # positive fp16 bit patterns order like their values
        q += c
        m = F16_TABLE[pair_max[p]]
        code = 0
        for y in range(SUB_BLOCKS):
            if smax[y] >= 0:
                x = F16_TABLE[smax[y]]
                # m / 2 and 3m / 4 are exact in float32 (m has 11 significant bits): the level is exact
                code |= (1 + (x > m * half) + (x > m * three_q)) << (2 * y)
        out[p] = code


def block_subs_threaded(pair_ptr, post_ptr, pair_cnt, pair_max, post_off, post_w, bshift, threads):
    """:func:`block_subs` (the same bytes) on ``threads`` threads, in chunks of whole terms
    balanced by postings (a term's pairs and postings are contiguous)."""
    out = np.zeros(pair_cnt.size, np.uint8)
    n_keys = pair_ptr.size - 1
    targets = np.linspace(0, post_ptr[-1], 4 * threads + 1)[1:-1]
    cuts = np.unique(np.concatenate([[0], np.searchsorted(post_ptr[:-1], targets), [n_keys]]))

    def worker():
        return lambda c: _block_subs_range(pair_cnt, pair_max, post_off, post_w, bshift, out,
                                           pair_ptr[cuts[c]], pair_ptr[cuts[c + 1]], post_ptr[cuts[c]])

    _for_each_chunk(cuts.size - 1, threads, worker)
    return out


# --- top-k heap (root = worst kept hit: lowest score, then highest sequence number) ------------
@njit(cache=True, inline="always")
def _worse(s1, q1, s2, q2):
    return s1 < s2 or (s1 == s2 and q1 > q2)


@njit(cache=True)
def _sift_down(hs, hq, hr, n, i):
    while True:
        l = 2 * i + 1
        if l >= n:
            return
        m = l
        r = l + 1
        if r < n and _worse(hs[r], hq[r], hs[l], hq[l]):
            m = r
        if _worse(hs[m], hq[m], hs[i], hq[i]):
            hs[i], hs[m] = hs[m], hs[i]
            hq[i], hq[m] = hq[m], hq[i]
            hr[i], hr[m] = hr[m], hr[i]
            i = m
        else:
            return


@njit(cache=True)
def _push(hs, hq, hr, state, k, s, sq, ref):
    n = state[0]
    if n < k:
        i = n
        hs[i] = s
        hq[i] = sq
        hr[i] = ref
        while i > 0:
            par = (i - 1) >> 1
            if _worse(hs[i], hq[i], hs[par], hq[par]):
                hs[i], hs[par] = hs[par], hs[i]
                hq[i], hq[par] = hq[par], hq[i]
                hr[i], hr[par] = hr[par], hr[i]
                i = par
            else:
                break
        state[0] = n + 1
    elif _worse(hs[0], hq[0], s, sq):
        hs[0] = s
        hq[0] = sq
        hr[0] = ref
        _sift_down(hs, hq, hr, n, 0)


# --- search ------------------------------------------------------------------------------------
LOOKUP_COST = 64  # one binary-search lookup in a cold (term, block) run costs about this many streamed postings
GATHER_MAX = 32  # see _blockmax_segment: survivors are gathered from the runs read when they hold at most this many postings
# cache lines of the next block's first runs to prefetch while a block is scored. 0 since the block
# sweep walks each term's runs in order (the hardware prefetcher follows them): on this 2-core AVX-512
# machine (2026-11-26, 1M idf documents, 200 queries, variants interleaved) 1 line cost 4-6 % more
# CPU time than none
PREFETCH_LINES = 0
_SUB_FRACTIONS_FLAT = np.ascontiguousarray(SUB_FRACTIONS).ravel()  # row c: code c's 4 levels (see _add_scaled4)
assert SUB_BLOCKS == 4  # the bound pass adds a pair's sub-block levels as one 4-lane vector


@njit(cache=True, nogil=True)
def search_segment(
    q_j, q_w, n_docs, bshift,
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, post_off, post_w, f16,
    allowed, seq, ref_base, k, hs, hq, hr, state, head_blocks=64, strategy=0, scratch=None, chk=None,
    block_lo=0, block_hi=-1,
):
    """Exact top-k over one segment, merged into the shared heap (hs, hq, hr, state).

    ``q_j``: term index of each query term in this segment (present terms only); ``q_w``:
    float32 query weights (clause weight applied). ``pair_sub``: the segment's sub-block codes
    (:func:`block_subs`), or an empty uint8 array for a segment without them (format 1: searched
    with block bounds only). ``allowed``: uint8 per doc (filter and
    not deleted) or empty for "all". ``state`` = [heap size, matched docs, 1 if matched is
    exact, blocks scored, candidate blocks(, postings streamed, lookups)]: the counters in
    brackets are kept when ``state`` is that long.

    ``strategy``: :data:`STRATEGY_AUTO` (0) picks one per call with :func:`choose_strategy`;
    :data:`STRATEGY_BLOCKMAX` (1) forces :func:`_blockmax_segment`; :data:`STRATEGY_TAAT` (2)
    forces :func:`_taat_segment`. ``scratch``: float32 zeros, at least ``n_docs`` long, that
    TAAT uses as its accumulator and leaves all zeros (reuse it across calls); without it TAAT
    allocates one. Every strategy returns the same hits with bit-identical scores (summed in
    query-term order, like ``explain``). Returns the strategy used.

    ``chk``: see :func:`check_run`. With it, the kernel verifies each postings run the first
    time it reads it (the block tables ``pair_*`` of the query terms must be verified by the
    caller); a run failing its checksum stops the search with ``state[7]`` = the bad chunk
    (``state`` must then have 8 entries, ``state[7]`` = -1 on entry), so no damaged byte ever
    reaches a score.

    ``block_lo``, ``block_hi``: block-max searches only blocks [block_lo, block_hi) (-1: to the
    end), so that one query can run on several threads over parts of a segment, each with its
    own heap; TAAT ignores them (the caller splits only block-max work).
    """
    if chk is not None and state.size < 8:
        raise ValueError("search_segment with chk needs a state of 8 entries")
    s = strategy
    if s == STRATEGY_AUTO:
        s = choose_strategy(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, k, state)
    if s == STRATEGY_TAAT:
        if scratch is None:
            acc = np.zeros(n_docs, np.float32)
        else:
            acc = scratch
            if acc.size < n_docs:
                acc = np.zeros(n_docs, np.float32)
        _taat_segment(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, f16,
                      allowed, seq, ref_base, k, hs, hq, hr, state, acc, chk)
        return STRATEGY_TAAT
    _blockmax_segment(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, post_off,
                      post_w, f16, allowed, seq, ref_base, k, hs, hq, hr, state, head_blocks, chk, block_lo, block_hi)
    return STRATEGY_BLOCKMAX


@njit(cache=True)
def choose_strategy(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, k, state):
    """The cheaper exact strategy for this query on this segment: a cost model in nanoseconds,
    calibrated on 20k-1M document segments (docs/engine.md).

    TAAT reads every posting of the query terms (~1.4 ns each) and scans the documents hit
    (~0.5 ns each). Block-max reads at most as many postings, usually far fewer, but every hit
    that enters its top-k heap is rescored in query-term order (~50 ns per query term); about
    k (1 + ln(n / k)) hits enter a heap of k over n documents in scan order, fewer when earlier
    segments filled it already. Block-max is kept unless that rescoring alone would cost more
    than half of a TAAT pass: it wins by far whenever the weights let its bounds prune, which
    the model cannot see in advance. In practice TAAT is chosen for large k."""
    P = 0
    for i in range(q_j.size):
        P += post_ptr[q_j[i] + 1] - post_ptr[q_j[i]]
    if P == 0 or n_docs == 0:
        return STRATEGY_BLOCKMAX
    kk = float(max(k, 1))
    if state[0] >= k:  # the heap is full already: only docs beating earlier segments' hits enter
        seen = float(max(state[1], k))
        pushes = kk * np.log1p(n_docs / seen)
    else:
        pushes = kk * (1.0 + np.log(max(n_docs / kk, 1.0)))
    pushes = min(pushes, float(n_docs), float(P))
    rescoring = pushes * q_j.size * 50.0
    taat = 1.4 * P + 0.5 * n_docs
    if rescoring > 0.5 * taat:
        return STRATEGY_TAAT
    return STRATEGY_BLOCKMAX


@njit(cache=True)
def _taat_segment(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, f16,
                  allowed, seq, ref_base, k, hs, hq, hr, state, acc, chk=None):
    """Exact term-at-a-time: every posting of the query terms, in query-term order, into the dense
    float32 accumulator ``acc`` (so each doc's sum is its canonical score bit for bit), then one
    pass over the documents hit keeps the allowed top k and zeroes ``acc`` again."""
    lo = n_docs
    hi = 0
    streamed = 0
    for i in range(q_j.size):
        j = q_j[i]
        w = q_w[i]
        q = post_ptr[j]
        p0 = pair_ptr[j]
        p1 = pair_ptr[j + 1]
        if p1 > p0:
            b0 = np.int64(pair_block[p0]) << bshift
            if b0 < lo:
                lo = b0
            b1 = (np.int64(pair_block[p1 - 1]) + 1) << bshift
            if b1 > hi:
                hi = b1
        streamed += post_ptr[j + 1] - q
        bad = check_run(chk, q, post_ptr[j + 1] - q)
        if bad >= 0:
            state[7] = bad
            acc[:] = 0.0  # left all zeros for the next caller
            return
        for p in range(p0, p1):
            base = np.int64(pair_block[p]) << bshift
            c = np.int64(pair_cnt[p]) + 1
            for qq in range(q, q + c):
                acc[base + post_off[qq]] += w * f16[post_w[qq]]
            q += c
    if hi > n_docs:
        hi = n_docs
    use_mask = allowed.size > 0
    matched = 0
    full = state[0] >= k
    thr = hs[0] if full else np.float32(0.0)
    for d in range(lo, hi):
        s = acc[d]
        if s > 0:
            acc[d] = 0.0
            if use_mask and not allowed[d]:
                continue
            matched += 1
            if full and s < thr:
                continue
            _push(hs, hq, hr, state, k, s, seq[d], ref_base + d)
            if not full and state[0] >= k:
                full = True
            if full:
                thr = hs[0]
    state[1] += matched
    if state.size >= 5:
        nb = (hi - lo + (1 << bshift) - 1) >> bshift if hi > lo else 0
        state[3] += nb
        state[4] += nb
    if state.size >= 6:
        state[5] += streamed


@njit(cache=True)
def _block_plan(q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, f16, allowed,
                head_blocks, block_lo=0, block_hi=-1):
    """Per-query block bounds, visit order, and the runs of the few blocks visited out of order.

    ``ub[b]``: the bound of block b. Without sub-block codes (``pair_sub`` empty: segment format
    1) the sum over query terms of query weight x the term's maximum in block b; with them
    ``ubs[b * SUB_BLOCKS + s]``, the same sum over sub-block s with each term's maximum there
    (rounded up to a level of its block maximum), and ``ub[b]`` the highest of its sub-blocks'
    (a term heavy in one sub-block and a term heavy in another no longer add up). ``tsum[i]``:
    sum of term i's block-level bounds (for the term order). Candidate blocks (in [block_lo,
    block_hi), a positive bound and, with a filter, an allowed doc) are visited in two phases:

    * the *head*, ``head`` (best bound first): every candidate whose bound falls in the top bins
      of a 1024-bin histogram of the bounds holding at least ``max(head_blocks, nc / 16)`` of them
      (they raise the k-th score quickly). Every other candidate's bound is strictly lower than
      every head block's, so once a head block's bound is below the k-th score nothing left can
      reach it. Their runs are in ``hslot[i, h]`` (posting start << 9 | count of term i in head
      block h, -1: none), ``hbmc[i, h]`` (query weight x block max) and ``hsub[i, h]`` (its
      sub-block code; 255 without codes);
    * the *tail*, ``tail`` (block order: sequential reads), whose runs the kernel finds with one
      cursor per term walking that term's (block, count) table: no per-(block, term) table is
      built, so this set-up pass costs one read of the query terms' block tables (~2 ns per
      (term, block) pair) instead of a scattered write per pair.

    ``head_blocks`` = 0: no head, every candidate in the tail. The kernel asks for that when the
    top-k heap is already full on entry (an earlier segment set the k-th score): the head's run
    table then costs more (a second read of the block tables) than the earlier rise of the k-th
    score saves (measured over ten 1M-document segments: -5 % CPU per query).
    """
    nq = q_j.size
    bs = 1 << bshift
    n_blocks = (n_docs + bs - 1) >> bshift
    ub = np.zeros(n_blocks, np.float32)
    tsum = np.zeros(nq, np.float64)  # per term: sum of its block bounds
    has_sub = pair_sub.size > 0
    ubs = np.zeros(n_blocks * SUB_BLOCKS if has_sub else 0, np.float32)
    for i in range(nq):
        j = q_j[i]
        w = q_w[i]
        t = 0.0
        if has_sub:
            for p in range(pair_ptr[j], pair_ptr[j + 1]):
                m = w * f16[pair_max[p]]
                # ubs[block's 4 sub-blocks] += m x the code's 4 levels
                _add_scaled4(ubs, np.int64(pair_block[p]) * SUB_BLOCKS, _SUB_FRACTIONS_FLAT,
                             np.int64(pair_sub[p]) * SUB_BLOCKS, m)
                t += m
        else:
            for p in range(pair_ptr[j], pair_ptr[j + 1]):
                m = w * f16[pair_max[p]]
                ub[np.int64(pair_block[p])] += m
                t += m
        tsum[i] = t
    if has_sub:
        for b in range(n_blocks):
            v = ubs[b * SUB_BLOCKS]
            for y in range(1, SUB_BLOCKS):
                v = max(v, ubs[b * SUB_BLOCKS + y])
            ub[b] = v
    use_mask = allowed.size > 0
    lo = max(block_lo, 0)
    hi = n_blocks if block_hi < 0 else min(block_hi, n_blocks)
    nc = 0
    cand = np.empty(max(hi - lo, 0), np.int64)
    vmax = np.float32(0.0)
    for b in range(lo, hi):
        if ub[b] <= 0:
            continue
        if use_mask:
            found = False
            for d in range(b * bs, min((b + 1) * bs, n_docs)):
                if allowed[d]:
                    found = True
                    break
            if not found:
                continue
        cand[nc] = b
        nc += 1
        if ub[b] > vmax:
            vmax = ub[b]
    cand = cand[:nc]
    n_first = min(nc, max(head_blocks, nc >> 4)) if head_blocks > 0 else 0
    # head = the candidates in the top histogram bins (a monotone binning: a lower bin holds only
    # strictly lower bounds); at least n_first of them
    if n_first <= 0:
        return (ub, ubs, tsum, np.empty(0, np.int64), np.empty((nq, 0), np.int64), np.empty((nq, 0), np.float32),
                np.empty((nq, 0), np.uint8), cand, nc)
    nbins = 1024
    scale = np.float32(nbins) / vmax if vmax > 0 else np.float32(0.0)
    bins = np.empty(nc, np.int64)
    hist = np.zeros(nbins, np.int64)
    for c in range(nc):
        x = min(np.int64(ub[cand[c]] * scale), nbins - 1)
        bins[c] = x
        hist[x] += 1
    cut = nbins
    got = 0
    while got < n_first and cut > 0:
        cut -= 1
        got += hist[cut]
    head = np.empty(got, np.int64)
    tail = np.empty(nc - got, np.int64)
    h = 0
    t = 0
    for c in range(nc):
        if bins[c] >= cut:
            head[h] = cand[c]
            h += 1
        else:
            tail[t] = cand[c]
            t += 1
    head = head[np.argsort(-ub[head])]
    nh = head.size
    hrow = np.full(n_blocks, -1, np.int64)
    for x in range(nh):
        hrow[head[x]] = x
    hslot = np.full((nq, nh), -1, np.int64)
    hbmc = np.zeros((nq, nh), np.float32)
    hsub = np.full((nq, nh), 255, np.uint8)  # 255: every sub-block at the block bound
    if nh > 0:
        for i in range(nq):
            j = q_j[i]
            w = q_w[i]
            q = post_ptr[j]
            for p in range(pair_ptr[j], pair_ptr[j + 1]):
                c = np.int64(pair_cnt[p]) + 1
                r = hrow[np.int64(pair_block[p])]
                if r >= 0:
                    hslot[i, r] = (q << 9) | c  # posting start and count (<= 256) in one word
                    hbmc[i, r] = w * f16[pair_max[p]]
                    if has_sub:
                        hsub[i, r] = pair_sub[p]
                q += c
    return ub, ubs, tsum, head, hslot, hbmc, hsub, tail, nc


@njit(cache=True, inline="always")
def _find_weight(post_off, post_w, f16, q0, cnt, o):
    """Weight of block offset ``o`` in one (term, block) run (offsets ascending), or 0."""
    lo = q0
    n = cnt
    while n > 1:  # branch-free lower bound
        half = n >> 1
        lo = lo + half if post_off[lo + half - 1] < o else lo
        n -= half
    if n == 1 and post_off[lo] < o:
        lo += 1
    if lo < q0 + cnt and post_off[lo] == o:
        return f16[post_w[lo]]
    return np.float32(0.0)


@njit(cache=True)
def _canonical_score(slot_row, q_w, post_off, post_w, f16, o):
    """The score of one doc summed in query-term order (what explain reproduces)."""
    s = np.float32(0.0)
    for i in range(q_w.size):
        sl = slot_row[i]
        if sl >= 0:
            w = _find_weight(post_off, post_w, f16, sl >> 9, sl & 511, o)
            if w > 0:
                s += q_w[i] * w
    return s


@njit(cache=True, inline="always")
def _check_block(chk, slot_row, lazy):
    """Verify every postings run of one block (before canonical scores read them)."""
    for i in range(slot_row.size):
        sl = slot_row[i]
        if sl >= 0 and lazy[i]:
            bad = check_run(chk, sl >> 9, sl & 511)
            if bad >= 0:
                return bad
    return -1


@njit(cache=True, inline="always")
def _block_run(i, oi, b, in_head, hslot, hbmc, hsub, cp, pe, cq, pair_block, pair_cnt, pair_max, pair_sub, q_w, f16,
               row, rbm, rsub, stamp):
    """Term i's run in block b, the oi-th block visited, into ``row[i]`` (posting start << 9 |
    count, -1: none), its bound into ``rbm[i]`` and its sub-block code into ``rsub[i]`` (255:
    none stored, every sub-block at ``rbm[i]``). Head blocks read the plan's table; tail blocks
    (visited in block order) move term i's cursor forward to b, only when the block needs the
    term: a long light term is skipped over many blocks at once (galloping search for the block,
    then the posting start by summing the skipped counts)."""
    stamp[i] = oi
    if in_head:
        row[i] = hslot[i, oi]
        rbm[i] = hbmc[i, oi]
        rsub[i] = hsub[i, oi]
        return
    p = cp[i]
    e = pe[i]
    q = cq[i]
    if p < e and np.int64(pair_block[p]) < b:
        # first pair at or after block b: gallop from p, then binary search
        lo = p  # pair_block[lo] < b
        step = 1
        hi = p + 1
        while hi < e and np.int64(pair_block[hi]) < b:
            lo = hi
            step <<= 1
            hi = p + step
        if hi > e:
            hi = e
        while hi - lo > 1:  # pair_block[lo] < b; hi == e or pair_block[hi] >= b
            mid = (lo + hi) >> 1
            if np.int64(pair_block[mid]) < b:
                lo = mid
            else:
                hi = mid
        s = hi - p
        for t in range(p, hi):
            s += np.int64(pair_cnt[t])
        q += s
        p = hi
    if p < e and np.int64(pair_block[p]) == b:
        c = np.int64(pair_cnt[p]) + 1
        row[i] = (q << 9) | c
        rbm[i] = q_w[i] * f16[pair_max[p]]
        rsub[i] = pair_sub[p] if pair_sub.size > 0 else 255
        cp[i] = p + 1
        cq[i] = q + c
    else:
        row[i] = -1
        rbm[i] = 0.0
        cp[i] = p
        cq[i] = q


@njit(cache=True, inline="always")
def _take_off(rem4, rb, code):
    """Take a streamed term's bound off the remaining bound of each sub-block (``rb`` x its level
    there, ``code``: see ``npkernels.SUB_BLOCKS``; one 4-lane operation, no branch: this runs for
    every term streamed in every block) and return the highest. A dead sub-block (-inf: no doc
    there can reach the k-th score) stays dead. The products are those the bound pass added, so
    only the order of the sums differs, which the margin on the block's bound covers: a live
    sub-block's bound never falls below the true bound of its terms not yet streamed (>= 0)."""
    _add_scaled4(rem4, 0, _SUB_FRACTIONS_FLAT, np.int64(code) * SUB_BLOCKS, -rb)
    return max(max(rem4[0], rem4[1]), max(rem4[2], rem4[3]))


@njit(cache=True)
def _blockmax_segment(
    q_j, q_w, n_docs, bshift,
    post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, post_off, post_w, f16,
    allowed, seq, ref_base, k, hs, hq, hr, state, head_blocks, chk=None, block_lo=0, block_hi=-1,
):
    """Exact block-max top-k with progressive pruning inside blocks.

    Every decision compares a true upper bound with the current k-th score ``thr``:

    * block-max: a block whose bound (sum over terms of query weight x block max; with
      sub-block codes the highest such sum over its sub-blocks) is below ``thr`` is skipped
      (visit order: see :func:`_block_plan`: the head blocks best bound first, then the others
      in block order, their runs found by one cursor per term);
    * inside a block, the terms are streamed into a 256-float accumulator in decreasing order
      of (bound / postings in the block), so the bound ``rem`` of the terms not yet streamed
      falls fastest per posting read. With sub-block codes it is kept per sub-block (a
      sub-block whose bound is below ``thr`` is dead from the start) and ``rem`` is the highest
      live one. Once ``rem`` < ``thr``, a doc no streamed term hit is out, and a hit doc is out
      when its partial sum + its sub-block's ``rem`` < ``thr``: when the highest
      partial sum ``mx`` + ``rem`` < ``thr`` the block is done; otherwise the survivors are
      gathered from the runs streamed so far (at most :data:`GATHER_MAX` postings) or, after
      long runs, from the accumulator when at most ``bs / LOOKUP_COST`` can survive (else the
      next run is streamed). Each remaining term is then looked up for them (binary search in
      its run) where that is cheaper than streaming the run, and when no doc is left the
      block's remaining terms are never read.

    Heap entries are rescored in query-term order, so scores are identical to explain's.
    """
    nq = q_j.size
    bs = 1 << bshift
    lazy, bad = prepare_terms(chk, q_j, post_ptr)  # short terms verified now, long ones run by run
    if bad >= 0:
        state[7] = bad
        return
    ub, ubs, tsum, head, hslot, hbmc, hsub, tail, nc = _block_plan(
        q_j, q_w, n_docs, bshift, post_ptr, pair_ptr, pair_block, pair_cnt, pair_max, pair_sub, f16, allowed,
        head_blocks if state[0] < k else 0, block_lo, block_hi)
    has_sub = pair_sub.size > 0
    # the remaining bound is kept per sub-block (one "sub-block", the whole block, without codes):
    # the doc at block offset o is in sub-block (o * nsub) >> bshift
    nsub = SUB_BLOCKS if has_sub else 1
    rem4 = np.full(SUB_BLOCKS, -np.inf, np.float32)  # (4 lanes for _take_off; those past nsub stay -inf)
    use_mask = allowed.size > 0
    # term order inside blocks: decreasing (sum of block bounds / postings), i.e. the bound each
    # posting read takes off on average: rare heavy terms first, long light ones last
    gkey = np.zeros(nq, np.float64)
    for i in range(nq):
        n_post = post_ptr[q_j[i] + 1] - post_ptr[q_j[i]]
        if n_post > 0:
            gkey[i] = -tsum[i] / n_post
    gorder = np.argsort(gkey)
    # tail cursors, per term: next (block, count) pair, its end, and the first posting of that pair
    cp = np.empty(nq, np.int64)
    pe = np.empty(nq, np.int64)
    cq = np.empty(nq, np.int64)
    for i in range(nq):
        cp[i] = pair_ptr[q_j[i]]
        pe[i] = pair_ptr[q_j[i] + 1]
        cq[i] = post_ptr[q_j[i]]
    acc = np.zeros(bs, np.float32)
    cands = np.empty(bs, np.int64)
    limit = bs // LOOKUP_COST  # more survivors than this: streaming the rest is cheaper
    mark = np.zeros(bs, np.uint8)  # docs already in cands (left all zeros)
    row = np.full(nq, -1, np.int64)  # per term: its run in the current block (-1: none) ...
    rbm = np.zeros(nq, np.float32)  # ... its bound there ...
    rsub = np.full(nq, 255, np.uint8)  # ... and its sub-block code (see _block_run), valid when stamp[i] == oi
    stamp = np.full(nq, -1, np.int64)
    exact_total = True
    matched = 0
    scored = 0
    n_look = 0
    n_stream = 0
    full = state[0] >= k
    thr = hs[0] if full else np.float32(0.0)
    slack = np.float32(1.0001)  # float32 sums in different orders differ in the last bits
    # rem starts at the block's (sub-blocks') bound (summed in another order than the terms are
    # taken off): this margin keeps it above the exact remaining bound whatever the rounding
    margin = np.float32(1.00001)
    last_streamed = nq
    nh = head.size
    total = nh + tail.size
    oi = -1
    while oi + 1 < total:
        oi += 1
        if oi < nh:
            b = head[oi]
            if full and ub[b] * slack < thr:
                exact_total = False
                break  # the head is sorted and every tail bound is below it: nothing left can reach thr
        else:
            b = tail[oi - nh]
            if full and ub[b] * slack < thr:
                exact_total = False
                continue
        scored += 1
        if oi + 1 < total and PREFETCH_LINES > 0:
            # the next block's runs are elsewhere in memory: start loading the ones it will
            # likely stream (as many as this block's predecessor did, and two more) now
            n_pf = 0
            nxt = oi + 1
            nb = head[nxt] if nxt < nh else tail[nxt - nh]
            for x in range(nq):
                if n_pf > last_streamed + 1:
                    break
                i = gorder[x]
                if nxt < nh:
                    sl = hslot[i, nxt]
                else:
                    p = cp[i]
                    sl = -1
                    if p < pe[i] and np.int64(pair_block[p]) == nb:
                        sl = (cq[i] << 9) | (np.int64(pair_cnt[p]) + 1)
                if sl >= 0:
                    n_pf += 1
                    q0 = sl >> 9
                    cnt = sl & 511
                    for q in range(q0, q0 + min(cnt, PREFETCH_LINES * 64), 64):
                        _prefetch(post_off, q)
                    for q in range(q0, q0 + min(cnt, PREFETCH_LINES * 32), 32):
                        _prefetch(post_w, q)
        base = b << bshift
        # per sub-block: the bound of the terms not streamed yet (-inf: dead, its bound cannot
        # reach thr); rem, the highest, bounds every doc of the block that can still make it
        if has_sub:
            for y in range(SUB_BLOCKS):  # (a constant trip count: unrolled)
                v = ubs[b * SUB_BLOCKS + y]
                rem4[y] = v * margin if not full or v * slack >= thr else -np.inf
        else:
            rem4[0] = ub[b] * margin
        rem = ub[b] * margin
        ns = 0  # terms streamed
        blk_stream = 0  # postings streamed in this block
        mx = np.float32(0.0)  # the highest partial sum in acc
        x = 0  # next term (position in gorder)
        nca = -1  # -1: every term streamed; >= 0: only cands[:nca] can still reach thr
        while x < nq:
            i = gorder[x]
            x += 1
            if stamp[i] != oi:
                # _block_run, written out on this hot path (a call passes a dozen arrays, and their
                # reference counts cost more than the cursor step itself)
                stamp[i] = oi
                if oi < nh:
                    row[i] = hslot[i, oi]
                    rbm[i] = hbmc[i, oi]
                    rsub[i] = hsub[i, oi]
                else:
                    p = cp[i]
                    e = pe[i]
                    q = cq[i]
                    while p < e and np.int64(pair_block[p]) < b:  # usually a step or two: see _block_run
                        q += np.int64(pair_cnt[p]) + 1
                        p += 1
                    if p < e and np.int64(pair_block[p]) == b:
                        c = np.int64(pair_cnt[p]) + 1
                        row[i] = (q << 9) | c
                        rbm[i] = q_w[i] * f16[pair_max[p]]
                        rsub[i] = pair_sub[p] if has_sub else 255
                        cp[i] = p + 1
                        cq[i] = q + c
                    else:
                        row[i] = -1
                        rbm[i] = 0.0
                        cp[i] = p
                        cq[i] = q
            sl = row[i]
            if sl < 0:
                continue
            w = q_w[i]
            q0 = sl >> 9
            cnt = sl & 511
            if lazy[i]:
                bad = check_run(chk, q0, cnt)
                if bad >= 0:
                    state[7] = bad
                    return
            for q in range(q0, q0 + cnt):
                o = np.int64(post_off[q])
                s = acc[o] + w * f16[post_w[q]]
                acc[o] = s
                mx = max(mx, s)
            n_stream += cnt
            blk_stream += cnt
            if has_sub:
                rem = _take_off(rem4, rbm[i], rsub[i])
            else:  # format 1: one bound for the whole block
                rem -= rbm[i]
                rem4[0] = rem
            ns += 1
            if full and x < nq and rem * slack < thr:
                # untouched docs are out (their sum is at most rem); a hit doc is out when its partial
                # sum + rem < thr. mx, the highest partial sum, settles most blocks here
                if (mx + rem) * slack < thr:
                    nca = 0
                    break
                if blk_stream <= GATHER_MAX:
                    # few postings read: gather the survivors from the runs streamed so far (each doc
                    # once, ``mark``), cheaper than a pass over the block's accumulator
                    nca = 0
                    for y in range(x):  # the terms visited in this block; those with a run were streamed
                        sx = row[gorder[y]]
                        if sx < 0:
                            continue
                        for q in range(sx >> 9, (sx >> 9) + (sx & 511)):
                            o = np.int64(post_off[q])
                            s = acc[o]
                            ok = (s > 0) & ((s + rem4[(o * nsub) >> bshift]) * slack >= thr) & (mark[o] == 0)
                            if use_mask:
                                ok &= allowed[base + o] != 0
                            cands[nca] = o
                            nca += ok
                            if ok:
                                mark[o] = 1
                    for c in range(nca):
                        mark[cands[c]] = 0
                    break
                # many postings read (weights that do not fall with frequency): roughly count the hit
                # docs that may still reach thr (branch-free; the count only decides the switch to
                # lookups, survivors are picked exactly): with more than a handful, streaming the
                # next runs is cheaper than looking them up
                cut = thr / slack - rem
                c = 0
                for o in range(bs):
                    c += acc[o] >= cut
                if c <= limit:
                    nca = 0
                    for y in range(nsub):  # sub-block by sub-block: dead ones hold no survivor
                        r = rem4[y]
                        if r == -np.inf:
                            continue
                        o0 = (y * bs + nsub - 1) // nsub  # its offsets: (o * nsub) >> bshift == y
                        o1 = ((y + 1) * bs + nsub - 1) // nsub
                        if use_mask:
                            for o in range(o0, o1):
                                s = acc[o]
                                a = allowed[base + o] != 0 if base + o < n_docs else False
                                cands[nca] = o
                                nca += (s > 0) & ((s + r) * slack >= thr) & a
                        else:
                            for o in range(o0, o1):  # branch-free compaction
                                s = acc[o]
                                cands[nca] = o
                                nca += (s > 0) & ((s + r) * slack >= thr)
                    break
        last_streamed = ns
        if nca >= 0:
            exact_total = False
            while x < nq and nca > 0:
                i = gorder[x]
                x += 1
                if stamp[i] != oi:
                    # as above
                    stamp[i] = oi
                    if oi < nh:
                        row[i] = hslot[i, oi]
                        rbm[i] = hbmc[i, oi]
                        rsub[i] = hsub[i, oi]
                    else:
                        p = cp[i]
                        e = pe[i]
                        q = cq[i]
                        while p < e and np.int64(pair_block[p]) < b:  # usually a step or two: see _block_run
                            q += np.int64(pair_cnt[p]) + 1
                            p += 1
                        if p < e and np.int64(pair_block[p]) == b:
                            c = np.int64(pair_cnt[p]) + 1
                            row[i] = (q << 9) | c
                            rbm[i] = q_w[i] * f16[pair_max[p]]
                            rsub[i] = pair_sub[p] if has_sub else 255
                            cp[i] = p + 1
                            cq[i] = q + c
                        else:
                            row[i] = -1
                            rbm[i] = 0.0
                            cp[i] = p
                            cq[i] = q
                sl = row[i]
                if sl < 0:
                    continue
                w = q_w[i]
                q0 = sl >> 9
                cnt = sl & 511
                if lazy[i]:
                    bad = check_run(chk, q0, cnt)
                    if bad >= 0:
                        state[7] = bad
                        return
                if nca * LOOKUP_COST < cnt:
                    n_look += nca
                    for c in range(nca):
                        o = cands[c]
                        y = _find_weight(post_off, post_w, f16, q0, cnt, o)
                        if y > 0:
                            acc[o] += w * y
                else:  # stream the run: the dead docs' sums are never read again
                    n_stream += cnt
                    for q in range(q0, q0 + cnt):
                        acc[post_off[q]] += w * f16[post_w[q]]
                # never below 0 here, whatever the rounding (a dead sub-block at 0 still keeps none of
                # its docs: their sums are below thr on their own)
                if has_sub:
                    _take_off(rem4, rbm[i], rsub[i])
                    for y in range(SUB_BLOCKS):
                        rem4[y] = max(rem4[y], np.float32(0.0))
                else:
                    rem4[0] = max(rem4[0] - rbm[i], np.float32(0.0))
                keep = 0
                for c in range(nca):
                    o = cands[c]
                    cands[keep] = o
                    keep += (acc[o] + rem4[(o * nsub) >> bshift]) * slack >= thr
                nca = keep
            filled = False
            for c in range(nca):
                o = cands[c]
                s = acc[o]
                if s * slack < thr:
                    continue
                if not filled:  # every term's run in this block, then verified, before the scores read them
                    for y in range(nq):
                        if stamp[y] != oi:
                            _block_run(y, oi, b, oi < nh, hslot, hbmc, hsub, cp, pe, cq, pair_block, pair_cnt,
                                       pair_max, pair_sub, q_w, f16, row, rbm, rsub, stamp)
                    bad = _check_block(chk, row, lazy)
                    if bad >= 0:
                        state[7] = bad
                        return
                    filled = True
                s = _canonical_score(row, q_w, post_off, post_w, f16, o)
                if s < thr:
                    continue
                d = base + o
                _push(hs, hq, hr, state, k, s, seq[d], ref_base + d)
                thr = hs[0]
            acc[:] = 0.0
            continue
        # every term streamed: count the hit docs and look for possible hits without branching
        # (cut is a hair below thr / slack: the exact test follows for what passes it)
        cut = thr / slack * np.float32(0.99999) if full else np.float32(0.0)
        c = 0
        if use_mask:
            for o in range(bs):
                a = allowed[base + o] != 0 if base + o < n_docs else False
                matched += (acc[o] > 0) & a
                c += (acc[o] >= cut) & (acc[o] > 0) & a
        else:
            for o in range(bs):
                matched += acc[o] > 0
                c += (acc[o] >= cut) & (acc[o] > 0)
        if c == 0:
            acc[:] = 0.0
            continue
        # every run of the block was streamed (row is complete), so verified (check_run) before the
        # scores below read them
        for o in range(bs):
            s = acc[o]
            if s <= 0:
                continue
            acc[o] = 0.0
            d = base + o
            if use_mask and not allowed[d]:
                continue
            if full and s * slack < thr:
                continue
            s = _canonical_score(row, q_w, post_off, post_w, f16, o)
            if full and s < thr:
                continue
            _push(hs, hq, hr, state, k, s, seq[d], ref_base + d)
            if not full and state[0] >= k:
                full = True
            if full:
                thr = hs[0]
    state[1] += matched
    if state.size >= 5:
        state[3] += scored
        state[4] += nc
    if state.size >= 7:
        state[5] += n_stream
        state[6] += n_look
    if not exact_total:
        state[2] = 0
