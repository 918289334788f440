"""The kernels widen stored float16 weights with the CPU's conversion instruction where it has one
(``kernels.simd.f16_value``): every finite float16 must give the float32 of the table that
explain, the numpy twins and older kernels use, bit for bit, or scores would drift."""

import numpy as np
from numba import njit

from stair_es.engine.kernels.simd import HAVE_F16C, f16_value
from stair_es.engine.layout import F16_TABLE


@njit
def _widen_all(table):
    out = np.empty(65536, np.float32)
    for i in range(65536):
        out[i] = f16_value(table, np.uint16(i))
    return out


def test_every_finite_float16_widens_to_the_tables_float32():
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    finite = np.isfinite(bits.view(np.float16))
    got = _widen_all(F16_TABLE)
    assert (got[finite].view(np.uint32) == F16_TABLE[finite].view(np.uint32)).all(), f"F16C={HAVE_F16C}"
