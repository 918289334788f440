"""Bad input and hostile clients: each gets a JSON error with the right status and the CLI's
code, and the server keeps serving the next request."""

from __future__ import annotations

import functools
import http.server
import logging
import threading

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from stair_es.errors import InvalidInputError
from stair_es.serve.app import create_app
from stair_es.serve.security import check_bind, key_matches, load_api_key

from .conftest import API_KEY, b64, make_config, png_bytes


def err(r, status, code=2):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["code"] == code and e["message"] and e["type"]
    return e["message"]


def still_serving(client):
    r = client.post("/v1/search", json={"text": "red", "top_k": 1})
    assert r.status_code == 200 and r.json()["hits"][0]["id"] == "red-car"


# --- malformed requests -------------------------------------------------------------------------
@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b'{"text": "red", "top_k": "many"}', 422, "top_k"),
    (b'{"text": "red", "top_k": 0}', 422, "top_k"),
    (b'{"text": "red", "colour": "x"}', 422, "colour"),
    (b'{"text": 5}', 422, "text"),
    (b'[1, 2]', 422, "body"),
    (b'{"text": "red", "top_k": 100000}', 400, "top_k"),
    (b'{"text": "red", "tokens": {"red": 1}}', 400, "one query"),
    (b'{}', 400, "one query"),
    (b'{"text": "red", "where": ["nosuchfield=1"]}', 400, "nosuchfield"),
    (b'{"tokens": {"red": -1}}', 400, "red"),
])
def test_malformed_search_requests(client, body, status, words):
    r = client.post("/v1/search", content=body, headers={"content-type": "application/json"})
    assert words in err(r, status)
    still_serving(client)


def test_unknown_index_and_document(client):
    assert "nope" in err(client.post("/v1/search", json={"index": "nope", "text": "red"}), 404, code=4)
    assert "ghost" in err(client.post("/v1/explain", json={"text": "red", "id": "ghost"}), 404, code=4)
    assert "Bad-Name" in err(client.post("/v1/search", json={"index": "Bad-Name", "text": "red"}), 400)
    err(client.get("/v1/nothing"), 404, code=4)  # the documented code of every 404
    err(client.get("/v1/search"), 405)


def test_encode_limits(home, image_root):
    cfg = make_config(home, image_root, max_inputs=3, max_text_chars=50, max_body_bytes=20_000)
    with TestClient(create_app(cfg)) as c:
        assert "inputs: 4; the limit is 3 per request (--max-inputs)" in err(c.post("/v1/encode", json={"inputs": [{"text": "a"}] * 4}), 400)
        assert "limit is 50" in err(c.post("/v1/encode", json={"inputs": [{"text": "x" * 51}]}), 400)
        assert "exactly one" in err(c.post("/v1/encode", json={"inputs": [{"text": "a", "image": {"path": "x.png"}}]}), 400)
        assert "empty" in err(c.post("/v1/encode", json={"inputs": [{"text": "  "}]}), 400)
        huge = {"inputs": [{"image": {"base64": "A" * 30_000}}]}
        assert "larger than 20000 bytes" in err(c.post("/v1/encode", json=huge), 413)
        # a body sent without Content-Length (chunked) is counted as it arrives
        chunks = (b'{"inputs": [{"text": "' + b"y" * 1000 + b'"}]}' for _ in range(30))
        err(c.post("/v1/encode", content=chunks, headers={"content-type": "application/json"}), 413)
        assert c.post("/v1/encode", json={"inputs": [{"text": "red"}]}).status_code == 200


@pytest.mark.parametrize("image, status, words", [
    ({"base64": "!!!not base64!!!"}, 422, "not valid base64"),
    ({"base64": b64(b"GIF89a this is no image at all")}, 422, "not an image"),
    ({"base64": b64(png_bytes((1, 2, 3))[:60])}, 422, "base64 image"),
    ({"base64": "data:text/plain,hello"}, 422, "data: URI"),
    ({"path": "broken.png"}, 422, "broken.png"),
    ({"path": "notes.txt"}, 422, "notes.txt"),
    ({"path": "missing.png"}, 400, "no such file"),
    ({"path": "sub"}, 400, "not a file"),
    ({}, 400, "exactly one"),
    ({"path": "red-car.png", "base64": "AAAA"}, 400, "exactly one"),
])
def test_images_that_fail(client, image, status, words):
    for route, body in (("/v1/encode", {"inputs": [{"image": image}]}), ("/v1/search", {"image": image})):
        msg = err(client.post(route, json=body), status)
        assert words in msg, msg
        assert "/tmp" not in msg  # the server's real paths are never echoed
    still_serving(client)


# --- paths confined to the roots ----------------------------------------------------------------
@pytest.mark.parametrize("path, words", [
    ("../outside/secret.png", "'..'"),
    ("sub/../../outside/secret.png", "'..'"),
    ("escape.png", "outside the image root"),
    ("escape-dir/secret.png", "outside the image root"),
    ("/etc/passwd", "absolute"),
    ("\\etc\\passwd", "absolute"),
    ("C:/Windows/win.ini", "absolute"),
    ("red\x00.png", "NUL"),
])
def test_path_traversal_refused(client, path, words):
    for route, body in (("/v1/encode", {"inputs": [{"image": {"path": path}}]}), ("/v1/search", {"image": {"path": path}})):
        msg = err(client.post(route, json=body), 403)
        assert words in msg, msg
    still_serving(client)


def test_paths_refused_without_roots(home, image_root):
    with TestClient(create_app(make_config(home, image_root, image_roots=[]))) as c:
        assert "no image roots" in err(c.post("/v1/encode", json={"inputs": [{"image": {"path": "red-car.png"}}]}), 403)
        assert c.get("/v1/thumbnail/pics/red-car").status_code == 404


# --- image URLs: refused unless allowed; fetched from a local server when allowed ---------------
@pytest.fixture
def image_http(image_root):
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(image_root))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_image_urls_refused_by_default(client, image_http):
    msg = err(client.post("/v1/encode", json={"inputs": [{"image": {"url": f"{image_http}/red-car.png"}}]}), 400)
    assert "--allow-image-urls" in msg


def test_image_urls_fetched_when_allowed(home, image_root, image_http):
    with TestClient(create_app(make_config(home, image_root, allow_image_urls=True, allow_private_urls=True, max_image_bytes=5000))) as c:
        by_url = c.post("/v1/encode", json={"inputs": [{"image": {"url": f"{image_http}/red-car.png"}}]})
        by_path = c.post("/v1/encode", json={"inputs": [{"image": {"path": "red-car.png"}}]})
        assert by_url.status_code == 200 and by_url.json()["results"] == by_path.json()["results"]
        r = c.post("/v1/search", json={"image": {"url": f"{image_http}/sub/red-again.png"}, "top_k": 1, "caption_weight": 0})
        assert r.json()["hits"][0]["id"] == "red-car"
        assert "HTTP 404" in err(c.post("/v1/encode", json={"inputs": [{"image": {"url": f"{image_http}/none.png"}}]}), 422)
        assert "http://" in err(c.post("/v1/encode", json={"inputs": [{"image": {"url": "file:///etc/passwd"}}]}), 400)
        port_closed = "http://127.0.0.1:9/x.png"
        assert "cannot fetch" in err(c.post("/v1/encode", json={"inputs": [{"image": {"url": port_closed}}]}), 422)
        (image_root / "big.png").write_bytes(png_bytes((5, 5, 5), size=(400, 400)) + b"\0" * 6000)
        assert "cap" in err(c.post("/v1/encode", json={"inputs": [{"image": {"url": f"{image_http}/big.png"}}]}), 422)


# --- API key -----------------------------------------------------------------------------------
def test_api_key_required_when_configured(home, image_root, caplog):
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(make_config(home, image_root, api_key=API_KEY))) as c:
        body = {"inputs": [{"text": "red"}]}
        assert "requires an API key" in err(c.post("/v1/encode", json=body), 401)
        r = c.post("/v1/encode", json=body, headers={"Authorization": "Bearer wrong-key-wrong-key-wrong"})
        assert err(r, 401) == "wrong API key" and r.headers["www-authenticate"] == "Bearer"
        err(c.post("/v1/encode", json=body, headers={"Authorization": f"Basic {API_KEY}"}), 401)
        err(c.get("/v1/indices", headers={"X-API-Key": API_KEY[:-1]}), 401)
        err(c.get("/", params={"q": "red"}), 401)
        err(c.get("/v1/thumbnail/pics/red-car"), 401)
        assert c.post("/v1/encode", json=body, headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        assert c.get("/v1/indices", headers={"X-API-Key": API_KEY}).status_code == 200
        assert c.get("/healthz").status_code == 200  # probes stay open
        assert c.get("/readyz").json() == {"status": "ready"}  # without the key: ready or not, nothing else
        ready = c.get("/readyz", headers={"X-API-Key": API_KEY}).json()
        assert ready["api_key"] is True and API_KEY not in str(ready)
    assert API_KEY not in caplog.text


def test_key_comparison_and_loading(tmp_path, monkeypatch):
    assert key_matches(API_KEY, API_KEY) and not key_matches(API_KEY, API_KEY + "x") and not key_matches(API_KEY, None)
    assert not key_matches(API_KEY, "\udcff")  # undecodable header bytes are a mismatch, not a crash
    f = tmp_path / "key"
    f.write_text(API_KEY + "\n")
    assert load_api_key(f) == API_KEY
    f.write_text("short")
    with pytest.raises(InvalidInputError, match="16 characters"):
        load_api_key(f)
    f.write_text("")
    with pytest.raises(InvalidInputError, match="empty"):
        load_api_key(f)
    monkeypatch.setenv("STAIR_ES_SERVE_API_KEY", API_KEY)
    assert load_api_key(None) == API_KEY


def test_bind_beyond_loopback_needs_a_key():
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    with pytest.raises(InvalidInputError, match="API key"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", API_KEY)


def test_cli_refuses_public_bind_without_key(tmp_path, monkeypatch):
    from stair_es.cli.main import cli

    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    r = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--home", str(tmp_path), "--encoder", "bow"])
    assert r.exit_code == 2 and "API key" in r.output and "Traceback" not in r.output


# --- a full worker pool and queue answer 429 at once instead of queueing without end -------------
@pytest.mark.process
def test_busy_server_answers_429_and_recovers(home, image_root):
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from fakes import ColorEncoder
    from stair_es.encoders.base import register_encoder

    from .conftest import ThreadServer

    class SlowEncoder(ColorEncoder):
        name = "slow-fake"

        def encode_texts(self, texts, **kw):
            time.sleep(1.0)
            return super().encode_texts(texts, **kw)

    register_encoder("slow-fake", SlowEncoder)
    srv = ThreadServer(create_app(make_config(home, image_root, encoder="slow-fake", workers=1, max_queue=0)))
    try:
        def call(_):
            return httpx.post(srv.url + "/v1/encode", json={"inputs": [{"text": "red"}]}, timeout=30)

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(call, range(4)))
        codes = sorted(r.status_code for r in answers)
        assert codes.count(200) >= 1 and 429 in codes, codes
        busy = next(r for r in answers if r.status_code == 429).json()["error"]
        assert busy["code"] == 5 and "busy" in busy["message"]
        assert call(0).status_code == 200  # and it recovers
    finally:
        srv.close()
