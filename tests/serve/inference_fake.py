"""What Elasticsearch's `custom` inference service and OpenSearch's ml-commons HTTP connector do
with the JSON `stair-es es|opensearch` registers, re-enacted on the tests' fake cluster.

Neither emulator implements ``_inference`` or ml-commons, so this module adds those routes to
:class:`backends.fake_cluster.FakeCluster` and performs the calls the engines would make, by
their documented rules:

* Elasticsearch: the ``request`` template gets ``${input}`` (a JSON array of strings) and
  ``${input_type}`` (the ``input_type.translation`` of the context, JSON-quoted), headers get
  ``${api_key}`` from ``secret_parameters``; the response is read with ``token_path`` /
  ``weight_path`` the way ``SparseEmbeddingResponseParser`` does (``MapPathExtractor``: each
  ``[*]`` maps over a list; the result is one list of tokens and one of weights per input).
* OpenSearch: ``connector.pre_process.default.embedding`` turns ``text_docs`` into
  ``${parameters.input}`` (a JSON array of strings), headers get ``${credential.api_key}``,
  and with no post-process function a top-level JSON array is handed on as ``response``.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

from backends.fake_cluster import FakeCluster, _error

# The sparse_embedding example of the Elasticsearch docs (CustomResponseParams) and the
# service's own test (CustomServiceTests), as recorded: what token_path/weight_path read.
RECORDED_ES_RESPONSE = {
    "request_id": "75C50B5B-E79E-4930-****-F48DBB392231",
    "latency": 22,
    "usage": {"token_count": 11},
    "result": {"sparse_embeddings": [{"index": 0, "embedding": [{"tokenId": 6, "weight": 0.101},
                                                                {"tokenId": 163040, "weight": 0.28417}]}]},
}
RECORDED_ES_PATHS = ("$.result.sparse_embeddings[*].embedding[*].tokenId",
                     "$.result.sparse_embeddings[*].embedding[*].weight")
RECORDED_ES_PARSED = [{"6": 0.101, "163040": 0.28417}]


def extract(doc: Any, path: str) -> Any:
    """The subset of JSONPath the custom service reads: ``$.a.b[*].c[*].d``."""
    if not path.startswith("$."):
        raise ValueError(f"path must start with $.: {path}")
    parts = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)(\[\*\])?", path[2:])

    def walk(o: Any, i: int) -> Any:
        if i == len(parts):
            return o
        name, star = parts[i]
        if not isinstance(o, dict) or name not in o:
            raise KeyError(f"{path}: no field {name!r}")
        v = o[name]
        if star:
            if not isinstance(v, list):
                raise TypeError(f"{path}: {name!r} is not a list")
            return [walk(x, i + 1) for x in v]
        return walk(v, i + 1)

    return walk(doc, 0)


def parse_sparse(doc: Any, token_path: str, weight_path: str) -> list[dict[str, float]]:
    """As SparseEmbeddingResponseParser.transform: parallel lists per input -> token maps."""
    tokens, weights = extract(doc, token_path), extract(doc, weight_path)
    if not isinstance(tokens, list) or len(tokens) != len(weights):
        raise ValueError("token and weight lists differ in size")
    out = []
    for t, w in zip(tokens, weights):
        if not isinstance(t, list) or not isinstance(w, list) or len(t) != len(w):
            raise ValueError("an entry's token and weight lists differ")
        out.append({str(a): float(b) for a, b in zip(t, w)})
    return out


def _post(url: str, body: bytes, headers: dict[str, str]) -> Any:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def es_custom_call(settings: dict, inputs: list[str], context: str) -> list[dict[str, float]]:
    """One call of the custom service in ``context`` (ingest | search), parsed as Elasticsearch does."""
    it = settings.get("input_type") or {}
    translated = (it.get("translation") or {}).get(context, it.get("default", ""))
    body = settings["request"].replace("${input}", json.dumps(inputs)).replace("${input_type}", json.dumps(translated))
    if "${" in body:
        raise ValueError(f"unfilled template in {body}")
    secrets = settings.get("secret_parameters") or {}
    headers = {k: re.sub(r"\$\{(\w+)\}", lambda m: secrets[m.group(1)], v) for k, v in (settings.get("headers") or {}).items()}
    resp = _post(settings["url"], body.encode(), headers)
    jp = settings["response"]["json_parser"]
    return parse_sparse(resp, jp["token_path"], jp["weight_path"])


def os_connector_call(connector: dict, text_docs: list[str]) -> list[dict[str, float]]:
    """One predict action of an ml-commons HTTP connector; returns ``dataAsMap.response``."""
    (action,) = [a for a in connector["actions"] if a["action_type"] == "predict"]
    assert action.get("pre_process_function") == "connector.pre_process.default.embedding"
    params = {"input": json.dumps(text_docs)}
    body = re.sub(r"\$\{parameters\.(\w+)\}", lambda m: params[m.group(1)], action["request_body"])
    cred = connector.get("credential") or {}
    headers = {k: re.sub(r"\$\{credential\.(\w+)\}", lambda m: cred[m.group(1)], v)
               for k, v in (action.get("headers") or {}).items()}
    resp = _post(action["url"], body.encode(), headers)
    if action.get("post_process_function"):
        raise AssertionError("no post-process function is expected for sparse encodings")
    return resp  # ml-commons: a top-level JSON array becomes dataAsMap {"response": [...]}


class InferenceCluster:
    """A FakeCluster that also answers ``_inference``, ingest pipelines (with ``_simulate``),
    ml-commons connectors/models/tasks/predict and search pipelines, recording every body."""

    def __init__(self, flavor: str):
        self.fake = FakeCluster(flavor)
        self.url = self.fake.url
        self.requests: list[tuple[str, str, Any]] = []
        self.endpoints: dict[str, dict] = {}
        self.pipelines: dict[str, dict] = {}
        self.search_pipelines: dict[str, dict] = {}
        self.connectors: dict[str, dict] = {}
        self.models: dict[str, dict] = {}
        handler = self.fake.server.RequestHandlerClass
        original = handler._route
        me = self

        def _route(h, method, parts, params, raw):
            if parts and parts[0] in ("_inference", "_ingest", "_plugins") or parts[:2] == ["_search", "pipeline"]:
                body = json.loads(raw) if raw else None
                me.requests.append((method, "/" + "/".join(parts), body))
                try:
                    return me.route(method, parts, body)
                except Exception as e:  # noqa: BLE001 - as a node answers a failed inference
                    return _error(400, "status_exception", f"{type(e).__name__}: {e}")
            return original(h, method, parts, params, raw)

        handler._route = _route

    def close(self):
        self.fake.close()

    # --- Elasticsearch -------------------------------------------------------------------------
    def es_infer(self, inference_id: str, inputs: list[str], context: str) -> list[dict[str, float]]:
        ep = self.endpoints[inference_id]
        return es_custom_call(ep["service_settings"], inputs, context)

    def route(self, method: str, parts: list[str], body: Any):
        if parts[0] == "_inference":
            task, iid = parts[1], parts[2]
            if method == "PUT":
                if body.get("service") != "custom" or task != "sparse_embedding":
                    return _error(400, "status_exception", "unsupported service/task")
                s = body["service_settings"]
                for key in ("url", "request", "response"):
                    if key not in s:
                        return _error(400, "validation_exception", f"[service_settings] does not contain [{key}]")
                self.endpoints[iid] = body
                shown = {k: v for k, v in s.items() if k != "secret_parameters"}
                return 200, {"inference_id": iid, "task_type": task, "service": "custom", "service_settings": shown}
            if method == "POST":
                inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                maps = self.es_infer(iid, inputs, body.get("input_type", "search"))
                return 200, {"sparse_embedding": [{"is_truncated": False, "embedding": m} for m in maps]}
        if parts[0] == "_ingest" and parts[1] == "pipeline":
            pid = parts[2]
            if method == "PUT":
                self.pipelines[pid] = body
                return 200, {"acknowledged": True}
            if parts[3:] == ["_simulate"]:
                return 200, {"docs": [{"doc": {"_source": self.run_pipeline(pid, d["_source"])}} for d in body["docs"]]}
        if parts[:2] == ["_search", "pipeline"] and method == "PUT":
            self.search_pipelines[parts[2]] = body
            return 200, {"acknowledged": True}
        if parts[:2] == ["_plugins", "_ml"]:
            return self.ml(method, parts[2:], body)
        return _error(400, "illegal_argument_exception", f"fake: unsupported {method} /{'/'.join(parts)}")

    def run_pipeline(self, pid: str, source: dict) -> dict:
        source = dict(source)
        for proc in self.pipelines[pid]["processors"]:
            if "inference" in proc:
                p = proc["inference"]
                for io in p["input_output"]:
                    (m,) = self.es_infer(p["model_id"], [source[io["input_field"]]], "ingest")
                    source[io["output_field"]] = m
            elif "sparse_encoding" in proc:
                p = proc["sparse_encoding"]
                assert p.get("prune_type", "none") in ("none",), "the fake does not prune"
                for src, dst in p["field_map"].items():
                    (m,) = self.os_predict(p["model_id"], [source[src]])
                    source[dst] = m
        return source

    # --- OpenSearch ml-commons -----------------------------------------------------------------
    def os_predict(self, model_id: str, text_docs: list[str]) -> list[dict[str, float]]:
        model = self.models[model_id]
        assert model["deployed"], "the model is not deployed"
        return os_connector_call(self.connectors[model["connector_id"]], text_docs)

    def ml(self, method: str, rest: list[str], body: Any):
        if rest == ["connectors", "_create"]:
            for key in ("name", "version", "protocol", "actions"):
                if key not in body:
                    return _error(400, "illegal_argument_exception", f"connector without {key}")
            cid = f"conn{len(self.connectors) + 1}"
            self.connectors[cid] = body
            return 200, {"connector_id": cid}
        if rest == ["models", "_register"]:
            if body.get("function_name") != "remote" or body.get("connector_id") not in self.connectors:
                return _error(400, "illegal_argument_exception", "remote model needs a known connector_id")
            mid = f"model{len(self.models) + 1}"
            self.models[mid] = {**body, "deployed": False}
            return 200, {"task_id": f"task-{mid}", "status": "CREATED"}
        if rest[0] == "tasks" and method == "GET":
            mid = rest[1].removeprefix("task-")
            return 200, {"model_id": mid, "task_type": "REGISTER_MODEL", "function_name": "REMOTE", "state": "COMPLETED"}
        if rest[0] == "models" and rest[2:] == ["_deploy"]:
            self.models[rest[1]]["deployed"] = True
            return 200, {"task_id": "deploy-" + rest[1], "task_type": "DEPLOY_MODEL", "status": "COMPLETED"}
        if rest[0] == "models" and rest[2:] == ["_predict"]:
            maps = self.os_predict(rest[1], body["text_docs"])
            return 200, {"inference_results": [{"output": [{"name": "output", "dataAsMap": {"response": maps}}],
                                                "status_code": 200}]}
        return _error(400, "illegal_argument_exception", f"fake ml: unsupported {method} {rest}")
