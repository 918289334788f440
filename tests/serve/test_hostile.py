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
