"""The inference endpoints Elasticsearch (`custom` service) and OpenSearch (ml-commons HTTP
connector) call; their request and response shapes are the engines', not ours."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request

from ..errors import InvalidInputError
from .runtime import ParsedJSONRoute, Runtime, read_json, require_key, runtime

router = APIRouter(route_class=ParsedJSONRoute, tags=["clusters"], dependencies=[Depends(require_key)])


@router.post("/v1/elasticsearch/sparse_embedding")
async def es_sparse_embedding(request: Request, kind: Literal["text", "image", "auto"] = "text",
                              rt: Runtime = Depends(runtime)):
    """For the Elasticsearch `custom` inference service: request ``{"input": [...], "input_type": "text"|"image"|"auto"}``
    (input_type, if sent, overrides ``?kind``), response parallel lists per input under
    ``$.result.sparse_embeddings[*].embedding[*].token`` / ``.weight``."""
    body = await read_json(request)
    if not isinstance(body, dict) or "input" not in body:
        raise InvalidInputError('send {"input": ["text", ...]} (the custom service\'s ${input})')
    k = body.get("input_type") or kind
    items = await _inputs(rt, body["input"], k)
    return await rt.run(rt.service.es_sparse_embedding, None, k, items)


@router.post("/v1/opensearch/sparse_encoding")
async def os_sparse_encoding(request: Request, kind: Literal["text", "image", "auto"] = "text",
                             keys: Literal["token", "id"] = "token", rt: Runtime = Depends(runtime)):
    """For an OpenSearch ml-commons HTTP connector: request a JSON array of strings (``${parameters.input}``
    after ``connector.pre_process.default.embedding``), response one ``{token: weight}`` map per input
    (``?keys=id``: token ids, for the seismic ``sparse_vector``)."""
    body = await read_json(request)
    inputs = body.get("input", body.get("inputs")) if isinstance(body, dict) else body
    if inputs is None:
        raise InvalidInputError('send a JSON array of strings (or {"input": [...]})')
    items = await _inputs(rt, inputs, kind)
    return await rt.run(rt.service.os_sparse_encoding, None, kind, keys, items)


async def _inputs(rt: Runtime, inputs, kind: str) -> list[tuple[str, Any]]:
    """The call's inputs, checked and capped, their image URLs fetched (never on a worker)."""
    items = rt.service.cluster_inputs(inputs, kind)
    await rt.fetch_images([ref if k == "image" else None for k, ref in items], [f"input {n}" for n in range(len(items))])
    return items
