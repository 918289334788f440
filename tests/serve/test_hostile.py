"""Issue 26: `stair-es serve` under hostile input and overload. Each test here failed on the
code before its fix: text that is not valid Unicode, unbounded work per request, foreign Host
headers, disclosure without a key, 503s without Retry-After."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from stair_es.serve.app import create_app

from .conftest import make_config


def err(r, status, code=2):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["code"] == code and e["message"] and e["type"]
    return e["message"]


@pytest.fixture
def lenient(config):
    """A client that gets the server's 500s as answers instead of exceptions."""
    with TestClient(create_app(config), raise_server_exceptions=False) as c:
        yield c


# --- finding 4: lone surrogates and invalid UTF-8 -> 400 naming the field ----------------------
@pytest.mark.parametrize("route, body, field", [
    ("/v1/search", b'{"text": "red\\ud800"}', "text"),
    ("/v1/search", b'{"text": "red", "where": ["kind=\\udc00"]}', "where[0]"),
    ("/v1/search", b'{"tokens": {"\\ud800": 1}}', "tokens (a key)"),
    ("/v1/search", b'{"text": "r\xffed car"}', "text"),
    ("/v1/explain", b'{"text": "red", "id": "red-car\\uDBFF"}', "id"),
    ("/v1/encode", b'{"inputs": [{"text": "a"}, {"text": "a\\ud800 car"}]}', "inputs[1].text"),
    ("/v1/encode", b'{"inputs": [{"image": {"path": "red\xc3(.png"}}]}', "inputs[0].image.path"),
    ("/v1/opensearch/sparse_encoding", b'["a\\ud800"]', "body[0]"),
    ("/v1/elasticsearch/sparse_embedding", b'{"input": ["ok", "a\\udfff"]}', "input[1]"),
])
def test_text_that_is_not_unicode_is_refused_naming_the_field(lenient, caplog, route, body, field):
    caplog.set_level(logging.WARNING)
    r = lenient.post(route, content=body, headers={"content-type": "application/json"})
    msg = err(r, 400)
    assert msg.startswith(field + ":") and "surrogate" in msg, msg
    assert "Traceback" not in caplog.text and "internal error" not in caplog.text
    ok = lenient.post("/v1/search", json={"text": "red", "top_k": 1})
    assert ok.status_code == 200


def test_valid_unicode_and_escaped_pairs_pass(lenient):
    # an escaped surrogate *pair* is one valid character; a literal backslash-u is just text
    r = lenient.post("/v1/search", content=b'{"text": "red \\ud83d\\ude97 \\\\ud800"}',
                     headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text


def test_body_not_utf8_and_not_json(lenient):
    r = lenient.post("/v1/search", content=b"\xff\xfe{", headers={"content-type": "application/json"})
    assert "not valid UTF-8 (byte 0xff at offset 0)" in err(r, 400)


# --- finding 1: bounded work per request, refused before any work starts -----------------------
@pytest.mark.parametrize("body, words", [
    ({"text": "red", "where": ["kind=vehicle"] * 65}, "where: filters: 65; the limit is 64 per request (--max-filters)"),
    ({"text": "red", "require": ["red"] * 600, "exclude": ["blue"] * 425},
     "require + exclude + exclude_query: tokens: 1025; the limit is 1024 per request (--max-clause-tokens)"),
    ({"tokens": {f"t{i}": 1.0 for i in range(2049)}}, "tokens: entries in the token map: 2049; the limit is 2048"),
    ({"text": "red", "top_k": 1001}, "top_k: 1001; the limit is 1000 per request (--max-top-k)"),
    ({"text": "red", "top_k": 101, "explain": True}, "explain: hits to explain (top_k): 101; the limit is 100"),
    ({"text": "red", "expr": "red " * 1100}, "expr: characters: 4400; the limit is 4096"),
])
def test_search_limits_name_the_cap(client, body, words):
    for route in ("/v1/search", "/v1/explain"):
        b = dict(body, id="red-car") if route == "/v1/explain" else body
        assert words in err(client.post(route, json=b), 400)
    assert client.post("/v1/search", json={"text": "red", "where": ["kind=vehicle"] * 64}).status_code == 200


def test_a_million_filters_are_refused_before_any_work(home, image_root, monkeypatch):
    """Finding 1 of issue 26: 1,000,000 `where` filters (a 14 MB body) ran 38 s and answered 200."""
    cfg = make_config(home, image_root)
    app = create_app(cfg)
    calls = []
    with TestClient(app) as c:
        svc = app.state.service
        monkeypatch.setattr(svc, "prepare_searches", lambda bodies: calls.append(bodies) or [])
        body = {"text": "red", "where": ["year>=1999"] * 1_000_000}
        r = c.post("/v1/search", json=body)
        # refused while parsing, at the 65th filter: the count is "more than", never a million built
        assert "where: filters: more than 64; the limit is 64 per request (--max-filters)" in err(r, 400)
        r = c.post("/v1/search", json={"text": "red", "require": ["red"] * 1_000_000})
        assert "--max-clause-tokens" in err(r, 400)
        r = c.post("/v1/encode", json={"inputs": [{"text": "a"}] * 200_000})
        assert "inputs: more than 64; the limit is 64" in err(r, 400)
        r = c.post("/v1/opensearch/sparse_encoding", json=["a"] * 100_000)
        assert "the limit is 64 per request (--max-inputs)" in err(r, 400)
    assert calls == []  # nothing was prepared: the refusal came before the work


def test_limits_are_configurable(home, image_root):
    cfg = make_config(home, image_root, max_filters=1, max_query_tokens=2, max_explain_hits=3)
    with TestClient(create_app(cfg)) as c:
        assert "the limit is 1" in err(c.post("/v1/search", json={"text": "red", "where": ["kind=a", "kind=b"]}), 400)
        assert "the limit is 2" in err(c.post("/v1/search", json={"tokens": {"red": 1, "car": 1, "sky": 1}}), 400)
        assert c.post("/v1/search", json={"text": "red", "top_k": 3, "explain": True}).status_code == 200
        assert "the limit is 3" in err(c.post("/v1/search", json={"text": "red", "top_k": 4, "explain": True}), 400)


def test_cli_limits_options_and_env(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    out = CliRunner().invoke(cli, ["serve", "--help"]).output
    for option in ("--max-filters", "--max-clause-tokens", "--max-query-tokens", "--max-top-k", "--max-explain-hits",
                   "STAIR_ES_SERVE_MAX_FILTERS"):
        assert option in out
    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app.state.config))
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    monkeypatch.setenv("STAIR_ES_SERVE_MAX_FILTERS", "7")
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--max-explain-hits", "9",
                                 "--allowed-host", "search.lan", "--port", "8181", "--public-docs"])
    assert r.exit_code == 0, r.output
    assert started[0].bind_host == "127.0.0.1" and list(started[0].allowed_hosts) == ["search.lan"]
    assert started[0].public_docs is True
    assert started[0].max_filters == 7 and started[0].max_explain_hits == 9 and started[0].max_top_k == 1000


# --- finding 2: Host allow-list against DNS rebinding; security headers on HTML -----------------
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "[::2]:80"])
def test_foreign_host_header_is_refused(client, host):
    for method, route in (("GET", "/v1/indices"), ("POST", "/v1/search"), ("GET", "/"), ("GET", "/docs")):
        r = client.request(method, route, json={"text": "red"} if method == "POST" else None, headers={"Host": host})
        msg = err(r, 400)
        assert "--allowed-host" in msg and "is not a name this server answers to" in msg
        assert "hits" not in r.text and "pics" not in r.text


@pytest.mark.parametrize("host", ["localhost", "localhost:8080", "127.0.0.1:9", "[::1]:8080", "LOCALHOST."])
def test_loopback_names_answer(client, host):
    assert client.get("/v1/indices", headers={"Host": host}).status_code == 200


def test_allowed_host_option(home, image_root):
    with TestClient(create_app(make_config(home, image_root, allowed_hosts=["search.lan"])),
                    base_url="http://search.lan:8080") as c:
        assert c.get("/v1/indices").status_code == 200
        assert c.get("/v1/indices", headers={"Host": "other.lan"}).status_code == 400
    with TestClient(create_app(make_config(home, image_root, allowed_hosts=["*"]))) as c:
        assert c.get("/v1/indices", headers={"Host": "anything.example"}).status_code == 200
    # the bind address is allowed by default
    with TestClient(create_app(make_config(home, image_root, allowed_hosts=[], bind_host="10.1.2.3")),
                    base_url="http://10.1.2.3:8080") as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/healthz", headers={"Host": "testserver"}).status_code == 400


def test_html_answers_carry_security_headers(client):
    for route in ("/", "/?q=red", "/docs", "/redoc"):
        r = client.get(route)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]  # no inline script but by hash
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
    assert "'sha256-" in client.get("/docs").headers["content-security-policy"]  # Swagger UI's start-up script


# --- finding 5: nothing disclosed without a key ----------------------------------------------------
KEYED_ROUTES = [("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"), ("GET", "/docs/oauth2-redirect"),
                ("GET", "/static/app.js"), ("GET", "/static/style.css"), ("GET", "/static-offline-docs/swagger-ui.css"),
                ("GET", "/"), ("GET", "/v1/indices"), ("GET", "/v1/thumbnail/pics/red-car"), ("GET", "/v1/nothing"),
                ("POST", "/v1/search"), ("POST", "/v1/nothing")]


def test_with_a_key_only_the_probes_are_public(home, image_root):
    from .conftest import API_KEY

    with TestClient(create_app(make_config(home, image_root, api_key=API_KEY))) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json() == {"status": "ready"}  # no paths, no settings, no models
        for method, route in KEYED_ROUTES:
            r = c.request(method, route, json={"text": "red"} if method == "POST" else None)
            assert r.status_code == 401, (route, r.status_code)
            assert r.json()["error"]["code"] == 2 and r.headers["www-authenticate"] == "Bearer"
        key = {"Authorization": f"Bearer {API_KEY}"}
        for route in ("/docs", "/redoc", "/openapi.json", "/static/app.js", "/static-offline-docs/swagger-ui.css"):
            assert c.get(route, headers=key).status_code == 200, route
        assert c.get("/readyz", headers=key).json()["models"] == ["fake-color"]


def test_public_docs_option(home, image_root):
    from .conftest import API_KEY

    with TestClient(create_app(make_config(home, image_root, api_key=API_KEY, public_docs=True))) as c:
        for route in ("/docs", "/redoc", "/openapi.json", "/static-offline-docs/swagger-ui.css"):
            assert c.get(route).status_code == 200, route
        for route in ("/v1/indices", "/static/app.js", "/"):
            assert c.get(route).status_code == 401, route


def test_no_server_paths_in_answers(client, image_root, home):
    secret = str(image_root.parent)  # the tests' tmp folder: every server path lies under it
    ready = client.get("/readyz").json()
    assert ready["image_roots"] == 1
    answers = [client.get("/readyz"), client.get("/v1/indices"),
               client.post("/v1/search", json={"text": "red", "top_k": 10}),
               client.post("/v1/search", json={"index": "nope", "text": "red"}),
               client.post("/v1/explain", json={"text": "red", "id": "ghost"}),
               client.post("/v1/encode", json={"inputs": [{"image": {"path": "escape.png"}}]}),
               client.get("/v1/thumbnail/pics/no-picture"), client.get("/v1/thumbnail/nope/x")]
    for r in answers:
        assert secret not in r.text and str(home) not in r.text, r.text
    hits = answers[2].json()["hits"]
    sources = {h["id"]: h["source"] for h in hits}
    assert sources["red-car"] == "red-car.png"  # relative to its image root
    assert sources["no-picture"] == "secret.png"  # outside every root: its file name only
    nope = answers[3].json()["error"]
    assert nope["code"] == 4 and "nope" in nope["message"]


def test_404_bodies_use_the_documented_code(client):
    for r in (client.get("/v1/nothing"), client.post("/v1/nothing", json={}), client.get("/nothing/at/all"),
              client.post("/v1/search", json={"index": "nope", "text": "red"}), client.get("/v1/thumbnail/pics/ghost")):
        assert r.status_code == 404 and r.json()["error"]["code"] == 4, r.text


# --- finding 7 (part): shed and not-ready answers say when to retry ------------------------------
def test_busy_answers_carry_retry_after(home, image_root):
    import asyncio
    import threading

    import httpx

    from fakes import ColorEncoder
    from stair_es.encoders.base import register_encoder

    gate = threading.Event()

    class BlockedEncoder(ColorEncoder):
        name = "blocked-fake"

        def encode_texts(self, texts, **kw):
            gate.wait(10)
            return super().encode_texts(texts, **kw)

    register_encoder("blocked-fake", BlockedEncoder)
    app = create_app(make_config(home, image_root, encoder="blocked-fake", workers=1, max_queue=0,
                                 load_encoder_at_start=False))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            first = asyncio.create_task(http.post("/v1/encode", json={"inputs": [{"text": "red"}]}))
            await asyncio.sleep(0.3)  # the first holds the only worker
            second = await http.post("/v1/encode", json={"inputs": [{"text": "red"}]})
            gate.set()
            return await first, second

    first, second = asyncio.run(main())
    assert first.status_code == 200
    assert second.status_code == 429 and second.json()["error"]["code"] == 5
    # Retry-After in whole seconds (HTTP), the exact delay in ms beside it (header and body)
    assert int(second.headers["retry-after"]) >= 1
    ms = int(second.headers["retry-after-ms"])
    assert ms >= 1 and second.json()["error"]["retry_after_ms"] == ms
    assert int(second.headers["retry-after"]) * 1000 >= ms


def test_not_ready_carries_retry_after(home, image_root, monkeypatch):
    from stair_es.errors import BackendError

    app = create_app(make_config(home, image_root, load_encoder_at_start=False))
    with TestClient(app) as c:
        def down():
            raise BackendError(f"cannot list indices in {home}")
        monkeypatch.setattr(app.state.service, "ready", down)
        r = c.get("/readyz")
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert str(home) not in r.text and "<index home>" in r.text
