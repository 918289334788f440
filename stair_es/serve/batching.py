"""Inter-query batching for `stair-es serve`: one FIFO queue and a fixed set of search threads
that take their work from it, with no thread in between.

Requests wait in arrival order. A free search thread takes what waits at the head of the
queue, at most ``max_batch`` requests (after the first it may wait up to ``window`` seconds
for more), prepares them together with one call of ``prepare`` (for ``/v1/search``,
:meth:`~stair_es.serve.service.Service.prepare_searches`: the batch's query texts are encoded
in one call of the model), runs the first of them at once and leaves the others, prepared,
at the head of the queue, where the next free thread (itself included) takes them in order.
While one thread prepares, the others do not take later requests: searches start strictly in
arrival order. ``run`` runs on the search thread (the embedded engine's kernel runs without the
GIL, so the threads search in parallel), which hands its answer to the event loop at once,
through the loop's inbox (:mod:`.inbox`: a pipe written without holding the GIL).

Why no dispatcher thread (until 2026-11-27 one took each batch, prepared it and handed each
request to a pool's free thread): on two cores it was a fourth busy thread beside the event
loop and two searches, each hand-over a wake-up and a GIL switch more, and requests waited
for it as well as for a thread.

Why not one batch searched as a whole (``search_batch``): its answers all leave when the
slowest search of the batch ends, and the threads that finished first wait for it idle. At
1M documents, where searches differ a lot in length, that cost more than it saved. Why not a
thread per request, as the other routes do: requests then also fight over the GIL while they
are prepared, and are not served strictly in arrival order.

A request whose caller stopped waiting (its deadline passed, or the client left) is dropped
before its preparation and before its search, if it has not started them yet. With
``max_wait`` (seconds, or a function giving them now, or None), a request that has waited
longer than that when its turn comes gets ``overdue(waited)`` (an exception: the server's 429)
instead of its search: after the machine stalled, the backlog is told to come back instead of
being served late, so the queue drains at once and later requests are not held behind it. Its
wait is its time in the queue before its batch was taken and after the batch was prepared: the
preparation itself is work on it.

This module knows asyncio, not FastAPI; admission (429 when too many wait) is the caller's.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .admission import cpu_wait_s
from .inbox import Inboxes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """Where a batched request spent its time on the server (seconds)."""

    queued: float  # from submit until a search thread took its batch
    prepare: float  # preparing its batch
    wait: float  # prepared, waiting for a free search thread (0 for the first of a batch)
    run: float  # its own search (and answer)
    size: int  # requests in its batch
    done_at: float = 0.0  # time.perf_counter() when its thread finished (the hand-over to the loop starts)
    cpu_wait: float = 0.0  # of prepare / size + run: its thread runnable but waiting for a core (Linux)


@dataclass
class _Job:
    item: Any
    future: asyncio.Future
    t_submit: float
    hand: Callable[..., None]  # runs a call on the loop, from any thread (.inbox)


@dataclass
class _Ready:
    """A prepared request waiting at the head of the queue for a free thread."""

    job: _Job
    prepared: Any
    queued: float
    prepare: float
    size: int
    t_prepared: float
    prepare_cpu_wait: float = 0.0  # the batch's preparation waiting for a core


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
    threads; at most ``workers`` run at once, started in arrival order. ``max_wait`` and
    ``overdue``: see the module's doc."""

    def __init__(self, prepare: Callable[[list[Any]], Sequence[Any]], run: Callable[[Any], Any], *, workers: int = 2,
                 max_batch: int = 16, window: float = 0.0, name: str = "stair-es-batcher",
                 thread_init: Callable[[], None] | None = None,
                 max_wait: float | Callable[[], float | None] | None = None,
                 overdue: Callable[[float], BaseException] | None = None):
        if max_batch < 1 or workers < 1:
            raise ValueError("max_batch and workers must be at least 1")
        self.prepare, self.run = prepare, run
        self.max_batch, self.window = int(max_batch), max(0.0, float(window))
        # seconds, or a function of nothing giving them (None: no limit), read at each turn
        self._max_wait = max_wait if callable(max_wait) else (float(max_wait) if max_wait and max_wait > 0 else None)
        self._overdue = overdue or (lambda waited: TimeoutError(f"waited {waited * 1000:.0f} ms in the queue"))
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()  # not yet taken, in arrival order
        self._ready: deque[_Ready] = deque()  # prepared, ahead of every request in _queue
        self._preparing = False  # a thread is preparing the head of the queue: the others wait for it
        self._closed = False
        self._thread_init = thread_init
        self._inboxes = Inboxes()  # where the answers go, per event loop
        self.batches = 0  # counters, for tests and curious operators
        self.items = 0
        self.overdue = 0
        self._threads = [threading.Thread(target=self._work, name=f"{name}-search-{i}", daemon=True)
                         for i in range(int(workers))]
        for t in self._threads:
            t.start()

    @property
    def max_wait(self) -> float | None:
        """Seconds a request may have waited when its turn comes (None: no limit)."""
        mw = self._max_wait
        if callable(mw):
            mw = mw()
            return mw if mw and mw > 0 else None
        return mw

    async def submit(self, item: Any) -> tuple[Any, Timing]:
        loop = asyncio.get_running_loop()
        job = _Job(item, loop.create_future(), time.perf_counter(), self._inboxes.hand(loop))
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._queue.append(job)
            if not self._preparing:
                self._cond.notify()  # a free thread, if any, takes it
            elif self.window > 0:
                self._cond.notify_all()  # the preparer, waiting for its batch to fill, counts again
        return await job.future

    @staticmethod
    def _answer(job: _Job, result: Any, timing: Timing | None) -> None:
        job.hand(_deliver, job.future, result, timing)

    def _late(self, job: _Job, now: float, ready: _Ready | None = None) -> bool:
        """Answers ``job`` with ``overdue`` if it waited past ``max_wait``; True then. A prepared
        request (``ready``) has waited its time in the queue before its batch was taken and since
        the batch was prepared, not the preparation itself, which was its own work (a batch of
        query texts encoded together may take longer than the whole wait allowed)."""
        limit = self.max_wait
        if limit is None:
            return False
        waited = now - job.t_submit if ready is None else ready.queued + (now - ready.t_prepared)
        if waited <= limit:
            return False
        self.overdue += 1
        try:
            err = self._overdue(waited)
        except BaseException as e:  # noqa: BLE001 - a broken callback must not kill a search thread
            err = e
        self._answer(job, err, None)
        return True

    def _next(self) -> _Ready | list[_Job] | None:
        """Under the lock: the next prepared request to run, or a batch to prepare (this thread
        is then the preparer), or None when closed and drained."""
        while True:
            now = time.perf_counter()
            while self._ready:
                r = self._ready.popleft()
                if r.job.future.done() or self._late(r.job, now, r):  # gave up, or waited too long: not searched
                    continue
                if self._ready:
                    self._cond.notify()  # another free thread takes the next one
                return r
            if self._queue and not self._preparing:
                while self._queue and (self._queue[0].future.done() or self._late(self._queue[0], now)):
                    self._queue.popleft()  # gave up or overdue: dropped unprepared
                if not self._queue:
                    continue
                self._preparing = True
                if self.window > 0:
                    deadline = self._queue[0].t_submit + self.window
                    while len(self._queue) < self.max_batch and not self._closed:
                        left = deadline - time.perf_counter()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                taken = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch))]
                batch = [j for j in taken if not j.future.done()]
                if batch:
                    return batch
                self._preparing = False
                continue
            if self._closed and not self._queue and not self._preparing:
                self._cond.notify_all()
                return None
            self._cond.wait()

    def _work(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while True:
            with self._cond:
                got = self._next()
            if got is None:
                return
            if isinstance(got, _Ready):
                self._run_one(got)
                continue
            first = self._prepare(got)
            if first is not None:
                self._run_one(first)

    def _prepare(self, batch: list[_Job]) -> _Ready | None:
        """Prepares a batch; its first request is returned, to run on this thread at once, the
        others go to the head of the queue."""
        t0, w0 = time.perf_counter(), cpu_wait_s()
        try:
            prepared = list(self.prepare([j.item for j in batch]))
            if len(prepared) != len(batch):
                raise RuntimeError(f"prepare returned {len(prepared)} values for {len(batch)} requests")
        except BaseException as e:  # noqa: BLE001 - handed to every caller of the batch, never lost
            log.exception("preparing a batch of %d requests failed", len(batch))
            prepared = [e] * len(batch)
        t1, w1 = time.perf_counter(), cpu_wait_s()
        ready = []
        for job, p in zip(batch, prepared):
            if isinstance(p, BaseException):
                self._answer(job, p, None)
            else:
                ready.append(_Ready(job, p, t0 - job.t_submit, t1 - t0, len(batch), t1, w1 - w0))
        with self._cond:
            self.batches += 1
            self.items += len(batch)
            self._ready.extend(ready[1:])  # _ready was empty: nobody fills it while a batch is prepared
            self._preparing = False
            if self._ready or self._queue:
                self._cond.notify(len(self._ready) + (1 if self._queue else 0))
        return ready[0] if ready else None

    def _run_one(self, r: _Ready) -> None:
        if r.job.future.done():  # its caller gave up while the batch was prepared: not searched
            return
        t0, w0 = time.perf_counter(), cpu_wait_s()
        try:
            result = self.run(r.prepared)
        except BaseException as e:  # noqa: BLE001 - this request's error, for its caller
            result = e
        t1, w1 = time.perf_counter(), cpu_wait_s()
        self._answer(r.job, result, Timing(r.queued, r.prepare, t0 - r.t_prepared, t1 - t0, r.size, t1,
                                           r.prepare_cpu_wait / max(1, r.size) + (w1 - w0)))

    def close(self, timeout: float = 10.0) -> None:
        """Stop taking requests; the ones already queued are still answered."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        end = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, end - time.monotonic()))
        self._inboxes.close()
