"""Where an ``encode-catalog`` worker's CPU goes while it makes a shard (reported in each
manifest entry as ``cpu_split`` and printed by ``benchmarks/encode_catalog_bench.py``)."""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import time
from typing import Any, Callable, Iterator


class CpuSplit:
    """Where a worker's CPU goes while it makes one shard, in CPU seconds: ``decode`` (image
    reading and decoding, on the decoding threads), ``encode`` (the encoder's calls on the
    worker's main thread: the ONNX network, clip-art head, merging, captions), ``rows``
    (documents to columns), ``write`` (Parquet), ``other_threads`` (CPU of every other thread
    of the process meanwhile: the encoder's pixel worker -- colour, scene, drawing gate, OCR --
    and ONNX Runtime's own threads) and ``gc`` (wall seconds in Python's garbage collector).
    Per-thread CPU clocks, so the figures hold however many threads run at once."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {"decode": 0.0, "encode": 0.0, "rows": 0.0, "write": 0.0}
        self._lock = threading.Lock()
        self._gc = 0.0
        self._gc_start: float | None = None

    def timed_load(self, load: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(location: Any) -> Any:
            c = time.thread_time()
            try:
                return load(location)
            finally:
                with self._lock:
                    self.cpu["decode"] += time.thread_time() - c
        return run

    @contextlib.contextmanager
    def timed(self, part: str) -> Iterator[None]:
        c = time.thread_time()
        gc.callbacks.append(self._on_gc)
        try:
            yield
        finally:
            gc.callbacks.remove(self._on_gc)
            self.cpu[part] += time.thread_time() - c

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self._gc += time.perf_counter() - self._gc_start
            self._gc_start = None

    def result(self, total_cpu: float) -> dict[str, float]:
        out = {k: round(v, 4) for k, v in self.cpu.items()}
        out["other_threads"] = round(max(0.0, total_cpu - sum(self.cpu.values())), 4)
        out["gc"] = round(self._gc, 4)
        return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's threads, summed by thread name (Linux's
    ``/proc/self/task/*/stat``; ``{}`` elsewhere). Python threads without a native name carry the
    process's name; Ray's own threads (its core worker's IO, gRPC, metrics) carry theirs, so this
    shows what a Ray worker or driver spends beside the work itself."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue  # the thread ended meanwhile
        name = raw[raw.index(b"(") + 1:raw.rindex(b")")].decode("utf-8", "replace")
        fields = raw[raw.rindex(b")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def thread_cpu_delta(before: dict[str, float], after: dict[str, float], floor: float = 0.0005,
                     total: float | None = None) -> dict[str, float]:
    """What each thread name spent between two :func:`thread_cpu` readings (the larger ones only);
    with the process's ``total`` CPU over the same time, threads that ended meanwhile (their CPU is
    no longer listed per thread) as ``(ended threads)``."""
    out = {k: round(v - before.get(k, 0.0), 4) for k, v in after.items()}
    if total is not None and out:
        out["(ended threads)"] = round(max(0.0, total - sum(out.values())), 4)
    return dict(sorted(((k, v) for k, v in out.items() if v >= floor), key=lambda kv: -kv[1]))


RUSAGE_FIELDS = ("ru_utime", "ru_stime", "ru_minflt", "ru_majflt", "ru_nvcsw", "ru_nivcsw")


def rusage() -> dict[str, float]:
    """This process's user and system CPU seconds, page faults and context switches so far
    (``getrusage``; ``{}`` where there is none)."""
    try:
        import resource
    except ImportError:  # not Unix
        return {}
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {f[3:]: getattr(r, f) for f in RUSAGE_FIELDS}


def rusage_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Between two :func:`rusage` readings: ``utime``/``stime`` (CPU seconds in user space and in the
    kernel: page faults, system calls), ``minflt``/``majflt`` (page faults), ``nvcsw``/``nivcsw``
    (context switches: waiting, and preempted by another thread or process)."""
    return {k: round(after[k] - before.get(k, 0), 4) for k in after}
