"""This process's memory as Linux reports it in ``/proc/self/status`` (benchmarks only)."""

from __future__ import annotations


def status_mb(field: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) in MB; NaN where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def rss_mb() -> float:
    return status_mb("VmRSS")


def peak_rss_mb() -> float:
    return status_mb("VmHWM")
