"""Inter-query batching for `stair-es serve`: one FIFO queue and one dispatcher thread.

Requests wait in arrival order. The dispatcher thread takes every waiting request, at most
``max_batch`` of them (after the first it may wait up to ``window`` seconds for more), and
runs them as one call of ``work``. For ``/v1/search`` that is
:meth:`~stair_es.serve.service.Service.search_many`: texts encoded in one call, and one
``search_batch`` on the embedded engine, whose kernel runs the batch on several threads
without the GIL. Answers go back to the event loop with one wake-up per batch, not one
thread hand-off per request.

Why not one worker thread per request: the threads then fight over the GIL with each other
and with the event loop, and a request that arrived late can overtake one that arrived early.
Here the order of service is the order of arrival, and the event loop thread meets only one
other Python thread.

This module knows asyncio, not FastAPI; admission (503 when too many wait) is the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Where a batched request spent its time on the server (seconds)."""

    queued: float  # from submit until its batch started
    batch: float  # how long its batch ran
    size: int  # requests in its batch


@dataclass
class _Job:
    item: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    t_submit: float


def _deliver(answers: Sequence[tuple[asyncio.Future, Any, Timing]]) -> None:
    for fut, result, timing in answers:
        if fut.done():  # the client went away and its request was cancelled
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result((result, timing))


class Batcher:
    """``await batcher.submit(item)`` returns ``(work's answer for item, Timing)`` or raises
    the exception ``work`` returned (or raised) for it.

    ``work(items)`` gets a list and must return one answer per item, in order; an answer that
    is an exception is raised in that item's caller only. If ``work`` itself raises, every
    item of the batch gets that exception."""

    def __init__(self, work: Callable[[list[Any]], Sequence[Any]], *, max_batch: int = 16, window: float = 0.0,
                 name: str = "stair-es-batcher"):
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self.work, self.max_batch, self.window = work, int(max_batch), max(0.0, float(window))
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._closed = False
        self.batches = 0  # counters for /readyz and tests
        self.items = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def submit(self, item: Any) -> tuple[Any, Timing]:
        loop = asyncio.get_running_loop()
        job = _Job(item, loop.create_future(), loop, time.perf_counter())
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(job)
            self._cond.notify()
        return await job.future

    def _take(self) -> list[_Job] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None  # closed and drained
            if self.window > 0:
                deadline = self._queue[0].t_submit + self.window
                while len(self._queue) < self.max_batch and not self._closed:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            return [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            t0 = time.perf_counter()
            try:
                answers = list(self.work([j.item for j in batch]))
                if len(answers) != len(batch):
                    raise RuntimeError(f"the batch work returned {len(answers)} answers for {len(batch)} requests")
            except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch, never lost
                log.exception("a batch of %d requests failed", len(batch))
                answers = [e] * len(batch)
            t1 = time.perf_counter()
            self.batches += 1
            self.items += len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, Timing]]] = {}
            for job, answer in zip(batch, answers):
                by_loop.setdefault(job.loop, []).append((job.future, answer, Timing(t0 - job.t_submit, t1 - t0, len(batch))))
            for loop, items in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_deliver, items)
                except RuntimeError:  # that event loop is closed: nobody waits for these answers
                    pass

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests; the ones already queued are still answered."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
