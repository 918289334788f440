"""Routes of search: ``POST /v1/search``, ``POST /v1/explain``, ``GET /v1/indices``, thumbnails
and heatmaps."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from .errors import ServerBusyError
from .models import ExplainBody, SearchBody
from .runtime import ParsedJSONRoute, Runtime, dumps, require_key, runtime
from .stats import PHASES, T_ENTRY

router = APIRouter(route_class=ParsedJSONRoute, tags=["search"], dependencies=[Depends(require_key)])


@router.post("/v1/search")
async def search(request: Request, body: SearchBody, rt: Runtime = Depends(runtime)):
    """Search an index with text, a token map or an example image, with filters and token clauses.

    The ``Server-Timing`` header of the answer says where the time went on the server, in ms:
    ``pre`` (from the request's first byte in the app to this route: the gates, reading,
    parsing and validating the body), ``queue`` (waiting to be taken), ``prepare`` (its
    batch's preparation, with the batch size), ``wait`` (for a free search thread),
    ``search`` (its search and answer on that thread), of which ``engine`` (the backend's
    search) and ``answer`` (the answer's JSON), each with its thread's CPU time as
    ``engine_cpu`` and ``answer_cpu`` (wall minus CPU: the thread waited for the GIL or a
    core), ``deliver`` (from the thread's end to this route running again on the event loop)
    and ``app`` (from this route's start to its answer)."""
    payload, timing = await search_answer(rt, body, request.scope)
    return Response(payload, media_type="application/json", headers={"Server-Timing": timing})


async def search_answer(rt: Runtime, body: SearchBody, scope: dict) -> tuple[bytes, str]:
    """The JSON answer of one validated search and its ``Server-Timing`` value. Shared by the
    route above and the plain ASGI path of :mod:`.fastpath`, so both answer alike."""
    t0 = time.perf_counter()
    svc = rt.service
    svc.check_limits(vars(body))  # before any work: a capped body is refused at once
    item = body.model_dump(exclude_none=True)
    await rt.fetch_images([item.get("image")])  # an image URL is fetched here, never on a worker
    state = scope.get("state") or {}
    t_entry = state.get(T_ENTRY, t0)
    if not rt.batching:
        payload = await rt.run(lambda b: dumps(svc.search(b)), item)
        t_end = time.perf_counter()
        timing = f"pre;dur={(t0 - t_entry) * 1000:.2f}, app;dur={(t_end - t0) * 1000:.2f}"
    else:
        try:
            payload, t, (engine, engine_cpu, answer, answer_cpu) = await rt.search_batched(item)
        except ServerBusyError as e:
            if rt.stats is not None and e.server_timing:  # shed from the queue (--queue-timeout-ms), not at the door
                state[PHASES] = {"overdue": True}
            raise
        t_end = time.perf_counter()
        deliver = max(0.0, t_end - t.done_at)
        timing = (f"pre;dur={(t0 - t_entry) * 1000:.2f}, queue;dur={t.queued * 1000:.2f}, "
                  f"prepare;dur={t.prepare * 1000:.2f};desc=\"batch of {t.size}\", wait;dur={t.wait * 1000:.2f}, "
                  f"search;dur={t.run * 1000:.2f}, engine;dur={engine * 1000:.2f}, "
                  f"engine_cpu;dur={engine_cpu * 1000:.2f}, answer;dur={answer * 1000:.2f}, "
                  f"answer_cpu;dur={answer_cpu * 1000:.2f}, deliver;dur={deliver * 1000:.2f}, "
                  f"app;dur={(t_end - t0) * 1000:.2f}")
        if rt.stats is not None:
            state[PHASES] = {"pre": t0 - t_entry, "queue": t.queued, "prepare": t.prepare, "wait": t.wait,
                             "engine": engine, "engine_cpu": engine_cpu, "answer": answer, "answer_cpu": answer_cpu,
                             "deliver": deliver, "returned": time.perf_counter()}
    return payload, timing


@router.post("/v1/explain")
async def explain(body: ExplainBody, rt: Runtime = Depends(runtime)):
    """Why document ``id`` scores what it does: per-token contributions that sum to the score."""
    rt.service.check_limits(vars(body))
    item = body.model_dump(exclude_none=True)
    await rt.fetch_images([item.get("image")])
    return await rt.run(rt.service.explain, item)


@router.get("/v1/indices")
async def indices(rt: Runtime = Depends(runtime)):
    """The backend's indices with their document counts, metadata fields and encoder."""
    return {"indices": await rt.run(rt.service.indices)}


@router.get("/v1/thumbnail/{index}/{doc_id:path}", responses={200: {"content": {"image/jpeg": {}}}})
async def thumbnail(index: str, doc_id: str, size: int = Query(256, ge=32, le=1024), rt: Runtime = Depends(runtime)):
    """A JPEG thumbnail of a document's image (only images under the server's image roots)."""
    data = await rt.run(rt.service.thumbnail, index, doc_id, size, kind="media")
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=300"})


@router.get("/v1/heatmap/{index}/{doc_id:path}", responses={200: {"content": {"image/png": {}}}})
async def heatmap(index: str, doc_id: str, q: str = Query(..., min_length=1, max_length=4096),
                  size: int = Query(256, ge=32, le=1024), alpha: float = Query(0.5, ge=0, le=1),
                  rt: Runtime = Depends(runtime)):
    """A document's image with the STAIR localisation of query ``q`` over it (stair-encoder indices only)."""
    data = await rt.run(rt.service.heatmap, index, doc_id, q, size, alpha, kind="media")
    return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})
