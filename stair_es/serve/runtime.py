"""What every route of `stair-es serve` shares: the :class:`Runtime` (the service, its
config, admission to the worker threads and the search batcher), the API key dependency and
the JSON helpers. One Runtime per app, kept on ``app.state.runtime``.

This module owns how CPU work reaches the worker threads; it must not know any route.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

import anyio
from fastapi import Header, Request

from ..errors import InvalidInputError
from .batching import Batcher
from .errors import ServerBusyError
from .security import AuthError, key_from_headers, key_matches
from .service import ServeConfig, Service


class Runtime:
    """The service and how work reaches it: at most ``workers`` calls at once in worker
    threads, past ``workers + max_queue`` requests in progress a refusal at once."""

    def __init__(self, config: ServeConfig, service: Service):
        self.config, self.service = config, service
        self.limiter = anyio.CapacityLimiter(max(1, config.workers))
        self.pending = 0
        self.batching = config.batches_searches(service.backend.in_process)
        self._batchers: list[Batcher] = []  # the live one, made at the first search after start

    def admit(self) -> None:
        # one count for every route: past workers + max_queue requests in progress, 503 at once
        if self.pending >= self.config.workers + self.config.max_queue:
            raise ServerBusyError(f"the server is busy ({self.pending} requests in progress); retry shortly",
                                  status=503)
        self.pending += 1

    def release(self) -> None:
        self.pending -= 1

    async def run(self, fn: Callable, *args: Any) -> Any:
        self.admit()
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self.limiter)
        finally:
            self.release()

    def batcher(self) -> Batcher:
        if not self._batchers:
            svc, config = self.service, self.config
            # the answer's JSON is made on the search thread too, not on the event loop
            self._batchers.append(Batcher(svc.prepare_searches, lambda p: dumps(svc.run_search(p)),
                                          workers=config.workers, max_batch=config.max_batch,
                                          window=config.batch_window_ms / 1000.0, name="stair-es-search"))
        return self._batchers[0]

    def close(self) -> None:
        while self._batchers:
            self._batchers.pop().close()
        self.service.close()


def runtime(request: Request) -> Runtime:
    """FastAPI dependency: the app's Runtime."""
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


async def read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"the request body is not valid JSON ({getattr(e, 'msg', e)}); send JSON") from None
