"""What every benchmark shares: latency statistics under one naming, memory, provenance, timing.

* :func:`percentiles` -- ``{"p50_ms", "p95_ms", "p99_ms", "mean_ms", "n"}`` of a list of
  milliseconds: the one naming of latency figures in printed tables and saved results;
  :func:`stat` reads a figure from a saved result of either naming (older result files say
  ``"p50"`` inside a ``"latency_ms"`` object).
* :func:`rss_mb` / :func:`peak_rss_mb` -- this process's resident memory now and at its peak
  (``/proc/self/status``, see :mod:`benchmarks.procstat`).
* :func:`machine_info` -- where a figure comes from: commit (``+dirty`` with local changes), CPU,
  cores, RAM, load average, Python and package versions, arguments, start time (UTC).
  :func:`provenance_line` gives the same as one line for the foot of a printed report.
* :class:`Timer` -- wall-clock and CPU seconds of a block (``with Timer() as t: ...; t.wall_s``).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

try:
    from benchmarks.procstat import peak_rss_mb, rss_mb
except ImportError:  # run as `python benchmarks/x.py`: this folder is on sys.path
    from procstat import peak_rss_mb, rss_mb  # type: ignore[no-redef]

__all__ = ["PERCENTILES", "Timer", "git_commit", "machine_info", "peak_rss_mb", "percentiles", "provenance_line", "rss_mb",
           "stat"]

ROOT = Path(__file__).resolve().parents[1]
PERCENTILES = (50, 95, 99)
PACKAGES = ("stair-es", "numpy", "numba", "scipy", "torch", "faiss-cpu", "pyseismic-lsr", "pyterrier-pisa")


def percentiles(ms: Iterable[float], qs: Iterable[int] = PERCENTILES) -> dict[str, float]:
    """``{"p50_ms": ..., "p95_ms": ..., "p99_ms": ..., "mean_ms": ..., "n": ...}`` of milliseconds
    (an empty dict for no values)."""
    import numpy as np

    a = np.asarray(list(ms), dtype=np.float64)
    if not a.size:
        return {}
    out: dict[str, float] = {f"p{q}_ms": float(np.percentile(a, q)) for q in qs}
    out["mean_ms"] = float(a.mean())
    out["n"] = int(a.size)
    return out


def stat(figures: Mapping[str, Any] | None, name: str) -> float | None:
    """Figure ``name`` (``"p50"``, ``"p95"``, ``"mean"``...) of a latency object in either naming
    (``p50_ms``, or ``p50`` in results saved before the naming was one)."""
    if not figures:
        return None
    base = name.removesuffix("_ms")
    v = figures.get(f"{base}_ms", figures.get(base))
    return None if v is None else float(v)


class Timer:
    """Wall-clock and process CPU seconds of a ``with`` block (``wall_s``, ``cpu_s``, ``wall_ms``)."""

    def __enter__(self) -> "Timer":
        self._t, self._c = time.perf_counter(), time.process_time()
        self.wall_s = self.cpu_s = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._t
        self.cpu_s = time.process_time() - self._c

    @property
    def wall_ms(self) -> float:
        return self.wall_s * 1000.0


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    """The short commit of this checkout, or "unknown" outside git."""
    return _git("rev-parse", "--short", "HEAD") or "unknown"


def machine_info(packages: Iterable[str] = PACKAGES) -> dict[str, Any]:
    """Provenance of a benchmark run (no secrets: arguments, versions, hardware)."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    versions = {}
    for pkg in packages:
        try:
            versions[pkg] = version(pkg)
        except PackageNotFoundError:
            versions[pkg] = None
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return {"commit": commit + ("+dirty" if commit and dirty else ""), "cpu": cpu, "cores": os.cpu_count(),
            "ram_gb": ram_gb, "platform": platform.platform(), "python": platform.python_version(),
            "loadavg_start": list(os.getloadavg()), "versions": versions, "argv": sys.argv[1:],
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def provenance_line(info: Mapping[str, Any] | None = None) -> str:
    """``commit abc1234; <CPU>, 2 cores, 23.4 GB RAM; Python 3.11.2; 2026-11-27 04:00:00 UTC`` (of
    :func:`machine_info`, or of ``info`` when given)."""
    m = info or machine_info()
    return (f"commit {m['commit'] or 'unknown'}; {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM; "
            f"Python {m['python']}; {m['started']}")


def user_shell_env(pycache: Path | str, **overrides: str) -> dict[str, str]:
    """The environment of a user's shell for a timed ``stair-es`` command: this one's, plus
    ``overrides``, with Python's bytecode cached under ``pycache`` (so the checkout is not written
    to) whatever ``PYTHONDONTWRITEBYTECODE`` this shell has -- otherwise every command would
    compile stair_es from source, about 0.2 s that no user with a normal shell pays."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(pycache), **overrides)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
