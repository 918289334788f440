"""How fast `stair-es serve`'s worker pool hands a job's answer back to the event loop, for one or
more checkouts side by side.

The pool runs encoding, explain, thumbnails and the results page. This times ``Admission.run``
of trivial jobs (two at a time, on uvloop, as the server runs) from the loop's side: the round
trip of each pair, and the event loop thread's CPU per job (what the hand-over costs the thread
that also accepts, sheds and answers). ``--busy N`` adds N threads that run Python without a
pause (the GIL is then taken from them at each switch interval: an extreme, not a server's load).
``--searches DOCS`` keeps the server's two search threads busy meanwhile, as under load: four
searches always in flight through the server's batcher on the DOCS-document index of
``benchmarks.serve_load`` (built under ``--home`` if missing), and a pair of pool jobs every
2 ms. Each checkout runs in its own process, in turns, ``--rounds`` times.

    python -m benchmarks.serve_pool_handover --tree old=/tmp/old --tree new=. --rounds 3
    python -m benchmarks.serve_pool_handover --tree old=/tmp/old --tree new=. --searches 1000000 --jobs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import git_commit


def _searcher(home: str, docs: int):
    """A batcher of the server's own searches on the load benchmark's index, and its queries."""
    import functools
    from pathlib import Path

    from benchmarks.serve_load import build_index, query_maps
    from stair_es.serve.admission import lower_thread_priority
    from stair_es.serve.batching import Batcher
    from stair_es.serve.runtime import dumps
    from stair_es.serve.service import ServeConfig, Service

    name = f"load-{docs}"
    queries = query_maps(build_index(Path(home), name, docs), 1000)
    svc = Service(ServeConfig(backend_options={"home": home}))
    batcher = Batcher(svc.prepare_searches, functools.partial(svc.run_search_json, dumps=dumps), workers=2,
                      thread_init=functools.partial(lower_thread_priority, 5))
    return batcher, [{"index": name, "tokens": q, "top_k": 10, "caption_weight": 0} for q in queries]


def _measure(jobs: int, busy: int, searches: int = 0, home: str = "") -> dict:
    import uvloop

    import stair_es
    from stair_es.serve.admission import Admission

    stop = threading.Event()

    def spin() -> None:
        x = 0
        while not stop.is_set():
            for i in range(2000):
                x += i

    for _ in range(busy):
        threading.Thread(target=spin, daemon=True).start()
    adm = Admission(workers=2, max_queue=64, worker_nice=5)
    batcher, bodies = _searcher(home, searches) if searches else (None, [])
    done = [0]

    async def search_forever(k: int) -> None:
        while not stop.is_set():
            await batcher.submit(bodies[k % len(bodies)])
            done[0] += 1
            k += 4

    async def main() -> tuple[list[float], float, float]:
        feeders = [asyncio.ensure_future(search_forever(k)) for k in range(4 if batcher else 0)]
        lat = []
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(jobs // 2):
            t = time.perf_counter()
            await asyncio.gather(adm.run(int, 1), adm.run(int, 2))
            lat.append((time.perf_counter() - t) * 1e6)
            if batcher:
                await asyncio.sleep(0.002)
        took = time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*feeders)
        return lat, (time.thread_time() - c0) / jobs * 1e6, done[0] / took

    try:
        lat, cpu, qps = uvloop.run(main())
    finally:
        stop.set()
        adm.close()
        if batcher:
            batcher.close()
    lat.sort()
    return {"p50_us": lat[len(lat) // 2], "p99_us": lat[int(len(lat) * 0.99)], "mean_us": statistics.fmean(lat),
            "loop_cpu_us_per_job": cpu, "searches_per_s": qps, "package": stair_es.__file__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=None, help="NAME=FOLDER of a checkout (default: this one).")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=6000, help="Jobs per checkout and round.")
    ap.add_argument("--busy", type=int, default=0, help="Threads that run Python without a pause meanwhile.")
    ap.add_argument("--searches", type=int, default=0, metavar="DOCS",
                    help="Keep two search threads busy on the DOCS-document load index meanwhile (0: no searches).")
    ap.add_argument("--home", default=None, help="Where the load index is (default: benchmarks.serve_load's).")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        sys.path.insert(0, a.child)
        print(json.dumps(_measure(a.jobs, a.busy, a.searches, a.home or "")))
        return
    if a.searches and not a.home:
        from benchmarks.corpora import CACHE_DIR

        a.home = str(Path(CACHE_DIR) / "serve_load")
    trees = [t.split("=", 1) for t in (a.tree or ["this=."])]
    print(f"# worker pool hand-over: commit {git_commit()}, {a.jobs} jobs per round, busy threads {a.busy}, "
          f"searches on {a.searches or 'no'} documents meanwhile")
    got: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for _ in range(a.rounds):
        for name, folder in trees:
            out = subprocess.run([sys.executable, "-m", "benchmarks.serve_pool_handover", "--child", folder,
                                  "--jobs", str(a.jobs), "--busy", str(a.busy), "--searches", str(a.searches)]
                                 + (["--home", a.home] if a.home else []), check=True, capture_output=True, text=True)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for name, rs in got.items():
        print(f"# {name}: {rs[0]['package']}")
    print("\n| checkout | pair round trip p50 / p99 / mean us (median of rounds) | event loop CPU per job us | "
          "searches/s | per round (loop CPU) |")
    print("|---|---|---:|---:|---|")
    for name, rs in got.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "package"}
        rounds = " ".join(f"{r['loop_cpu_us_per_job']:.1f}" for r in rs)
        print(f"| {name} | {med['p50_us']:.0f} / {med['p99_us']:.0f} / {med['mean_us']:.0f} | "
              f"{med['loop_cpu_us_per_job']:.1f} | {med['searches_per_s']:.0f} | {rounds} |")


if __name__ == "__main__":
    main()
