"""Inter-query batching for `stair-es serve`: one FIFO queue, one dispatcher thread, a fixed
pool of search threads.

Requests wait in arrival order. The dispatcher thread takes what waits, at most ``max_batch``
requests (after the first it may wait up to ``window`` seconds for more), and prepares them
together with one call of ``prepare``. For ``/v1/search`` that is
:meth:`~stair_es.serve.service.Service.prepare_searches`: the batch's query texts are encoded
in one call of the model. Each prepared request then goes, in order, to the first free one of
``workers`` search threads, which runs ``run`` on it (the embedded engine's kernel runs
without the GIL, so the threads search in parallel) and hands its answer back to the event
loop at once.

Why not one batch searched as a whole (``search_batch``): its answers all leave when the
slowest search of the batch ends, and the threads that finished first wait for it idle. At
1M documents, where searches differ a lot in length, that cost more than it saved. Why not a
thread per request, as the other routes do: requests then also fight over the GIL while they
are prepared, and are not served strictly in arrival order.

A request whose caller stopped waiting (its deadline passed, or the client left) is dropped
before its preparation and before its search, if it has not started them yet.

This module knows asyncio, not FastAPI; admission (429 when too many wait) is the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Where a batched request spent its time on the server (seconds)."""

    queued: float  # from submit until its batch was taken
    prepare: float  # preparing its batch
    wait: float  # prepared, waiting for a free search thread
    run: float  # its own search (and answer)
    size: int  # requests in its batch
    done_at: float = 0.0  # time.perf_counter() when its thread finished (the hand-over to the loop starts)


@dataclass
class _Job:
    item: Any
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    t_submit: float


def _deliver(fut: asyncio.Future, result: Any, timing: Timing | None) -> None:
    if fut.done():  # the client went away and its request was cancelled
        return
    if isinstance(result, BaseException):
        fut.set_exception(result)
    else:
        fut.set_result((result, timing))


class Batcher:
    """``await batcher.submit(item)`` returns ``(run(prepared item), Timing)``, or raises the
    exception that preparing or running that item gave.

    ``prepare(items)`` gets a list and returns one prepared value per item, in order; a value
    that is an exception is raised in that item's caller only (if ``prepare`` itself raises,
    every item of the batch gets that exception). ``run(prepared)`` runs on one of ``workers``
    threads; at most ``workers`` run at once, taken in arrival order."""

    def __init__(self, prepare: Callable[[list[Any]], Sequence[Any]], run: Callable[[Any], Any], *, workers: int = 2,
                 max_batch: int = 16, window: float = 0.0, name: str = "stair-es-batcher",
                 thread_init: Callable[[], None] | None = None):
        if max_batch < 1 or workers < 1:
            raise ValueError("max_batch and workers must be at least 1")
        self.prepare, self.run = prepare, run
        self.max_batch, self.window = int(max_batch), max(0.0, float(window))
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._closed = False
        self._free = threading.Semaphore(workers)  # the dispatcher hands on a request only to a free thread
        self._thread_init = thread_init
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name + "-search", initializer=thread_init)
        self.batches = 0  # counters, for tests and curious operators
        self.items = 0
        self._thread = threading.Thread(target=self._dispatch, name=name, daemon=True)
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
            taken = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]
            # a request whose caller gave up (past --request-timeout, or gone) is dropped unprepared
            return [j for j in taken if not j.future.done()]

    @staticmethod
    def _answer(job: _Job, result: Any, timing: Timing | None) -> None:
        try:
            job.loop.call_soon_threadsafe(_deliver, job.future, result, timing)
        except RuntimeError:  # that event loop is closed: nobody waits for this answer
            pass

    def _dispatch(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while True:
            batch = self._take()
            if batch is None:
                return
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                prepared = list(self.prepare([j.item for j in batch]))
                if len(prepared) != len(batch):
                    raise RuntimeError(f"prepare returned {len(prepared)} values for {len(batch)} requests")
            except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch, never lost
                log.exception("preparing a batch of %d requests failed", len(batch))
                prepared = [e] * len(batch)
            t1 = time.perf_counter()
            self.batches += 1
            self.items += len(batch)
            for job, p in zip(batch, prepared):
                if isinstance(p, BaseException):
                    self._answer(job, p, None)
                    continue
                self._free.acquire()
                if job.future.done():  # its caller gave up while it waited for a thread: not searched
                    self._free.release()
                    continue
                self._pool.submit(self._run_one, job, p, Timing(t0 - job.t_submit, t1 - t0, 0.0, 0.0, len(batch)), t1)

    def _run_one(self, job: _Job, prepared: Any, timing: Timing, t_prepared: float) -> None:
        t0 = time.perf_counter()
        try:
            result = self.run(prepared)
        except BaseException as e:  # noqa: BLE001 - this request's error, for its caller
            result = e
        finally:
            self._free.release()
        t1 = time.perf_counter()
        self._answer(job, result, Timing(timing.queued, timing.prepare, t0 - t_prepared, t1 - t0, timing.size, t1))

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests; the ones already queued are still answered."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        self._pool.shutdown(wait=True)
