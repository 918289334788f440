"""Issue 26 under overload: admission (a bounded first-come-first-served queue, 429 with
Retry-After beyond it, 504 past --request-timeout with queued work dropped), uvicorn's bare
503 replaced, image URL fetches kept off the workers (total deadline, a cap, redirects
re-checked, credentials never echoed), a deadline on request headers (finding 6) and JSON
bodies never parsed past the limits (finding 1). Each test failed on the code before."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
import tracemalloc

import httpx
import pytest

from fakes import ColorEncoder
from stair_es.encoders.base import register_encoder
from stair_es.serve.app import create_app

from .conftest import ThreadServer, make_config, png_bytes


def err(r, status, code):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["code"] == code and e["message"] and e["type"]
    return e


class Gate:
    """An encoder whose encode_texts blocks until released, recording the texts in the order it gets them."""

    def __init__(self, name: str):
        self.open = threading.Event()
        self.seen: list[str] = []
        gate = self

        class Gated(ColorEncoder):
            def encode_texts(self, texts, **kw):
                gate.seen.extend(texts)
                if not any(t == "warm up" for t in texts):
                    gate.open.wait(20)
                return super().encode_texts(texts, **kw)

        Gated.name = name
        register_encoder(name, Gated)


def asgi(app):
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1", timeout=30)


async def until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


# --- finding 7: admission control --------------------------------------------------------------
def test_queue_is_first_come_first_served_and_sheds_beyond_it(home, image_root):
    gate = Gate("gate-fifo")
    app = create_app(make_config(home, image_root, encoder="gate-fifo", workers=1, max_queue=3,
                                 queue_timeout_ms=None, load_encoder_at_start=False))  # only --max-queue counts

    async def main():
        async with asgi(app) as http:
            enc = lambda t: http.post("/v1/encode", json={"inputs": [{"text": t}]})  # noqa: E731
            first = asyncio.create_task(enc("first"))
            await until(lambda: gate.seen == ["first"])  # it holds the only worker
            queued = []
            for t in ("q1", "q2", "q3"):  # arrive one after the other
                queued.append(asyncio.create_task(enc(t)))
                await asyncio.sleep(0.05)
            shed = await enc("shed")  # the queue (3) is full: refused at once, not queued
            # refused before its body is read: not even a malformed one is parsed while the queue is full
            unread = await http.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"})
            gate.open.set()
            return await first, [await q for q in queued], shed, unread

    first, queued, shed, unread = asyncio.run(main())
    assert unread.status_code == 429
    assert first.status_code == 200 and [q.status_code for q in queued] == [200, 200, 200]
    assert gate.seen == ["first", "q1", "q2", "q3"]  # served in arrival order; "shed" never reached the model
    e = err(shed, 429, 5)
    assert e["type"] == "ServerBusyError" and "--max-queue 3" in e["message"]
    ms = int(shed.headers["retry-after-ms"])
    assert e["retry_after_ms"] == ms >= 1 and int(shed.headers["retry-after"]) == -(-ms // 1000)


def test_request_timeout_drops_queued_work_and_abandons_running_work(home, image_root):
    gate = Gate("gate-timeout")
    app = create_app(make_config(home, image_root, encoder="gate-timeout", workers=1, max_queue=4,
                                 request_timeout=0.6, load_encoder_at_start=False))

    async def main():
        async with asgi(app) as http:
            enc = lambda t: http.post("/v1/encode", json={"inputs": [{"text": t}]})  # noqa: E731
            running = asyncio.create_task(enc("running"))
            await until(lambda: gate.seen == ["running"])
            queued = await enc("queued")  # waits behind it, past the deadline
            running = await running
            gate.open.set()
            await asyncio.sleep(0.2)  # the worker finishes the abandoned one, then is free again
            after = await enc("after")
            return running, queued, after

    running, queued, after = asyncio.run(main())
    e = err(queued, 504, 5)
    assert e["type"] == "RequestTimeoutError" and "left the queue before any work" in e["message"]
    assert "--request-timeout 0.6 s" in e["message"] and int(queued.headers["retry-after"]) >= 1
    assert "answer was abandoned" in err(running, 504, 5)["message"]
    assert after.status_code == 200
    assert gate.seen == ["running", "after"]  # the queued request's work never started


def test_batched_search_past_its_deadline_is_dropped_before_its_search(home, image_root):
    gate = Gate("fake-color")  # the index's query encoder: the batch's preparation blocks
    searched = []
    try:
        app = create_app(make_config(home, image_root, workers=1, max_queue=8, request_timeout=0.5,
                                     load_encoder_at_start=False))
        backend = app.state.service.backend
        real = backend.search  # what every search path ends in (the batcher holds the service's own methods)
        backend.search = lambda *a, **kw: searched.append(a) or real(*a, **kw)

        async def main():
            async with asgi(app) as http:
                first = asyncio.create_task(http.post("/v1/search", json={"text": "red"}))
                await until(lambda: gate.seen == ["red"])
                late = await http.post("/v1/search", json={"text": "blue"})  # queued behind the blocked batch
                gate.open.set()
                first = await first
                return first, late, await http.post("/v1/search", json={"text": "green"})

        first, late, after = asyncio.run(main())
    finally:
        register_encoder("fake-color", ColorEncoder)
    assert err(first, 504, 5)["type"] == "RequestTimeoutError"
    assert err(late, 504, 5)["type"] == "RequestTimeoutError"
    assert "blue" not in gate.seen  # neither was searched once its caller gave up; a later search is
    assert after.status_code == 200 and len(searched) == 1


def test_in_flight_gate_answers_429_with_retry_after_instead_of_a_bare_503(home, image_root):
    gate = Gate("gate-inflight")
    app = create_app(make_config(home, image_root, encoder="gate-inflight", workers=1, max_queue=10, max_in_flight=1,
                                 load_encoder_at_start=False))

    async def main():
        async with asgi(app) as http:
            held = asyncio.create_task(http.post("/v1/encode", json={"inputs": [{"text": "hold"}]}))
            await until(lambda: gate.seen == ["hold"])
            refused = await http.get("/v1/indices")
            health = await http.get("/healthz")
            gate.open.set()
            return await held, refused, health

    held, refused, health = asyncio.run(main())
    assert held.status_code == 200 and health.status_code == 200  # the liveness probe is never shed
    e = err(refused, 429, 5)
    assert "busy" in e["message"] and refused.headers["retry-after"] and refused.headers["retry-after-ms"]


def test_cli_runs_uvicorn_without_its_bare_503_and_with_a_header_deadline(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append((app.state.config, kw)))
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--request-timeout", "2.5",
                                 "--header-timeout", "3", "--max-url-fetches", "2", "--url-timeout", "4"])
    assert r.exit_code == 0, r.output
    config, kw = started[0]
    assert "limit_concurrency" not in kw and kw["http"].__name__.startswith("HeaderDeadline")
    assert (config.request_timeout, config.header_timeout, config.max_url_fetches, config.url_timeout) == (2.5, 3, 2, 4)
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--request-timeout", "0"])
    assert started[1][0].request_timeout is None


def test_cli_loop_nice_option_and_its_environment_variable(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app.state.config))
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    monkeypatch.delenv("STAIR_ES_SERVE_LOOP_NICE", raising=False)
    base = ["serve", "--home", str(tmp_path), "--encoder", "bow"]
    assert CliRunner().invoke(cli, base).exit_code == 0
    assert CliRunner().invoke(cli, [*base, "--loop-nice", "-5"]).exit_code == 0
    monkeypatch.setenv("STAIR_ES_SERVE_LOOP_NICE", "3")
    assert CliRunner().invoke(cli, base).exit_code == 0
    assert [c.loop_nice for c in started] == [0, -5, 3]
    monkeypatch.delenv("STAIR_ES_SERVE_LOOP_REALTIME", raising=False)
    assert CliRunner().invoke(cli, [*base, "--loop-realtime"]).exit_code == 0
    assert [c.loop_realtime for c in started] == [False, False, False, True]
    bad = CliRunner().invoke(cli, [*base, "--loop-nice", "-30"])
    assert bad.exit_code == 2 and "--loop-nice" in bad.output


def test_cli_warm_makes_every_embedded_reader_warm_itself(tmp_path, monkeypatch):
    import os

    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    # `serve --warm` sets STAIR_ES_WARM in this process: setenv first, so the test's end restores the
    # variable as it was (a delenv of an absent variable records nothing, and the engine tests that
    # run later in the same process would all warm their indices)
    monkeypatch.setenv("STAIR_ES_WARM", "0")
    monkeypatch.delenv("STAIR_ES_WARM")
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow"])
    assert r.exit_code == 0, r.output
    assert "STAIR_ES_WARM" not in os.environ
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--warm"])
    assert r.exit_code == 0, r.output
    assert os.environ["STAIR_ES_WARM"] == "1"  # EngineIndex.open warms each reader (tests/engine/test_warm.py)


# --- finding 6: a connection that sends half a header is closed --------------------------------
@pytest.mark.process
@pytest.mark.parametrize("base", ["httptools", "h11"])
def test_half_a_header_is_closed_at_the_header_deadline(config, base):
    import importlib

    from stair_es.serve.protocol import header_deadline_protocol

    mod, cls = {"httptools": ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
                "h11": ("uvicorn.protocols.http.h11_impl", "H11Protocol")}[base]
    # 1.5 s, not less: on a loaded machine the loop may parse a complete header late, and the
    # slow-body check below must not be cut by the header deadline for that reason
    proto = header_deadline_protocol(1.5, getattr(importlib.import_module(mod), cls))
    srv = ThreadServer(create_app(config), http=proto, timeout_keep_alive=30)
    try:
        for opening in (b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ", b""):  # half a header; nothing
            with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
                s.sendall(opening)
                assert s.recv(100) == b""  # closed by the server (before the test's own 20 s timeout)
        # a complete request on a keep-alive connection is answered, and the next half one closed again
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert b'"status":"ok"' in s.recv(1000)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            assert s.recv(100) == b""
        # a slow body is the body guard's (--body-timeout), not cut by the header deadline
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
            s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 15\r\n\r\n{\"te")
            time.sleep(2.0)  # past the header deadline
            s.sendall(b'xt": "red"}')
            assert s.recv(1000).startswith(b"HTTP/1.1 200")
    finally:
        srv.close()


# --- finding 1: a capped body is never parsed past the cap ---------------------------------------
def test_parsing_stops_at_the_cap_and_allocates_little():
    from stair_es.serve.jsonbody import caps_of, parse_capped
    from stair_es.serve.service import LimitExceededError, ServeConfig

    caps, other = caps_of(ServeConfig())
    text = json.dumps({"text": "red", "where": ["year>=1999"] * 1_000_000})  # 14 MB
    tracemalloc.start()
    try:
        with pytest.raises(LimitExceededError, match=r"where: filters: more than 64; the limit is 64"):
            parse_capped(text, caps, other)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 256 * 1024, peak  # json.loads built a million strings (tens of MB) before any check
    # nesting, a top-level list, a token map and the values of a whole body are bounded too
    deep = "[" * 100_000 + "]" * 100_000 + " " * 70_000
    with pytest.raises(LimitExceededError, match="deeper than 32"):
        parse_capped(deep, caps, other)
    with pytest.raises(LimitExceededError, match=r"inputs: more than 64; .*--max-inputs"):
        parse_capped(json.dumps(["a"] * 100_000), caps, other)
    with pytest.raises(LimitExceededError, match=r"tokens: entries in the token map: more than 2048"):
        parse_capped(json.dumps({"tokens": {f"t{i}": 1 for i in range(100_000)}}), caps, other)
    with pytest.raises(LimitExceededError, match="more than 2048 items"):
        parse_capped(json.dumps({"text": "a", "other": list(range(100_000))}), caps, other)
    # what fits is parsed exactly as json.loads does, small or large
    body = {"text": "r\u00e9d \U0001F697", "where": ["a=1"] * 64, "tokens": {"x": 1.5e-3, "y": -2}, "n": None,
            "b": [True, False, {"z": []}], "image": {"base64": "A" * 200_000}}
    assert parse_capped(json.dumps(body), caps, other) == body
    assert parse_capped(json.dumps(body), caps, other, small=0) == body


def test_huge_nested_or_listed_bodies_are_400_not_500(client):
    r = client.post("/v1/search", content=b"[" * 200_000 + b"]" * 200_000, headers={"content-type": "application/json"})
    assert "deeper than 32" in err(r, 400, 2)["message"]
    r = client.post("/v1/search", content=b"[" * 30_000 + b"]" * 30_000, headers={"content-type": "application/json"})
    assert "deeper than 32" in err(r, 400, 2)["message"]  # a small body, through json.loads
    r = client.post("/v1/opensearch/sparse_encoding", json=["a"] * 100_000)
    assert "--max-inputs" in err(r, 400, 2)["message"]
    r = client.post("/v1/search", content=b'{"text": "red", "where": [' + b'"a=1",' * 20_000 + b'"a=1"] ',
                    headers={"content-type": "application/json"})
    assert "--max-filters" in err(r, 400, 2)["message"]
    assert client.post("/v1/search", json={"text": "red", "where": ["kind=vehicle"]}).status_code == 200


# --- finding 3: slow upstreams are isolated from encoding and search ----------------------------
class Trickle:
    """A raw HTTP server on 127.0.0.1 that answers 200 and then one byte a second, forever."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn):
        try:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\n")
            while not self.stop.wait(1.0):
                conn.sendall(b"x")
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def trickle():
    t = Trickle()
    yield t
    t.close()


def test_slow_image_urls_hold_neither_encoding_nor_search(home, image_root, trickle):
    app = create_app(make_config(home, image_root, allow_image_urls=True, allow_private_urls=True, workers=1, max_url_fetches=2,
                                 url_timeout=2.0, load_encoder_at_start=False))
    url = f"http://127.0.0.1:{trickle.port}/slow.png"

    async def main():
        async with asgi(app) as http:
            slow = [asyncio.create_task(http.post("/v1/encode", json={"inputs": [{"image": {"url": url}}]}))
                    for _ in range(3)]
            await until(lambda: trickle.connections >= 2)  # both fetch slots are held by the trickling host
            text = await http.post("/v1/encode", json={"inputs": [{"text": "red"}]})
            search = await http.post("/v1/search", json={"text": "red", "top_k": 1})
            pending = sum(not t.done() for t in slow)
            return text, search, pending, [await t for t in slow]

    text, search, pending, slow = asyncio.run(main())
    assert text.status_code == 200 and search.status_code == 200
    assert pending == 3  # answered while every slow fetch was still going on
    msgs = [err(r, r.status_code, r.json()["error"]["code"])["message"] for r in slow]
    assert all(m.startswith("input 0: image URL http://127.0.0.1:") for m in msgs if "within 2 s" in m), msgs
    # cut at the total deadline although a byte arrived every second; the third waited for a slot within it
    assert sum("not fetched within 2 s" in m for m in msgs) >= 2, msgs
    assert all(r.status_code in (422, 503) for r in slow)
    assert trickle.connections <= 3


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/to-file":
            self.send_response(302)
            self.send_header("Location", "file:///etc/passwd")
            self.end_headers()
        elif self.path.startswith("/to-ok"):
            self.send_response(302)
            self.send_header("Location", "/ok.png")
            self.end_headers()
        elif self.path == "/ok.png":
            body = png_bytes((220, 30, 30))
            self.server.auth_seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.server.auth_seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.end_headers()


@pytest.fixture
def upstream():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.auth_seen = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_redirects_are_rechecked_and_credentials_never_echoed(home, image_root, upstream):
    base = f"http://127.0.0.1:{upstream.server_port}"
    app = create_app(make_config(home, image_root, allow_image_urls=True, allow_private_urls=True, load_encoder_at_start=False))

    async def main():
        async with asgi(app) as http:
            post = lambda u: http.post("/v1/encode", json={"inputs": [{"image": {"url": u}}]})  # noqa: E731
            return (await post(base + "/to-file"), await post(base + "/to-ok?sig=s3cr3t-sig"),
                    await post(base.replace("http://", "http://alice:pa55word@") + "/missing.png?token=t0ken"),
                    await http.post("/v1/opensearch/sparse_encoding?kind=image", json=[base + "/ok.png"]))

    to_file, to_ok, missing, cluster = asyncio.run(main())
    assert "redirected to a URL that is not http(s)" in err(to_file, 422, 2)["message"]
    assert to_ok.status_code == 200 and to_ok.json()["results"][0]["kind"] == "image"
    msg = err(missing, 422, 2)["message"]
    assert "HTTP 404" in msg and "/missing.png" in msg
    for secret in ("alice", "pa55word", "t0ken"):
        assert secret not in missing.text
    assert cluster.status_code == 200 and cluster.json()[0]  # the cluster endpoints fetch off the workers too
    import base64

    assert "Basic " + base64.b64encode(b"alice:pa55word").decode() in upstream.auth_seen  # as HTTP Basic, to that host


def test_url_fetches_never_run_on_a_worker(home, image_root, upstream, monkeypatch):
    import stair_es.serve.inputs as inputs

    def no(*a, **kw):
        raise AssertionError("an image URL was fetched on a worker thread")

    monkeypatch.setattr(inputs, "fetch_blocking", no)
    app = create_app(make_config(home, image_root, allow_image_urls=True, allow_private_urls=True, load_encoder_at_start=False))
    url = f"http://127.0.0.1:{upstream.server_port}/ok.png"

    async def main():
        async with asgi(app) as http:
            return (await http.post("/v1/encode", json={"inputs": [{"image": {"url": url}}]}),
                    await http.post("/v1/search", json={"image": {"url": url}, "top_k": 1}),
                    await http.post("/v1/elasticsearch/sparse_embedding", json={"input": [url], "input_type": "image"}))

    for r in asyncio.run(main()):
        assert r.status_code == 200, r.text


@pytest.mark.skipif(not hasattr(__import__("os"), "setpriority"), reason="per-thread nice values are a Linux feature")
def test_worker_threads_can_run_below_the_event_loop(home, image_root):
    import os

    from stair_es.serve.admission import Admission

    base = os.getpriority(os.PRIO_PROCESS, 0)
    adm = Admission(1, 1, worker_nice=3)
    try:
        assert asyncio.run(adm.run(os.getpriority, os.PRIO_PROCESS, 0)) == min(19, base + 3)
    finally:
        adm.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the event loop's thread keeps its own


@pytest.mark.skipif(not hasattr(__import__("os"), "setpriority"), reason="per-thread nice values are a Linux feature")
def test_search_threads_run_worker_nice_below_the_loop_not_twice_that():
    """Preparation and search both run on the search threads, --worker-nice below the loop: a
    thread inherits its starter's nice value, and they once ran 2 x --worker-nice below."""
    import functools
    import os

    from stair_es.serve.admission import lower_thread_priority
    from stair_es.serve.batching import Batcher

    base = os.getpriority(os.PRIO_PROCESS, 0)
    b = Batcher(lambda items: [(os.getpriority(os.PRIO_PROCESS, 0), x) for x in items],
                lambda p: (p[0], os.getpriority(os.PRIO_PROCESS, 0)), workers=2,
                thread_init=functools.partial(lower_thread_priority, 3))

    async def main():
        return await asyncio.gather(*(b.submit(i) for i in range(6)))

    try:
        for (prepare, search), _ in asyncio.run(main()):
            assert prepare == search == min(19, base + 3)
    finally:
        b.close()
    assert os.getpriority(os.PRIO_PROCESS, 0) == base


@pytest.mark.skipif(not hasattr(__import__("os"), "setpriority"), reason="per-thread nice values are a Linux feature")
def test_the_event_loops_thread_can_run_at_its_own_nice_value(home, image_root, monkeypatch, caplog):
    """STAIR_ES_SERVE_LOOP_NICE sets the nice value of the thread that accepts, sheds and answers;
    where the kernel refuses (a negative value without root or CAP_SYS_NICE) it says so and runs on."""
    import os

    from fastapi.testclient import TestClient

    import stair_es.serve.admission as admission

    target = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 2)  # raising one's own nice value is always allowed
    monkeypatch.setenv("STAIR_ES_SERVE_LOOP_NICE", str(target))
    config = make_config(home, image_root)
    assert config.loop_nice == target
    with TestClient(create_app(config)) as c:
        assert c.portal.call(os.getpriority, os.PRIO_PROCESS, 0) == target  # the event loop's thread
        assert c.get("/healthz").status_code == 200

    def refused(*a):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(admission.os, "setpriority", refused)
    caplog.clear()
    with TestClient(create_app(make_config(home, image_root, loop_nice=-5))) as c:
        assert c.post("/v1/search", json={"text": "red"}).status_code == 200
    assert any("cannot run at nice -5" in r.getMessage() and "CAP_SYS_NICE" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("STAIR_ES_SERVE_LOOP_NICE", "high")
    with pytest.raises(Exception, match="STAIR_ES_SERVE_LOOP_NICE='high' is not an integer"):
        make_config(home, image_root)


def test_the_event_loops_thread_can_run_real_time_and_its_searches_do_not(home, image_root, monkeypatch, caplog):
    """--loop-realtime: the thread that accepts, sheds and answers runs in SCHED_FIFO while the app
    runs (it then runs at once when it wakes, not after the next scheduler tick), the search and
    worker threads it starts stay ordinary (SCHED_RESET_ON_FORK), and it is put back when the app
    stops. Where the kernel refuses, a warning says what it needs and the server runs on."""
    import os

    from fastapi.testclient import TestClient

    import stair_es.serve.admission as admission

    def policies(c):
        rt = c.app.state.runtime
        threads = [t.native_id for b in rt._batchers for t in b._threads] + [t.ident and t.native_id
                                                                          for t in rt.admission._pool._threads]
        return (c.portal.call(os.sched_getscheduler, 0) & ~os.SCHED_RESET_ON_FORK,
                {os.sched_getscheduler(tid) for tid in threads if tid})

    monkeypatch.setenv("STAIR_ES_SERVE_LOOP_REALTIME", "1")
    config = make_config(home, image_root)
    assert config.loop_realtime
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        allowed = True
    except PermissionError:
        allowed = False
    if allowed:
        with TestClient(create_app(config)) as c:
            assert c.post("/v1/search", json={"text": "red"}).status_code == 200
            assert c.post("/v1/encode", json={"inputs": [{"text": "red"}]}).status_code == 200
            loop_policy, others = policies(c)
            portal_thread = c.portal
            assert loop_policy == os.SCHED_FIFO and others == {os.SCHED_OTHER}
        assert portal_thread is not None

    def refused(*a):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(admission.os, "sched_setscheduler", refused)
    caplog.clear()
    with TestClient(create_app(config)) as c:
        assert c.post("/v1/search", json={"text": "red"}).status_code == 200
        assert c.portal.call(os.sched_getscheduler, 0) == os.SCHED_OTHER
    assert any("--loop-realtime" in r.getMessage() and "CAP_SYS_NICE" in r.getMessage() for r in caplog.records)
    if not allowed:
        pytest.skip("this process may not use SCHED_FIFO (needs root or CAP_SYS_NICE): only the refusal was checked")


def test_removed_scheduling_settings_are_named_at_start_not_ignored(home, image_root, monkeypatch, caplog):
    """$STAIR_ES_SERVE_WORKER_POLICY, $STAIR_ES_SERVE_LOOP_SLICE_US and $STAIR_ES_SERVE_SWITCH_INTERVAL_MS were
    measured, did not pay and are no longer read: a server started with one set says so once per setting,
    and serves as usual with Python's own switch interval."""
    import sys

    from fastapi.testclient import TestClient

    before = sys.getswitchinterval()
    monkeypatch.setenv("STAIR_ES_SERVE_WORKER_POLICY", "batch")
    monkeypatch.setenv("STAIR_ES_SERVE_LOOP_SLICE_US", "200")
    monkeypatch.setenv("STAIR_ES_SERVE_SWITCH_INTERVAL_MS", "1")
    caplog.clear()
    with TestClient(create_app(make_config(home, image_root))) as c:
        assert c.post("/v1/search", json={"text": "red"}).status_code == 200
        assert sys.getswitchinterval() == before
    warned = [r.getMessage() for r in caplog.records if "no longer read" in r.getMessage()]
    assert len(warned) == 3 and "STAIR_ES_SERVE_WORKER_POLICY" in warned[0] and "unset it" in warned[0]
    assert "STAIR_ES_SERVE_LOOP_SLICE_US" in warned[1] and "STAIR_ES_SERVE_SWITCH_INTERVAL_MS" in warned[2]


def test_probes_and_warm_up_never_wait_behind_requests(home, image_root, caplog):
    """A readiness probe queued behind a full worker pool would call a busy server dead; a
    warm-up cut by --request-timeout would leave a slow-loading model unloaded."""
    gate = Gate("gate-probe")

    class SlowStart(ColorEncoder):
        def encode_texts(self, texts, **kw):
            time.sleep(0.5)  # longer than the request timeout below
            return super().encode_texts(texts, **kw)

    SlowStart.name = "slow-start"
    register_encoder("slow-start", SlowStart)
    app = create_app(make_config(home, image_root, encoder="slow-start", request_timeout=0.2))
    from fastapi.testclient import TestClient

    caplog.set_level("WARNING")
    with TestClient(app):  # the warm-up (0.5 s per text) ran to the end despite the 0.2 s request timeout
        assert "slow-start" in app.state.service.loaded_models()
    assert "could not be loaded" not in caplog.text and "RequestTimeoutError" not in caplog.text, caplog.text

    app = create_app(make_config(home, image_root, encoder="gate-probe", workers=1, max_queue=0,
                                 load_encoder_at_start=False))

    async def main():
        async with asgi(app) as http:
            held = asyncio.create_task(http.post("/v1/encode", json={"inputs": [{"text": "hold"}]}))
            await until(lambda: gate.seen == ["hold"])
            busy = await http.post("/v1/encode", json={"inputs": [{"text": "more"}]})
            ready = await http.get("/readyz")
            gate.open.set()
            return await held, busy, ready

    held, busy, ready = asyncio.run(main())
    assert held.status_code == 200 and busy.status_code == 429
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


def test_max_queue_ms_sheds_when_the_wait_ahead_exceeds_the_budget():
    """The queue follows the server's speed: with 2 requests admitted on 1 worker at a mean
    service time of 100 ms, the next would wait about 200 ms; a 150 ms budget refuses it at
    once (429, naming --max-queue-ms) though --max-queue has room, and lets it in once the
    service times are short again."""
    from stair_es.serve.admission import Admission

    adm = Admission(workers=1, max_queue=64, max_wait_ms=150)
    try:
        adm._mean_s = 0.100
        adm.enter()
        adm.enter()
        assert adm.expected_wait_ms() == 200 and adm.full()
        with pytest.raises(Exception) as e:
            adm.enter()
        assert "--max-queue-ms 150" in str(e.value) and e.value.retry_after_ms >= 200
        adm.observe(0.0)
        for _ in range(40):  # faster service: the same queue is now within the budget
            adm.observe(0.010)
        assert not adm.full()
        adm.enter()
        assert adm.admitted == 3
    finally:
        adm.close()
    off = Admission(workers=1, max_queue=64)
    try:
        off._mean_s = 10.0
        for _ in range(5):
            off.enter()
        assert not off.full()  # without a budget, only --max-queue counts
    finally:
        off.close()


def test_queue_timeout_answers_429_to_requests_that_waited_too_long(home, image_root, monkeypatch):
    """--queue-timeout-ms: after a stall (here one search that holds the only worker for 0.4 s),
    the searches that queued meanwhile past 100 ms are answered 429 with Retry-After, the
    queue wait in Server-Timing and the option named, never run; the next search after them is
    served at once. Off by default."""
    from stair_es.backends.embedded import EmbeddedBackend

    calls, release = [], threading.Event()
    real = EmbeddedBackend.search

    def search(self, index, request):
        calls.append(1)
        if len(calls) == 1:
            release.wait(5)  # the stall
        return real(self, index, request)

    monkeypatch.setattr(EmbeddedBackend, "search", search)
    app = create_app(make_config(home, image_root, workers=1, max_queue=16, queue_timeout_ms=100))

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            stalled = asyncio.ensure_future(http.post("/v1/search", json={"tokens": {"red": 1.0}}))
            await asyncio.sleep(0.1)
            backlog = [asyncio.ensure_future(http.post("/v1/search", json={"tokens": {"red": 1.0}}))
                       for _ in range(3)]
            await asyncio.sleep(0.3)
            release.set()
            first, *late = await asyncio.gather(stalled, *backlog)
            after = await http.post("/v1/search", json={"tokens": {"red": 1.0}})
            return first, late, after

    first, late, after = asyncio.run(main())
    assert first.status_code == 200 and after.status_code == 200
    assert [r.status_code for r in late] == [429, 429, 429]
    for r in late:
        e = r.json()["error"]
        assert e["type"] == "ServerBusyError" and "--queue-timeout-ms 100" in e["message"]
        assert int(r.headers["retry-after"]) >= 1 and int(r.headers["retry-after-ms"]) == e["retry_after_ms"]
        assert float(r.headers["server-timing"].split("dur=")[1]) > 100
    assert len(calls) == 2  # the stalled search and the next one: never the three late ones
    assert app.state.runtime.batcher().overdue == 3


def test_queue_timeout_on_the_worker_pool():
    """The same rule on the pool of the other routes: a call that waited past the timeout for a
    worker is answered 429 and never runs; its slot goes to the next in line."""
    import threading

    from stair_es.serve.admission import Admission

    adm = Admission(workers=1, max_queue=8, queue_timeout_ms=50)
    gate, ran = threading.Event(), []

    async def main():
        hold = asyncio.ensure_future(adm.run(gate.wait, 5))
        await asyncio.sleep(0.02)
        waiting = asyncio.ensure_future(adm.run(ran.append, "late"))
        await asyncio.sleep(0.15)
        gate.set()
        results = await asyncio.gather(hold, waiting, return_exceptions=True)
        return results, await adm.run(ran.append, "next")

    try:
        (held, late), _ = asyncio.run(main())
    finally:
        adm.close()
    from stair_es.serve.errors import ServerBusyError

    assert held is True and isinstance(late, ServerBusyError) and late.status == 429
    assert "--queue-timeout-ms 50" in str(late) and ran == ["next"] and adm.overdue == 1
    assert adm.admitted == 0
    # a steady overload is refused at the door at once, not after waiting the timeout: with a mean
    # service time of 30 ms on 1 worker, a request behind 2 others would wait 60 ms > 50 ms
    door = Admission(workers=1, max_queue=64, queue_timeout_ms=50)
    try:
        door._mean_s = 0.030
        door.enter()
        door.enter()
        assert door.expected_wait_ms() == 60 and door.full()
        with pytest.raises(ServerBusyError, match="more than --queue-timeout-ms 50"):
            door.enter()
        door.max_wait_ms = 40.0  # the lower budget is the one named
        with pytest.raises(ServerBusyError, match="more than --max-queue-ms 40"):
            door.enter()
    finally:
        door.close()


def test_cli_queue_timeout_option_and_env(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    assert "--queue-timeout-ms" in CliRunner().invoke(cli, ["serve", "--help"]).output
    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app.state.config))
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow"])
    assert r.exit_code == 0, r.output
    monkeypatch.setenv("STAIR_ES_SERVE_QUEUE_TIMEOUT_MS", "75")
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--queue-timeout-ms", "40"])
    assert r.exit_code == 0, r.output
    for value in ("off", "0"):
        r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--queue-timeout-ms", value])
        assert r.exit_code == 0, r.output
    monkeypatch.delenv("STAIR_ES_SERVE_QUEUE_TIMEOUT_MS")
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow"])
    assert r.exit_code == 0, r.output
    # on by default (auto), as a bounded search queue is in Elasticsearch; off or 0 turns it off
    assert [c.queue_timeout_ms for c in started] == ["auto", 75.0, 40.0, None, None, "auto"]
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--queue-timeout-ms", "soon"])
    assert r.exit_code != 0 and "--queue-timeout-ms" in r.output and "'auto' or 'off'" in r.output


def test_queue_timeout_auto_follows_each_kind_of_works_service_time():
    """The default queue timeout (auto): 20 ms while a request takes less than 5 ms, 4 service
    times beyond, each kind of work (searches, the pool's encoding and the rest) by its own
    moving average: slow image encodings keep a queue of their own length while fast searches
    are held to 20 ms. Until a kind's service time is known (8 served) only --max-queue bounds
    it, so the first slow encodings are not refused on a guess. The door refuses what would wait
    past it, naming why; 429 from the queue names the timeout it waited past."""
    from stair_es.serve.admission import AUTO_FLOOR_MS, AUTO_MIN_SAMPLES, Admission
    from stair_es.serve.errors import ServerBusyError
    from stair_es.serve.service import ServeConfig

    assert ServeConfig().queue_timeout_ms == "auto"
    adm = Admission(workers=2, max_queue=64, queue_timeout_ms="auto")
    try:
        assert adm.queue_timeout("search") is None and adm.queue_timeout("pool") is None  # nothing measured yet
        for _ in range(AUTO_MIN_SAMPLES - 1):
            adm.observe(0.150, "pool")
        assert adm.queue_timeout("pool") is None
        adm.observe(0.150, "pool")  # the 8th: the encodings' own mean at once, not a guess slowly forgotten
        assert abs(adm.queue_timeout("pool") - 600) < 1 and adm.queue_timeout("search") is None
        for _ in range(100):
            adm.observe(0.150, "pool")  # image encodings of 150 ms
            adm.observe(0.004, "search")  # searches of 4 ms
        assert adm.queue_timeout("search") == AUTO_FLOOR_MS
        assert abs(adm.queue_timeout("pool") - 600) < 1
        adm._mean_s = 0.010
        for _ in range(6):
            adm.enter("pool")
        # 5 ahead x 10 ms / 2 workers = 25 ms: past a search's 20 ms, within an encoding's 600 ms
        assert adm.expected_wait_ms() == 25 and adm.full("search") and not adm.full("pool")
        with pytest.raises(ServerBusyError, match="auto"):
            adm.enter("search")
        adm.enter("pool")
        late = adm.overdue_error(1.3, "pool")
        assert late.status == 429 and "waited 1300 ms" in str(late) and "2 x its queue timeout of 600 ms" in str(late)
        # the door refuses what would wait past the timeout; one it let in is refused only past twice that
        assert adm.overdue_after_s("search") == 2 * AUTO_FLOOR_MS / 1000
        assert abs(adm.overdue_after_s("pool") - 1.2) < 1e-3
    finally:
        adm.close()
    with pytest.raises(Exception, match="'auto' or 'off'"):
        Admission(workers=1, max_queue=1, queue_timeout_ms="later")
    off = Admission(workers=1, max_queue=64, queue_timeout_ms=None)
    try:
        off._mean_s = 1.0
        for _ in range(10):
            off.enter()
        assert off.queue_timeout("search") is None and not off.full("search") and off.overdue_after_s() is None
    finally:
        off.close()
    fixed = Admission(workers=1, max_queue=64, queue_timeout_ms=30)
    try:
        assert fixed.overdue_after_s("search") == 0.030  # a number given is the limit as given
    finally:
        fixed.close()


@pytest.mark.process
def test_a_results_pages_thumbnails_queue_by_their_own_service_time(home, image_root, monkeypatch):
    """A results page asks for its thumbnails at once, after explain calls of about 2 ms taught the
    pool's auto queue timeout its 20 ms floor. Thumbnails (here 40 ms each, two workers) are their
    own kind of work: the burst waits up to about 120 ms in the queue and every thumbnail is
    served, where a shared timeout shed the last ones (429) on an otherwise idle server."""
    from stair_es.serve.admission import AUTO_MIN_SAMPLES
    from stair_es.serve.service import Service

    real = Service.thumbnail

    def slow_thumbnail(self, *args):
        time.sleep(0.04)
        return real(self, *args)

    monkeypatch.setattr(Service, "thumbnail", slow_thumbnail)
    app = create_app(make_config(home, image_root, workers=2, allowed_hosts=["127.0.0.1"]))
    srv = ThreadServer(app)
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            for _ in range(AUTO_MIN_SAMPLES + 4):  # fast work of the pool: its timeout is the 20 ms floor
                assert c.post("/v1/explain", json={"text": "red", "id": "red-car"}).status_code == 200
            assert app.state.runtime.admission.queue_timeout("pool") == 20.0

        def fetch(doc_id: str, out: list) -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as c:
                out.append(c.get(f"/v1/thumbnail/pics/{doc_id}", params={"size": 64}).status_code)

        for burst in range(2):  # before the thumbnails' own time is known, and after
            codes: list[int] = []
            threads = [threading.Thread(target=fetch, args=("red-car", codes)) for _ in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert codes == [200] * 6, (burst, codes)
        assert app.state.runtime.admission.queue_timeout("media") >= 4 * 40
    finally:
        srv.close()


def test_queue_timeout_auto_does_not_grow_when_other_processes_take_the_cores():
    """The auto queue timeout follows a request's own time, not the time its thread waited for a
    core: while another job takes a core and 4 ms searches take 20 ms of wall time, the searches'
    queue is still held to 20 ms (not 4 x 20 = 80 ms, which every answered request would wait on
    top). The drain time a refused client is told follows the wall time: the server's real speed."""
    from stair_es.serve.admission import AUTO_FLOOR_MS, Admission
    from stair_es.serve.errors import ServerBusyError

    adm = Admission(workers=2, max_queue=64, queue_timeout_ms="auto")
    slow = Admission(workers=2, max_queue=64, queue_timeout_ms="auto")
    try:
        for _ in range(100):
            adm.observe(0.020, "search", cpu_wait=0.016)  # 4 ms of its own, 16 ms waiting for a core
            slow.observe(0.020, "search")  # 20 ms of its own (a cluster waiting on the network, say)
            for a in (adm, slow):
                a.observe(0.150, "pool", cpu_wait=0.0)
        assert adm.queue_timeout("search") == AUTO_FLOOR_MS
        assert abs(slow.queue_timeout("search") - 80) < 0.5
        assert abs(adm.queue_timeout("pool") - 600) < 1
        for a in (adm, slow):
            for _ in range(2):
                a.enter("search")
        # the same wall times, so the same drain time for a refused client
        assert adm.retry_after_ms() == slow.retry_after_ms() > 0
        # a third would wait about 2 x 20 ms / 2 workers: past 20 ms, within 80 ms
        with pytest.raises(ServerBusyError, match="queue timeout of 20 ms"):
            adm.enter("search")
        slow.enter("search")
    finally:
        adm.close()
        slow.close()


def test_a_threads_wait_for_a_core_is_read_per_thread():
    import os
    import threading

    from stair_es.serve.admission import cpu_wait_s

    if not os.path.exists("/proc/thread-self/schedstat"):
        pytest.skip("no /proc/thread-self/schedstat here (Linux with schedstats): the wait counts as 0")
    a = cpu_wait_s()
    b = cpu_wait_s()
    assert 0.0 <= a <= b
    got = []
    t = threading.Thread(target=lambda: got.append(cpu_wait_s()))
    t.start()
    t.join()
    assert got and 0.0 <= got[0]
