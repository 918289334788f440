"""The FastAPI application of `stair-es serve`: one app factory, one router per area.

:func:`create_app` builds one app around one :class:`~.service.Service`: the routers of
:mod:`.routes_health`, :mod:`.routes_search`, :mod:`.routes_encode`, :mod:`.routes_clusters`
and :mod:`.routes_page`, the error handlers of :mod:`.errors` and the middleware of
:mod:`.middleware`. The request and response models (:mod:`.models`) are the contract
(OpenAPI at ``/docs``). Errors keep the CLI's meaning (:mod:`.errors`). CPU work runs through
the :class:`~.runtime.Runtime`. Request bodies are read whole by the body guard before any
route runs, capped in size and in time. A valid ``POST /v1/search`` is answered by the same
route code without FastAPI's routing (:mod:`.fastpath`).
"""

from __future__ import annotations

import gc
import logging
import os
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from .. import __version__
from ..errors import StairError
from . import routes_clusters, routes_debug, routes_encode, routes_health, routes_page, routes_search
from .admission import set_loop_priority, set_loop_realtime, unset_loop_realtime
from .fastpath import SearchFastPath
from .jsonbody import caps_of, parse_capped
from .handlers import install_handlers
from .middleware import BodyGuard, HostGuard, InFlightGate, KeyGate, QueueFullGate
from .runtime import Runtime
from .security import host_names
from .service import ServeConfig, Service

log = logging.getLogger("stair_es.serve")


def create_app(config: ServeConfig | None = None, *, service: Service | None = None, fast_path: bool = True) -> FastAPI:
    """The app; ``fast_path=False`` sends ``/v1/search`` through FastAPI's route too (tests compare the two)."""
    config = config or (service.config if service else ServeConfig())
    rt = Runtime(config, service or Service(config))
    svc = rt.service

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        def applied(problem: str | None) -> bool:
            """Whether a scheduling change of the event loop's thread took (why not is logged)."""
            if problem:
                log.warning("%s", problem)
            return problem is None

        # measured in docs/serve.md, did not pay, removed: said, not silently ignored
        for gone in ("STAIR_ES_SERVE_WORKER_POLICY", "STAIR_ES_SERVE_LOOP_SLICE_US", "STAIR_ES_SERVE_SWITCH_INTERVAL_MS"):
            if os.environ.get(gone, "").strip():
                log.warning("$%s is no longer read (it did not pay in docs/serve.md's measures): the server runs "
                            "without it; unset it", gone)
        if config.loop_nice:  # this runs on the event loop's thread (uvicorn's main thread)
            applied(set_loop_priority(config.loop_nice))
        # the same thread; the threads it starts from now on are ordinary ones
        realtime = bool(config.loop_realtime) and applied(set_loop_realtime())
        if config.load_encoder_at_start:
            try:
                await rt.run_aside(svc.warm_up)  # models load once, before the first request
            except StairError as e:
                log.error("the encoder could not be loaded: %s (the server answers /readyz with 503)", e)
            except Exception as e:  # noqa: BLE001 - logged; encode requests will report it
                log.error("the encoder failed its warm-up: %s: %s", type(e).__name__, e)
            try:
                await rt.run_aside(svc.warm_indices)  # open the indices and load their query encoders now
            except StairError as e:
                log.error("the backend's indices could not be listed: %s", e)
        # What start-up built (indices, models, kernels: ~150,000 objects at 1M documents) lives as
        # long as the server: out of the collector's way. A full collection walked them all, holding
        # the GIL (so every search and the event loop) for 120-150 ms at 1M documents. (No collection
        # first: it would cost that once more per start; start-up's garbage waits for gc.unfreeze.)
        gc.freeze()
        if rt.stats is not None:
            rt.stats.start()  # the event loop's stalls, sampled while the server runs
        yield
        gc.unfreeze()  # collectable again once the app is gone (tests start many apps in one process)
        if realtime:
            unset_loop_realtime()
        if rt.stats is not None:
            rt.stats.stop()
        rt.close()

    # fastapi-offline serves Swagger UI and ReDoc from the package (FastAPI's own /docs loads them
    # from a CDN, which machines without internet cannot reach)
    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(title="stair-es serve", version=__version__, lifespan=lifespan,
                         description="Learned sparse image search over HTTP: encode texts and images into token weights, "
                                     "search and explain on the configured backend, and the inference endpoints that "
                                     "Elasticsearch (`custom` service) and OpenSearch (ml-commons HTTP connector) call.")
    app.state.service = svc
    app.state.config = config
    app.state.runtime = rt
    install_handlers(app, svc.scrub)
    for module in (routes_health, routes_encode, routes_search, routes_clusters, routes_page):
        app.include_router(module.router)
    if rt.stats is not None:
        app.include_router(routes_debug.router)
    app.mount("/static", StaticFiles(directory=str(resources.files("stair_es.serve") / "static")), name="static")
    # The gates run first, in front of FastAPI's own stack (its server-error, telemetry and body-limit
    # layers, then its routing): a refused or shed request costs the event loop only the gates
    # before it, and a valid search is answered right after them without FastAPI's routing
    # (:mod:`.fastpath`; same answer, less CPU). Each gate answers in the one error shape itself.
    caps, other = caps_of(config)
    build_fastapi_stack = app.build_middleware_stack

    def build_middleware_stack():
        inner = build_fastapi_stack()
        if fast_path:
            inner = SearchFastPath(inner, runtime=rt, api_key=config.api_key, scrub=svc.scrub)
        inner = BodyGuard(inner, max_bytes=config.max_body_bytes, timeout=config.body_timeout,
                          parse=lambda text: parse_capped(text, caps, other))
        inner = QueueFullGate(inner, admission=rt.admission, batched_search=rt.batching,  # sheds before the body is read
                              stamp=config.debug_stats)
        inner = KeyGate(inner, api_key=config.api_key, public_docs=config.public_docs)  # before any body is read
        inner = HostGuard(inner, allowed=host_names(config.bind_host, config.allowed_hosts))
        return InFlightGate(inner, limit=config.in_flight_limit(), retry_after_ms=rt.admission.retry_after_ms,
                            stats=rt.stats)  # first

    app.build_middleware_stack = build_middleware_stack  # Starlette builds the stack at the first request
    return app
