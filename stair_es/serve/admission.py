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

The queue timeout is on by default, derived from the service times seen (``"auto"``): a request
may wait :data:`AUTO_FLOOR_MS` (20 ms), or :data:`AUTO_SERVICE_TIMES` (4) mean service times of
its kind when that is longer. Under ``auto`` the door refuses a request expected to wait past it,
and one the door let in is refused from the queue only past :data:`AUTO_OVERDUE_SLACK` (2) times
it: refusals then come back in about a millisecond, and a misjudged request is served a little
late rather than refused after its wait (docs/serve.md, "Refused at the door, not after the
wait"). The kinds are searches (the batcher's queue), pictures
(thumbnails and heatmaps: an image decoded and resized, 15-40 ms each) and the worker pool's
other work (encoding, explain, the page), each with its own moving average, so a slow kind (an
image encoding of 150 ms, a cluster's search, the thumbnails a results page asks for at once)
keeps a queue of its own length while a fast one
(a search of 5 ms on 1M documents) is held to the 20 ms that keep its p99 near 50 ms at 80 % of
the server's capacity (measured in docs/serve.md, "Defaults that hold the p99").

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
import contextlib
import functools
import math
import os
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..errors import InvalidInputError
from .errors import RequestTimeoutError, ServerBusyError
from .inbox import Inboxes, submit


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
    if steps > 0:
        with contextlib.suppress(AttributeError, OSError):
            base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread (its id is the process id)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + steps))


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


class _SchedStat:
    """This thread's ``/proc/thread-self/schedstat``, open for as long as the thread lives."""

    def __init__(self):
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except (AttributeError, OSError):
            self.fd = -1

    def __del__(self):
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)


_schedstat = threading.local()


def cpu_wait_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a core since it started
    (Linux: ``run_delay`` of ``/proc/thread-self/schedstat``, about a microsecond to read); 0.0
    where unknown. Wall time minus the growth of this is a piece of work's own time: what it
    ran, and what it waited for anything but a core (the GIL, a lock, the network)."""
    st = getattr(_schedstat, "st", None)
    if st is None:
        st = _schedstat.st = _SchedStat()
    if st.fd < 0:
        return 0.0
    try:
        return int(os.pread(st.fd, 64, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


#: ``--queue-timeout-ms auto`` (the default): a request may wait this long in the queue ...
AUTO_FLOOR_MS = 20.0
#: ... or this many mean service times of its kind, when that is longer.
AUTO_SERVICE_TIMES = 4.0
#: Under ``auto``, a request the door let in is refused from the queue only once it has waited this many
#: times its queue timeout: the door already refuses one expected to wait past it, so what still waits
#: longer is a misjudged one, which is better served a little late than refused after its wait (a
#: refusal from the queue comes back only after that wait; one at the door in about a millisecond).
AUTO_OVERDUE_SLACK = 2.0
#: The kinds of work with a queue timeout of their own under ``auto``: searches through the batcher,
#: pictures (thumbnails, heatmaps) and the pool's other work.
KINDS = ("search", "media", "pool")
#: Under ``auto``, a kind's queue is bounded only by ``--max-queue`` until this many of its requests were served
#: (its service time is not known yet: a guess would refuse slow work, such as the first image encodings).
AUTO_MIN_SAMPLES = 8


def queue_timeout_setting(value: Any) -> float | str | None:
    """``--queue-timeout-ms`` as given (a number of ms, ``auto`` or ``off``; 0: off) -> ms, ``"auto"`` or None."""
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v == "auto":
            return "auto"
        if v in ("off", "none", ""):
            return None
        try:
            value = float(v)
        except ValueError:
            raise InvalidInputError(f"queue timeout {value!r}: give milliseconds (e.g. 20), 'auto' or 'off'") from None
    value = float(value)
    if value < 0 or value != value:
        raise InvalidInputError(f"queue timeout {value:g}: give milliseconds >= 0 (0: off), 'auto' or 'off'")
    return value if value > 0 else None


def set_loop_realtime() -> str | None:
    """Run on the event loop's thread: puts it in the real-time class (``SCHED_FIFO``, the lowest
    real-time priority, 1), so that when it wakes (a request arrived, a search finished) it runs
    at once instead of waiting for a core that CPU-bound threads hold: on a kernel that does not
    preempt them on wake-up it waited for the next scheduler tick (4 ms at 250 Hz), once or
    twice. With ``SCHED_RESET_ON_FORK``: the threads it starts (search threads, the worker pool)
    are ordinary ones. The kernel allows it to root, to ``CAP_SYS_NICE`` or within
    ``RLIMIT_RTPRIO``. Returns why it could not be done (the server runs on, unchanged), or None."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
    except PermissionError:
        return ("the event loop's thread cannot run in the real-time class (--loop-realtime): that needs root, "
                "CAP_SYS_NICE or an RLIMIT_RTPRIO of 1 or more; it runs as an ordinary thread")
    except (AttributeError, OSError) as e:
        return f"the event loop's thread cannot be made real-time here ({e}); it runs as an ordinary thread"
    return None


def unset_loop_realtime() -> None:
    """Back to an ordinary thread (when the app stops: the thread may run other things after it)."""
    with contextlib.suppress(AttributeError, OSError):
        if os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


class Admission:
    def __init__(self, workers: int, max_queue: int, request_timeout: float | None = None, *,
                 name: str = "stair-es-worker", worker_nice: int = 0, max_wait_ms: float | None = None,
                 queue_timeout_ms: float | str | None = None):
        self.workers, self.max_queue = max(1, int(workers)), max(0, int(max_queue))
        self.max_wait_ms = float(max_wait_ms) if max_wait_ms and max_wait_ms > 0 else None
        # a fixed number of ms, "auto" (derived per kind of work from its service times) or None (off)
        self.queue_timeout_ms = queue_timeout_setting(queue_timeout_ms)
        self.request_timeout = request_timeout if request_timeout and request_timeout > 0 else None
        self.admitted = 0  # running + waiting, on every path (the search batcher's queue included)
        self._busy = 0  # worker slots held by pool work
        self._waiting: deque[asyncio.Future] = deque()
        self._mean_s = 0.005  # moving average of service times (seconds); a guess until the first request
        self._kind_mean_s = dict.fromkeys(KINDS, 0.0)  # the same, per kind of work (for the auto queue timeout)
        self._kind_seen = dict.fromkeys(KINDS, 0)  # service times observed per kind
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=name,
                                        initializer=lower_thread_priority, initargs=(worker_nice,))
        self._inboxes = Inboxes()  # how the workers' answers reach the event loop
        self.shed = 0  # counters, for tests and curious operators
        self.timed_out = 0
        self.overdue = 0  # answered 429 past --queue-timeout-ms (the search batcher counts its own)

    # --- the numbers a refused client is told ----------------------------------------------------
    def observe(self, seconds: float, kind: str = "pool", cpu_wait: float = 0.0) -> None:
        """One service time (seconds, wall) of ``kind`` (one of :data:`KINDS`) into the moving
        averages; ``cpu_wait``: the part of it the thread spent waiting for a core (:func:`cpu_wait_s`).

        The drain time told to refused clients and expected at the door follows the wall time (how
        fast the server goes now). The auto queue timeout follows the work's own time, without
        the waits for a core: when other processes take the cores and a 5 ms search takes 20 ms of
        wall time, the queue may still hold only what 20 ms of waiting allows, instead of growing
        with the slowdown (4 x 20 ms) and every answered request waiting that much longer. Slow
        work (an image encoding, a cluster's search waiting on the network) keeps its own length."""
        seconds = max(0.0, seconds)
        own = max(0.0, seconds - max(0.0, cpu_wait))
        self._mean_s += 0.1 * (seconds - self._mean_s)
        seen = self._kind_seen[kind] = self._kind_seen[kind] + 1
        # the first ones as a plain mean (no guess to forget), then a moving average
        self._kind_mean_s[kind] += (own - self._kind_mean_s[kind]) * max(0.1, 1.0 / seen)

    def queue_timeout(self, kind: str = "pool") -> float | None:
        """The queue timeout of ``kind`` in ms now (None: off): the fixed ``--queue-timeout-ms``, or
        under ``auto`` :data:`AUTO_FLOOR_MS`, or :data:`AUTO_SERVICE_TIMES` mean service times of
        that kind when longer (none until :data:`AUTO_MIN_SAMPLES` of that kind were served).
        Safe to call from a search thread: it only reads numbers."""
        qt = self.queue_timeout_ms
        if qt == "auto":
            if self._kind_seen[kind] < AUTO_MIN_SAMPLES:
                return None
            return max(AUTO_FLOOR_MS, AUTO_SERVICE_TIMES * self._kind_mean_s[kind] * 1000)
        return qt

    def queue_timeout_s(self, kind: str = "pool") -> float | None:
        ms = self.queue_timeout(kind)
        return None if ms is None else ms / 1000

    def overdue_after_s(self, kind: str = "pool") -> float | None:
        """How long a request of ``kind`` the door let in may wait in the queue before it is refused
        (None: no limit): its queue timeout, times :data:`AUTO_OVERDUE_SLACK` under ``auto``."""
        s = self.queue_timeout_s(kind)
        return s if s is None or self.queue_timeout_ms != "auto" else s * AUTO_OVERDUE_SLACK

    def _timeout_named(self, ms: float) -> str:
        if self.queue_timeout_ms == "auto":
            return (f"its queue timeout of {ms:.0f} ms (--queue-timeout-ms auto: {AUTO_FLOOR_MS:g} ms, or "
                    f"{AUTO_SERVICE_TIMES:g} service times when longer)")
        return f"--queue-timeout-ms {ms:g}"

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

    def _door_budget(self, kind: str = "pool") -> tuple[float, bool] | None:
        """The wait a request of ``kind`` may be expected to have before it is refused at the door,
        and whether the queue timeout sets it (else ``--max-queue-ms``): the lower of the two (a
        request that would wait past the queue timeout would only be refused later, after that wait)."""
        qt, mw = self.queue_timeout(kind), self.max_wait_ms
        if qt is None:
            return None if mw is None else (mw, False)
        return (qt, True) if mw is None or qt <= mw else (mw, False)

    def _over_budget(self, kind: str = "pool") -> bool:
        if self.admitted < self.workers:
            return False
        budget = self._door_budget(kind)
        return budget is not None and self.expected_wait_ms() > budget[0]

    def full(self, kind: str = "pool") -> bool:
        """Whether a request of ``kind`` (``search``: the batcher's; ``pool``: any other) is refused now."""
        return self.admitted >= self.workers + self.max_queue or self._over_budget(kind)

    def busy_message(self, kind: str = "pool") -> str:
        if self.admitted < self.workers + self.max_queue and self._over_budget(kind):
            ms, by_timeout = self._door_budget(kind)
            named = self._timeout_named(ms) if by_timeout else f"--max-queue-ms {ms:g}"
            return (f"the server is busy: the {self.admitted} requests running or queued would make this one wait about "
                    f"{self.expected_wait_ms():.0f} ms, more than {named}; retry after "
                    f"{self.retry_after_ms()} ms")
        return (f"the server is busy: {self.admitted} requests are running or queued, the most it holds (--workers "
                f"{self.workers} + --max-queue {self.max_queue}); retry after {self.retry_after_ms()} ms")

    def enter(self, kind: str = "pool") -> None:
        """Counts a request in, or refuses it (429) when workers + max_queue are already admitted
        or it would be expected to wait past its budget."""
        if self.full(kind):
            self.shed += 1
            raise ServerBusyError(self.busy_message(kind), self.retry_after_ms())
        self.admitted += 1

    def overdue_error(self, waited: float, kind: str = "pool") -> ServerBusyError:
        """The 429 of a request of ``kind`` that waited ``waited`` seconds in the queue, past its queue
        timeout. Safe to call from a search thread: it only reads numbers."""
        ms = waited * 1000
        limit = self.queue_timeout(kind)
        named = self._timeout_named(limit if limit is not None else 0.0)
        if self.queue_timeout_ms == "auto":
            named = f"{AUTO_OVERDUE_SLACK:g} x {named}"
        return ServerBusyError(f"the server is busy: this request waited {ms:.0f} ms in the queue, more than {named}, "
                               f"and was not run; retry after {self.retry_after_ms()} ms", self.retry_after_ms(),
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

    async def _slot(self, deadline: float | None, t0: float, kind: str = "pool") -> None:
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
            limit = self.overdue_after_s(kind)
            if limit is not None and waited > limit:
                self.overdue += 1
                self._free()  # the slot it was handed goes to the next in line
                raise self.overdue_error(waited, kind)
        except (asyncio.TimeoutError, asyncio.CancelledError) as e:
            if fut.done() and not fut.cancelled():  # the slot was handed over just now: pass it on
                self._free()
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiting.remove(fut)
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

    async def run(self, fn: Callable, *args: Any, kind: str = "pool") -> Any:
        """``fn(*args)`` on a worker thread, admitted, queued first come first served, under the
        deadline; ``kind`` (``pool`` or ``media``) chooses its queue timeout."""
        self.enter(kind)
        try:
            t0 = time.monotonic()
            deadline = self.deadline()
            await self._slot(deadline, t0, kind)
            loop = asyncio.get_running_loop()
            job, started, spent = loop.create_future(), time.monotonic(), [0.0, 0.0]

            def timed() -> Any:  # on a worker thread: its service time and its waits for a core, for _ended
                w0 = cpu_wait_s()
                try:
                    return fn(*args)
                finally:
                    spent[:] = [time.monotonic() - started, cpu_wait_s() - w0]

            try:
                submit(self._pool, self._inboxes.hand(loop), job, timed, ended=functools.partial(self._ended, spent, kind))
            except BaseException:
                self._free()
                raise
            if deadline is None:
                return await job
            try:
                return await asyncio.wait_for(asyncio.shield(job), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                job.add_done_callback(lambda f: f.cancelled() or f.exception())  # its error, if any, is nobody's now
                raise self.timeout(time.monotonic() - t0, started=True) from None
        finally:
            self.leave()

    def _ended(self, spent: list[float], kind: str, ran: bool) -> None:
        """On the loop: a worker's job ended (``ran`` False: the pool dropped it); its time is
        counted and its slot goes to the next in line."""
        if ran:
            self.observe(spent[0], kind, spent[1])
        self._free()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._inboxes.close()
