"""Routes ``/healthz`` and ``/readyz``: the probes, public even when an API key is set."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from ..errors import StairError
from .handlers import error_response
from .runtime import ParsedJSONRoute, Runtime, runtime

router = APIRouter(route_class=ParsedJSONRoute, tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process answers (no model or backend is touched)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, rt: Runtime = Depends(runtime)):
    """The encoder is loaded and the backend answers; 503 with the reason otherwise. With an
    API key set, a caller without it learns only ready or not (no settings, no reason)."""
    told = not rt.config.api_key or request.scope.get("state", {}).get("key_ok", False)
    try:
        info = await rt.run_aside(rt.service.ready)  # never queued behind searches
    except StairError as e:
        reason = f"not ready: {rt.service.scrub(str(e))}" if told else "not ready"
        return error_response(503, e.exit_code, type(e).__name__ if told else "NotReady", reason)
    return info if told else {"status": "ready"}
