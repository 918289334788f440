"""`stair-es serve` as a real uvicorn process on 127.0.0.1: it starts from the CLI, answers,
survives a slow client (408 for that client, others served meanwhile) and never logs the key."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from stair_es.backends.embedded import EmbeddedBackend
from stair_es.encoders.base import get_encoder
from stair_es.schema import Document, IndexSchema

from .conftest import API_KEY

pytestmark = pytest.mark.process


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url, body=None, key=API_KEY, timeout=30):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def served(tmp_path):
    home = tmp_path / "home"
    backend = EmbeddedBackend(home)
    backend.create_index("words", IndexSchema(fields={"kind": "keyword"}, encoder={"name": "bow"}))
    bow = get_encoder("bow")
    texts = {"car": "a red car on the road", "tree": "a green tree in a park", "sea": "the blue sea at dawn"}
    backend.ingest("words", [Document(id=k, vectors={"image": bow.encode_texts([t])[0]}, caption=t,
                                      metadata={"kind": k}) for k, t in texts.items()])
    backend.close()
    port = _port()
    env = {**os.environ, "STAIR_ES_SERVE_API_KEY": API_KEY}
    proc = subprocess.Popen([sys.executable, "-m", "stair_es.cli.main", "serve", "--home", str(home), "--encoder", "bow",
                             "--port", str(port), "--body-timeout", "1", "--index", "words", "--workers", "2"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"stair-es serve exited: {proc.stdout.read()}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.skip("stair-es serve did not answer within 60 s on this machine")
            time.sleep(0.2)
    yield url, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_real_process_serves_searches_and_survives_a_slow_client(served):
    url, proc = served
    status, ready = _call(url + "/readyz")
    assert status == 200 and set(ready["models"]) == {"bow"}  # the encode encoder and the index's, loaded at start
    status, res = _call(url + "/v1/search", {"text": "red car"})
    assert status == 200 and res["hits"][0]["id"] == "car"

    # a client that announces 200 bytes and sends 10, then stalls
    slow = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    slow.sendall(b"POST /v1/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 200\r\n\r\n{\"text\": ")
    t0 = time.monotonic()
    status, res = _call(url + "/v1/search", {"text": "blue sea"})  # others are served meanwhile
    assert status == 200 and res["hits"][0]["id"] == "sea"
    assert time.monotonic() - t0 < 1.0
    slow.settimeout(10)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = slow.recv(4096)
        if not chunk:
            break
        answer += chunk
    slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"did not arrive within 1 s" in answer

    assert _call(url + "/v1/search", {"text": "red"}, key="wrong-" + API_KEY)[0] == 401
    assert _call(url + "/v1/search", {"text": "tree"})[1]["hits"][0]["id"] == "tree"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=15)[0]
    assert proc.returncode == 0, out
    assert "127.0.0.1" in out and API_KEY not in out and "Traceback" not in out
