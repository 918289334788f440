"""The one error shape of `stair-es serve` and the HTTP status of every error class.

``{"error": {"code": <the CLI's exit code>, "type": <error class>, "message": <one line>}}``,
plus ``retry_after_ms`` on answers that say when to come back (429, 503, 504). This module
owns the table of statuses (docs/serve.md has the same table) and the exception handlers;
it must not know any route.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import (BackendError, DocumentNotFoundError, EncoderVersionError, ImageError, IndexExistsError,
                      IndexLockedError, IndexNotFoundError, InvalidInputError, MissingDependencyError, ModelError,
                      StairError)
from .security import AuthError, PathNotAllowedError
from .service import ThumbnailUnavailable

log = logging.getLogger("stair_es.serve")

#: The header with the exact delay in milliseconds (``Retry-After`` itself is whole seconds, RFC 9110).
RETRY_AFTER_MS_HEADER = "Retry-After-Ms"


class ServerBusyError(StairError):
    """More requests wait than the queue holds (429), or a resource the request needs is full (503)."""

    exit_code = 5

    def __init__(self, message: str, retry_after_ms: int = 1000, status: int = 429):
        super().__init__(message)
        self.retry_after_ms, self.status = max(1, int(retry_after_ms)), status


class RequestTimeoutError(StairError):
    """The request did not finish within ``--request-timeout`` (504); its queued work was dropped."""

    exit_code = 5

    def __init__(self, message: str, retry_after_ms: int = 1000):
        super().__init__(message)
        self.retry_after_ms = max(1, int(retry_after_ms))


_STATUS: list[tuple[type, int]] = [
    (AuthError, 401), (PathNotAllowedError, 403), (ImageError, 422), (EncoderVersionError, 409),
    (InvalidInputError, 400), (IndexNotFoundError, 404), (DocumentNotFoundError, 404), (ThumbnailUnavailable, 404),
    (IndexExistsError, 409), (IndexLockedError, 409), (MissingDependencyError, 501), (BackendError, 502),
    (ModelError, 500), (RequestTimeoutError, 504),
]


def status_of(e: StairError) -> int:
    if isinstance(e, ServerBusyError):
        return e.status
    for cls, status in _STATUS:
        if isinstance(e, cls):
            return status
    return 500


def retry_headers(retry_after_ms: int) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1, as HTTP wants) and the exact delay in ms."""
    return {"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000))), RETRY_AFTER_MS_HEADER: str(int(retry_after_ms))}


def error_body(code: int, typ: str, message: str, retry_after_ms: int | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "type": typ, "message": message}
    if retry_after_ms is not None:
        err["retry_after_ms"] = int(retry_after_ms)
    return {"error": err}


def error_response(status: int, code: int, typ: str, message: str, headers: dict[str, str] | None = None,
                   retry_after_ms: int | None = None) -> JSONResponse:
    if retry_after_ms is not None:
        headers = {**(headers or {}), **retry_headers(retry_after_ms)}
    return JSONResponse(error_body(code, typ, message, retry_after_ms), status_code=status, headers=headers)


def install_handlers(app: FastAPI, scrub) -> None:
    """Every error as the one JSON shape; ``scrub`` takes server paths out of messages."""

    @app.exception_handler(StairError)
    async def stair_error(request: Request, e: StairError):
        status = status_of(e)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status >= 500 and status not in (503, 504):
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return error_response(status, e.exit_code, type(e).__name__, scrub(str(e)), headers,
                              getattr(e, "retry_after_ms", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            ctx = first.get("ctx") or {}
            return error_response(400, 2, "InvalidInputError",
                                  f"the request body is not valid JSON ({ctx.get('error', 'malformed')}); send a JSON object")
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "body"
        more = f" (and {len(errs) - 1} more problems)" if len(errs) > 1 else ""
        return error_response(422, 2, "InvalidInputError", f"{where}: {first.get('msg', 'invalid value')}{more}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        path = request.url.path[:200]
        if e.status_code == 404:  # the documented code of every 404 (as an unknown index or document)
            return error_response(404, 4, "NotFoundError", f"no such endpoint {path}; see /docs")
        msg = {405: f"method {request.method} is not allowed on {path}; see /docs"}.get(e.status_code, str(e.detail))
        return error_response(e.status_code, 2, "InvalidInputError", msg)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, 70, "InternalError", f"internal error: {type(e).__name__} (see the server log)")
