"""Routes of search: ``POST /v1/search``, ``POST /v1/explain``, ``GET /v1/indices``, thumbnails
and heatmaps."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from .models import ExplainBody, SearchBody
from .runtime import ParsedJSONRoute, Runtime, dumps, require_key, runtime

router = APIRouter(route_class=ParsedJSONRoute, tags=["search"], dependencies=[Depends(require_key)])


@router.post("/v1/search")
async def search(body: SearchBody, rt: Runtime = Depends(runtime)):
    """Search an index with text, a token map or an example image, with filters and token clauses.

    The ``Server-Timing`` header of the answer says where the time went on the server:
    ``queue`` (waiting to be taken), ``prepare`` (its batch's preparation, with the batch
    size), ``wait`` (for a free search thread), ``search`` (its search and answer) and ``app``
    (from the request's validation to its answer)."""
    t0 = time.perf_counter()
    svc = rt.service
    svc.check_limits(vars(body))  # before any work: a capped body is refused at once
    item = body.model_dump(exclude_none=True)
    await rt.fetch_images([item.get("image")])  # an image URL is fetched here, never on a worker
    if not rt.batching:
        payload = await rt.run(lambda b: dumps(svc.search(b)), item)
        timing = f"app;dur={(time.perf_counter() - t0) * 1000:.2f}"
    else:
        payload, t = await rt.search_batched(item)
        timing = (f"queue;dur={t.queued * 1000:.2f}, prepare;dur={t.prepare * 1000:.2f};desc=\"batch of {t.size}\", "
                  f"wait;dur={t.wait * 1000:.2f}, search;dur={t.run * 1000:.2f}, "
                  f"app;dur={(time.perf_counter() - t0) * 1000:.2f}")
    return Response(payload, media_type="application/json", headers={"Server-Timing": timing})


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
    data = await rt.run(rt.service.thumbnail, index, doc_id, size)
    return Response(data, media_type="image/jpeg", headers={"Cache-Control": "private, max-age=300"})


@router.get("/v1/heatmap/{index}/{doc_id:path}", responses={200: {"content": {"image/png": {}}}})
async def heatmap(index: str, doc_id: str, q: str = Query(..., min_length=1, max_length=4096),
                  size: int = Query(256, ge=32, le=1024), alpha: float = Query(0.5, ge=0, le=1),
                  rt: Runtime = Depends(runtime)):
    """A document's image with the STAIR localisation of query ``q`` over it (stair-encoder indices only)."""
    data = await rt.run(rt.service.heatmap, index, doc_id, q, size, alpha)
    return Response(data, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})
