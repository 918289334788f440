"""``POST /v1/search`` as plain ASGI, beside FastAPI's route: the same answer for less CPU.

A search is the request a server gets most, and on two cores the event loop's share of it
counts: through FastAPI each one went through its exception middleware, its router, the
dependency solver (which here also rebuilt parts of the route's dependency graph per
request) and a ``Response`` object: without them the event loop's CPU per search inside the
app halves (``benchmarks/serve_overhead.py``; py-spy on a live server had put about 40 % of
the app's samples there). :class:`SearchFastPath` sits
just inside :class:`~.middleware.BodyGuard`, so every gate has already run (in-flight cap,
Host, API key, queue, body size, time, UTF-8 and JSON limits), takes the parsed body,
validates it with the route's own model (:class:`~.models.SearchBody`) and runs the route's
own code (:func:`~.routes_search.search_answer`), then writes the answer itself with the
headers the route's ``Response`` has, in the same order.

Whatever it does not handle goes on to FastAPI unchanged: any other route, a body that is
not a JSON object or fails validation (FastAPI answers the documented 422/400, byte for byte
as before), and, as a guard if the app is ever assembled without the key gate, a request
whose API key the gate did not accept. The FastAPI route stays, for ``/docs`` and as that
fallback.

This module knows the search route's model and code, not the service.
"""

from __future__ import annotations

from pydantic import ValidationError

from ..errors import StairError
from .handlers import internal_error_response, stair_error_response
from .middleware import PARSED_JSON
from .models import SearchBody
from .routes_search import search_answer

_JSON = b"application/json"


class SearchFastPath:
    """Pure ASGI middleware (innermost): answers a valid ``POST /v1/search`` without FastAPI."""

    def __init__(self, app, runtime, api_key: str | None, scrub):
        self.app, self.runtime, self.api_key, self.scrub = app, runtime, api_key, scrub

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/v1/search" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        state = scope.get("state")
        data = state.get(PARSED_JSON) if state else None
        if not isinstance(data, dict) or (self.api_key and not state.get("key_ok")):
            return await self.app(scope, receive, send)
        try:
            body = SearchBody.model_validate(data, from_attributes=True)  # as FastAPI validates a body
        except ValidationError:
            return await self.app(scope, receive, send)  # FastAPI's own 422, as documented
        try:
            payload, timing = await search_answer(self.runtime, body, scope)
        except StairError as e:
            return await stair_error_response(e, self.scrub, "POST", "/v1/search")(scope, receive, send)
        except Exception:  # noqa: BLE001 - logged with its traceback, answered in the one error shape
            return await internal_error_response("POST", "/v1/search")(scope, receive, send)
        # the headers of Response(payload, media_type="application/json", headers={"Server-Timing": ...})
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"server-timing", timing.encode("latin-1")),
                                (b"content-length", str(len(payload)).encode("latin-1")),
                                (b"content-type", _JSON)]})
        await send({"type": "http.response.body", "body": payload})
