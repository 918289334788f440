"""How long a search thread of `stair-es serve` keeps the GIL from the event loop, in process.

The event loop's thread needs the GIL for every callback (reading a request, the gates, a 429,
handing an answer back). While a search thread holds it, the loop waits whatever its priority.
This runs the searches the way a search thread does (``prepare_searches`` + ``run_search_json``,
the answer's JSON included) on ``--threads`` threads, and beside them a probe thread that
sleeps ``--probe-us`` again and again and records how late it gets the GIL back. With one
search thread on a two-core machine the probe has a core of its own, so its lateness is the
GIL: how long the search thread's Python parts (preparation, the answer's dicts and JSON)
hold it at a stretch. ``--switch-ms`` sets ``sys.setswitchinterval`` (Python's default 5 ms),
the longest a thread running Python code keeps the GIL when another asks for it.

    python -m benchmarks.serve_gil --docs 1000000 --seconds 5 --threads 0,1,2 --switch-ms 5,1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.common import git_commit
from benchmarks.corpora import CACHE_DIR
from benchmarks.serve_load import build_index, query_maps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load")
    ap.add_argument("--seconds", type=float, default=5.0, help="Per setting.")
    ap.add_argument("--threads", default="0,1,2", help="Search threads beside the probe, comma-separated settings.")
    ap.add_argument("--switch-ms", default="5", help="sys.setswitchinterval values in ms, comma-separated.")
    ap.add_argument("--probe-us", type=float, default=200.0)
    ap.add_argument("--top-k", type=int, default=10)
    args = ap.parse_args()
    from stair_es.serve.runtime import dumps
    from stair_es.serve.service import ServeConfig, Service

    name = f"load-{args.docs}"
    corpus = build_index(args.home, name, args.docs)
    bodies = [{"tokens": q, "top_k": args.top_k, "caption_weight": 0, "index": name} for q in query_maps(corpus, 1000)]
    svc = Service(ServeConfig(backend="embedded", backend_options={"home": str(args.home)}, encoder="bow",
                              default_index=name))
    for b in bodies[:50]:  # open the index, load the kernels
        svc.run_search_json(svc.prepare_searches([b])[0], dumps)
    print(f"# GIL held by search threads: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.docs:,} docs, {args.seconds:g} s per setting, "
          f"probe sleeps {args.probe_us:g} us", flush=True)
    print()
    print("| search threads | switch interval ms | searches/s | search wall ms p50 | thread CPU ms/search | "
          "of which engine CPU | probe late p50 ms | p99 ms | p99.9 ms | max ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    old = sys.getswitchinterval()
    try:
        for sw in [float(x) for x in args.switch_ms.split(",")]:
            sys.setswitchinterval(sw / 1000)
            for n in [int(x) for x in args.threads.split(",")]:
                stop = threading.Event()
                stats: list[tuple[float, float, float]] = []  # (wall s, thread CPU s, engine CPU s) per search

                def search(k: int) -> None:
                    i = k
                    while not stop.is_set():
                        t0, c0 = time.perf_counter(), time.thread_time()
                        p = svc.prepare_searches([bodies[i % len(bodies)]])[0]
                        _, (_, engine_cpu, _, _) = svc.run_search_json(p, dumps)
                        stats.append((time.perf_counter() - t0, time.thread_time() - c0, engine_cpu))
                        i += n

                threads = [threading.Thread(target=search, args=(k,), daemon=True) for k in range(n)]
                for t in threads:
                    t.start()
                late: list[float] = []
                sleep_s = args.probe_us / 1e6
                end = time.perf_counter() + args.seconds
                while time.perf_counter() < end:
                    t = time.perf_counter()
                    time.sleep(sleep_s)
                    late.append((time.perf_counter() - t - sleep_s) * 1000)
                stop.set()
                for t in threads:
                    t.join()
                a = np.array(late)
                s = np.array(stats) if stats else np.zeros((0, 3))
                row = {"threads": n, "switch_ms": sw, "searches_per_s": len(s) / args.seconds,
                       "wall_p50_ms": float(np.median(s[:, 0]) * 1000) if len(s) else None,
                       "cpu_ms": float(s[:, 1].mean() * 1000) if len(s) else None,
                       "engine_cpu_ms": float(s[:, 2].mean() * 1000) if len(s) else None,
                       "late_p50_ms": float(np.percentile(a, 50)), "late_p99_ms": float(np.percentile(a, 99)),
                       "late_p999_ms": float(np.percentile(a, 99.9)), "late_max_ms": float(a.max())}
                print(json.dumps(row), file=sys.stderr, flush=True)

                def f(v, d=2):
                    return "-" if v is None else f"{v:.{d}f}"

                print(f"| {n} | {sw:g} | {row['searches_per_s']:.0f} | {f(row['wall_p50_ms'])} | {f(row['cpu_ms'])} | "
                      f"{f(row['engine_cpu_ms'])} | {row['late_p50_ms']:.3f} | {row['late_p99_ms']:.2f} | "
                      f"{row['late_p999_ms']:.2f} | {row['late_max_ms']:.2f} |", flush=True)
    finally:
        sys.setswitchinterval(old)
        svc.close()


if __name__ == "__main__":
    main()
