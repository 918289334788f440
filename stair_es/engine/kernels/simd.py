"""LLVM intrinsics the kernels use where numba's loops fall short: a prefetch hint, a 4-lane
``dst += a * src`` (the sub-block bounds) and eight of them at once from packed arrays, the CPU's
float16 -> float32 conversion, an 8-lane scatter-add. Nothing here knows what the arrays hold
beyond their types."""

from __future__ import annotations

import platform

from llvmlite import binding as llvm
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _cpu_converts_f16() -> bool:
    """Whether this CPU converts float16 to float32 in one instruction (x86: F16C, since 2012;
    64-bit ARM: always). Elsewhere LLVM would call a runtime helper that numba does not link."""
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    try:
        return bool(llvm.get_host_cpu_features().get("f16c"))
    except Exception:  # noqa: BLE001 - no feature list: the table, which works everywhere
        return False


#: the kernels widen stored float16 weights with the CPU's instruction (else the 256 KiB table
#: ``layout.F16_TABLE``, whose lookups miss the L1 cache: the TAAT kernel took 1.18x as long with it
#: on the 100k Zipf corpus, 2026-11-27, AMD EPYC). Both give the same float32, bit for bit (the
#: table is built by numpy's conversion; infinities and NaN, which no stored weight is, aside)
HAVE_F16C = _cpu_converts_f16()


@intrinsic
def _f16_bits_to_f32(typingctx, bits):
    """float16 bits (uint16) -> float32 by the CPU's conversion (x86 ``vcvtph2ps``)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@njit(cache=True, inline="always")
def f16_value(f16, bits):
    """The float32 value of stored float16 ``bits``: the CPU's conversion where it has one, else
    the table ``f16`` (:data:`..layout.F16_TABLE`)."""
    if HAVE_F16C:
        return _f16_bits_to_f32(bits)
    return f16[bits]


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



#: postings per call of :func:`_scatter_add8`
SCATTER_LANES = 8


@intrinsic
def _scatter_add8(typingctx, acc, base, post_off, post_w, q, w):
    """``acc[base + post_off[q + l]] += w * float32(post_w[q + l])`` for the 8 postings ``l < 8``
    (float16 weight bits; their offsets distinct, as within one (term, block) run): the offsets and
    weights are loaded as two vectors, widened and multiplied as one, then each lane is added to
    its accumulator with scalar loads and stores -- the multiply, then the add, as the scalar loop
    rounds them. Needs the CPU's float16 conversion (:data:`HAVE_F16C`).

    Why: the scalar loop spends 4 memory operations a posting (offset, weight, accumulator load
    and store); this one 2.25. 8 lanes ran 0.92x the scalar F16C loop's time on the 100k Zipf
    corpus, 4 lanes 0.99x, 16 lanes 1.05x; AVX-512 gather and scatter of 8 or 16 lanes 1.6x (Zen 4
    scatters slowly) (AMD EPYC, 2026-11-27)."""
    sig = types.void(acc, base, post_off, post_w, q, w)
    n = SCATTER_LANES

    def codegen(context, builder, signature, args):
        aty, _, oty, wty, _, _ = signature.args
        a = context.make_array(aty)(context, builder, args[0])
        o = context.make_array(oty)(context, builder, args[2])
        wa = context.make_array(wty)(context, builder, args[3])
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        fv = ir.VectorType(f32, n)
        op = builder.bitcast(cgutils.get_item_pointer(context, builder, oty, o, [args[4]]), ir.VectorType(ir.IntType(8), n).as_pointer())
        wp = builder.bitcast(cgutils.get_item_pointer(context, builder, wty, wa, [args[4]]), ir.VectorType(ir.IntType(16), n).as_pointer())
        offs = builder.zext(builder.load(op, align=1), ir.VectorType(i64, n))
        vals = builder.fpext(builder.bitcast(builder.load(wp, align=2), ir.VectorType(ir.HalfType(), n)), fv)
        wv = builder.insert_element(ir.Constant(fv, ir.Undefined), args[5], i32(0))
        wv = builder.shuffle_vector(wv, ir.Constant(fv, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))
        prod = builder.fmul(wv, vals)
        bp = cgutils.get_item_pointer(context, builder, aty, a, [args[1]])
        for lane in range(n):
            p = builder.gep(bp, [builder.extract_element(offs, i32(lane))])
            builder.store(builder.fadd(builder.load(p, align=4), builder.extract_element(prod, i32(lane))), p, align=4)
        return context.get_dummy_value()

    return sig, codegen


#: (block, maximum, code) triples per call of :func:`_bound_add8`
BOUND_LANES = 8


@intrinsic
def _bound_add8(typingctx, dst, levels, idx, bits, code, p, w):
    """For the 8 items ``l < 8`` at ``p``: ``dst[4 idx[p + l]:+4] += m_l * levels[4 code[p + l]:+4]``
    with ``m_l = w * float32(bits[p + l])`` (float16 bits widened by the CPU's conversion); returns
    the sum of the 8 ``m_l`` (float32, lane order). Each 4-lane add is rounded as
    :func:`_add_scaled4`'s (a multiply, then an add), in item order, so ``dst`` ends bit for bit as
    8 calls of it would leave it; the ``idx`` of the 8 items must be distinct (one term's blocks).
    Needs :data:`HAVE_F16C`.

    Why: :func:`_add_scaled4` a pair at a time spends 6 loads on it (index, bits, the float16
    table, code, levels, ``dst``), and the block-max bound pass was bound by those loads; here the
    indices, bits and codes of 8 pairs come in three vector loads and the widening needs no table.
    The bound pass at 10M documents ran in 0.74x the time (0.535 against 0.735 ms a query with the
    prefetch of the next term's first pairs, 0.654 with that prefetch alone; AMD EPYC, 2026-11-28,
    docs/scale.md)."""
    sig = types.float32(dst, levels, idx, bits, code, p, w)
    n = BOUND_LANES

    def codegen(context, builder, signature, args):
        dty, lty, ity, bty, cty, _, _ = signature.args
        d = context.make_array(dty)(context, builder, args[0])
        lv = context.make_array(lty)(context, builder, args[1])
        ia = context.make_array(ity)(context, builder, args[2])
        ba = context.make_array(bty)(context, builder, args[3])
        ca = context.make_array(cty)(context, builder, args[4])
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        fv = ir.VectorType(f32, n)
        v4 = ir.VectorType(f32, 4)
        iv = ir.VectorType(i64, n)

        def vec(aty, a, width):
            ptr = cgutils.get_item_pointer(context, builder, aty, a, [args[5]])
            return builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(width), n).as_pointer()), align=width // 8)

        four = ir.Constant(iv, [2] * n)
        rows = builder.shl(builder.zext(vec(ity, ia, 16), iv), four)  # 4 x idx
        cols = builder.shl(builder.zext(vec(cty, ca, 8), iv), four)  # 4 x code
        vals = builder.fpext(builder.bitcast(vec(bty, ba, 16), ir.VectorType(ir.HalfType(), n)), fv)
        wv = builder.insert_element(ir.Constant(fv, ir.Undefined), args[6], i32(0))
        wv = builder.shuffle_vector(wv, ir.Constant(fv, ir.Undefined), ir.Constant(ir.VectorType(i32, n), [0] * n))
        mv = builder.fmul(wv, vals)
        d0 = cgutils.get_item_pointer(context, builder, dty, d, [ir.Constant(i64, 0)])
        l0 = cgutils.get_item_pointer(context, builder, lty, lv, [ir.Constant(i64, 0)])
        for lane in range(n):
            dp = builder.bitcast(builder.gep(d0, [builder.extract_element(rows, i32(lane))]), v4.as_pointer())
            lp = builder.bitcast(builder.gep(l0, [builder.extract_element(cols, i32(lane))]), v4.as_pointer())
            mb = builder.shuffle_vector(mv, ir.Constant(fv, ir.Undefined), ir.Constant(ir.VectorType(i32, 4), [lane] * 4))
            x = builder.load(dp, align=4)
            builder.store(builder.fadd(x, builder.fmul(mb, builder.load(lp, align=4))), dp, align=4)
        tot = builder.extract_element(mv, i32(0))
        for lane in range(1, n):
            tot = builder.fadd(tot, builder.extract_element(mv, i32(lane)))
        return tot

    return sig, codegen
