"""The machine's limits for exact sparse search, measured in the run that reports against them.

``python -m benchmarks.roofline [--docs 100000]`` prints them alone; :mod:`benchmarks.run` and
:mod:`benchmarks.profile_engine` measure them in their own run and put every exact system's
figures beside them:

* **copy** and **triad** bandwidth, STREAM-like, one thread: ``a[i] = b[i]`` and
  ``a[i] = b[i] + s * c[i]`` over float32 arrays of 4x the L3 (bytes counted as STREAM does:
  2 and 3 arrays a pass), best of 5 passes;
* **scatter-add**, one thread: ``acc[idx[i]] += w[i]`` with random ``idx`` into an accumulator
  of ``n_docs`` floats (the core of any term-at-a-time search; each update is a dependent load,
  add and store), million updates per second, best of 5;
* per exact system: postings of the query terms per query (the median over the timed queries),
  postings scored per second (that median / the p50 latency), bytes read per query (postings x
  the bytes one posting takes in that system's format) and that rate in GB/s, as a percentage
  of the measured copy bandwidth and of the scatter-add rate.

A system's postings/s is an *effective* rate: block-max reads fewer postings than the query
terms hold, so it can exceed what a full scan could do.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from numba import njit

#: bytes one posting of the query terms takes in each exact system's own format (what a full
#: scan of them reads): the engine stores a 1-byte block offset and a 2-byte float16 weight (its
#: block tables add 6 bytes per (term, block) pair, not counted); scipy's CSR an int32 row and
#: a float32 value; PISA compresses (block-coded docids and quantised scores: no fixed figure)
BYTES_PER_POSTING = {"embedded": 3.0, "bruteforce": 8.0}


@njit(cache=True, nogil=True)
def _copy(a, b):
    for i in range(a.size):
        a[i] = b[i]


@njit(cache=True, nogil=True)
def _triad(a, b, c, s):
    for i in range(a.size):
        a[i] = b[i] + s * c[i]


@njit(cache=True, nogil=True)
def _scatter_add(acc, idx, w):
    for i in range(idx.size):
        acc[idx[i]] += w[i]


def _l3_bytes() -> int:
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as f:
            txt = f.read().strip()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(txt[-1], 1)
        return int(txt.rstrip("KM")) * mult
    except (OSError, ValueError):
        return 32 << 20


def measure_limits(n_docs: int = 100_000, repeats: int = 5, array_bytes: int | None = None) -> dict:
    """Copy and triad GB/s and scatter-add million updates/s on one thread, best of ``repeats``."""
    n = (array_bytes or max(4 * _l3_bytes(), 64 << 20)) // 4
    a, b, c = np.zeros(n, np.float32), np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    _copy(a[:16], b[:16])
    _triad(a[:16], b[:16], c[:16], np.float32(3.0))
    copy_s, triad_s = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        _copy(a, b)
        copy_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        _triad(a, b, c, np.float32(3.0))
        triad_s.append(time.perf_counter() - t)
    del a, b, c
    rng = np.random.default_rng(0)
    m = 4_000_000
    idx = rng.integers(0, n_docs, m).astype(np.int64)
    w = rng.random(m).astype(np.float32)
    acc = np.zeros(n_docs, np.float32)
    _scatter_add(acc, idx[:16], w[:16])
    sc = []
    for _ in range(repeats):
        t = time.perf_counter()
        _scatter_add(acc, idx, w)
        sc.append(time.perf_counter() - t)
    return {"copy_gbs": 2 * n * 4 / min(copy_s) / 1e9, "triad_gbs": 3 * n * 4 / min(triad_s) / 1e9,
            "scatter_add_mups": m / min(sc) / 1e6, "scatter_acc_docs": n_docs, "array_mib": n * 4 / 2**20,
            "load": os.getloadavg()[0]}


def postings_per_query(doc_indices: np.ndarray, vocab: int, queries) -> np.ndarray:
    """Postings of the query terms, per query (``queries``: token-id arrays)."""
    df = np.bincount(np.asarray(doc_indices), minlength=vocab)
    return np.array([int(df[np.asarray(q, np.int64)].sum()) for q in queries], np.int64)


def entry(kind: str, p50_ms: float, postings: float, limits: dict, bytes_per_posting: float | None = None) -> dict:
    """One system's roofline figures (see the module docstring)."""
    bpp = bytes_per_posting if bytes_per_posting is not None else BYTES_PER_POSTING.get(kind)
    rate = postings / (p50_ms / 1e3) if p50_ms > 0 else float("nan")
    out = {"p50_ms": p50_ms, "postings_per_query": postings, "mpostings_per_s": rate / 1e6,
           "pct_of_scatter_add": 100.0 * rate / (limits["scatter_add_mups"] * 1e6)}
    if bpp is not None:
        gbs = rate * bpp / 1e9
        out.update(bytes_per_posting=bpp, bytes_per_query=postings * bpp, gbs=gbs, pct_of_copy=100.0 * gbs / limits["copy_gbs"])
    return out


def limits_line(limits: dict) -> str:
    return (f"machine limits (one thread, this run): copy {limits['copy_gbs']:.1f} GB/s, triad {limits['triad_gbs']:.1f} GB/s "
            f"({limits['array_mib']:.0f} MiB arrays), scalar scatter-add {limits['scatter_add_mups']:.0f} M updates/s into "
            f"{limits['scatter_acc_docs']:,} floats; load average {limits['load']:.2f}")


def table(rows: list[tuple[str, dict]]) -> str:
    """A markdown table of (label, :func:`entry`) rows."""
    out = ["| system | p50 ms | postings/query | M postings/s | % of scatter-add | bytes/query | GB/s | % of copy bandwidth |",
           "|---|---|---|---|---|---|---|---|"]
    for label, e in rows:
        b = (f"{e['bytes_per_query'] / 1e6:.2f} MB | {e['gbs']:.2f} | {e['pct_of_copy']:.0f} %" if "gbs" in e
             else "n/a | n/a | n/a")
        out.append(f"| {label} | {e['p50_ms']:.3f} | {e['postings_per_query']:,.0f} | {e['mpostings_per_s']:,.0f} | "
                   f"{e['pct_of_scatter_add']:.0f} % | {b} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.roofline", description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=100_000, help="accumulator size of the scatter-add (documents)")
    a = p.parse_args(argv)
    print(limits_line(measure_limits(a.docs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
