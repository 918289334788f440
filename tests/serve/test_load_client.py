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


def test_open_loop_generator_sends_on_schedule_and_summarizes(live_server):
    from benchmarks.serve_load import open_loop, summarize_open

    r = asyncio.run(open_loop(live_server.url, [{"red": 1.0}, {"blue": 1.0}], rate=40, seconds=1.0, top_k=3, seed=1))
    statuses = {x[0] for x in r["results"]}
    assert statuses == {200} and 15 <= len(r["results"]) <= 80  # Poisson, mean 40
    assert all(ms >= lt >= 0 or lt < 0.5 for _, ms, lt, *_ in r["results"])  # answered after it was due
    assert all(x[4] <= x[5] <= x[6] for x in r["results"])  # written after it was due, answered after written
    dues = [x[4] for x in r["results"]]
    assert max(dues) - min(dues) < 1.0  # each request's due time, on the clock the parent's sampler reads
    row = summarize_open(40, {**r, "rss_peak_mb": 110.0}, 1.0, 100.0)
    assert row["shed_pct"] == 0 and row["errors"] == {} and row["rss_growth_pct"] == 10.0
    # every answer says where its time went on the server, and the phases add up within the client's time
    bd = row["breakdown"]
    assert {"pre", "queue", "engine", "answer", "deliver", "outside"} <= set(bd)
    assert bd["total"]["p50"] >= bd["engine"]["p50"] > 0 and bd["outside"]["p50"] >= 0
    fake = {"offered": 3, "connections": 1, "results": [(200, 5.0, 0.0), (429, 2.0, 1.0), (0, 9.0, 0.0)]}
    row = summarize_open(3, fake, 1.0, None)
    assert row["qps"] == 1 and abs(row["shed_pct"] - 100 / 3) < 1e-9 and row["errors"] == {"0": 1}
    assert row["shed_p50_from_sent_ms"] == 1.0 and row["rss_growth_pct"] is None
    # a 429 with its queue wait in Server-Timing was shed from the queue (--queue-timeout-ms), not at the door
    fake["results"].append((429, 80.0, 0.0, "queue;dur=79.50", 0.0))
    row = summarize_open(4, fake, 1.0, None)
    assert row["shed_door_pct"] == 25 and row["shed_queue_pct"] == 25 and row["shed_door_max_ms"] == 2.0


def test_the_slowest_requests_are_grouped_into_episodes_with_what_else_ran():
    """Was the p99 one stall or spread out, and what did the other processes do meanwhile?"""
    from benchmarks.serve_load import tail_episodes

    res = [(200, 5.0, 0.0, "", 10 + i * 0.01) for i in range(1000)]  # 10 s of answers at 5 ms
    for i in range(300, 305):
        res[i] = (200, 400.0, 0.0, "", res[i][4])  # one stall of 5 requests around t = 13 s
    for i in (700, 701, 702):
        res[i] = (200, 90.0, 0.0, "", res[i][4])
    for i in (850, 990):
        res[i] = (200, 80.0, 0.0, "", res[i][4])
    # (time, machine busy s, server CPU s): others use 0.5 cores, 1.8 during the stall
    samples, busy, cpu = [], 0.0, 0.0
    for k in range(0, 120):
        t = 9 + k * 0.1
        others = 0.18 if 12.9 <= t <= 13.5 else 0.05
        busy, cpu = busy + others + 0.1, cpu + 0.1
        samples.append((t, busy, cpu))
    eps = tail_episodes(res, samples)
    assert [e["requests"] for e in eps] == [5, 3, 1, 1]
    big = eps[0]
    assert big["worst_ms"] == 400.0 and big["others_cores"] > 1.2 and big["others_cores_before"] < 0.6


def test_server_cpu_is_split_into_the_event_loop_thread_and_the_rest():
    """The benchmarks' CPU per request survives a noisy machine better than a p99: the event
    loop's share (uvicorn, the gates, the response) is reported apart from the workers'."""
    import os
    import threading
    import time

    import pytest

    from benchmarks.serve_load import add_cpu, process_cpu

    pid = os.getpid()
    whole, main = process_cpu(pid), process_cpu(pid, pid)
    if whole is None or main is None:
        pytest.skip("no /proc here: CPU per thread is read from /proc/PID/task/TID/stat (Linux)")
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1

    t = threading.Thread(target=spin)
    t.start()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # this (main) thread spins too
        pass
    stop.set()
    t.join()
    whole1, main1 = process_cpu(pid), process_cpu(pid, pid)
    assert whole1 - whole >= main1 - main >= 0
    acc = {"server_cpu_s": 1.0, "server_loop_cpu_s": 0.25}
    add_cpu(acc, {"server_cpu_s": 0.5, "server_loop_cpu_s": 0.1})
    assert acc["server_cpu_s"] == 1.5 and acc["server_loop_cpu_s"] == 0.35
    add_cpu(acc, {"server_cpu_s": 0.5, "server_loop_cpu_s": None})
    assert acc["server_loop_cpu_s"] is None and acc["server_cpu_s"] == 2.0


def test_shed_answers_are_split_into_reaching_the_loop_the_server_and_coming_back():
    """Where a slow 429 waited: the server's stamps (--debug-stats) against the generator's own
    write and read times, one monotonic clock for every process of the machine."""
    from benchmarks.serve_load import shed_split

    res = [(429, 1.0, 0.0, f'shed;desc="{10 + i:.6f} {10 + i + 0.0002:.6f}"', 0.0, 10 + i - 0.0001, 10 + i + 0.0005)
           for i in range(99)]
    res.append((429, 9.0, 0.0, 'shed;desc="200.008000 200.008200"', 0.0, 200.0, 200.0085))  # 8 ms to reach the loop
    res.append((429, 80.0, 0.0, "queue;dur=79.50", 0.0, 1.0, 1.08))  # shed from the queue: not the door's
    res.append((200, 5.0, 0.0, "app;dur=4", 0.0, 1.0, 1.005))
    sp = shed_split(res)
    assert sp["n"] == 100
    assert abs(sp["to_loop"]["p50"] - 0.1) < 1e-3 and abs(sp["in_server"]["p50"] - 0.2) < 1e-3
    assert abs(sp["back"]["p50"] - 0.3) < 1e-3 and abs(sp["to_loop"]["max"] - 8.0) < 1e-3
    assert abs(sp["to_loop"]["slowest_1pct_mean"] - 8.0) < 1e-3 and abs(sp["total"]["max"] - 8.5) < 1e-3
    assert shed_split([(429, 1.0, 0.0, "", 0.0)]) is None  # no stamps (no --debug-stats): nothing to split
