"""Route ``POST /v1/encode``: token weights of texts and images."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..errors import InvalidInputError
from .models import EncodeRequest, EncodeResponse
from .runtime import ParsedJSONRoute, Runtime, require_key, runtime

router = APIRouter(route_class=ParsedJSONRoute, tags=["encode"], dependencies=[Depends(require_key)])


@router.post("/v1/encode", response_model=EncodeResponse)
async def encode(body: EncodeRequest, rt: Runtime = Depends(runtime)):
    """Token weights of texts and images (one result per input, in order)."""
    svc = rt.service
    svc.check_count("max_inputs", len(body.inputs), "inputs")
    items = [i.model_dump(exclude_none=True) for i in body.inputs]
    for n, it in enumerate(items):
        if ("text" in it) == ("image" in it):
            raise InvalidInputError(f"input {n}: give exactly one of 'text' or 'image'")
    # image URLs are fetched here, on the fetch pool, never on a worker
    await rt.fetch_images([it.get("image") for it in items], [f"input {n}" for n in range(len(items))])
    results = await rt.run(svc.encode, items, body.top_k)
    return {"encoder": svc.encoder().name, "results": results}
