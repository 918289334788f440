"""The inference endpoints Elasticsearch (`custom` service) and OpenSearch (ml-commons HTTP
connector) call; their request and response shapes are the engines', not ours."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request

from ..errors import InvalidInputError
from .runtime import Runtime, read_json, require_key, runtime

router = APIRouter(tags=["clusters"], dependencies=[Depends(require_key)])


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
    return await rt.run(rt.service.es_sparse_embedding, body["input"], k)


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
    return await rt.run(rt.service.os_sparse_encoding, inputs, kind, keys)
