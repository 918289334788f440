"""``POST /v1/search`` answered without FastAPI's routing (stair_es/serve/fastpath.py) gives the
same answers as FastAPI's route: status, error shape, headers and their order, body."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

import stair_es.serve.fastpath as fastpath
from stair_es.serve.app import create_app

from .conftest import API_KEY, make_config

BODIES = [
    {"index": "pics", "text": "red", "top_k": 3},
    {"tokens": {"green": 1.0, "dark": 1.0}, "caption_weight": 0, "top_k": 1},
    {"text": "blue", "where": ["kind=landscape", "year>=2010"], "explain": True},
    {"text": "red", "exclude": ["car"], "token_field": "caption"},
    {"text": "red", "top_k": "2"},  # coerced as FastAPI coerces it
    # errors: validation (FastAPI's 422 by fallback), the library's (404, 400), the limits (400)
    {"text": "red", "topk": 3},
    {"text": "red", "top_k": 0},
    {"text": 5},
    {"index": "nope", "text": "red"},
    {"text": "red", "where": ["kind=landscape"] * 65},
    {"text": "red", "top_k": 5000},
    {"text": "red", "where": ["year>>3"]},
    {"text": "", "tokens": None},
]
RAW = [b"[1, 2]", b"\"text\"", b"{\"text\": \"red\"", b"null", b""]


def answer(client, body) -> tuple[int, list[str], dict[str, str], object]:
    if isinstance(body, bytes):
        r = client.post("/v1/search", content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.post("/v1/search", json=body)
    data = r.json()
    if isinstance(data, dict):
        data.pop("took_ms", None)  # the only field that differs between two runs of one search
    names = [k.lower() for k in r.headers.keys()]
    assert int(r.headers["content-length"]) == len(r.content)
    # Server-Timing and (through took_ms) the length differ between two runs of one search
    values = {k.lower(): v for k, v in r.headers.items() if k.lower() not in ("server-timing", "content-length")}
    return r.status_code, names, values, data


@pytest.fixture
def clients(config):
    with TestClient(create_app(config), raise_server_exceptions=False) as fast, \
            TestClient(create_app(config, fast_path=False), raise_server_exceptions=False) as slow:
        yield fast, slow


@pytest.fixture
def taken(monkeypatch):
    """Counts the searches the fast path answered itself."""
    seen = []
    original = fastpath.search_answer

    async def counting(rt, body, scope):
        seen.append(body)
        return await original(rt, body, scope)

    monkeypatch.setattr(fastpath, "search_answer", counting)
    return seen


@pytest.mark.parametrize("body", BODIES + RAW, ids=lambda b: json.dumps(b)[:60] if not isinstance(b, bytes) else repr(b))
def test_same_answer_as_fastapi(clients, body):
    fast, slow = clients
    a, b = answer(fast, body), answer(slow, body)
    assert a == b
    if a[0] == 200:
        assert a[1][:3] == ["server-timing", "content-length", "content-type"]


def test_valid_searches_skip_fastapi_and_invalid_ones_reach_it(clients, taken):
    fast, _ = clients
    assert fast.post("/v1/search", json={"text": "red"}).status_code == 200
    assert len(taken) == 1
    r = fast.post("/v1/search", json={"text": "red", "topk": 1})
    assert r.status_code == 422 and "topk" in r.json()["error"]["message"]
    r = fast.post("/v1/search", json={"index": "nope", "text": "red"})
    assert r.status_code == 404 and r.json()["error"]["code"] == 4
    assert len(taken) == 2  # the 404 was the fast path's (a valid body); the 422 FastAPI's
    timing = fast.post("/v1/search", json={"text": "red"}).headers["server-timing"]
    assert "engine;dur=" in timing and "app;dur=" in timing


def test_the_key_is_still_required(home, image_root, taken):
    with TestClient(create_app(make_config(home, image_root, api_key=API_KEY))) as c:
        r = c.post("/v1/search", json={"text": "red"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = c.post("/v1/search", json={"text": "red"}, headers={"X-API-Key": API_KEY + "x"})
        assert r.status_code == 401
        assert not taken
        r = c.post("/v1/search", json={"text": "red"}, headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200 and len(taken) == 1


def test_an_unexpected_error_is_a_logged_500_in_the_one_shape(clients, monkeypatch, caplog):
    fast, slow = clients
    for c in (fast, slow):
        svc = c.app.state.service

        def broken(*a, **k):
            raise RuntimeError("boom at /secret/path")

        monkeypatch.setattr(svc, "prepare_searches", broken)
        monkeypatch.setattr(svc, "search_many", broken)
    caplog.clear()
    a = answer(fast, {"text": "red"})
    b = answer(slow, {"text": "red"})
    assert a == b and a[0] == 500
    assert a[3] == {"error": {"code": 70, "type": "InternalError", "message": "internal error: RuntimeError (see the server log)"}}
    assert "/secret/path" not in json.dumps(a[3])
    logged = [r for r in caplog.records if r.name == "stair_es.serve" and "internal error" in r.getMessage()]
    assert len(logged) >= 1 and all(r.exc_info for r in logged)


def test_an_error_in_a_gate_or_a_route_is_one_500_in_the_one_shape_logged_once(config, monkeypatch, caplog):
    """The gates run in front of FastAPI's error layer: what escapes them is answered there."""
    from stair_es.serve.middleware import BodyGuard

    with TestClient(create_app(config)) as c:
        def broken_indices():
            raise RuntimeError("boom")

        monkeypatch.setattr(c.app.state.service, "indices", broken_indices)
        caplog.clear()
        r = c.get("/v1/indices")  # FastAPI's error layer answers, then re-raises to the gates
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalError"
        assert len([x for x in caplog.records if "internal error" in x.getMessage()]) == 1

        def broken_parse(self, body):
            raise RuntimeError("boom in a gate")

        monkeypatch.setattr(BodyGuard, "parsed", broken_parse)
        caplog.clear()
        r = c.post("/v1/search", json={"text": "red"})
        assert r.status_code == 500 and r.json() == {"error": {
            "code": 70, "type": "InternalError", "message": "internal error: RuntimeError (see the server log)"}}
        logged = [x for x in caplog.records if "internal error" in x.getMessage()]
        assert len(logged) == 1 and logged[0].exc_info
