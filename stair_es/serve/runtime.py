"""What every route of `stair-es serve` shares: the :class:`Runtime` (the service, its
config, admission to the worker threads and the search batcher), the API key dependency and
the JSON helpers. One Runtime per app, kept on ``app.state.runtime``.

This module owns how CPU work reaches the worker threads; it must not know any route.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from fastapi import Header, Request
from fastapi.routing import APIRoute

from ..errors import InvalidInputError
from .admission import Admission, lower_thread_priority, within
from .batching import Batcher, Timing
from .fetch import UrlFetcher
from .jsonbody import caps_of, parse_capped
from .middleware import PARSED_JSON
from .security import AuthError, key_from_headers, key_matches
from .service import ServeConfig, Service
from .stats import ServeStats


class Runtime:
    """The service and how work reaches it (:class:`~.admission.Admission`): at most
    ``workers`` calls at once on worker threads, ``max_queue`` more waiting first come first
    served, 429 beyond, 504 past ``request_timeout``. ``/v1/search`` with batching on waits in
    the batcher's own first-come-first-served queue, counted by the same admission. Image
    URLs are fetched by the :class:`~.fetch.UrlFetcher`, before the work reaches a worker."""

    def __init__(self, config: ServeConfig, service: Service):
        self.config, self.service = config, service
        self.admission = Admission(config.workers, config.max_queue, config.request_timeout,
                                   worker_nice=config.worker_nice, max_wait_ms=config.max_queue_ms,
                                   queue_timeout_ms=config.queue_timeout_ms)
        self.fetcher = UrlFetcher(config.max_url_fetches, config.url_timeout, config.max_image_bytes,
                                  allow_private=config.allow_private_urls)
        self.batching = config.batches_searches(service.backend.in_process)
        self._batchers: list[Batcher] = []  # the live one, made at the first search after start
        self._aside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stair-es-aside")
        self.stats = ServeStats() if config.debug_stats else None

    async def run(self, fn: Callable, *args: Any, kind: str = "pool") -> Any:
        """A request's work: admitted, queued first come first served, under --request-timeout
        (``kind="media"``: a thumbnail or heatmap, with a queue timeout of its own)."""
        return await self.admission.run(fn, *args, kind=kind)

    async def run_aside(self, fn: Callable, *args: Any) -> Any:
        """Work that must not wait behind requests nor be cut by their deadline: the warm-up at
        start (loading a model may take minutes) and the readiness probe (cheap, and a probe
        queued behind a minute of searches would call a busy server dead). One thread of its own."""
        return await asyncio.get_running_loop().run_in_executor(self._aside, functools.partial(fn, *args))

    async def search_batched(self, body: dict[str, Any]) -> tuple[bytes, Timing, tuple[float, float, float, float]]:
        """The JSON answer of one search, its :class:`~.batching.Timing` and its search's own
        (engine wall, engine CPU, answer wall, answer CPU) in seconds."""
        adm = self.admission
        adm.enter("search")
        try:
            t0 = time.monotonic()
            submitted = self.batcher().submit(body)
            if adm.request_timeout is None:
                (payload, detail), t = await submitted
            else:
                try:
                    (payload, detail), t = await within(submitted, adm.request_timeout)
                except asyncio.TimeoutError:  # the batcher drops it if it has not started
                    raise adm.timeout(time.monotonic() - t0, started=None) from None
            adm.observe(t.run + t.prepare / max(1, t.size), "search", t.cpu_wait)
            return payload, t, detail
        finally:
            adm.leave()

    async def fetch_images(self, refs: list[Any], labels: list[str] | None = None) -> None:
        """Fetches the image URLs among ``refs`` (image reference dicts) now, on the fetch pool,
        before the work reaches a worker; each ref gets the bytes under ``fetched`` (which
        :func:`~.inputs.open_image` reads). ``labels`` name the refs in errors (``input 2``)."""
        todo = [(n, r) for n, r in enumerate(refs) if isinstance(r, dict) and r.get("url") and "fetched" not in r]
        if not todo:
            return
        if not self.config.allow_image_urls:
            raise InvalidInputError("image URLs are refused by this server; send the image as base64, name a file under "
                                    "an image root, or start the server with --allow-image-urls")
        results = await asyncio.gather(*(self.fetcher.fetch(r["url"]) for _, r in todo), return_exceptions=True)
        for (n, r), res in zip(todo, results):
            if isinstance(res, InvalidInputError) and labels:  # ImageError too: name the input, as encoding does
                raise type(res)(f"{labels[n]}: {res}") from None
            if isinstance(res, BaseException):
                raise res
            r["fetched"] = res

    def batcher(self) -> Batcher:
        if not self._batchers:
            svc, config = self.service, self.config
            # the answer's JSON is made on the search thread too, not on the event loop
            self._batchers.append(Batcher(svc.prepare_searches, functools.partial(svc.run_search_json, dumps=dumps),
                                          workers=config.workers, max_batch=config.max_batch,
                                          window=config.batch_window_ms / 1000.0, name="stair-es-search",
                                          thread_init=functools.partial(lower_thread_priority, config.worker_nice),
                                          max_wait=functools.partial(self.admission.overdue_after_s, "search"),
                                          overdue=functools.partial(self.admission.overdue_error, kind="search")))
        return self._batchers[0]

    def close(self) -> None:
        while self._batchers:
            self._batchers.pop().close()
        self.admission.close()
        self.fetcher.close()
        self._aside.shutdown(wait=False, cancel_futures=True)
        self.service.close()


async def runtime(request: Request) -> Runtime:
    """FastAPI dependency: the app's Runtime. ``async`` on purpose: FastAPI runs a plain ``def``
    dependency on its thread pool, a hand-over to another thread and back (the GIL twice)
    for every request, which on a loaded machine cost milliseconds of the event loop's time."""
    return request.app.state.runtime


async def require_key(request: Request, authorization: str | None = Header(None, include_in_schema=False),
                      x_api_key: str | None = Header(None, include_in_schema=False)) -> None:
    """FastAPI dependency: the API key, when the server has one (the KeyGate middleware checks
    it first, before the body is read; this keeps a route safe if it is mounted without it)."""
    expected = request.app.state.config.api_key
    if not expected:
        return
    given = key_from_headers(authorization, x_api_key)
    if given is None:
        raise AuthError("this server requires an API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'")
    if not key_matches(expected, given):
        raise AuthError("wrong API key")


def dumps(data: Any) -> bytes:
    """JSON as FastAPI's JSONResponse writes it, without its per-value jsonable_encoder walk
    (the service hands over plain dicts, lists, strings and numbers)."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class ParsedJSONRequest(Request):
    """A request whose ``json()`` is the body :class:`~.middleware.BodyGuard` already parsed
    within the per-request limits, or (a body it left alone) parsed here within them."""

    async def json(self) -> Any:
        state = self.scope.get("state") or {}
        if PARSED_JSON in state:
            return state[PARSED_JSON]
        if not hasattr(self, "_json"):
            raw = await self.body()
            caps, other = caps_of(self.app.state.config)
            self._json = parse_capped(raw.decode("utf-8"), caps, other)
        return self._json


class ParsedJSONRoute(APIRoute):
    """The route class of every router: its JSON body is never parsed past the limits."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def route(request: Request):
            return await handler(ParsedJSONRequest(request.scope, request.receive))

        return route


async def read_json(request: Request) -> Any:
    try:
        return await request.json()
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"the request body is not valid JSON ({getattr(e, 'msg', e)}); send JSON") from None
