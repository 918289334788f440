"""The HTTP API of `stair-es serve`: encode, search, explain, indices, health and OpenAPI."""

from __future__ import annotations

import math
import re

from .conftest import COLOURS, b64, png_bytes


def test_health_ready_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == ["fake-color"]
    assert "api_key" in ready.json() and ready.json()["api_key"] is False
    docs = client.get("/docs")
    assert docs.status_code == 200 and "cdn." not in docs.text  # Swagger UI from the package, not a CDN
    js = re.search(r"src=['\"]([^'\"]+swagger-ui-bundle\.js)", docs.text).group(1)
    assert client.get(js).status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for p in ("/v1/encode", "/v1/search", "/v1/explain", "/v1/indices", "/v1/elasticsearch/sparse_embedding",
              "/v1/opensearch/sparse_encoding"):
        assert p in paths


def test_encode_texts_and_images_in_order(client, image_root):
    raw = png_bytes((10, 20, 230))
    r = client.post("/v1/encode", json={"inputs": [
        {"text": "a red car"},
        {"image": {"path": "red-car.png"}},
        {"image": {"base64": b64(raw)}},
        {"image": {"base64": "data:image/png;base64," + b64(raw)}},
        {"image": {"path": "sub/red-again.png"}},
    ]})
    assert r.status_code == 200, r.text
    res = r.json()["results"]
    assert [x["kind"] for x in res] == ["text", "image", "image", "image", "image"]
    assert res[0]["tokens"] == {"a": 1.0, "red": 1.0, "car": 1.0}
    assert max(res[1]["tokens"], key=lambda t: res[1]["tokens"][t] if t in ("red", "green", "blue") else -1) == "red"
    assert res[2]["tokens"] == res[3]["tokens"] and res[2]["tokens"]["blue"] > res[2]["tokens"]["red"]
    assert res[4]["tokens"]["red"] > res[4]["tokens"]["green"]


def test_encode_top_k_limits_tokens(client):
    r = client.post("/v1/encode", json={"inputs": [{"image": {"path": "red-car.png"}}], "top_k": 2})
    assert len(r.json()["results"][0]["tokens"]) == 2


def test_models_load_once(client):
    svc = client.app.state.service
    enc = svc.encoder()
    for _ in range(3):
        client.post("/v1/encode", json={"inputs": [{"text": "red"}]})
        client.post("/v1/search", json={"text": "red"})
    assert svc.encoder() is enc
    # the index was built with the same encoder config: its queries use the very same instance
    assert svc.query_encoder("pics") is enc and svc.loaded_models() == ["fake-color"]


def test_search_ranks_by_dot_product_and_explain_sums_to_score(client):
    r = client.post("/v1/search", json={"index": "pics", "text": "red", "top_k": 3})
    assert r.status_code == 200, r.text
    hits = r.json()["hits"]
    assert hits[0]["id"] == "red-car"
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    e = client.post("/v1/explain", json={"index": "pics", "text": "red", "id": "red-car"}).json()
    assert math.isclose(e["score"], hits[0]["score"], rel_tol=1e-6)
    assert math.isclose(sum(c["contribution"] for c in e["contributions"]), e["score"], rel_tol=1e-6)


def test_search_with_explain_filters_and_token_map(client):
    r = client.post("/v1/search", json={"text": "blue", "where": ["kind=landscape", "year>=2010"], "explain": True})
    body = r.json()
    assert {h["id"] for h in body["hits"]} <= {"blue-sea", "white-snow"}
    assert body["hits"][0]["id"] == "blue-sea"
    for h in body["hits"]:
        assert math.isclose(h["explanation"]["sum_of_contributions"], h["score"], rel_tol=1e-6)
    r = client.post("/v1/search", json={"tokens": {"green": 1.0, "dark": 1.0}, "caption_weight": 0, "top_k": 1})
    assert r.json()["hits"][0]["id"] == "green-tree"  # green and (mean brightness < 128) dark
    r = client.post("/v1/search", json={"text": "red", "exclude": ["car"], "token_field": "caption"})
    assert "red-car" not in [h["id"] for h in r.json()["hits"]]


def test_query_by_example_image(client):
    for image in ({"path": "sub/red-again.png"}, {"base64": b64(png_bytes((15, 35, 210)))}):
        r = client.post("/v1/search", json={"image": image, "caption_weight": 0, "top_k": 2})
        assert r.status_code == 200, r.text
    assert r.json()["hits"][0]["id"] == "blue-sea"
    r = client.post("/v1/search", json={"image": {"path": "sub/red-again.png"}, "caption_weight": 0, "top_k": 1})
    assert r.json()["hits"][0]["id"] == "red-car"


def test_indices_lists_fields_and_counts(client):
    (ix,) = client.get("/v1/indices").json()["indices"]
    assert ix["name"] == "pics" and ix["doc_count"] == len(COLOURS) + 1
    assert ix["fields"] == {"kind": "keyword", "year": "number"} and ix["encoder"] == "fake-color"


def test_thumbnails_only_for_images_under_the_roots(client):
    r = client.get("/v1/thumbnail/pics/red-car?size=64")
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg" and r.content[:2] == b"\xff\xd8"
    r = client.get("/v1/thumbnail/pics/no-picture")  # its source lies outside the image root
    assert r.status_code == 404 and "image roots" in r.json()["error"]["message"]
    assert client.get("/v1/thumbnail/pics/nope").status_code == 404
