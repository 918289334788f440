"""Load benchmark of `stair-es serve`: N concurrent clients on 127.0.0.1 against /v1/search.

For each corpus size it builds (once, cached) an embedded index of the synthetic STAIR-like
corpus of ``benchmarks/corpora.py``, starts `stair-es serve` as its own process on 127.0.0.1,
and runs a closed loop of C clients (each sends its next query when the previous answer
arrives) for a fixed time per client count. Queries are the corpus's token maps (text
"captions" of random images), so the figures are the server's search path, not a model's.
In the same run, the same queries go through ``backend.search`` in-process on one thread:
the ratio server/in-process is the HTTP and JSON overhead plus queueing.

    python -m benchmarks.serve_load --docs 100000 --clients 1,10,50 --seconds 20
    python -m benchmarks.serve_load --docs 1000000 --clients 50 --seconds 30 --workers 2

Every request loop is bounded in count and time and talks only to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.corpora import CACHE_DIR, CorpusSpec, load_corpus

FIELD = "image"


def build_index(home: Path, name: str, n_docs: int):
    """The corpus as an embedded index (one optimized segment), reused when already built."""
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    corpus = load_corpus(CorpusSpec(n_docs=n_docs, n_queries=1000))
    path = home / name
    if not (path / "manifest.json").exists():
        t0 = time.perf_counter()
        home.mkdir(parents=True, exist_ok=True)
        ix = EngineIndex.create(path, IndexSchema(fields={}, sparse_fields=(FIELD,), encoder={"name": "bow"}))
        d = corpus.docs
        step = 200_000
        for a in range(0, d.n_rows, step):
            b = min(d.n_rows, a + step)
            lo, hi = int(d.indptr[a]), int(d.indptr[b])
            ix.add_arrays([str(i) for i in range(a, b)],
                          {FIELD: (np.asarray(d.indptr[a:b + 1] - lo), np.asarray(d.indices[lo:hi]),
                                   np.asarray(d.weights[lo:hi]))})
        ix.optimize()
        ix.close()
        print(f"# built {name}: {n_docs} docs in {time.perf_counter() - t0:.0f} s", flush=True)
    return corpus


def query_maps(corpus, n: int) -> list[dict[str, float]]:
    from stair_es.vocab import default_vocabulary

    tokens = default_vocabulary().tokens
    q = corpus.queries
    return [{tokens[int(t)]: float(w) for t, w in zip(*q.row(i))} for i in range(min(n, q.n_rows))]


def in_process_p50(home: Path, name: str, queries: list[dict[str, float]], top_k: int, seconds: float) -> float:
    """Median ms of the same search through the library on one thread (make_request + backend.search)."""
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.search import QuerySpec, make_request

    b = EmbeddedBackend(home)
    times = []
    deadline = time.monotonic() + seconds
    for i, qm in enumerate(queries * 10):
        t = time.perf_counter()
        req, _ = make_request(b, name, QuerySpec(tokens=qm, top_k=top_k, caption_weight=0))
        b.search(name, req)
        if i >= 5:
            times.append((time.perf_counter() - t) * 1000)
        if time.monotonic() > deadline and len(times) >= 20:
            break
    b.close()
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(home: Path, index: str, workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "stair_es.cli.main", "serve", "--home", str(home), "--encoder", "bow",
                             "--index", index, "--port", str(port), "--workers", str(workers), "--max-queue", "1000",
                             "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    import urllib.request

    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"stair-es serve exited: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2):
                return proc, url
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("stair-es serve did not become ready in 120 s")
            time.sleep(0.3)


async def load(url: str, queries: list[dict[str, float]], clients: int, seconds: float, top_k: int,
               max_requests: int) -> dict:
    import httpx

    latencies: list[float] = []
    errors = 0
    stop = time.monotonic() + seconds
    sent = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
        # warm-up: every connection once, every worker thread once
        await asyncio.gather(*(http.post("/v1/search", json={"tokens": queries[i % len(queries)], "top_k": top_k,
                                                               "caption_weight": 0}) for i in range(clients)))

        async def client(k: int) -> None:
            nonlocal errors, sent
            i = k
            while time.monotonic() < stop and sent < max_requests:
                sent += 1
                body = {"tokens": queries[i % len(queries)], "top_k": top_k, "caption_weight": 0}
                t = time.perf_counter()
                r = await http.post("/v1/search", json=body)
                dt = (time.perf_counter() - t) * 1000
                if r.status_code == 200:
                    latencies.append(dt)
                else:
                    errors += 1
                i += clients

        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.perf_counter() - t0
    lat = np.array(latencies)
    return {"clients": clients, "requests": len(lat), "errors": errors, "qps": len(lat) / wall,
            "p50_ms": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
            "p99_ms": float(np.percentile(lat, 99)) if len(lat) else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", default="100000", help="Corpus sizes, comma-separated (e.g. 100000,1000000).")
    ap.add_argument("--clients", default="1,10,50", help="Concurrent client counts, comma-separated.")
    ap.add_argument("--seconds", type=float, default=20.0, help="Load time per client count.")
    ap.add_argument("--max-requests", type=int, default=200_000, help="Upper bound of requests per client count.")
    ap.add_argument("--workers", type=int, default=2, help="stair-es serve --workers.")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load", help="Where the indices are built.")
    args = ap.parse_args()

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = "?"
    print(f"# stair-es serve load: commit {commit}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, --workers {args.workers}, top_k {args.top_k}, "
          f"{args.seconds:g} s per row", flush=True)
    rows = []
    for n in [int(x) for x in args.docs.split(",")]:
        name = f"load-{n}"
        corpus = build_index(args.home, name, n)
        queries = query_maps(corpus, 1000)
        base = in_process_p50(args.home, name, queries, args.top_k, seconds=10)
        proc, url = start_server(args.home, name, args.workers)
        try:
            for c in [int(x) for x in args.clients.split(",")]:
                r = asyncio.run(load(url, queries, c, args.seconds, args.top_k, args.max_requests))
                r.update(docs=n, in_process_p50_ms=base)
                rows.append(r)
                print(json.dumps(r), flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    print()
    print("| docs | clients | requests | errors | QPS | p50 ms | p99 ms | in-process p50 ms | p50 server/in-process |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['docs']:,} | {r['clients']} | {r['requests']} | {r['errors']} | {r['qps']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['in_process_p50_ms']:.2f} | {r['p50_ms'] / r['in_process_p50_ms']:.1f}x |")


if __name__ == "__main__":
    main()
