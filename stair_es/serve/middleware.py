"""Pure ASGI middleware of `stair-es serve`, run before any route, in this order: the cap on
requests in flight (:class:`InFlightGate`), the Host allow-list and browser security headers
(:class:`HostGuard`), the API key gate (:class:`KeyGate`), the early 429 of a full queue
(:class:`QueueFullGate`), and the request body's size, time, text and JSON checks
(:class:`BodyGuard`, which parses the body once within the per-request limits).

Each answers a refused request itself, in the one error shape of :mod:`.errors`. This module
must not know any route or the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import sys
import time
from typing import Any, Callable

from ..errors import InvalidInputError
from .admission import within
from .errors import error_body, retry_headers
from .page import busy_page
from .protocol import T_RECV
from .security import host_allowed, html_headers, key_from_headers, key_matches
from .stats import T_ENTRY

log = logging.getLogger("stair_es.serve")


async def _send_error(send, status: int, body: dict, extra: list[tuple[bytes, bytes]] = ()) -> None:
    """Answers a refused request in the one error shape (``body`` from :func:`.errors.error_body`)."""
    await _send(send, status, "application/json", json.dumps(body).encode(), extra)


async def _send(send, status: int, content_type: str, payload: bytes, extra: list[tuple[bytes, bytes]] = ()) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(payload)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": payload})


def _raw(headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """Headers as ASGI sends them."""
    return [(k.lower().encode(), v.encode()) for k, v in headers.items()]


def _retry(ms: int) -> list[tuple[bytes, bytes]]:
    return _raw(retry_headers(ms))


# --- body guard (size and time caps before any route runs) -------------------------------------
class BodyGuard:
    """Pure ASGI middleware: reads a request body whole, refusing more than ``max_bytes`` (413)
    or a client slower than ``timeout`` seconds to send it (408); then replays it to the app.
    A slow or huge client ties up only its own connection, never a worker."""

    def __init__(self, app, max_bytes: int, timeout: float, parse: Callable[[str], Any] | None = None):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout
        self.parse = parse or json.loads

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._refuse(send, 413, f"the request body is larger than {self.max_bytes} bytes; send less "
                                                 "(fewer inputs, smaller images)")
        chunks: list[bytes] = []
        size = 0

        async def read_all() -> bool:
            nonlocal size
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return False
                body = msg.get("body", b"")
                size += len(body)
                if size > self.max_bytes:
                    raise OverflowError
                chunks.append(body)
                if not msg.get("more_body", False):
                    return True

        try:
            complete = await within(read_all(), self.timeout)
        except OverflowError:
            return await self._refuse(send, 413, f"the request body is larger than {self.max_bytes} bytes; send less")
        except asyncio.TimeoutError:
            return await self._refuse(send, 408, f"the request body did not arrive within {self.timeout:g} s; "
                                                 "send it faster or in a smaller request")
        if not complete:
            return
        body = b"".join(chunks)
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if body and (not ctype or ctype == b"application/json" or ctype.endswith(b"+json")):
            # parsed once, here, within the per-request limits (jsonbody); the routes take it from the scope
            bad, data = self.parsed(body)
            if bad:
                return await self._refuse(send, 400, bad)
            scope.setdefault("state", {})[PARSED_JSON] = data
        elif body:
            try:  # not JSON to the routes (they answer 422), but never text that is not UTF-8
                body.decode("utf-8")
            except UnicodeDecodeError as e:
                return await self._refuse(send, 400, f"the request body is not valid UTF-8 (byte 0x{body[e.start]:02x} at "
                                                     f"offset {e.start}); send JSON encoded as UTF-8")
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def parsed(self, body: bytes) -> tuple[str | None, Any]:
        """(the refusal, None) or (None, the body as JSON): not UTF-8, not JSON, past a
        per-request limit, or text holding a lone surrogate (naming its field) are refused."""
        try:
            text, utf8, where = body.decode("utf-8"), True, ""
        except UnicodeDecodeError as e:
            text, utf8, where = body.decode("utf-8", "surrogateescape"), False, f"byte 0x{body[e.start]:02x} at offset {e.start}"
        try:
            data = self.parse(text)
        except InvalidInputError as e:  # a per-request limit, met while parsing: nothing past it was built
            return str(e), None
        except ValueError as e:
            if not utf8:
                return f"the request body is not valid UTF-8 ({where}); send JSON encoded as UTF-8", None
            return f"the request body is not valid JSON ({getattr(e, 'msg', e)}); send a JSON object", None
        if utf8 and not _SURROGATE_ESCAPE.search(body):
            return None, data
        field = _bad_field(data)
        if field is not None:
            return (f"{field}: the text holds a lone surrogate (such as \\ud800) or bytes that are not UTF-8; "
                    "send valid Unicode text"), None
        if not utf8:
            return f"the request body is not valid UTF-8 ({where}); send JSON encoded as UTF-8", None
        return None, data

    async def _refuse(self, send, status: int, message: str) -> None:
        await _send_error(send, status, error_body(2, "InvalidInputError", message), [(b"connection", b"close")])


#: Where :class:`BodyGuard` leaves the parsed JSON body for the routes (:class:`~.runtime.ParsedJSONRoute`).
PARSED_JSON = "stair_es.json_body"

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _bad_field(data: Any) -> str | None:
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            items = list(value.items())
            for k, v in reversed(items):
                key_path = k if path == "body" else f"{path}.{k}"
                if _SURROGATE.search(k):
                    return f"{path} (a key)" if path != "body" else "a field name"
                stack.append((key_path, v))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", value[i]) for i in reversed(range(len(value))))
    return None


#: Seconds a client is told to wait (``Retry-After``) after a 503 or 429.
RETRY_AFTER_S = b"1"


class HostGuard:
    """Pure ASGI middleware: a request whose ``Host`` is not one the server answers to gets 400
    (a web page that rebinds its DNS name to 127.0.0.1 cannot read this server from a user's
    browser); HTML answers get the browser security headers (CSP, nosniff, no referrer, no framing);
    503 and 429 answers get ``Retry-After``."""

    def __init__(self, app, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = next((v for k, v in scope.get("headers") or [] if k == b"host"), None)
        host_s = host.decode("latin-1") if host is not None else None
        if not host_allowed(host_s, self.allowed):
            return await _send_error(send, 400, error_body(2, "InvalidInputError", (
                f"Host {host_s[:100]!r} is not a name this server answers to; reach it by an allowed name, or "
                "start it with --allowed-host NAME")))
        start: dict | None = None
        chunks: list[bytes] = []

        async def send_wrapped(msg):
            nonlocal start
            if msg["type"] == "http.response.start" and msg["status"] in (429, 503):
                # a shed or not-ready answer says when to come back (RFC 9110: seconds)
                hs = list(msg.get("headers") or [])
                if not any(k.lower() == b"retry-after" for k, _ in hs):
                    msg = {**msg, "headers": hs + [(b"retry-after", RETRY_AFTER_S)]}
            if msg["type"] == "http.response.start":
                ctype = next((v for k, v in msg.get("headers") or [] if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    start = msg  # held until the body is known (the CSP names its inline scripts' hashes)
                    return None
                return await send(msg)
            if start is not None and msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))
                if msg.get("more_body", False):
                    return None
                html = b"".join(chunks)
                extra = html_headers(html)
                headers = [(k, v) for k, v in start.get("headers") or [] if k.decode("latin-1").title() not in extra]
                headers += _raw(extra)
                await send({**start, "headers": headers})
                start = None
                return await send({"type": "http.response.body", "body": html, "more_body": False})
            return await send(msg)

        await self.app(scope, receive, send_wrapped)


#: Open to everyone even when an API key is set (probes); the docs too with --public-docs.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
DOCS_ASSETS = "/static-offline-docs/"


class KeyGate:
    """Pure ASGI middleware: with an API key set, every path but ``/healthz`` and ``/readyz``
    (and the OpenAPI pages with ``public_docs``) needs the key, checked before the body is read.
    ``/readyz`` is let through and says only ready or not to a caller without the key."""

    def __init__(self, app, api_key: str | None, public_docs: bool):
        self.app, self.api_key, self.public_docs = app, api_key, public_docs

    def _public(self, path: str) -> bool:
        return path in PUBLIC_PATHS or (self.public_docs and (path in DOCS_PATHS or path.startswith(DOCS_ASSETS)))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.api_key:
            return await self.app(scope, receive, send)
        headers = {k: v.decode("latin-1") for k, v in scope.get("headers") or []}
        given = key_from_headers(headers.get(b"authorization"), headers.get(b"x-api-key"))
        scope.setdefault("state", {})["key_ok"] = ok = key_matches(self.api_key, given)
        if ok or self._public(scope.get("path", "")):
            return await self.app(scope, receive, send)
        message = ("this server requires an API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
                   if given is None else "wrong API key")
        await _send_error(send, 401, error_body(2, "AuthError", message), [(b"www-authenticate", b"Bearer")])


class InFlightGate:
    """Pure ASGI middleware, outermost: at most ``limit`` HTTP requests in the app at once, on
    any route but ``/healthz``; beyond, 429 at once with ``Retry-After`` (seconds) and
    ``Retry-After-Ms``. It replaces uvicorn's ``limit_concurrency``, whose 503 says neither
    when to come back nor anything in JSON."""

    def __init__(self, app, limit: int, retry_after_ms: Callable[[], int], stats=None):
        self.app, self.limit, self.retry_after_ms = app, max(1, int(limit)), retry_after_ms
        self.in_flight = 0
        self.stats = stats  # a .stats.ServeStats with --debug-stats: each request's phases are kept

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") == "/healthz":
            return await self.app(scope, receive, send)
        t_entry = time.perf_counter()
        scope.setdefault("state", {})[T_ENTRY] = t_entry  # the routes' Server-Timing counts from here
        if self.stats is not None:
            return await self._observed(scope, receive, send, t_entry)
        return await self._gate(scope, receive, send)

    async def _observed(self, scope, receive, send, t_entry: float) -> None:
        status = 0

        async def send_seen(msg):
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            await self._gate(scope, receive, send_seen)
        finally:
            self.stats.request_done(scope["state"], status, t_entry)

    async def _gate(self, scope, receive, send):
        if self.in_flight >= self.limit:
            ms = self.retry_after_ms()
            return await _send_error(send, 429, error_body(5, "ServerBusyError", (
                f"the server is busy: {self.in_flight} requests in progress, the most it holds; retry after {ms} ms"),
                ms), _retry(ms))
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        except Exception:  # noqa: BLE001 - the gates run in front of FastAPI's error layer: answered here
            await _internal_error(scope, send)
        finally:
            self.in_flight -= 1


#: Set in a request's scope state by the error handler that logged its exception (:mod:`.handlers`).
ERROR_LOGGED = "stair_es.error_logged"


async def _internal_error(scope, send) -> None:
    """An exception escaped the app: logged once with its traceback (not again when FastAPI's
    error layer logged it, answered and re-raised it), and answered 500 in the one error shape
    unless an answer had already started."""
    if not (scope.get("state") or {}).get(ERROR_LOGGED):
        log.error("internal error on %s %s", scope.get("method"), scope.get("path"), exc_info=True)
    body = error_body(70, "InternalError", f"internal error: {sys.exc_info()[0].__name__} (see the server log)")
    with contextlib.suppress(Exception):  # the answer had started: the client gets what was sent
        await _send_error(send, 500, body)


class QueueFullGate:
    """Pure ASGI middleware, after the Host and key checks and before the body is read: when the
    admission queue is already full, a request for work (``/v1/...`` and the page) gets its 429
    at once, without its body being read, parsed or validated, so shedding stays cheap while the
    workers are saturated. (The route's own admission check still decides the close cases.)"""

    def __init__(self, app, admission, batched_search: bool = False, stamp: bool = False):
        self.app, self.admission = app, admission
        self.batched_search = batched_search  # /v1/search waits in the batcher's queue: its kind is "search"
        self.stamp = stamp  # --debug-stats: a shed answer tells when its bytes reached the loop and when it left

    def _stamps(self, scope) -> list[tuple[bytes, bytes]]:
        """``Server-Timing: shed;desc="T_RECV T_SEND"`` (``time.perf_counter()``, CLOCK_MONOTONIC on
        Linux, the same clock in every process of the machine): with the client's own send and
        receive times it splits a shed answer's time into reaching the server's event loop, inside
        the server, and coming back (benchmarks/serve_load.py prints the three)."""
        t_recv = (scope.get("state") or {}).get(T_RECV)
        if not self.stamp or t_recv is None:
            return []
        return [(b"server-timing", f'shed;desc="{t_recv:.6f} {time.perf_counter():.6f}"'.encode())]

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path.startswith("/v1/") or path == "/":
                kind = ("search" if self.batched_search and path == "/v1/search"
                        else "media" if path.startswith(("/v1/thumbnail/", "/v1/heatmap/")) else "pool")
                if self.admission.full(kind):
                    ms = self.admission.retry_after_ms()
                    self.admission.shed += 1
                    if path == "/":  # a browser: a page that says so and reloads itself, not the API's JSON
                        page = busy_page(self.admission.busy_message(kind), ms)
                        return await _send(send, 429, "text/html; charset=utf-8", page,
                                           _retry(ms) + self._stamps(scope) + _raw(html_headers(page)))
                    return await _send_error(send, 429, error_body(5, "ServerBusyError",
                                                                   self.admission.busy_message(kind), ms),
                                             _retry(ms) + self._stamps(scope))
        return await self.app(scope, receive, send)
