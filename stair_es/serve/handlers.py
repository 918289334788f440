"""Errors of `stair-es serve` as answers: the one JSON shape of :mod:`.errors` for every
exception, validation error and unknown route. Must not know any route."""

from __future__ import annotations

import logging
import sys

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import StairError
from .errors import error_body, retry_headers, status_of
from .middleware import ERROR_LOGGED

log = logging.getLogger("stair_es.serve")


def error_response(status: int, code: int, typ: str, message: str, headers: dict[str, str] | None = None,
                   retry_after_ms: int | None = None) -> JSONResponse:
    if retry_after_ms is not None:
        headers = {**(headers or {}), **retry_headers(retry_after_ms)}
    return JSONResponse(error_body(code, typ, message, retry_after_ms), status_code=status, headers=headers)


def stair_error_response(e: StairError, scrub, method: str, path: str) -> JSONResponse:
    """The answer to a library or serving error (its status from :func:`.errors.status_of`)."""
    status = status_of(e)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if getattr(e, "server_timing", None):
        headers = {"Server-Timing": e.server_timing}
    if status >= 500 and status not in (503, 504):
        log.warning("%s %s: %s: %s", method, path, type(e).__name__, e)
    return error_response(status, e.exit_code, type(e).__name__, scrub(str(e)), headers,
                          getattr(e, "retry_after_ms", None))


def internal_error_response(method: str, path: str) -> JSONResponse:
    """The answer to an unexpected exception (called while it is handled: its traceback is logged)."""
    log.exception("internal error on %s %s", method, path)
    e = sys.exc_info()[1]
    return error_response(500, 70, "InternalError", f"internal error: {type(e).__name__} (see the server log)")


def install_handlers(app: FastAPI, scrub) -> None:
    """Every error as the one JSON shape; ``scrub`` takes server paths out of messages."""

    @app.exception_handler(StairError)
    async def stair_error(request: Request, e: StairError):
        return stair_error_response(e, scrub, request.method, request.url.path)

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
        log.error("internal error on %s %s", request.method, request.url.path, exc_info=e)
        request.scope.setdefault("state", {})[ERROR_LOGGED] = True  # the gates, which see it re-raised, log no more
        return error_response(500, 70, "InternalError", f"internal error: {type(e).__name__} (see the server log)")
