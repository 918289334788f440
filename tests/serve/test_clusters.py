"""Elasticsearch and OpenSearch calling `stair-es serve` as their sparse model.

The request/response contract is checked three ways: against the shapes recorded from the
engines' docs, through the fake cluster driven by the real official clients (registration
with `stair-es es|opensearch ...`, then the calls the engines make, re-enacted by
:mod:`inference_fake` against a real uvicorn server), and on a real cluster when one is
given (skipped here: none can be installed on this machine)."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from click.testing import CliRunner

from stair_es.backends.codec import feature_map
from stair_es.serve import integrations as integ
from stair_es.serve.app import create_app
from stair_es.sparse import SparseVector

from .conftest import API_KEY, ThreadServer, b64, make_config, png_bytes
from .inference_fake import (RECORDED_ES_PARSED, RECORDED_ES_PATHS, RECORDED_ES_RESPONSE, InferenceCluster, extract,
                             parse_sparse)


def cli(*args):
    from stair_es.cli.main import cli as main

    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.output


def encoded(client, inputs):
    """/v1/encode's token maps (all tokens), as the backends' feature names."""
    res = client.post("/v1/encode", json={"inputs": inputs, "top_k": None}).json()["results"]
    return [feature_map(SparseVector.from_token_map(r["tokens"])) for r in res]


@pytest.fixture
def keyed_server(home, image_root):
    srv = ThreadServer(create_app(make_config(home, image_root, api_key=API_KEY)))
    yield srv
    srv.close()


@pytest.fixture
def key_file(tmp_path):
    f = tmp_path / "serve.key"
    f.write_text(API_KEY + "\n")
    return str(f)


# --- recorded shapes ----------------------------------------------------------------------------
def test_json_parser_reads_the_recorded_elasticsearch_example():
    assert parse_sparse(RECORDED_ES_RESPONSE, *RECORDED_ES_PATHS) == RECORDED_ES_PARSED
    assert extract({"data": [{"embedding": [1, 2]}]}, "$.data[*].embedding[*]") == [[1, 2]]


def test_es_endpoint_answers_parallel_lists_per_input(client):
    r = client.post("/v1/elasticsearch/sparse_embedding", json={"input": ["a red car", "red"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert list(body) == ["result"] and [e["index"] for e in body["result"]["sparse_embeddings"]] == [0, 1]
    tokens = extract(body, integ.ES_TOKEN_PATH)
    weights = extract(body, integ.ES_WEIGHT_PATH)
    assert all(isinstance(t, list) for t in tokens) and [len(t) for t in tokens] == [len(w) for w in weights]
    assert parse_sparse(body, integ.ES_TOKEN_PATH, integ.ES_WEIGHT_PATH) == encoded(client, [{"text": "a red car"},
                                                                                              {"text": "red"}])


def test_es_endpoint_images_by_input_type(client):
    raw = png_bytes((20, 30, 200))
    r = client.post("/v1/elasticsearch/sparse_embedding",
                    json={"input": ["red-car.png", "data:image/png;base64," + b64(raw)], "input_type": "image"})
    got = parse_sparse(r.json(), integ.ES_TOKEN_PATH, integ.ES_WEIGHT_PATH)
    assert got == encoded(client, [{"image": {"path": "red-car.png"}}, {"image": {"base64": b64(raw)}}])
    # a single string is one input; paths stay confined to the roots
    assert len(client.post("/v1/elasticsearch/sparse_embedding", json={"input": "red"}).json()["result"]["sparse_embeddings"]) == 1
    r = client.post("/v1/elasticsearch/sparse_embedding", json={"input": ["../outside/secret.png"], "input_type": "image"})
    assert r.status_code == 403
    r = client.post("/v1/elasticsearch/sparse_embedding", json={"inputs": ["x"]})
    assert r.status_code == 400 and "${input}" in r.json()["error"]["message"]
    assert client.post("/v1/elasticsearch/sparse_embedding", json={"input": [3]}).status_code == 400
    assert client.post("/v1/elasticsearch/sparse_embedding", json={"input": ["x"], "input_type": "video"}).status_code == 400


def test_auto_kind_tells_image_references_from_text(client):
    body = {"input": ["red-car.png", "image:sub/red-again.png", "a red car", "red.png is a file name",
                      "data:image/png;base64," + b64(png_bytes((9, 9, 200)))], "input_type": "auto"}
    got = parse_sparse(client.post("/v1/elasticsearch/sparse_embedding", json=body).json(),
                       integ.ES_TOKEN_PATH, integ.ES_WEIGHT_PATH)
    assert got == encoded(client, [{"image": {"path": "red-car.png"}}, {"image": {"path": "sub/red-again.png"}},
                                   {"text": "a red car"}, {"text": "red.png is a file name"},
                                   {"image": {"base64": b64(png_bytes((9, 9, 200)))}}])


def test_os_endpoint_answers_a_map_per_input(client):
    r = client.post("/v1/opensearch/sparse_encoding", json=["a red car", "blue"])
    assert r.status_code == 200, r.text
    assert r.json() == encoded(client, [{"text": "a red car"}, {"text": "blue"}])
    r = client.post("/v1/opensearch/sparse_encoding?kind=image&keys=id", json={"input": ["red-car.png"]})
    (ids,) = r.json()
    vec = SparseVector.from_token_map(client.post("/v1/encode", json={"inputs": [{"image": {"path": "red-car.png"}}],
                                                                      "top_k": None}).json()["results"][0]["tokens"])
    assert ids == feature_map(vec, "id") and all(k.isdigit() for k in ids)
    assert client.post("/v1/opensearch/sparse_encoding?keys=bad", json=["x"]).status_code == 422
    assert client.post("/v1/opensearch/sparse_encoding", json={"nothing": 1}).status_code == 400


# --- builders -----------------------------------------------------------------------------------
def test_es_registration_json():
    body = integ.es_inference_endpoint("http://10.0.0.5:8080/", documents="image", api_key=API_KEY, batch_size=8)
    s = body["service_settings"]
    assert body["service"] == "custom" and s["url"] == "http://10.0.0.5:8080/v1/elasticsearch/sparse_embedding"
    assert s["request"] == '{"input": ${input}, "input_type": ${input_type}}'
    assert s["response"] == {"json_parser": {"token_path": integ.ES_TOKEN_PATH, "weight_path": integ.ES_WEIGHT_PATH}}
    assert s["input_type"]["translation"] == {"ingest": "auto", "search": "text"}
    assert integ.es_inference_endpoint("http://h", documents="text")["service_settings"]["input_type"]["translation"] == {
        "ingest": "text", "search": "text"}
    assert s["headers"]["Authorization"] == "Bearer ${api_key}" and s["secret_parameters"] == {"api_key": API_KEY}
    assert integ.redact(body)["service_settings"]["secret_parameters"] == {"api_key": "<redacted>"}
    m = integ.es_mappings("semantic_text", inference_id="a", search_inference_id="b")["mappings"]["properties"]["image"]
    assert m == {"type": "semantic_text", "inference_id": "a", "search_inference_id": "b"}
    assert integ.es_mappings("sparse_vector")["mappings"]["properties"]["image"]["type"] == "sparse_vector"
    p = integ.es_ingest_pipeline("stair", "image_ref", "image")["processors"][0]["inference"]
    assert p == {"model_id": "stair", "input_output": [{"input_field": "image_ref", "output_field": "image"}]}


def test_os_registration_json():
    c = integ.os_connector("http://h:1", kind="image", keys="id", api_key=API_KEY)
    (a,) = c["actions"]
    assert c["protocol"] == "http" and c["credential"] == {"api_key": API_KEY}
    assert a["url"] == "http://h:1/v1/opensearch/sparse_encoding?kind=image&keys=id"
    assert a["request_body"] == "${parameters.input}" and "post_process_function" not in a
    assert a["headers"]["Authorization"] == "Bearer ${credential.api_key}"
    p = integ.os_ingest_pipeline("m", "image_ref", "image", prune_type="max_ratio", prune_ratio=0.1)
    assert p["processors"][0]["sparse_encoding"] == {"model_id": "m", "field_map": {"image_ref": "image"},
                                                     "prune_type": "max_ratio", "prune_ratio": 0.1}
    with pytest.raises(ValueError, match="prune_ratio"):
        integ.os_ingest_pipeline("m", "a", "b", prune_type="top_k")
    assert integ.os_neural_sparse_query("image", "m", "red") == {
        "query": {"neural_sparse": {"image": {"query_text": "red", "model_id": "m"}}}}
    two = integ.os_two_phase_pipeline()["request_processors"][0]["neural_sparse_two_phase_processor"]
    assert two["two_phase_parameter"]["prune_ratio"] == 0.4
    assert integ.os_mappings(keys="id")["mappings"]["properties"]["image"]["method"] == {"name": "seismic"}


def test_print_sends_nothing_and_redacts(key_file):
    out = cli("es", "register-inference", "stair", "--serve-url", "http://127.0.0.1:1", "--serve-api-key-file", key_file,
              "--print")
    assert API_KEY not in out and json.loads(out)["path"] == "/_inference/sparse_embedding/stair"
    out = cli("opensearch", "register-model", "--serve-url", "http://127.0.0.1:1", "--serve-api-key-file", key_file,
              "--print")
    assert API_KEY not in out and "_plugins/_ml/connectors/_create" in out and "<connector_id>" in out


# --- through the fake cluster, with the official clients ----------------------------------------
@pytest.mark.process
def test_elasticsearch_calls_serve_through_the_registered_endpoint(keyed_server, key_file, client):
    pytest.importorskip("elasticsearch")
    cluster = InferenceCluster("elasticsearch")
    try:
        out = cli("es", "register-inference", "stair-img", "--serve-url", keyed_server.url, "--serve-api-key-file",
                  key_file, "--url", cluster.url)
        assert API_KEY not in out and json.loads(out)["inference_id"] == "stair-img"
        (put,) = [b for m, p, b in cluster.requests if p == "/_inference/sparse_embedding/stair-img"]
        assert put["service_settings"]["secret_parameters"] == {"api_key": API_KEY}
        # what Elasticsearch does at ingest (image references) and at search (text)
        docs = cluster.es_infer("stair-img", ["red-car.png", "sub/red-again.png"], "ingest")
        assert docs == encoded(client, [{"image": {"path": "red-car.png"}}, {"image": {"path": "sub/red-again.png"}}])
        (query,) = cluster.es_infer("stair-img", ["a red car"], "search")
        assert query == encoded(client, [{"text": "a red car"}])[0]
        # a short text at ingest (the probe Elasticsearch may send when an endpoint is created) is text
        assert cluster.es_infer("stair-img", ["how big"], "ingest") == encoded(client, [{"text": "how big"}])
        # POST _inference through the client
        from elasticsearch import Elasticsearch

        es = Elasticsearch(cluster.url)
        res = es.perform_request("POST", "/_inference/sparse_embedding/stair-img", body={"input": ["red"]},
                                 headers={"content-type": "application/json", "accept": "application/json"}).body
        assert res["sparse_embedding"][0]["embedding"] == {"red": 1.0}
        # ingest pipeline with the inference processor, and the semantic_text index
        cli("es", "create-pipeline", "stair-pipe", "--inference-id", "stair-img", "--url", cluster.url)
        sim = es.perform_request("POST", "/_ingest/pipeline/stair-pipe/_simulate",
                                 body={"docs": [{"_source": {"image_ref": "blue-sea.png"}}]},
                                 headers={"content-type": "application/json", "accept": "application/json"}).body
        assert sim["docs"][0]["doc"]["_source"]["image"] == encoded(client, [{"image": {"path": "blue-sea.png"}}])[0]
        cli("es", "create-index", "photos", "--inference-id", "stair-img", "--search-inference-id", "stair-txt",
            "--url", cluster.url)
        mapping = cluster.fake.indices["photos"]["mappings"]["properties"]["image"]
        assert mapping == {"type": "semantic_text", "inference_id": "stair-img", "search_inference_id": "stair-txt"}
        # a wrong key in the cluster's secret: the call fails with the server's 401
        cluster.endpoints["stair-img"]["service_settings"]["secret_parameters"]["api_key"] = "x" * 20
        with pytest.raises(urllib.error.HTTPError) as e:
            cluster.es_infer("stair-img", ["red"], "search")
        assert e.value.code == 401
    finally:
        cluster.close()


@pytest.mark.process
def test_opensearch_calls_serve_through_the_registered_model(keyed_server, key_file, client):
    pytest.importorskip("opensearchpy")
    cluster = InferenceCluster("opensearch")
    try:
        out = json.loads(cli("opensearch", "register-model", "--serve-url", keyed_server.url, "--kind", "image",
                             "--serve-api-key-file", key_file, "--url", cluster.url))
        assert out["connector_id"] == "conn1" and out["model_id"] == "model1" and out["deployed"]
        text = json.loads(cli("opensearch", "register-model", "--serve-url", keyed_server.url, "--kind", "text",
                              "--serve-api-key-file", key_file, "--url", cluster.url))
        # the sparse_encoding processor's call (documents: image references) and neural_sparse's (query text)
        assert cluster.os_predict("model1", ["red-car.png", "green-tree.png"]) == encoded(
            client, [{"image": {"path": "red-car.png"}}, {"image": {"path": "green-tree.png"}}])
        assert cluster.os_predict(text["model_id"], ["blue sea"]) == encoded(client, [{"text": "blue sea"}])
        from opensearchpy import OpenSearch

        osc = OpenSearch(cluster.url)
        res = osc.transport.perform_request("POST", f"/_plugins/_ml/models/{text['model_id']}/_predict",
                                            body={"text_docs": ["red"]})
        assert res["inference_results"][0]["output"][0]["dataAsMap"]["response"] == [{"red": 1.0}]
        cli("opensearch", "create-pipeline", "sparse-pipe", "--model-id", "model1", "--url", cluster.url)
        sim = osc.transport.perform_request("POST", "/_ingest/pipeline/sparse-pipe/_simulate",
                                            body={"docs": [{"_source": {"image_ref": "white-snow.png"}}]})
        assert sim["docs"][0]["doc"]["_source"]["image"] == encoded(client, [{"image": {"path": "white-snow.png"}}])[0]
        cli("opensearch", "create-search-pipeline", "two-phase", "--url", cluster.url)
        assert "neural_sparse_two_phase_processor" in cluster.search_pipelines["two-phase"]["request_processors"][0]
        cli("opensearch", "create-index", "photos", "--pipeline", "sparse-pipe", "--url", cluster.url)
        assert cluster.fake.indices["photos"]["mappings"]["properties"]["image"] == {"type": "rank_features"}
        assert cluster.fake.indices["photos"]["settings"]["index"]["default_pipeline"] == "sparse-pipe"
    finally:
        cluster.close()


# --- real clusters (skipped here) ---------------------------------------------------------------
@pytest.mark.cluster
def test_real_elasticsearch_custom_service(keyed_server, key_file):
    url = os.environ.get("STAIR_ES_TEST_INFERENCE_URL")
    if not url:
        pytest.skip("needs Elasticsearch 8.19+/9.x with the custom inference service at $STAIR_ES_TEST_INFERENCE_URL "
                    "that can reach 127.0.0.1; none can be installed on this machine (no internet, no Docker) and "
                    "the noida-db emulator has no _inference API")
    cli("es", "register-inference", "stair-test", "--serve-url", keyed_server.url, "--serve-api-key-file", key_file,
        "--documents", "text", "--url", url)
    req = urllib.request.Request(f"{url}/_inference/sparse_embedding/stair-test", data=b'{"input": ["red"]}',
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["sparse_embedding"][0]["embedding"] == {"red": 1.0}


@pytest.mark.cluster
def test_real_opensearch_remote_model(keyed_server, key_file):
    url = os.environ.get("STAIR_OS_TEST_INFERENCE_URL")
    if not url:
        pytest.skip("needs OpenSearch 2.11+ with ml-commons (trusted connector endpoints allowing 127.0.0.1) at "
                    "$STAIR_OS_TEST_INFERENCE_URL; none can be installed here and the osmem-server emulator has "
                    "no ml-commons")
    out = json.loads(cli("opensearch", "register-model", "--serve-url", keyed_server.url, "--kind", "text",
                         "--serve-api-key-file", key_file, "--url", url))
    req = urllib.request.Request(f"{url}/_plugins/_ml/models/{out['model_id']}/_predict",
                                 data=b'{"text_docs": ["red"]}', headers={"Content-Type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert json.loads(r.read())["inference_results"][0]["output"][0]["dataAsMap"]["response"] == [{"red": 1.0}]


# --- /v1/search on a cluster backend -------------------------------------------------------------
@pytest.mark.parametrize("flavor", ["elasticsearch", "opensearch"])
def test_search_and_explain_on_a_cluster_backend(flavor, home, image_root):
    """The same requests as on the embedded engine, through the official client to the fake node."""
    pytest.importorskip("elasticsearch" if flavor == "elasticsearch" else "opensearchpy")
    from fastapi.testclient import TestClient

    from backends.fake_cluster import FakeCluster
    from stair_es.backends.base import get_backend
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.serve.service import Service

    with FakeCluster(flavor) as node:
        backend = get_backend(flavor, urls=[node.url])
        local = EmbeddedBackend(home)
        info = local.index_info("pics")
        backend.create_index("pics", info.schema)
        ids = ["red-car", "green-tree", "blue-sea", "white-snow", "night-sky"]
        assert not backend.ingest("pics", [local.get("pics", i) for i in ids]).failures
        local.close()
        cfg = make_config(home, image_root, backend=flavor, backend_options={"urls": [node.url]})
        with TestClient(create_app(cfg, service=Service(cfg, backend=backend))) as c:
            r = c.post("/v1/search", json={"text": "red", "top_k": 3, "where": ["year<2015"]})
            assert r.status_code == 200, r.text
            hits = r.json()["hits"]
            assert hits[0]["id"] == "red-car" and all(h["metadata"]["year"] < 2015 for h in hits)
            e = c.post("/v1/explain", json={"text": "red", "id": "red-car"}).json()
            assert abs(e["sum_of_contributions"] - hits[0]["score"]) < 1e-3 * hits[0]["score"]
            r = c.post("/v1/search", json={"image": {"path": "sub/red-again.png"}, "caption_weight": 0, "top_k": 1})
            assert r.json()["hits"][0]["id"] == "red-car"
            assert c.get("/v1/thumbnail/pics/red-car").status_code == 200
            assert c.post("/v1/search", json={"index": "nope", "text": "red"}).status_code == 404


def test_shipped_templates_match_the_builders():
    """mappings/inference/*.json (installed as stair_es.mappings) are what the commands send."""
    from importlib import resources

    folder = resources.files("stair_es.mappings").joinpath("inference")
    shipped = {p.name: json.loads(p.read_text("utf-8")) for p in folder.iterdir() if p.name.endswith(".json")}
    assert shipped == integ.templates(), "regenerate with: python -m stair_es.serve.integrations mappings/inference"
