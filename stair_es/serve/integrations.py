"""The JSON that makes Elasticsearch and OpenSearch call `stair-es serve` as their sparse model.

Elasticsearch (8.19+/9.x): an ``_inference`` endpoint of the ``custom`` service
(:func:`es_inference_endpoint`), an ingest pipeline with the ``inference`` processor
(:func:`es_ingest_pipeline`), and mappings with ``semantic_text`` or ``sparse_vector``
(:func:`es_mappings`). OpenSearch (2.x/3.x): an ml-commons HTTP connector
(:func:`os_connector`), the model registration (:func:`os_register_model`), a
``sparse_encoding`` ingest pipeline (:func:`os_ingest_pipeline`), a ``neural_sparse`` query
(:func:`os_neural_sparse_query`) and the two-phase search pipeline (:func:`os_two_phase_pipeline`).

Builders return plain dicts (printed by the CLI with ``--print``); :func:`cluster_call` sends
one to a cluster through the backend's own client, so TLS, auth and error messages are the
backends'. This module must not know FastAPI.
"""

from __future__ import annotations

import json
from typing import Any, Mapping
from urllib.parse import urlencode

#: The response paths of the Elasticsearch custom service for our /v1/elasticsearch/sparse_embedding.
ES_TOKEN_PATH = "$.result.sparse_embeddings[*].embedding[*].token"
ES_WEIGHT_PATH = "$.result.sparse_embeddings[*].embedding[*].weight"
ES_ENDPOINT = "/v1/elasticsearch/sparse_embedding"
OS_ENDPOINT = "/v1/opensearch/sparse_encoding"


# --- Elasticsearch ------------------------------------------------------------------------------
def es_inference_endpoint(serve_url: str, *, documents: str = "text", api_key: str | None = None,
                          batch_size: int | None = None) -> dict[str, Any]:
    """Body of ``PUT _inference/sparse_embedding/ID`` for the ``custom`` service.

    ``documents="image"``: what Elasticsearch ingests is an image reference (a path relative to
    the server's image root, a data: URI or an allowed URL) and what it searches with is text,
    through the ``input_type`` translation (ingest -> auto, search -> text); so one endpoint
    serves ``semantic_text`` at ingest and at query time. ``auto`` rather than ``image`` at
    ingest: a short text (such as the probe Elasticsearch may send when the endpoint is
    created) is encoded as text instead of failing as a missing file. ``documents="text"``:
    both sides are text.
    """
    if documents not in ("text", "image"):
        raise ValueError("documents must be 'text' or 'image'")
    headers = {"Content-Type": "application/json"}
    settings: dict[str, Any] = {
        "url": serve_url.rstrip("/") + ES_ENDPOINT,
        "headers": headers,
        "request": '{"input": ${input}, "input_type": ${input_type}}',
        "response": {"json_parser": {"token_path": ES_TOKEN_PATH, "weight_path": ES_WEIGHT_PATH}},
        "input_type": {"translation": {"ingest": "auto" if documents == "image" else "text", "search": "text"},
                       "default": "text"},
        "secret_parameters": {},
    }
    if api_key:
        headers["Authorization"] = "Bearer ${api_key}"
        settings["secret_parameters"] = {"api_key": api_key}
    if batch_size:
        settings["batch_size"] = int(batch_size)
    return {"service": "custom", "service_settings": settings}


def es_ingest_pipeline(inference_id: str, input_field: str, output_field: str,
                       description: str | None = None) -> dict[str, Any]:
    """Body of ``PUT _ingest/pipeline/ID``: the ``inference`` processor writes the tokens of
    ``input_field`` into the ``sparse_vector`` field ``output_field``."""
    return {
        "description": description or f"stair-es sparse tokens of {input_field} into {output_field} via {inference_id}",
        "processors": [{"inference": {"model_id": inference_id,
                                      "input_output": [{"input_field": input_field, "output_field": output_field}]}}],
    }


def es_mappings(kind: str, *, inference_id: str | None = None, search_inference_id: str | None = None,
                field: str = "image", source_field: str = "image_ref", metadata: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    """Index body with ``semantic_text`` (``kind="semantic_text"``: the cluster calls the endpoint
    at ingest and query time) or ``sparse_vector`` (``kind="sparse_vector"``: filled by the
    ingest pipeline, queried with ``sparse_vector`` + ``inference_id``)."""
    props: dict[str, Any] = {}
    if kind == "semantic_text":
        if not inference_id:
            raise ValueError("semantic_text needs an inference_id")
        props[field] = {"type": "semantic_text", "inference_id": inference_id}
        if search_inference_id:
            props[field]["search_inference_id"] = search_inference_id
    elif kind == "sparse_vector":
        props[source_field] = {"type": "keyword"}
        # prune: false keeps every token (ES 9.1+ prunes at index time by default), so scores are the model's
        props[field] = {"type": "sparse_vector", "index_options": {"prune": False}}
    else:
        raise ValueError("kind must be 'semantic_text' or 'sparse_vector'")
    props["caption_text"] = {"type": "text"}
    for name, ftype in (metadata or {}).items():
        props[name] = {"type": {"number": "double", "boolean": "boolean", "date": "date"}.get(ftype, "keyword")}
    return {"mappings": {"properties": props}}


def es_sparse_vector_query(field: str, inference_id: str, text: str) -> dict[str, Any]:
    return {"query": {"sparse_vector": {"field": field, "inference_id": inference_id, "query": text}}}


def es_semantic_query(field: str, text: str) -> dict[str, Any]:
    return {"query": {"semantic": {"field": field, "query": text}}}


# --- OpenSearch ---------------------------------------------------------------------------------
def os_connector(serve_url: str, *, kind: str = "text", keys: str = "token", api_key: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
    """Body of ``POST /_plugins/_ml/connectors/_create``: an HTTP connector whose predict action
    sends ``${parameters.input}`` (the default embedding pre-process turns the processor's
    ``text_docs`` into a JSON array of strings) and gets back a top-level JSON array with one
    ``{token: weight}`` map per input, which ml-commons hands to ``sparse_encoding`` and
    ``neural_sparse`` as ``response`` (List<Map<String, Float>>). No post-process function: the
    ml-commons blueprints say to leave it out for sparse encodings. ``keys="id"``: token ids
    (for the OpenSearch 3.3+ ``sparse_vector`` seismic field)."""
    query = urlencode({"kind": kind, "keys": keys})
    headers = {"Content-Type": "application/json"}
    connector: dict[str, Any] = {
        "name": name or f"stair-es {kind} sparse encoder",
        "description": f"stair-es serve: learned sparse tokens of {'images' if kind == 'image' else 'texts'} "
                       "(BERT WordPiece vocabulary)",
        "version": 1,
        "protocol": "http",
        "parameters": {},
        "actions": [{
            "action_type": "predict",
            "method": "POST",
            "url": f"{serve_url.rstrip('/')}{OS_ENDPOINT}?{query}",
            "headers": headers,
            "request_body": "${parameters.input}",
            "pre_process_function": "connector.pre_process.default.embedding",
        }],
    }
    if api_key:
        connector["credential"] = {"api_key": api_key}
        headers["Authorization"] = "Bearer ${credential.api_key}"
    return connector


def os_register_model(connector_id: str, *, name: str, description: str | None = None,
                      model_group_id: str | None = None) -> dict[str, Any]:
    """Body of ``POST /_plugins/_ml/models/_register`` for a remote model over ``connector_id``."""
    body: dict[str, Any] = {"name": name, "function_name": "remote", "connector_id": connector_id,
                            "description": description or "stair-es sparse encoder (remote, via stair-es serve)"}
    if model_group_id:
        body["model_group_id"] = model_group_id
    return body


PRUNE_TYPES = ("none", "max_ratio", "alpha_mass", "top_k", "abs_value")


def os_ingest_pipeline(model_id: str, input_field: str, output_field: str, *, prune_type: str = "none",
                       prune_ratio: float | None = None) -> dict[str, Any]:
    """Body of ``PUT _ingest/pipeline/ID`` with the ``sparse_encoding`` processor (optionally pruned)."""
    if prune_type not in PRUNE_TYPES:
        raise ValueError(f"prune_type must be one of {', '.join(PRUNE_TYPES)}")
    proc: dict[str, Any] = {"model_id": model_id, "field_map": {input_field: output_field}}
    if prune_type != "none":
        if prune_ratio is None:
            raise ValueError(f"prune_type {prune_type} needs a prune_ratio")
        proc["prune_type"] = prune_type
        proc["prune_ratio"] = float(prune_ratio)
    return {"description": f"stair-es sparse tokens of {input_field} into {output_field}",
            "processors": [{"sparse_encoding": proc}]}


def os_mappings(*, field: str = "image", source_field: str = "image_ref", keys: str = "token",
                metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Index body: ``rank_features`` for token keys; the seismic ``sparse_vector`` for id keys."""
    props: dict[str, Any] = {source_field: {"type": "keyword"}, "caption_text": {"type": "text"}}
    if keys == "id":
        return {"settings": {"index": {"sparse": True}},
                "mappings": {"properties": {**props, field: {"type": "sparse_vector", "method": {"name": "seismic"}}}}}
    props[field] = {"type": "rank_features"}
    for name, ftype in (metadata or {}).items():
        props[name] = {"type": {"number": "double", "boolean": "boolean", "date": "date"}.get(ftype, "keyword")}
    return {"mappings": {"properties": props}}


def os_neural_sparse_query(field: str, model_id: str, text: str) -> dict[str, Any]:
    return {"query": {"neural_sparse": {field: {"query_text": text, "model_id": model_id}}}}


def os_two_phase_pipeline(prune_ratio: float = 0.4, expansion_rate: float = 5.0,
                          max_window_size: int = 10000) -> dict[str, Any]:
    """Body of ``PUT /_search/pipeline/ID``: ``neural_sparse_two_phase_processor`` scores with the
    query's strong tokens first and rescores the top window with all of them."""
    return {"request_processors": [{"neural_sparse_two_phase_processor": {
        "tag": "stair-es", "description": "stair-es two-phase neural sparse",
        "two_phase_parameter": {"prune_ratio": prune_ratio, "expansion_rate": expansion_rate,
                                "max_window_size": max_window_size}}}]}


# --- sending ------------------------------------------------------------------------------------
def cluster_call(backend: Any, method: str, path: str, body: Any = None, what: str = "request") -> Any:
    """One request through a cluster backend's own client (its auth, TLS, retries and error mapping)."""
    return backend.request(method, path, body, action=what, retry=False)


def redact(body: Any) -> Any:
    """A copy with secret values replaced, for printing and logs."""
    if isinstance(body, dict):
        return {k: dict.fromkeys(v, "<redacted>") if k in ("secret_parameters", "credential") and isinstance(v, dict)
                else redact(v) for k, v in body.items()}
    if isinstance(body, (list, tuple)):
        return [redact(v) for v in body]
    return body


# --- the JSON files in mappings/inference/ --------------------------------------------------------
def templates() -> dict[str, Any]:
    """Every body above with ``<PLACEHOLDERS>``, as shipped in ``mappings/inference/`` for people who
    set a cluster up by hand (``python -m stair_es.serve.integrations DIR`` writes them; a test
    checks the shipped files equal these)."""
    url, key = "<STAIR_ES_SERVE_URL>", "<STAIR_ES_SERVE_API_KEY>"
    return {
        "es_custom_inference_endpoint.json": es_inference_endpoint(url, documents="image", api_key=key),
        "es_inference_pipeline.json": es_ingest_pipeline("<INFERENCE_ID>", "image_ref", "image"),
        "es_semantic_text.json": es_mappings("semantic_text", inference_id="<INFERENCE_ID>",
                                             search_inference_id="<SEARCH_INFERENCE_ID>"),
        "es_sparse_vector_inference.json": es_mappings("sparse_vector"),
        "es_sparse_vector_query.json": es_sparse_vector_query("image", "<INFERENCE_ID>", "<QUERY TEXT>"),
        "es_semantic_query.json": es_semantic_query("image", "<QUERY TEXT>"),
        "os_http_connector_image.json": os_connector(url, kind="image", api_key=key),
        "os_http_connector_text.json": os_connector(url, kind="text", api_key=key),
        "os_http_connector_token_id.json": os_connector(url, kind="image", keys="id", api_key=key),
        "os_register_model.json": os_register_model("<CONNECTOR_ID>", name="stair-es-image"),
        "os_sparse_encoding_pipeline.json": os_ingest_pipeline("<IMAGE_MODEL_ID>", "image_ref", "image",
                                                               prune_type="max_ratio", prune_ratio=0.1),
        "os_rank_features_index.json": os_mappings(),
        "os_seismic_index.json": os_mappings(keys="id"),
        "os_neural_sparse_query.json": os_neural_sparse_query("image", "<TEXT_MODEL_ID>", "<QUERY TEXT>"),
        "os_two_phase_search_pipeline.json": os_two_phase_pipeline(),
    }


def write_templates(folder: str) -> list[str]:
    from pathlib import Path

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for name, body in templates().items():
        (out / name).write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return sorted(templates())


if __name__ == "__main__":
    import sys

    print("\n".join(write_templates(sys.argv[1] if len(sys.argv) > 1 else "mappings/inference")))
