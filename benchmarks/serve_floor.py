"""The latency floor of `stair-es serve` at a given load, from its own service times.

Measures the CPU time of each search the way the server runs it (``prepare_searches`` and
``run_search_json`` of :class:`stair_es.serve.service.Service`, one thread, the corpus's 1000
queries), adds the HTTP cost per request measured by the open-loop benchmark
(``--http-ms``: server CPU per request minus the engine's), and simulates an M/G/c queue
(Poisson arrivals, first come first served, ``--workers`` servers, no other load) at the given
fractions of its saturation: the p99 a server with these service times cannot beat on c
dedicated cores, before any GIL, scheduling or network cost.

    python -m benchmarks.serve_floor --docs 1000000 --workers 2 --http-ms 1.5,0.7
"""

from __future__ import annotations

import argparse
import heapq
import os
import time
from pathlib import Path

import numpy as np

from benchmarks.serve_load import build_index, query_maps


def service_times(home: Path, name: str, queries, top_k: int) -> np.ndarray:
    from stair_es.serve.runtime import dumps
    from stair_es.serve.service import ServeConfig, Service

    svc = Service(ServeConfig(backend="embedded", backend_options={"home": str(home)}, encoder="bow"))
    bodies = [{"index": name, "tokens": q, "top_k": top_k, "caption_weight": 0} for q in queries]
    for b in bodies[:20]:  # warm
        svc.run_search_json(svc.prepare_searches([b])[0], dumps)
    out = []
    for b in bodies:
        c0 = time.thread_time()
        p = svc.prepare_searches([b])[0]
        svc.run_search_json(p, dumps)
        out.append(time.thread_time() - c0)
    svc.close()
    return np.array(out)


def simulate(service: np.ndarray, servers: int, rate: float, n: int, seed: int = 0) -> np.ndarray:
    """Response times of an M/G/c FIFO queue: Poisson(rate) arrivals, service times drawn from ``service``."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    s = rng.choice(service, n)
    free = [0.0] * servers  # when each server is next free
    heapq.heapify(free)
    out = np.empty(n)
    for i in range(n):
        start = max(arrivals[i], heapq.heappop(free))
        end = start + s[i]
        heapq.heappush(free, end)
        out[i] = end - arrivals[i]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--home", type=Path, required=True, help="Where serve_load built its indices.")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--http-ms", default="1.5", help="CPU per request outside the search (HTTP, JSON, gates); several, "
                                                     "comma-separated, are simulated on the same measured search times.")
    ap.add_argument("--fractions", default="0.5,0.8,0.9")
    ap.add_argument("--top-k", type=int, default=10)
    args = ap.parse_args()
    name = f"load-{args.docs}"
    corpus = build_index(args.home, name, args.docs)
    st = service_times(args.home, name, query_maps(corpus, 1000), args.top_k)
    print(f"# search CPU per request (prepare + engine + answer JSON, one thread): mean {st.mean() * 1000:.2f} ms, "
          f"p50 {np.percentile(st, 50) * 1000:.2f}, p99 {np.percentile(st, 99) * 1000:.2f}, "
          f"coefficient of variation {st.std() / st.mean():.2f} (load average {os.getloadavg()[0]:.2f})")
    print("| HTTP ms | CPU per request ms | S on dedicated cores /s | x S | rate /s | p50 ms | p99 ms | "
          "p99 with exponential service of the same mean |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for http_ms in (float(x) for x in args.http_ms.split(",")):
        total = st + http_ms / 1000
        mean = float(total.mean())
        sat = args.workers / mean
        for f in (float(x) for x in args.fractions.split(",")):
            r = simulate(total, args.workers, f * sat, 400_000)
            expo = simulate(np.random.default_rng(1).exponential(mean, 100_000), args.workers, f * sat, 400_000)
            print(f"| {http_ms:g} | {mean * 1000:.2f} | {sat:.0f} | {f:.2f} | {f * sat:.0f} | {np.percentile(r, 50) * 1000:.1f} | "
                  f"{np.percentile(r, 99) * 1000:.1f} | {np.percentile(expo, 99) * 1000:.1f} |")

if __name__ == "__main__":
    main()
