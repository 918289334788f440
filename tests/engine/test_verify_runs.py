"""Runs of chunks verified with one CRC-32 (``kernels.verify``): the run's CRC is checked against
what its chunks' table entries combine to, and a run that fails is gone through chunk by chunk,
so the verdicts -- which chunk is damaged, which are marked verified -- are those of verifying
every chunk alone."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

pytest.importorskip("numba")
from stair_es.engine.kernels import verify as V  # noqa: E402


def _container(shift: int, chunks: int, tail: int, seed: int = 3):
    rng = np.random.default_rng(seed)
    content = (chunks << shift) + tail
    data = rng.integers(0, 256, content, dtype=np.uint8)
    n = (content + (1 << shift) - 1) >> shift
    table = np.array([zlib.crc32(data[c << shift:min((c + 1) << shift, content)].tobytes()) for c in range(n)], np.uint32)
    return data, table, content, n


def _one_by_one(data, table, ok, shift, content, lo, hi):
    """The reference: every chunk alone."""
    for c in range(lo, hi + 1):
        if ok[c]:
            continue
        a = c << shift
        if zlib.crc32(data[a:min(a + (1 << shift), content)].tobytes()) != table[c]:
            return c
        ok[c] = True
    return -1


@pytest.mark.parametrize("shift", [12, 14])
@pytest.mark.parametrize("tail", [0, 1000])
def test_runs_give_the_verdicts_of_chunks_one_by_one(shift, tail):
    data, table, content, n = _container(shift, 9, tail)
    rng = np.random.default_rng(shift + tail)
    cases = [()] + [(c,) for c in range(n)] + [(2, 6), (0, n - 1)]
    for flips in cases:
        d = data.copy()
        for c in flips:
            d[min((c << shift) + int(rng.integers(0, 1 << shift)), content - 1)] ^= 1 << int(rng.integers(0, 8))
        for pre in (np.zeros(n, bool), np.arange(n) % 3 == 1):  # nothing verified yet; some chunks verified before
            for lo_b, hi_b in ((0, content), (100, content - 5), ((3 << shift) + 7, (6 << shift) + 1)):
                ok, want_ok = pre.copy(), pre.copy()
                lo, hi = lo_b >> shift, (hi_b - 1) >> shift
                want = _one_by_one(d, table, want_ok, shift, content, lo, hi)
                got = V.verify_ranges(d, table, ok, np.int64(shift), np.int64(content),
                                      np.array([lo_b], np.int64), np.array([hi_b], np.int64))
                assert got == want, (flips, lo_b, hi_b)
                assert (ok == want_ok).all(), (flips, lo_b, hi_b)


def test_the_combining_operator_is_zlibs_crc32_combine():
    rng = np.random.default_rng(1)
    for s in (9, 12, 14, 20):
        a = rng.integers(0, 256, 300, dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, 1 << s, dtype=np.uint8).tobytes()
        op = V._OPS[s - V._OPS_LO]
        x = zlib.crc32(a)
        combined = int(op[0, x & 255] ^ op[1, (x >> 8) & 255] ^ op[2, (x >> 16) & 255] ^ op[3, x >> 24]) ^ zlib.crc32(b)
        assert combined == zlib.crc32(a + b)
