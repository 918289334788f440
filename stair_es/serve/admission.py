"""Admission control of `stair-es serve`, like Elasticsearch's search thread pool and queue.

At most ``workers`` requests run at once (in worker threads); up to ``max_queue`` more wait
in one first-come-first-served queue; a request beyond that is refused at once with 429 and
a ``Retry-After`` (whole seconds, as HTTP wants) plus the exact delay in milliseconds
(``Retry-After-Ms`` and the body's ``retry_after_ms``). The delay is the time the requests
already admitted need to drain: admitted x mean service time / workers, the mean being a
moving average of the service times seen.

With a wait budget (``max_wait_ms``, ``--max-queue-ms``) a request is also refused when the
requests ahead of it would take longer than that to drain (requests ahead x mean service time
/ workers): the queue's length then follows the server's speed of the moment, so when the
machine slows down (other processes take the cores) the admitted requests still wait about
the budget at most instead of ``max_queue`` slow service times, and the excess is told to
come back at once.

With a queue timeout (``queue_timeout_ms``, ``--queue-timeout-ms``) a request that has already
waited longer than that when a worker frees for it is answered 429 instead of run (HAProxy's
``timeout queue``): after the machine stalled, the requests that piled up meanwhile are told to
come back at once instead of being served late, so the queue drains in one step and the ones
that arrive next wait no longer than usual. The search batcher applies the same rule. A
request that would be expected to wait longer than the queue timeout is refused at the door at
once, as with ``--max-queue-ms`` (the lower of the two counts), so a steady overload is still
shed in a millisecond, not after waiting the timeout.

With a ``request_timeout``, a request not answered in that time gets 504: if it was still
waiting, it leaves the queue and its work never starts; if it was running, its answer is
abandoned and the worker finishes it (a thread cannot be stopped mid-search), its slot held
until then, so the pool never runs more than ``workers`` at once.

Everything here runs on the event loop (no locks); work runs on a pool of ``workers``
threads that only ever holds as many tasks as there are free slots. This module knows
asyncio, not FastAPI.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .errors import RequestTimeoutError, ServerBusyError


if sys.version_info >= (3, 11):
    async def within(aw: Any, seconds: float) -> Any:
        """``await aw``, cancelled past ``seconds`` (``asyncio.TimeoutError``). On 3.11+ the
        awaitable runs in the caller's own task under ``asyncio.timeout``: ``wait_for`` made a
        task of it and a timer, twice per search on the event loop's path."""
        async with asyncio.timeout(seconds):
            return await aw
else:  # pragma: no cover - Python 3.10
    async def within(aw: Any, seconds: float) -> Any:
        return await asyncio.wait_for(aw, seconds)


def lower_thread_priority(steps: int) -> None:
    """Run in a new worker thread: sets that thread's nice value ``steps`` above the process's
    main thread (Linux schedules threads one by one), so the event loop's thread, which
    accepts, sheds and answers, gets the CPU first when the workers saturate it. A no-op where
    not supported.

    Counted from the main thread, not from the calling thread's own value: a thread inherits
    the nice value of the thread that starts it, which may itself be lowered already (until
    2026-11-27 the search threads were started by an already lowered dispatcher thread and ran
    2 x ``steps`` below)."""
    if steps <= 0:
        return
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread (its id is the process id)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + steps))
    except (AttributeError, OSError):
        pass


def set_loop_priority(nice: int) -> str | None:
    """Run on the event loop's thread: sets its nice value to ``nice`` (Linux schedules threads
    one by one). A negative value puts the thread that accepts, sheds and answers ahead of the
    machine's other processes, which the kernel allows only to root, to ``CAP_SYS_NICE`` or
    within ``RLIMIT_NICE``. Returns why it could not be done (the server runs on, unchanged),
    or None."""
    try:
        tid = threading.get_native_id()
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if nice != now:
            os.setpriority(os.PRIO_PROCESS, tid, max(-20, min(19, nice)))
    except PermissionError:
        return (f"the event loop's thread cannot run at nice {nice} (STAIR_ES_SERVE_LOOP_NICE): a value below the "
                f"current {now} needs root, CAP_SYS_NICE or a raised RLIMIT_NICE; it runs at nice {now}")
    except (AttributeError, OSError) as e:
        return f"the event loop's thread's nice value cannot be set here ({e}); it runs unchanged"
    return None


class Admission:
    def __init__(self, workers: int, max_queue: int, request_timeout: float | None = None, *,
                 name: str = "stair-es-worker", worker_nice: int = 0, max_wait_ms: float | None = None,
                 queue_timeout_ms: float | None = None):
        self.workers, self.max_queue = max(1, int(workers)), max(0, int(max_queue))
        self.max_wait_ms = float(max_wait_ms) if max_wait_ms and max_wait_ms > 0 else None
        self.queue_timeout_ms = float(queue_timeout_ms) if queue_timeout_ms and queue_timeout_ms > 0 else None
        self.request_timeout = request_timeout if request_timeout and request_timeout > 0 else None
        self.admitted = 0  # running + waiting, on every path (the search batcher's queue included)
        self._busy = 0  # worker slots held by pool work
        self._waiting: deque[asyncio.Future] = deque()
        self._mean_s = 0.005  # moving average of service times (seconds); a guess until the first request
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name,
                                        initializer=lower_thread_priority, initargs=(worker_nice,))
        self.shed = 0  # counters, for tests and curious operators
        self.timed_out = 0
        self.overdue = 0  # answered 429 past --queue-timeout-ms (the search batcher counts its own)

    # --- the numbers a refused client is told ----------------------------------------------------
    def observe(self, seconds: float) -> None:
        """One service time (seconds) into the moving average."""
        self._mean_s += 0.1 * (max(0.0, seconds) - self._mean_s)

    def retry_after_ms(self) -> int:
        """When a refused client should come back: the admitted requests' drain time, 1 ms to 60 s."""
        return int(min(60_000, max(1, math.ceil(max(1, self.admitted) * self._mean_s * 1000 / self.workers))))

    def deadline(self) -> float | None:
        return None if self.request_timeout is None else time.monotonic() + self.request_timeout

    # --- admission ---------------------------------------------------------------------------------
    def expected_wait_ms(self) -> float:
        """How long a request admitted now would wait for a worker: the requests ahead of it
        (beyond the ones a free worker takes at once) x mean service time / workers."""
        ahead = max(0, self.admitted - self.workers + 1)
        return ahead * self._mean_s * 1000 / self.workers

    def _door_budget(self) -> tuple[float, str] | None:
        """The wait a request may be expected to have before it is refused at the door, and the
        option that sets it: ``--max-queue-ms``, or ``--queue-timeout-ms`` when lower (a request
        that would wait past the queue timeout would only be refused later, after that wait)."""
        budgets = [(v, o) for v, o in ((self.max_wait_ms, "--max-queue-ms"), (self.queue_timeout_ms, "--queue-timeout-ms"))
                   if v is not None]
        return min(budgets) if budgets else None

    def _over_budget(self) -> bool:
        budget = self._door_budget()
        return budget is not None and self.admitted >= self.workers and self.expected_wait_ms() > budget[0]

    def full(self) -> bool:
        return self.admitted >= self.workers + self.max_queue or self._over_budget()

    def busy_message(self) -> str:
        if self.admitted < self.workers + self.max_queue and self._over_budget():
            ms, option = self._door_budget()
            return (f"the server is busy: the {self.admitted} requests running or queued would make this one wait about "
                    f"{self.expected_wait_ms():.0f} ms, more than {option} {ms:g}; retry after "
                    f"{self.retry_after_ms()} ms")
        return (f"the server is busy: {self.admitted} requests are running or queued, the most it holds (--workers "
                f"{self.workers} + --max-queue {self.max_queue}); retry after {self.retry_after_ms()} ms")

    def enter(self) -> None:
        """Counts a request in, or refuses it (429) when workers + max_queue are already admitted."""
        if self.full():
            self.shed += 1
            raise ServerBusyError(self.busy_message(), self.retry_after_ms())
        self.admitted += 1

    def overdue_error(self, waited: float) -> ServerBusyError:
        """The 429 of a request that waited ``waited`` seconds in the queue, past ``--queue-timeout-ms``.
        Safe to call from a search thread: it only reads numbers."""
        ms = waited * 1000
        return ServerBusyError(f"the server is busy: this request waited {ms:.0f} ms in the queue, more than "
                               f"--queue-timeout-ms {self.queue_timeout_ms:g}, and was not run; retry after "
                               f"{self.retry_after_ms()} ms", self.retry_after_ms(),
                               server_timing=f"queue;dur={ms:.2f}")

    def leave(self) -> None:
        self.admitted -= 1

    def timeout(self, waited: float, started: bool | None) -> RequestTimeoutError:
        """The 504 of a request past its deadline: ``started`` says whether its work had begun (None: unknown)."""
        self.timed_out += 1
        what = {True: "did not finish; its answer was abandoned (the worker completes the running work and takes "
                      "nothing else meanwhile)",
                False: "did not get a worker; it left the queue before any work",
                None: "did not finish; its work was dropped if it had not started"}[started]
        return RequestTimeoutError(f"the request {what} within --request-timeout {self.request_timeout:g} s "
                                   f"(after {waited:.2f} s); retry later, send less work, or raise --request-timeout",
                                   self.retry_after_ms())

    async def _slot(self, deadline: float | None, t0: float) -> None:
        if self._busy < self.workers and not self._waiting:
            self._busy += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            if deadline is None:
                await fut
            else:
                await asyncio.wait_for(asyncio.shield(fut), max(0.0, deadline - time.monotonic()))
            waited = time.monotonic() - t0
            if self.queue_timeout_ms is not None and waited * 1000 > self.queue_timeout_ms:
                self.overdue += 1
                self._free()  # the slot it was handed goes to the next in line
                raise self.overdue_error(waited)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if fut.done() and not fut.cancelled():  # the slot was handed over just now: pass it on
                self._free()
            else:
                fut.cancel()
                try:
                    self._waiting.remove(fut)
                except ValueError:
                    pass
            if isinstance(e, asyncio.TimeoutError):
                raise self.timeout(time.monotonic() - t0, started=False) from None
            raise

    def _free(self) -> None:
        """A slot is free: hand it to the first live waiter, in arrival order."""
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot stays held, now by that waiter
                return
        self._busy -= 1

    async def run(self, fn: Callable, *args: Any) -> Any:
        """``fn(*args)`` on a worker thread, admitted, queued first come first served, under the deadline."""
        self.enter()
        try:
            t0 = time.monotonic()
            deadline = self.deadline()
            await self._slot(deadline, t0)
            loop = asyncio.get_running_loop()
            started = time.monotonic()

            def call() -> Any:
                try:
                    return fn(*args)
                finally:
                    try:
                        loop.call_soon_threadsafe(self._done, time.monotonic() - started)
                    except RuntimeError:  # the event loop is closed: nobody waits for the slot
                        pass

            try:
                cf = self._pool.submit(call)
            except BaseException:
                self._free()
                raise
            job = asyncio.wrap_future(cf)
            if deadline is None:
                return await job
            try:
                return await asyncio.wait_for(asyncio.shield(job), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                job.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error, if any, is nobody's now
                raise self.timeout(time.monotonic() - t0, started=True) from None
        finally:
            self.leave()

    def _done(self, took: float) -> None:
        self.observe(took)
        self._free()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
