"""Image URL fetches of `stair-es serve` (``--allow-image-urls``), kept away from the workers.

A fetch runs on its own small pool of threads (``--max-url-fetches`` at once; more wait for
a free one within their deadline), never on a model or search worker, so a slow upstream
cannot hold up text encoding or search. Each fetch has one total deadline
(``--url-timeout``) for connecting, the headers, every redirect and all the body's bytes: a
host that sends one byte a second is cut off at the deadline. Redirects are followed (at most
5), each re-checked against the same rules (http/https only). Credentials in a URL
(``http://user:pass@host/``) are sent as HTTP Basic to that host only, never forwarded on a
redirect, and never repeated in a message: :func:`public_url` is what errors show.

**A fetch cannot reach inside** (unless ``allow_private``, ``--allow-private-urls``): the
host of every hop (the URL and each redirect) is resolved once, every address it resolves to
is checked (:func:`address_rule`: loopback, private, link-local, multicast, reserved,
unspecified, shared or otherwise not globally routable, IPv4 and IPv6, with the IPv4 inside
IPv4-mapped, 6to4 and Teredo addresses checked as IPv4), and the connection goes to the
address checked, never to the name again, so DNS rebinding between the check and the connect
cannot change where it goes. Refusals are :class:`UrlRefusedError` (400), naming the rule,
never the address a name resolved to. The lookup runs on a small pool of its own within the
fetch's deadline: a resolver that hangs costs the fetch its deadline, not its slot beyond it.
Environment proxies are not used then (the proxy, not this server, would resolve the name).

This module knows urllib and asyncio, not FastAPI or any encoder.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import http.client
import ipaddress
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from ..errors import ImageError, InvalidInputError
from .errors import ServerBusyError
from .inbox import Inboxes, submit

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


class UrlRefusedError(InvalidInputError):
    """An image URL (or a redirect) leads to an address this server does not fetch from (400)."""


#: What each rule refuses, as refusals name it.
_RULES = (("is_unspecified", "an unspecified address (0.0.0.0, ::)"), ("is_loopback", "a loopback address"),
          ("is_link_local", "a link-local address (such as the 169.254.169.254 of cloud metadata services)"),
          ("is_multicast", "a multicast address"), ("is_reserved", "a reserved address"),
          ("is_private", "a private address"))


def address_rule(addr: str) -> str | None:
    """Why a fetch may not connect to ``addr`` (an IP address, IPv6 possibly with a ``%zone``),
    or None for a globally routable unicast address. IPv4 carried in an IPv6 address
    (IPv4-mapped ``::ffff:a.b.c.d``, 6to4, Teredo) is judged as that IPv4 address too."""
    try:
        ip = ipaddress.ip_address(addr.split("%", 1)[0])
    except ValueError:
        return "not an IP address"
    judged: list = []  # the IPv4 carried inside first: its rule is the one that names the target
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # a connection to ::ffff:a.b.c.d goes to a.b.c.d: judged as that alone
            ip = ip.ipv4_mapped
        else:
            if ip.sixtofour is not None:
                judged.append(ip.sixtofour)
            if ip.teredo is not None:
                judged.extend(ip.teredo)
    judged.append(ip)
    for one in judged:
        for attr, rule in _RULES:
            if getattr(one, attr):
                return rule
        if not one.is_global:  # e.g. 100.64.0.0/10, carrier-grade NAT shared space
            return "an address that is not globally routable"
    return None


def _getaddrinfo(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver; tests replace this function)."""
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def _connect(addr: str, port: int, timeout: float, source_address=None) -> socket.socket:
    """A TCP connection to an address already checked (tests replace this function)."""
    return socket.create_connection((addr, port), timeout, source_address)


_resolver_lock = threading.Lock()
_resolver: ThreadPoolExecutor | None = None
#: Lookups at once; a hung resolver holds one of these threads, never a fetch slot past its deadline.
RESOLVER_THREADS = 8


def _resolver_pool() -> ThreadPoolExecutor:
    global _resolver
    with _resolver_lock:
        if _resolver is None:
            _resolver = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="stair-es-dns")
        return _resolver


def vetted_addresses(host: str, port: int, deadline: float) -> list[str]:
    """The addresses of ``host`` a fetch may connect to, resolved once within ``deadline``
    (``time.monotonic()``); :class:`UrlRefusedError` if any of them is not public (a name that
    resolves to both is refused too: which one a client gets is the resolver's choice)."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    shown = (f"[{name}]" if ":" in name else name)[:100]
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
        addrs = [name]  # an address literal: nothing to resolve
    except ValueError:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("no time left to resolve the host") from None
        job = _resolver_pool().submit(_getaddrinfo, name, port)
        try:
            addrs = job.result(timeout=left)
        except FutureTimeout:
            if not job.cancel():  # still queued behind hung lookups: it never runs; else its outcome is nobody's
                job.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise socket.timeout("the host name was not resolved in time") from None
        except (OSError, UnicodeError) as e:
            raise ImageError(f"host {shown}: its name cannot be resolved ({type(e).__name__})") from None
    if not addrs:
        raise ImageError(f"host {shown}: its name resolves to no address")
    for addr in addrs:
        rule = address_rule(addr)
        if rule is not None:
            target = "is" if addrs == [name] else "resolves to"
            raise UrlRefusedError(f"host {shown} {target} {rule}; this server does not fetch from its own or internal "
                                  "networks (start it with --allow-private-urls on a trusted network)")
    return list(dict.fromkeys(addrs))


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
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _opener(watch: _Watch, deadline: float, allow_private: bool) -> urllib.request.OpenerDirector:
    def vetted_connection(address, timeout=socket._GLOBAL_DEFAULT_TIMEOUT, source_address=None):
        host, port = address
        if timeout is socket._GLOBAL_DEFAULT_TIMEOUT:
            timeout = None
        last: OSError | None = None
        for addr in vetted_addresses(host, port, deadline):  # checked once; connected to as checked
            try:
                return watch.add(_connect(addr, port, timeout, source_address))
            except OSError as e:
                last = e
        raise last or OSError("no address to connect to")

    def watched(cls):
        class Watched(cls):
            def __init__(self, *a, **kw):
                super().__init__(*a, **kw)
                if allow_private:
                    self._create_connection = lambda *ca, **ckw: watch.add(socket.create_connection(*ca, **ckw))
                else:
                    self._create_connection = vetted_connection
        return Watched

    conn, sconn = watched(http.client.HTTPConnection), watched(http.client.HTTPSConnection)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(sconn, req, context=self._context)

    # checked addresses only make sense for direct connections: an environment proxy would resolve the name itself
    handlers = [Http, Https, _Redirects] + ([] if allow_private else [urllib.request.ProxyHandler({})])
    return urllib.request.build_opener(*handlers)


def fetch_blocking(url: str, max_bytes: int, timeout: float, total: float | None = None, *,
                   allow_private: bool = False) -> bytes:
    """The bytes at ``url``, all within ``timeout`` seconds in total (connect, redirects, every
    read); ``total`` is the whole deadline messages name (``timeout`` is what is left of it).
    Without ``allow_private``, every hop's host must resolve to public addresses only
    (:func:`vetted_addresses`); the lookup counts against the same deadline."""
    deadline = time.monotonic() + timeout
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
        with _opener(watch, deadline, allow_private).open(req, timeout=timeout) as resp:  # noqa: S310 - scheme checked, redirects re-checked
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
    except UrlRefusedError as e:  # raised while connecting to some hop: named with the URL asked for
        raise UrlRefusedError(f"image URL {shown}: {e}") from None
    except ImageError as e:
        if str(e).startswith("host "):
            raise ImageError(f"image URL {shown}: {e}") from None
        raise
    except InvalidInputError:
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

    def __init__(self, max_fetches: int = 4, timeout: float = 10.0, max_bytes: int = 10 * 1024 * 1024, *,
                 allow_private: bool = False):
        self.max_fetches, self.timeout, self.max_bytes = max(1, int(max_fetches)), float(timeout), int(max_bytes)
        self.allow_private = bool(allow_private)
        self._slots: asyncio.Semaphore | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.max_fetches, thread_name_prefix="stair-es-url-fetch")
        self._inboxes = Inboxes()  # how the fetches' bytes reach the event loop
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
        job = loop.create_future()
        try:  # the slot is free when the thread is, not before
            submit(self._pool, self._inboxes.hand(loop), job, functools.partial(
                fetch_blocking, url, self.max_bytes, left, self.timeout, allow_private=self.allow_private),
                ended=lambda ran: self._release())
        except BaseException:
            self._release()
            raise
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
        self._inboxes.close()
