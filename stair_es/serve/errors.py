"""The one error shape of `stair-es serve` and the HTTP status of every error class.

``{"error": {"code": <the CLI's exit code>, "type": <error class>, "message": <one line>}}``,
plus ``retry_after_ms`` on answers that say when to come back (429, 503, 504). This module
owns the errors of serving and the table of statuses (docs/serve.md has the same table);
:mod:`.handlers` turns them into answers. It must not know FastAPI.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import (BackendError, DocumentNotFoundError, EncoderVersionError, ImageError, IndexExistsError,
                      IndexLockedError, IndexNotFoundError, InvalidInputError, MissingDependencyError, ModelError,
                      StairError)
from .security import AuthError, PathNotAllowedError

#: The header with the exact delay in milliseconds (``Retry-After`` itself is whole seconds, RFC 9110).
RETRY_AFTER_MS_HEADER = "Retry-After-Ms"


class ThumbnailUnavailable(StairError):
    """A document has no image under the server's image roots."""

    exit_code = 4


class ServerBusyError(StairError):
    """More requests wait than the queue holds (429), or a resource the request needs is full (503)."""

    exit_code = 5

    def __init__(self, message: str, retry_after_ms: int = 1000, status: int = 429, server_timing: str | None = None):
        super().__init__(message)
        self.retry_after_ms, self.status = max(1, int(retry_after_ms)), status
        self.server_timing = server_timing  # a ``Server-Timing`` value (the queue wait of one shed from the queue)


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
    return next((status for cls, status in _STATUS if isinstance(e, cls)), 500)


def retry_headers(retry_after_ms: int) -> dict[str, str]:
    """``Retry-After`` in whole seconds (at least 1, as HTTP wants) and the exact delay in ms."""
    return {"Retry-After": str(max(1, math.ceil(retry_after_ms / 1000))), RETRY_AFTER_MS_HEADER: str(int(retry_after_ms))}


def error_body(code: int, typ: str, message: str, retry_after_ms: int | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "type": typ, "message": message}
    if retry_after_ms is not None:
        err["retry_after_ms"] = int(retry_after_ms)
    return {"error": err}
