"""The FastAPI application of `stair-es serve`: routes, request models, errors as JSON.

:func:`create_app` builds one app around one :class:`~.service.Service`. The request and
response models are the contract (OpenAPI at ``/docs``). Errors keep the CLI's meaning:
``{"error": {"code": <the CLI's exit code>, "type": <error class>, "message": <the CLI's
one-line message>}}`` with an HTTP status that fits. CPU work (encoding, searching) runs in
a bounded pool of worker threads, or, for ``/v1/search`` with batching on, through the
first-come-first-served queue of :mod:`.batching`; past ``workers + max_queue`` requests in
progress the server answers 503 at once instead of queueing without end. Request bodies are read whole by
:class:`BodyGuard` before any route runs, capped in size and in time.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Callable, Literal

import anyio
from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import (BackendError, DocumentNotFoundError, EncoderVersionError, ImageError, IndexExistsError,
                      IndexLockedError, IndexNotFoundError, InvalidInputError, MissingDependencyError, ModelError,
                      StairError)
from .batching import Batcher
from .security import (HTML_HEADERS, AuthError, PathNotAllowedError, content_security_policy, host_allowed, host_names,
                       key_from_headers, key_matches)
from .service import ServeConfig, Service, ThumbnailUnavailable

log = logging.getLogger("stair_es.serve")


# --- errors ------------------------------------------------------------------------------------
class ServerBusyError(StairError):
    exit_code = 5


_STATUS: list[tuple[type, int]] = [
    (AuthError, 401), (PathNotAllowedError, 403), (ImageError, 422), (EncoderVersionError, 409),
    (InvalidInputError, 400), (IndexNotFoundError, 404), (DocumentNotFoundError, 404), (ThumbnailUnavailable, 404),
    (IndexExistsError, 409), (IndexLockedError, 409), (MissingDependencyError, 501), (BackendError, 502),
    (ModelError, 500), (ServerBusyError, 503),
]


def status_of(e: StairError) -> int:
    for cls, status in _STATUS:
        if isinstance(e, cls):
            return status
    return 500


def error_body(code: int, typ: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "type": typ, "message": message}}


def error_response(status: int, code: int, typ: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(code, typ, message), status_code=status, headers=headers)


# --- body guard (size and time caps before any route runs) -------------------------------------
class BodyGuard:
    """Pure ASGI middleware: reads a request body whole, refusing more than ``max_bytes`` (413)
    or a client slower than ``timeout`` seconds to send it (408); then replays it to the app.
    A slow or huge client ties up only its own connection, never a worker."""

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            return await self._refuse(send, 413, f"the request body is larger than {self.max_bytes} bytes; send less "
                                                 "(fewer inputs, smaller images)")
        chunks: list[bytes] = []
        size = 0

        async def read_all() -> bool:
            nonlocal size
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return False
                body = msg.get("body", b"")
                size += len(body)
                if size > self.max_bytes:
                    raise OverflowError
                chunks.append(body)
                if not msg.get("more_body", False):
                    return True

        try:
            complete = await asyncio.wait_for(read_all(), self.timeout)
        except OverflowError:
            return await self._refuse(send, 413, f"the request body is larger than {self.max_bytes} bytes; send less")
        except asyncio.TimeoutError:
            return await self._refuse(send, 408, f"the request body did not arrive within {self.timeout:g} s; "
                                                 "send it faster or in a smaller request")
        if not complete:
            return
        body = b"".join(chunks)
        bad = bad_text(body)
        if bad:
            return await self._refuse(send, 400, bad)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send, status: int, message: str) -> None:
        payload = json.dumps(error_body(2, "InvalidInputError", message)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def bad_text(body: bytes) -> str | None:
    """The message for a body whose text is not valid Unicode (a lone surrogate such as
    ``"\\ud800"``, or bytes that are not UTF-8), naming the first field that holds it; None if
    the text is fine. Valid UTF-8 without a surrogate escape is let through without parsing."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        utf8 = False
        where = f"byte 0x{body[e.start]:02x} at offset {e.start}"
    else:
        utf8 = True
        if not _SURROGATE_ESCAPE.search(body):
            return None
    try:
        data = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        if utf8:
            return None  # not JSON: the route's own parser says so
        return f"the request body is not valid UTF-8 ({where}); send JSON encoded as UTF-8"
    field = _bad_field(data)
    if field is None:
        return None if utf8 else f"the request body is not valid UTF-8 ({where}); send JSON encoded as UTF-8"
    return (f"{field}: the text holds a lone surrogate (such as \\ud800) or bytes that are not UTF-8; "
            "send valid Unicode text")


def _bad_field(data: Any) -> str | None:
    stack: list[tuple[str, Any]] = [("body", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            items = list(value.items())
            for k, v in reversed(items):
                key_path = k if path == "body" else f"{path}.{k}"
                if _SURROGATE.search(k):
                    return f"{path} (a key)" if path != "body" else "a field name"
                stack.append((key_path, v))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{path}[{i}]", value[i]))
    return None


#: Seconds a client is told to wait (``Retry-After``) after a 503 or 429.
RETRY_AFTER_S = b"1"


class HostGuard:
    """Pure ASGI middleware: a request whose ``Host`` is not one the server answers to gets 400
    (a web page that rebinds its DNS name to 127.0.0.1 cannot read this server from a user's
    browser); HTML answers get the browser security headers (CSP, nosniff, no referrer, no framing);
    503 and 429 answers get ``Retry-After``."""

    def __init__(self, app, allowed: frozenset[str] | None):
        self.app, self.allowed = app, allowed

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        host = next((v for k, v in scope.get("headers") or [] if k == b"host"), None)
        host_s = host.decode("latin-1") if host is not None else None
        if not host_allowed(host_s, self.allowed):
            payload = json.dumps(error_body(2, "InvalidInputError", (
                f"Host {host_s[:100]!r} is not a name this server answers to; reach it by an allowed name, or "
                "start it with --allowed-host NAME"))).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            return await send({"type": "http.response.body", "body": payload})
        start: dict | None = None
        chunks: list[bytes] = []

        async def send_wrapped(msg):
            nonlocal start
            if msg["type"] == "http.response.start" and msg["status"] in (429, 503):
                # a shed or not-ready answer says when to come back (RFC 9110: seconds)
                hs = list(msg.get("headers") or [])
                if not any(k.lower() == b"retry-after" for k, _ in hs):
                    msg = {**msg, "headers": hs + [(b"retry-after", RETRY_AFTER_S)]}
            if msg["type"] == "http.response.start":
                ctype = next((v for k, v in msg.get("headers") or [] if k.lower() == b"content-type"), b"")
                if ctype.startswith(b"text/html"):
                    start = msg  # held until the body is known (the CSP names its inline scripts' hashes)
                    return None
                return await send(msg)
            if start is not None and msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))
                if msg.get("more_body", False):
                    return None
                html = b"".join(chunks)
                extra = {"Content-Security-Policy": content_security_policy(html), **HTML_HEADERS}
                headers = [(k, v) for k, v in start.get("headers") or [] if k.decode("latin-1").title() not in extra]
                headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
                await send({**start, "headers": headers})
                start = None
                return await send({"type": "http.response.body", "body": html, "more_body": False})
            return await send(msg)

        await self.app(scope, receive, send_wrapped)


#: Open to everyone even when an API key is set (probes); the docs too with --public-docs.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
DOCS_ASSETS = "/static-offline-docs/"


class KeyGate:
    """Pure ASGI middleware: with an API key set, every path but ``/healthz`` and ``/readyz``
    (and the OpenAPI pages with ``public_docs``) needs the key, checked before the body is read.
    ``/readyz`` is let through and says only ready or not to a caller without the key."""

    def __init__(self, app, api_key: str | None, public_docs: bool):
        self.app, self.api_key, self.public_docs = app, api_key, public_docs

    def _public(self, path: str) -> bool:
        return path in PUBLIC_PATHS or (self.public_docs and (path in DOCS_PATHS or path.startswith(DOCS_ASSETS)))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.api_key:
            return await self.app(scope, receive, send)
        headers = {k: v.decode("latin-1") for k, v in scope.get("headers") or []}
        given = key_from_headers(headers.get(b"authorization"), headers.get(b"x-api-key"))
        scope.setdefault("state", {})["key_ok"] = ok = key_matches(self.api_key, given)
        if ok or self._public(scope.get("path", "")):
            return await self.app(scope, receive, send)
        message = ("this server requires an API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
                   if given is None else "wrong API key")
        payload = json.dumps(error_body(2, "AuthError", message)).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": payload})


# --- request models (the OpenAPI contract) -----------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageRef(_Strict):
    """Exactly one of: a path relative to an image root, base64 bytes (or a data: URI), an http(s) URL
    (only if the server allows URLs)."""

    path: str | None = Field(None, max_length=4096)
    base64: str | None = None
    url: str | None = Field(None, max_length=4096)


class EncodeInput(_Strict):
    text: str | None = None
    image: ImageRef | None = None


class EncodeRequest(_Strict):
    inputs: list[EncodeInput] = Field(..., min_length=1)
    top_k: int | None = Field(50, ge=1, le=30522, description="Tokens returned per input (null: all).")


class EncodeResult(BaseModel):
    kind: Literal["text", "image"]
    nnz: int
    tokens: dict[str, float]


class EncodeResponse(BaseModel):
    encoder: str
    results: list[EncodeResult]


class SearchBody(_Strict):
    index: str | None = Field(None, description="Index to search (default: the server's --index).")
    text: str | None = None
    tokens: dict[str, float] | None = Field(None, description="A token map instead of text.")
    image: ImageRef | None = Field(None, description="Query by example image.")
    where: list[str] = Field(default_factory=list, description="Metadata filters as in `stair-es search --where`.")
    require: list[str] = Field(default_factory=list)
    require_all: bool = False
    exclude: list[str] = Field(default_factory=list)
    exclude_query: list[str] = Field(default_factory=list)
    expr: str | None = None
    token_field: str = "image"
    caption_weight: float = Field(0.5, ge=0)
    image_weight: float = Field(1.0, ge=0)
    top_k: int = Field(10, ge=1)
    query_top_k: int | None = Field(None, ge=1)
    min_weight: float | None = None
    explain: bool = Field(False, description="Add each hit's per-token contributions.")
    force: bool = False


class ExplainBody(SearchBody):
    id: str = Field(..., min_length=1)


# --- app ---------------------------------------------------------------------------------------
def create_app(config: ServeConfig | None = None, *, service: Service | None = None) -> FastAPI:
    config = config or (service.config if service else ServeConfig())
    svc = service or Service(config)
    limiter = anyio.CapacityLimiter(max(1, config.workers))
    state = {"pending": 0}

    def admit() -> None:
        # one count for every route: past workers + max_queue requests in progress, 503 at once
        if state["pending"] >= config.workers + config.max_queue:
            raise ServerBusyError(f"the server is busy ({state['pending']} requests in progress); retry shortly")
        state["pending"] += 1

    async def run(fn: Callable, *args: Any) -> Any:
        admit()
        try:
            return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=limiter)
        finally:
            state["pending"] -= 1

    batching = config.batches_searches(svc.backend.in_process)
    batchers: list[Batcher] = []  # the live one, made at the first search after start

    def batcher() -> Batcher:
        if not batchers:
            # the answer's JSON is made on the search thread too, not on the event loop
            batchers.append(Batcher(svc.prepare_searches, lambda p: dumps(svc.run_search(p)), workers=config.workers,
                                    max_batch=config.max_batch, window=config.batch_window_ms / 1000.0,
                                    name="stair-es-search"))
        return batchers[0]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if config.load_encoder_at_start:
            try:
                await run(svc.warm_up)  # models load once, before the first request
            except StairError as e:
                log.error("the encoder could not be loaded: %s (the server answers /readyz with 503)", e)
            except Exception as e:  # noqa: BLE001 - logged; encode requests will report it
                log.error("the encoder failed its warm-up: %s: %s", type(e).__name__, e)
            try:
                await run(svc.warm_indices)  # open the indices and load their query encoders now
            except StairError as e:
                log.error("the backend's indices could not be listed: %s", e)
        yield
        while batchers:
            batchers.pop().close()
        svc.close()

    # fastapi-offline serves Swagger UI and ReDoc from the package (FastAPI's own /docs loads them
    # from a CDN, which machines without internet cannot reach)
    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(title="stair-es serve", version=__version__, lifespan=lifespan,
                  description="Learned sparse image search over HTTP: encode texts and images into token weights, "
                              "search and explain on the configured backend, and the inference endpoints that "
                              "Elasticsearch (`custom` service) and OpenSearch (ml-commons HTTP connector) call.")
    app.state.service = svc
    app.state.config = config

    async def require_key(authorization: str | None = Header(None, include_in_schema=False),
                          x_api_key: str | None = Header(None, include_in_schema=False)) -> None:
        if not config.api_key:
            return
        given = key_from_headers(authorization, x_api_key)
        if given is None:
            raise AuthError("this server requires an API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'")
        if not key_matches(config.api_key, given):
            raise AuthError("wrong API key")

    auth = [Depends(require_key)]

    @app.exception_handler(StairError)
    async def stair_error(request: Request, e: StairError):
        status = status_of(e)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status >= 500:
            log.warning("%s %s: %s: %s", request.method, request.url.path, type(e).__name__, e)
        return error_response(status, e.exit_code, type(e).__name__, svc.scrub(str(e)), headers)

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

    # --- health -------------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process answers (no model or backend is touched)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"])
    async def readyz(request: Request):
        """The encoder is loaded and the backend answers; 503 with the reason otherwise. With an
        API key set, a caller without it learns only ready or not (no settings, no reason)."""
        told = not config.api_key or request.scope.get("state", {}).get("key_ok", False)
        try:
            info = await run(svc.ready)
        except StairError as e:
            reason = f"not ready: {svc.scrub(str(e))}" if told else "not ready"
            return error_response(503, e.exit_code, type(e).__name__ if told else "NotReady", reason)
        return info if told else {"status": "ready"}

    # --- API ----------------------------------------------------------------------------------
    @app.post("/v1/encode", response_model=EncodeResponse, dependencies=auth, tags=["encode"])
    async def encode(body: EncodeRequest):
        """Token weights of texts and images (one result per input, in order)."""
        svc.check_count("max_inputs", len(body.inputs), "inputs")
        items = [i.model_dump(exclude_none=True) for i in body.inputs]
        for n, it in enumerate(items):
            if ("text" in it) == ("image" in it):
                raise InvalidInputError(f"input {n}: give exactly one of 'text' or 'image'")
        results = await run(svc.encode, items, body.top_k)
        return {"encoder": svc.encoder().name, "results": results}

    @app.post("/v1/search", dependencies=auth, tags=["search"])
    async def search(body: SearchBody):
        """Search an index with text, a token map or an example image, with filters and token clauses.

        The ``Server-Timing`` header of the answer says where the time went on the server:
        ``queue`` (waiting to be taken), ``prepare`` (its batch's preparation, with the batch
        size), ``wait`` (for a free search thread), ``search`` (its search and answer) and ``app``
        (from the request's validation to its answer)."""
        t0 = time.perf_counter()
        svc.check_limits(vars(body))  # before any work: a capped body is refused at once
        if not batching:
            payload = await run(lambda b: dumps(svc.search(b)), body.model_dump(exclude_none=True))
            timing = f"app;dur={(time.perf_counter() - t0) * 1000:.2f}"
        else:
            admit()
            try:
                payload, t = await batcher().submit(body.model_dump(exclude_none=True))
            finally:
                state["pending"] -= 1
            timing = (f"queue;dur={t.queued * 1000:.2f}, prepare;dur={t.prepare * 1000:.2f};desc=\"batch of {t.size}\", "
                      f"wait;dur={t.wait * 1000:.2f}, search;dur={t.run * 1000:.2f}, "
                      f"app;dur={(time.perf_counter() - t0) * 1000:.2f}")
        return Response(payload, media_type="application/json", headers={"Server-Timing": timing})

    @app.post("/v1/explain", dependencies=auth, tags=["search"])
    async def explain(body: ExplainBody):
        """Why document ``id`` scores what it does: per-token contributions that sum to the score."""
        svc.check_limits(vars(body))
        return await run(svc.explain, body.model_dump(exclude_none=True))

    @app.get("/v1/indices", dependencies=auth, tags=["search"])
    async def indices():
        """The backend's indices with their document counts, metadata fields and encoder."""
        return {"indices": await run(svc.indices)}

    @app.get("/v1/thumbnail/{index}/{doc_id:path}", dependencies=auth, tags=["search"],
             responses={200: {"content": {"image/jpeg": {}}}})
    async def thumbnail(index: str, doc_id: str, size: int = Query(256, ge=32, le=1024)):
        """A JPEG thumbnail of a document's image (only images under the server's image roots)."""
        data = await run(svc.thumbnail, index, doc_id, size)
        return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=300"})

    @app.get("/v1/heatmap/{index}/{doc_id:path}", dependencies=auth, tags=["search"],
             responses={200: {"content": {"image/png": {}}}})
    async def heatmap(index: str, doc_id: str, q: str = Query(..., min_length=1, max_length=4096),
                      size: int = Query(256, ge=32, le=1024), alpha: float = Query(0.5, ge=0, le=1)):
        """A document's image with the STAIR localisation of query ``q`` over it (stair-encoder indices only)."""
        data = await run(svc.heatmap, index, doc_id, q, size, alpha)
        return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})

    # --- Elasticsearch / OpenSearch inference endpoints --------------------------------------
    @app.post("/v1/elasticsearch/sparse_embedding", dependencies=auth, tags=["clusters"])
    async def es_sparse_embedding(request: Request, kind: Literal["text", "image", "auto"] = "text"):
        """For the Elasticsearch `custom` inference service: request ``{"input": [...], "input_type": "text"|"image"|"auto"}``
        (input_type, if sent, overrides ``?kind``), response parallel lists per input under
        ``$.result.sparse_embeddings[*].embedding[*].token`` / ``.weight``."""
        body = await _json(request)
        if not isinstance(body, dict) or "input" not in body:
            raise InvalidInputError('send {"input": ["text", ...]} (the custom service\'s ${input})')
        k = body.get("input_type") or kind
        return await run(svc.es_sparse_embedding, body["input"], k)

    @app.post("/v1/opensearch/sparse_encoding", dependencies=auth, tags=["clusters"])
    async def os_sparse_encoding(request: Request, kind: Literal["text", "image", "auto"] = "text",
                                 keys: Literal["token", "id"] = "token"):
        """For an OpenSearch ml-commons HTTP connector: request a JSON array of strings (``${parameters.input}``
        after ``connector.pre_process.default.embedding``), response one ``{token: weight}`` map per input
        (``?keys=id``: token ids, for the seismic ``sparse_vector``)."""
        body = await _json(request)
        inputs = body.get("input", body.get("inputs")) if isinstance(body, dict) else body
        if inputs is None:
            raise InvalidInputError('send a JSON array of strings (or {"input": [...]})')
        return await run(svc.os_sparse_encoding, inputs, kind, keys)

    # --- results page -------------------------------------------------------------------------
    from .page import render_page

    @app.get("/", response_class=HTMLResponse, dependencies=auth, include_in_schema=False)
    async def page(request: Request):
        return HTMLResponse(await run(render_page, svc, dict(request.query_params), request.query_params.getlist("where")))

    app.mount("/static", StaticFiles(directory=str(resources.files("stair_es.serve") / "static")), name="static")
    app.add_middleware(BodyGuard, max_bytes=config.max_body_bytes, timeout=config.body_timeout)
    app.add_middleware(KeyGate, api_key=config.api_key, public_docs=config.public_docs)  # before any body is read
    app.add_middleware(HostGuard, allowed=host_names(config.bind_host, config.allowed_hosts))  # outermost: first
    return app


def dumps(data: Any) -> bytes:
    """JSON as FastAPI's JSONResponse writes it, without its per-value jsonable_encoder walk
    (the service hands over plain dicts, lists, strings and numbers)."""
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


async def _json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"the request body is not valid JSON ({getattr(e, 'msg', e)}); send JSON") from None
