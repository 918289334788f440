"""The HTTP/1.1 protocol `stair-es serve` runs uvicorn with: uvicorn's own, plus a deadline
for a request's headers.

uvicorn closes a keep-alive connection idle between requests (``timeout_keep_alive``) and
the body guard bounds the time to send a body, but a connection that sends half a header and
stops was kept open for good. Here a connection must complete each request's headers within
``header_timeout`` seconds of opening or of its previous answer, or it is closed. This module
knows uvicorn's protocol classes only through their public ``connection_made`` /
``data_received`` / ``on_response_complete`` / ``connection_lost`` and the ``cycle`` each
request gets when its headers are complete.
"""

from __future__ import annotations

import asyncio
import time

#: Seconds a client may take to send a request's headers (the ``--header-timeout`` default).
HEADER_TIMEOUT = 10.0
#: Where the protocol leaves (with ``stamp``, under ``--debug-stats``) the ``time.perf_counter()`` at
#: which the event loop handed it the bytes that completed a request's headers.
T_RECV = "stair_es.t_recv"


class CoalescingTransport:
    """The connection's transport, but a response's head goes out with the first write after it
    (its body, in the same step of the event loop): one ``send`` per answer instead of two.

    uvicorn writes the status line and headers when the app sends ``http.response.start`` and
    the body on ``http.response.body``; with ``TCP_NODELAY`` that was two system calls and two
    segments per answer (``write`` was 14 % of the event loop's CPU samples at 150 searches/s).
    The head is held until the next write, and flushed at the loop's next step if none comes (a
    response whose body waits), or before the transport closes. Order is never changed: held
    bytes always go first. Everything else is the transport's own."""

    __slots__ = ("_transport", "_loop", "_held")

    def __init__(self, transport, loop):
        self._transport, self._loop, self._held = transport, loop, None

    def write(self, data) -> None:
        held = self._held
        if held is not None:
            self._held = None
            return self._transport.write(held + bytes(data))
        if data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":  # a response's head: its body comes next
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return None
        return self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name):
        return getattr(self._transport, name)


def header_deadline_protocol(header_timeout: float = HEADER_TIMEOUT, base: type | None = None, *,
                             stamp: bool = False) -> type:
    """uvicorn's HTTP/1.1 protocol class (httptools if installed, else h11) with a header deadline.
    With ``stamp`` (``--debug-stats``) each request's scope state gets :data:`T_RECV`: when the
    event loop handed over the bytes that completed its headers, before uvicorn parsed them and
    before the app's task was scheduled (what a shed answer waits for beyond the app)."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base  # noqa: N813

    class HeaderDeadline(base):  # type: ignore[misc, valid-type]
        _header_timer: asyncio.TimerHandle | None = None
        _armed_cycle = None

        def _arm(self) -> None:
            self._disarm()
            self._armed_cycle = self.cycle
            self._header_timer = self.loop.call_later(header_timeout, self._header_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_late(self) -> None:
            self._header_timer = None
            idle = self.cycle is None or self.cycle.response_complete  # not while a request is being answered
            if self.cycle is self._armed_cycle and idle and not self.transport.is_closing():
                self.transport.close()  # no complete header since the deadline was armed

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(CoalescingTransport(transport, self.loop))
            self._arm()

        def data_received(self, data: bytes) -> None:
            if stamp:
                t, before = time.perf_counter(), self.cycle
            super().data_received(data)
            if stamp and self.cycle is not None and self.cycle is not before:
                state = self.cycle.scope.get("state")
                if state is None:
                    state = self.cycle.scope["state"] = {}
                state[T_RECV] = t  # read by the gates (and the app's task has not run yet)
            if self._header_timer is not None and self.cycle is not self._armed_cycle:
                self._disarm()  # a request's headers are complete: the body has its own deadline

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # the next request's headers (an idle connection: uvicorn closes it sooner)

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline
