"""The HTTP protocol `stair-es serve` runs uvicorn with: a response's head and body leave in one
write (stair_es/serve/protocol.py), in order, for every kind of answer."""

from __future__ import annotations

import asyncio
import http.client
import importlib

import pytest

from stair_es.serve.app import create_app
from stair_es.serve.protocol import CoalescingTransport, header_deadline_protocol

from .conftest import ThreadServer


class FakeTransport:
    def __init__(self):
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data):
        assert not self.closed
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 1) if name == "peername" else default


HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


def test_head_and_body_leave_in_one_write_and_nothing_is_reordered_or_lost():
    async def main():
        loop = asyncio.get_running_loop()
        t = FakeTransport()
        c = CoalescingTransport(t, loop)
        c.write(HEAD)
        assert t.writes == []  # held for its body
        c.write(b"{}")
        assert t.writes == [HEAD + b"{}"]
        c.write(b"more")  # not a head: at once
        assert t.writes[-1] == b"more"
        c.write(HEAD)  # a head whose body does not come in this step: flushed at the next one
        await asyncio.sleep(0)
        assert t.writes[-1] == HEAD
        c.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        c.close()  # flushed before the close
        assert t.writes[-1] == b"HTTP/1.1 100 Continue\r\n\r\n" and t.closed
        assert c.get_extra_info("peername") == ("127.0.0.1", 1)  # the rest is the transport's
        c2 = CoalescingTransport(FakeTransport(), loop)
        c2.write(HEAD)
        c2._transport.closed = True  # the peer went away meanwhile: nothing written to a closed transport
        await asyncio.sleep(0)
        assert c2._transport.writes == []

    asyncio.run(main())


@pytest.mark.process
@pytest.mark.parametrize("base", ["httptools", "h11"])
def test_every_kind_of_answer_on_one_keep_alive_connection(config, base):
    mod, cls = {"httptools": ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol"),
                "h11": ("uvicorn.protocols.http.h11_impl", "H11Protocol")}[base]
    proto = header_deadline_protocol(10, getattr(importlib.import_module(mod), cls))
    srv = ThreadServer(create_app(config), http=proto)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=20)
        for method, path, body, status in [
            ("GET", "/healthz", None, 200),
            ("POST", "/v1/search", b'{"text": "red", "top_k": 2}', 200),
            ("HEAD", "/healthz", None, 405),
            ("POST", "/v1/search", b'{"text": "red", "topk": 2}', 422),
            ("GET", "/nope", None, 404),
            ("GET", "/", None, 200),  # the HTML page, with its security headers
            ("POST", "/v1/search", b'{"tokens": {"red": 1.0}}', 200),
        ]:
            conn.request(method, path, body=body, headers={"Host": "127.0.0.1", "Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            assert r.status == status, (method, path, r.status, data[:200])
            if method != "HEAD":
                assert int(r.getheader("content-length", len(data))) == len(data)
            if path == "/v1/search" and status == 200:
                assert data.startswith(b'{"total"') and r.getheader("server-timing")
        conn.close()
    finally:
        srv.close()


@pytest.mark.process
@pytest.mark.parametrize("debug_stats", [True, False])
def test_shed_answers_carry_the_loops_receive_time_only_with_debug_stats(home, image_root, debug_stats):
    """With --debug-stats a 429 of the door says when the event loop handed uvicorn its bytes and
    when it left (``Server-Timing: shed;desc="T_RECV T_SEND"``, this machine's monotonic clock), so
    a load generator can tell where a slow shed answer waited; without it, no clock is shown."""
    import time as _time

    import httpx

    from stair_es.serve.service import ServeConfig

    from .conftest import make_config

    config: ServeConfig = make_config(home, image_root, debug_stats=debug_stats, load_encoder_at_start=False)
    app = create_app(config)
    srv = ThreadServer(app, http=header_deadline_protocol(10, stamp=debug_stats))
    try:
        adm = app.state.runtime.admission
        adm.admitted = adm.workers + adm.max_queue  # the queue is full
        t0 = _time.perf_counter()
        with httpx.Client(base_url=srv.url, timeout=10) as http:
            r = http.post("/v1/search", json={"tokens": {"red": 1.0}})
        t1 = _time.perf_counter()
        adm.admitted = 0
    finally:
        srv.close()
    assert r.status_code == 429 and r.json()["error"]["type"] == "ServerBusyError"
    timing = r.headers.get("server-timing")
    if not debug_stats:
        assert timing is None
        return
    t_recv, t_send = (float(v) for v in timing.split('shed;desc="')[1].split('"')[0].split())
    assert t0 <= t_recv <= t_send <= t1
