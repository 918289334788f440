"""Image URL fetches of `stair-es serve` (``--allow-image-urls``), kept away from the workers.

A fetch runs on its own small pool of threads (``--max-url-fetches`` at once; more wait for
a free one within their deadline), never on a model or search worker, so a slow upstream
cannot hold up text encoding or search. Each fetch has one total deadline
(``--url-timeout``) for connecting, the headers, every redirect and all the body's bytes: a
host that sends one byte a second is cut off at the deadline. Redirects are followed (at most
5), each re-checked against the same rules (http/https only). Credentials in a URL
(``http://user:pass@host/``) are sent as HTTP Basic to that host only, never forwarded on a
redirect, and never repeated in a message: :func:`public_url` is what errors show.

This module knows urllib and asyncio, not FastAPI or any encoder.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ..errors import ImageError, InvalidInputError
from .errors import ServerBusyError

MAX_REDIRECTS = 5


def public_url(url: str, limit: int = 100) -> str:
    """``url`` as messages may show it: no user or password, no query string (signed URLs
    carry their secrets there), no fragment; cut to ``limit`` characters."""
    try:
        p = urllib.parse.urlsplit(url)
        host = p.hostname or ""
        if p.port:
            host = f"{host}:{p.port}"
        shown = urllib.parse.urlunsplit((p.scheme, host, p.path, "", ""))
        if p.query:
            shown += "?..."
    except ValueError:
        shown = "<an invalid URL>"
    return shown[:limit]


def check_url(url: str) -> None:
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        raise InvalidInputError(f"image URL {public_url(str(url))!r}: only http:// and https:// URLs are fetched")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """Follows at most MAX_REDIRECTS redirects, each to an http(s) URL only (urllib alone would
    also follow ftp:// and answer a file:// one with a bare HTTP error)."""

    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req, fp, code, msg, headers):
        location = headers.get("location") or headers.get("uri")
        if location:
            target = urllib.parse.urljoin(req.full_url, location)
            if not target.lower().startswith(("http://", "https://")):
                raise ImageError(f"image URL {public_url(req.full_url)}: redirected to a URL that is not http(s) "
                                 f"({public_url(target, 40)}); refused")
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Watch:
    """Every socket one fetch opens (redirects included); at the deadline they are all shut
    down, so a read blocked on a host that trickles its bytes returns at once."""

    def __init__(self):
        self.socks: list[socket.socket] = []
        self.fired = False
        self._lock = threading.Lock()

    def add(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self.socks.append(sock)
            if self.fired:
                _shut(sock)
        return sock

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            for s in self.socks:
                _shut(s)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _opener(watch: _Watch) -> urllib.request.OpenerDirector:
    def watched(cls):
        class Watched(cls):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                self._create_connection = lambda *ca, **ckw: watch.add(socket.create_connection(*ca, **ckw))
        return Watched

    conn, sconn = watched(http.client.HTTPConnection), watched(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(sconn, req, context=self._context)

    return urllib.request.build_opener(Http, Https, _Redirects)


def fetch_blocking(url: str, max_bytes: int, timeout: float, total: float | None = None) -> bytes:
    """The bytes at ``url``, all within ``timeout`` seconds in total (connect, redirects, every
    read); ``total`` is the whole deadline messages name (``timeout`` is what is left of it)."""
    check_url(url)
    shown = public_url(url)
    parts = urllib.parse.urlsplit(url)
    auth = None
    if parts.username is not None or parts.password is not None:
        user = urllib.parse.unquote(parts.username or "")
        password = urllib.parse.unquote(parts.password or "")
        auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        netloc = parts.hostname or ""
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port:
            netloc += f":{parts.port}"
        url = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    req = urllib.request.Request(url, headers={"User-Agent": "stair-es-serve"})
    if auth:
        req.add_unredirected_header("Authorization", auth)  # to this host only, never along a redirect
    watch = _Watch()
    timer = threading.Timer(timeout, watch.fire)
    timer.daemon = True
    timer.start()
    late = ImageError(f"image URL {shown}: not fetched within {total or timeout:g} s (--url-timeout: connecting, redirects "
                      "and all the bytes together)")
    try:
        with _opener(watch).open(req, timeout=timeout) as resp:  # noqa: S310 - scheme checked, redirects re-checked
            length = resp.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise ImageError(f"image URL {shown}: {length} bytes, more than the {max_bytes}-byte cap")
            chunks, size = [], 0
            while True:
                chunk = resp.read1(min(65536, max_bytes + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > max_bytes:
                    raise ImageError(f"image URL {shown}: more than the {max_bytes}-byte cap")
            if watch.fired:
                raise late
            return b"".join(chunks)
    except (ImageError, InvalidInputError):
        raise
    except urllib.error.HTTPError as e:
        raise ImageError(f"image URL {shown}: the server answered HTTP {e.code}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as e:
        if watch.fired or isinstance(getattr(e, "reason", e), (socket.timeout, TimeoutError)):
            raise late from None
        reason = str(getattr(e, "reason", e)).replace(url, shown)
        raise ImageError(f"image URL {shown}: cannot fetch it ({reason[:200]})") from None
    finally:
        timer.cancel()


class UrlFetcher:
    """``await fetcher.fetch(url)``: the bytes, fetched on a pool of ``max_fetches`` threads of its
    own, within ``timeout`` seconds in total from the call (waiting for a free fetch slot included)."""

    def __init__(self, max_fetches: int = 4, timeout: float = 10.0, max_bytes: int = 10 * 1024 * 1024):
        self.max_fetches, self.timeout, self.max_bytes = max(1, int(max_fetches)), float(timeout), int(max_bytes)
        self._slots: asyncio.Semaphore | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.max_fetches, thread_name_prefix="stair-es-url-fetch")
        self.in_progress = 0

    async def fetch(self, url: str) -> bytes:
        check_url(url)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_fetches)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(self._slots.acquire(), self.timeout)
        except asyncio.TimeoutError:
            raise ServerBusyError(f"image URL {public_url(url)}: {self.max_fetches} image fetches were in progress for "
                                  f"{self.timeout:g} s (--max-url-fetches); retry later", int(self.timeout * 1000),
                                  status=503) from None
        self.in_progress += 1
        left = max(0.001, self.timeout - (time.monotonic() - t0))
        loop = asyncio.get_running_loop()

        def done(_f) -> None:
            try:
                loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop is closed
                pass

        cf = self._pool.submit(fetch_blocking, url, self.max_bytes, left, self.timeout)
        cf.add_done_callback(done)  # the slot is free when the thread is, not before
        job = asyncio.wrap_future(cf)
        try:
            return await asyncio.wait_for(asyncio.shield(job), left + 1.0)
        except asyncio.TimeoutError:  # the thread keeps its own deadline; this is a backstop (DNS)
            job.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise ImageError(f"image URL {public_url(url)}: not fetched within {self.timeout:g} s (--url-timeout)") from None

    def _release(self) -> None:
        self.in_progress -= 1
        if self._slots is not None:
            self._slots.release()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
