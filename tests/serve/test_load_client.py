"""The load benchmark's own HTTP client (benchmarks/serve_load.py) against a real server: it
must read answers and Server-Timing right, and survive the server closing idle connections."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from benchmarks.serve_load import Connection, search_request, server_timing, summarize


def test_server_timing_is_parsed():
    t = server_timing(b'queue;dur=0.12, prepare;dur=0.30;desc="batch of 4", wait;dur=0.01, search;dur=5.3, app;dur=6.1')
    assert t == {"queue": 0.12, "prepare": 0.3, "batch_size": 4.0, "wait": 0.01, "search": 5.3, "app": 6.1}


def test_client_reads_answers_and_reconnects(live_server):
    u = urlsplit(live_server.url)
    raw = search_request(u.hostname, u.port, {"red": 1.0}, 3)

    async def main():
        conn = Connection(u.hostname, u.port)
        first = await conn.request(raw)
        conn.writer.close()  # as if the server had closed the idle keep-alive connection
        await asyncio.sleep(0.05)
        second = await conn.request(raw)
        conn.close()
        return first, second

    first, second = asyncio.run(main())
    assert first[0] == second[0] == 200
    assert "app" in server_timing(first[1]) and server_timing(second[1])["batch_size"] >= 1


def test_summary_pools_slices():
    a = {"latencies": [1.0, 2.0], "app": [0.5], "sizes": [1.0], "errors": {503: 1}, "wall": 1.0, "client_cpu": 0.01,
         "server_cpu": 0.02}
    b = {"latencies": [3.0], "app": [], "sizes": [], "errors": {}, "wall": 2.0, "client_cpu": 0.0, "server_cpu": 0.01}
    r = summarize([a, b])
    assert r["requests"] == 3 and r["errors"] == 1 and r["error_statuses"] == {503: 1} and r["qps"] == 1.0
    assert r["p50_ms"] == 2.0 and r["server_cpu_ms_per_request"] == 7.5
