"""CPU per `/v1/search` of `stair-es serve` outside the engine: the app's own cost, in process.

On a shared machine a p99 moves with the other jobs; CPU time per request does not (much).
This calls the ASGI app directly (no sockets, no uvicorn) with the same search bodies the
load benchmarks send, and counts, per request:

* ``app``: the whole request through the app (gates, body, validation, route, batcher,
  search, answer), CPU of the whole process;
* ``loop``: the CPU of the thread that runs the event loop (the gates, parsing, validation,
  routing, the response; everything but the search and its answer's JSON);
* ``direct``: the same search run the way the worker runs it (``prepare_searches`` +
  ``run_search_json``), with no HTTP at all, on one thread.

``app - direct`` is what HTTP costs inside the app; uvicorn's own parsing and writing come on
top (``benchmarks.serve_load`` splits the live server's CPU into its event-loop thread and the
rest). Settings take turns in ``--rounds`` (the machine's load falls on all alike); medians of
the rounds are printed. ``--profile`` prints where the loop thread's time goes (cProfile).

    python -m benchmarks.serve_overhead --docs 100000 --requests 400 --rounds 5
    python -m benchmarks.serve_overhead --docs 1000000 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import time
from pathlib import Path

from benchmarks.common import git_commit
from benchmarks.corpora import CACHE_DIR
from benchmarks.serve_load import build_index, query_maps


def scope_of(app, body: bytes, path: str = "/v1/search") -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                                              (b"content-length", str(len(body)).encode())],
            "http_version": "1.1", "scheme": "http", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8080),
            "root_path": "", "app": app}


async def call(app, body: bytes) -> tuple[int, bytes]:
    msgs = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict] = []

    async def receive():
        return msgs.pop() if msgs else {"type": "http.disconnect"}

    async def send(m):
        sent.append(m)

    await app(scope_of(app, body), receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="Print the loop thread's cProfile of one round.")
    args = ap.parse_args()
    from stair_es.serve.app import create_app
    from stair_es.serve.runtime import dumps
    from stair_es.serve.service import ServeConfig

    name = f"load-{args.docs}"
    corpus = build_index(args.home, name, args.docs)
    queries = query_maps(corpus, args.requests)
    bodies = [json.dumps({"tokens": q, "top_k": args.top_k, "caption_weight": 0}).encode() for q in queries]
    cfg = ServeConfig(backend="embedded", backend_options={"home": str(args.home)}, encoder="bow", default_index=name)
    app = create_app(cfg)
    svc = app.state.service
    print(f"# stair-es serve overhead in process: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.docs:,} docs, {len(bodies)} searches x "
          f"{args.rounds} rounds", flush=True)

    def direct() -> dict[str, float]:
        c0 = time.thread_time()
        for b in bodies:
            p = svc.prepare_searches([json.loads(b) | {"index": name}])[0]
            svc.run_search_json(p, dumps)
        return {"direct": (time.thread_time() - c0) * 1000 / len(bodies)}

    async def through_app(profile=None) -> dict[str, float]:
        c0, l0 = time.process_time(), time.thread_time()  # this coroutine runs on the loop's thread
        if profile is not None:
            profile.enable()
        for b in bodies:
            status, out = await call(app, b)
            if status != 200:
                raise SystemExit(f"the app answered {status}: {out[:300]!r}")
        if profile is not None:
            profile.disable()
        n = len(bodies)
        return {"app": (time.process_time() - c0) * 1000 / n, "loop": (time.thread_time() - l0) * 1000 / n}

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - gc_t0[0])

    async def run() -> None:
        gc.callbacks.append(on_gc)
        async with app.router.lifespan_context(app):
            for b in bodies[:30]:
                await call(app, b)
            for v in pauses.values():
                v.clear()
            rows: list[dict[str, float]] = []
            for _ in range(args.rounds):
                r = await through_app()
                r.update(await asyncio.get_running_loop().run_in_executor(None, direct))
                rows.append(r)
                print(json.dumps({k: round(v, 3) for k, v in r.items()}), flush=True)
            n_req = args.rounds * len(bodies)
            print("garbage collections during the rounds (the GIL is held throughout each): "
                  + ", ".join(f"generation {g}: {len(v)} ({len(v) / n_req:.3f} per search), {sum(v) * 1000:.1f} ms in all, "
                              f"longest {max(v, default=0) * 1000:.1f} ms" for g, v in pauses.items()))
            med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            print(f"\nmedian of {args.rounds} rounds, ms of CPU per search (load average {os.getloadavg()[0]:.2f}):")
            print("| through the app | of which the loop thread | the search alone (worker's way) | app - search |")
            print("|---:|---:|---:|---:|")
            print(f"| {med['app']:.3f} | {med['loop']:.3f} | {med['direct']:.3f} | {med['app'] - med['direct']:.3f} |")
            if args.profile:
                import cProfile
                import pstats

                pr = cProfile.Profile()
                await through_app(pr)
                st = pstats.Stats(pr)
                st.sort_stats("tottime").print_stats(40)
                st.sort_stats("cumtime").print_stats(40)

    asyncio.run(run())


if __name__ == "__main__":
    main()
