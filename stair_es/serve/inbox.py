"""How `stair-es serve`'s threads (the search threads, the worker pool) hand their answers to the
event loop without holding the GIL while they wake it.

``loop.call_soon_threadsafe`` wakes the loop with a system call made while holding the GIL
(uvloop's ``uv_async_send``, an eventfd write): at 1.5·S on 1M documents a fifth of the search
threads' GIL samples were on that call, which takes a microsecond; the thread was, it seems,
switched out there (its own wake-up of the loop, or its share used up) with the GIL in its hands,
and the loop, which answers and sheds, slept until a thread niced below it ran again
(docs/serve.md, "What held the door"). Here a thread appends its call to a deque and, when the
loop has not been woken since its last drain, writes a byte to a pipe with ``os.write``, which
lets the GIL go during the call; the loop reads the pipe (``add_reader``) and runs every call
waiting, in order.

:func:`submit` runs a call on a thread pool with its end handed over that way (the worker pool of
:mod:`.admission`, the URL fetches of :mod:`.fetch`).

This module knows asyncio and nothing of what is handed over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from concurrent.futures import Executor
from typing import Any, Callable


def call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """``loop.call_soon_threadsafe(fn, *args)``, from any thread; nothing once that loop is closed
    (nobody waits for its answers any more)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


class LoopInbox:
    """Calls for one event loop from other threads, run on the loop in the order they came."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._items: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._r, self._w = os.pipe()
        try:
            for fd in (self._r, self._w):
                os.set_blocking(fd, False)
            loop.add_reader(self._r, self._drain)  # NotImplementedError where the loop cannot watch a pipe
        except BaseException:
            os.close(self._r)
            os.close(self._w)
            raise
        self._signalled = False  # a byte is in the pipe, or about to be, since the last drain
        self._closed = False

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """From any thread: ``fn(*args)``, run on the loop."""
        if self._closed:
            return call_soon(self.loop, fn, *args)
        self._items.append((fn, args))  # before the flag is read: a drain that clears it after sees this
        if not self._signalled:
            self._signalled = True
            try:
                os.write(self._w, b"\0")
            except BlockingIOError:  # the pipe is full: bytes are waiting, the loop drains them and this
                pass
            except OSError:  # the pipe is gone (closed at shutdown): never left waiting for a byte
                call_soon(self.loop, self._run_left)

    def _drain(self) -> None:
        """On the loop: every call waiting, in order."""
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self._r, 4096)
        # after the read (a byte written meanwhile may be read with the others) and before the deque is
        # drained: a call appended from now on writes a byte again; one appended before is run below
        self._signalled = False
        self._run_left()

    def close(self) -> None:
        """No more reading; calls still waiting (or coming) go through ``call_soon_threadsafe``."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # the loop is closed already (or gone): nothing to unregister
            self.loop.remove_reader(self._r)
        if self._items:
            call_soon(self.loop, self._run_left)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _run_left(self) -> None:
        while self._items:
            fn, args = self._items.popleft()
            fn(*args)


class Inboxes:
    """One :class:`LoopInbox` per event loop, made on that loop's thread at its first use; the
    inboxes of loops that have ended are closed then (a server runs one loop, but tests and
    embedding programs may run many, one after the other)."""

    def __init__(self):
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopInbox | None] = {}

    def hand(self, loop: asyncio.AbstractEventLoop) -> Callable[..., None]:
        """On ``loop``'s thread: a function that any thread may call as ``hand(fn, *args)`` to run
        ``fn(*args)`` on ``loop`` (through its inbox, or ``call_soon_threadsafe`` where the loop
        cannot watch a pipe, e.g. Windows' proactor loop)."""
        try:
            inbox = self._by_loop[loop]
        except KeyError:
            for gone in [lp for lp in self._by_loop if lp.is_closed()]:
                old = self._by_loop.pop(gone)
                if old is not None:
                    old.close()
            try:
                inbox = LoopInbox(loop)
            except (NotImplementedError, OSError):
                inbox = None
            self._by_loop[loop] = inbox
        if inbox is None:
            return lambda fn, *args: call_soon(loop, fn, *args)
        return inbox.call

    def close(self) -> None:
        for inbox in self._by_loop.values():
            if inbox is not None:
                inbox.close()


def submit(pool: Executor, hand: Callable[..., None], job: asyncio.Future, fn: Callable[..., Any], *args: Any,
           ended: Callable[[bool], None]) -> None:
    """``fn(*args)`` on ``pool``; its end reaches ``job``'s loop in one hand-over (``hand``, from
    :meth:`Inboxes.hand`), where ``ended(True)`` runs first (a slot freed, a time counted), then
    ``job`` gets the result or the error, unless its caller has gone. A call the pool drops before
    it runs (shut down) gives ``ended(False)`` and a cancelled ``job``. Raises what
    ``pool.submit`` raises (a pool shut down already), with nothing run."""
    def call() -> None:
        try:
            out, err = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - the caller's error, raised in the caller
            out, err = None, e
        hand(_end, job, out, err, ended, True)

    pool.submit(call).add_done_callback(
        lambda f: f.cancelled() and hand(_end, job, None, asyncio.CancelledError(), ended, False))


def _end(job: asyncio.Future, out: Any, err: BaseException | None, ended: Callable[[bool], None], ran: bool) -> None:
    ended(ran)
    if job.done():  # the caller went away (the client left, its deadline passed)
        return
    if err is None:
        job.set_result(out)
    elif isinstance(err, asyncio.CancelledError):  # it never ran
        job.cancel()
    else:
        job.set_exception(err)
