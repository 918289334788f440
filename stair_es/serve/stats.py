"""Where the time of `stair-es serve` goes, for operators tuning it (``--debug-stats``, off by default).

With it on, the server keeps the phases of its recent requests (the last :data:`KEEP` of each
kind) and a monitor of its event loop, and ``GET /debug/stats`` (behind the API key when one
is set) answers their percentiles:

* ``search``: per answered ``/v1/search``, in milliseconds: ``pre`` (from the first byte the
  app saw to the route: the gates, reading and parsing the body, validation), ``queue``,
  ``prepare``, ``wait`` (for a free search thread), ``engine`` (the backend's search) and its
  ``engine_cpu`` (that thread's CPU time meanwhile), ``answer`` (the answer's dicts and JSON)
  and ``answer_cpu``, ``deliver`` (from the worker's end to the route running again on the
  event loop), ``post`` (from the route's return to the last byte handed to the server) and
  ``total``;
* ``shed``: per 429 of a gate, ``total`` from the first byte the app saw to the answer sent;
  ``shed_from_queue`` the same for the 429s of searches that waited past ``--queue-timeout-ms``;
* ``loop``: how late the event loop woke from a 5 ms sleep (its stalls: a thread holding the
  GIL, or the loop's thread waiting for a core);
* ``gc``: per generation, the garbage collections run and how long each held the GIL (every
  thread waits meanwhile, the event loop too);
* for the slowest 1 % of the searches, the mean of each phase: where the p99 goes.

A phase's wall time minus its CPU time is time its thread was ready but not running: waiting
for the GIL or for a core (the engine's kernel runs without the GIL, so for ``engine`` it is
mostly a core).

This module knows asyncio, not FastAPI.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import deque
from typing import Any

import numpy as np

#: Requests (and loop samples) kept per kind.
KEEP = 20_000
#: The loop monitor's sleep, in seconds.
LOOP_TICK = 0.005

#: Where the outermost gate leaves the time (``time.perf_counter``) the app first saw a request.
T_ENTRY = "stair_es.t_entry"
#: Where a route leaves its phases (a dict of seconds) for the outermost gate to complete.
PHASES = "stair_es.phases"


class ServeStats:
    def __init__(self, keep: int = KEEP):
        self.search: deque[dict[str, float]] = deque(maxlen=keep)
        self.shed: deque[float] = deque(maxlen=keep)
        self.shed_queue: deque[float] = deque(maxlen=keep)
        self.loop_lag: deque[float] = deque(maxlen=keep)
        self.gc_pauses: dict[int, deque[float]] = {g: deque(maxlen=keep) for g in range(3)}
        self._gc_t0 = 0.0
        self._task: asyncio.Task | None = None
        self.started = time.time()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # runs in whichever thread triggered the collection, holding the GIL: no lock needed
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif info.get("generation") in self.gc_pauses:
            self.gc_pauses[info["generation"]].append(time.perf_counter() - self._gc_t0)

    # --- recording (on the event loop) -------------------------------------------------------------
    def request_done(self, state: dict[str, Any], status: int, t_entry: float) -> None:
        total = time.perf_counter() - t_entry
        phases = state.get(PHASES)
        if status == 429 and phases is None:
            self.shed.append(total)
        elif status == 429 and phases is not None and phases.get("overdue"):
            self.shed_queue.append(total)
        elif phases is not None and status == 200:
            phases = dict(phases)
            if "returned" in phases:
                phases["post"] = time.perf_counter() - phases.pop("returned")
            phases["total"] = total
            self.search.append(phases)

    async def _watch_loop(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(LOOP_TICK)
            self.loop_lag.append(max(0.0, time.perf_counter() - t - LOOP_TICK))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch_loop())
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._on_gc)

    # --- the summary -----------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        gc_pauses = {f"generation_{g}": _pct_ms(list(v)) for g, v in self.gc_pauses.items()}
        return {"since_s": round(time.time() - self.started, 1), "kept": KEEP,
                "search": _phases_summary(list(self.search)), "shed": _pct_ms(list(self.shed)),
                "shed_from_queue": _pct_ms(list(self.shed_queue)), "loop_lag": _pct_ms(list(self.loop_lag)),
                "gc": {**gc_pauses, "frozen_objects": gc.get_freeze_count()}}

    def reset(self) -> None:
        for kept in (self.search, self.shed, self.shed_queue, self.loop_lag, *self.gc_pauses.values()):
            kept.clear()
        self.started = time.time()


def _pct_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    a = np.asarray(values) * 1000
    return {"n": int(a.size), "p50_ms": round(float(np.percentile(a, 50)), 3),
            "p99_ms": round(float(np.percentile(a, 99)), 3), "max_ms": round(float(a.max()), 3),
            "mean_ms": round(float(a.mean()), 3)}


def _phases_summary(rows: list[dict[str, float]]) -> dict[str, Any]:
    if not rows:
        return {"n": 0}
    names = sorted({k for r in rows for k in r})
    out: dict[str, Any] = {"n": len(rows), "phases": {k: _pct_ms([r[k] for r in rows if k in r]) for k in names}}
    totals = np.array([r.get("total", 0.0) for r in rows])
    cut = np.percentile(totals, 99)
    slow = [r for r, t in zip(rows, totals) if t >= cut]
    out["slowest_1pct_mean_ms"] = {k: round(float(np.mean([r.get(k, 0.0) for r in slow])) * 1000, 3) for k in names}
    return out
