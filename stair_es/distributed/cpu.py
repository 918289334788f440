"""Where an ``encode-catalog`` worker's CPU goes while it makes a shard (reported in each
manifest entry as ``cpu_split`` and printed by ``benchmarks/encode_catalog_bench.py``)."""

from __future__ import annotations

import contextlib
import gc
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
