"""The results page at ``/`` (rendered on the server; see :mod:`.page`) and its static files."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from .errors import ServerBusyError, retry_headers
from .page import busy_page, render_page
from .runtime import ParsedJSONRoute, Runtime, require_key, runtime

router = APIRouter(route_class=ParsedJSONRoute, dependencies=[Depends(require_key)], include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
async def page(request: Request, rt: Runtime = Depends(runtime)):
    try:
        return HTMLResponse(await rt.run(render_page, rt.service, dict(request.query_params),
                                         request.query_params.getlist("where")))
    except ServerBusyError as e:  # a browser gets a page that reloads itself, not the API's JSON
        return HTMLResponse(busy_page(str(e), e.retry_after_ms), status_code=e.status,
                            headers=retry_headers(e.retry_after_ms))
