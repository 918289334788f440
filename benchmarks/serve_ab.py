"""Open-loop A/B of `stair-es serve` settings or checkouts, in alternating slices.

On a machine shared with other jobs, the load of the moment moves a server's latency more than
most changes do (S moved from 83 to 176 searches/s within minutes here). This runs every
setting's server side by side on the same index and sends each the same Poisson load
(``benchmarks.serve_load --generate``, another process) in short slices that take turns, so
the machine's changes fall on all settings alike; the slices of each setting are pooled.

    python -m benchmarks.serve_ab --docs 1000000 --rate 100,180 --slices 6 --slice-seconds 5 \\
        --setting "base=@/work/main/.venv/bin/python:/tmp/base" --setting "new=" \\
        --setting "budget=--max-queue-ms 250"

A setting is ``NAME=SERVER OPTIONS``, or ``NAME=@PYTHON:FOLDER SERVER OPTIONS`` to run another
checkout's server (its own Python and folder).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.common import git_commit
from benchmarks.corpora import CACHE_DIR
from benchmarks.serve_load import (
    GENERATOR,
    SERVER,
    add_cpu,
    build_index,
    debug_stats,
    print_machine,
    print_shed_split,
    process_rss_mb,
    query_maps,
    run_generator,
    start_hogs,
    start_server,
    stop_hogs,
    stop_servers,
    summarize_open,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--home", type=Path, default=Path(CACHE_DIR) / "serve_load")
    ap.add_argument("--rate", default="100,180", help="Arrival rates (searches/s), comma-separated.")
    ap.add_argument("--slices", type=int, default=6, help="Slices per setting and rate.")
    ap.add_argument("--slice-seconds", type=float, default=5.0)
    ap.add_argument("--setting", action="append", required=True, help="NAME=[@PYTHON:FOLDER ]SERVER OPTIONS")
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--generator-realtime", action="store_true",
                    help="Run the load generator in SCHED_FIFO 1 (root or CAP_SYS_NICE; see serve_load).")
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--hog", type=int, default=0,
                    help="Processes that spin at nice --hog-nice for the whole run, as another job taking a core "
                         "(default 0: none; counted in 'others').")
    ap.add_argument("--hog-nice", type=int, default=0)
    args = ap.parse_args()
    GENERATOR.update(realtime=args.generator_realtime)
    name = f"load-{args.docs}"
    corpus = build_index(args.home, name, args.docs)
    qfile = Path(tempfile.mkdtemp(prefix="stair-serve-ab-")) / "queries.json"
    qfile.write_text(json.dumps(query_maps(corpus, 1000)))
    settings = []
    for s in args.setting:
        label, _, rest = s.partition("=")
        python, cwd = sys.executable, None
        if rest.startswith("@"):
            where, _, rest = rest[1:].partition(" ")
            python, _, cwd = where.partition(":")
        settings.append((label, python, cwd or None, rest.split()))
    print(f"# stair-es serve open-loop A/B: commit {git_commit()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {args.docs:,} docs, --max-queue {args.max_queue}, "
          f"{args.slices} slices of {args.slice_seconds:g} s per setting and rate, in turn"
          f"{', the generator in SCHED_FIFO 1' if args.generator_realtime else ''}"
          f"{f', {args.hog} busy-looping process(es) at nice {args.hog_nice} throughout' if args.hog else ''}",
          flush=True)
    servers, hogs = {}, []
    try:
        for label, python, cwd, extra in settings:
            SERVER.update(python=python, cwd=cwd)
            servers[label] = start_server(args.home, name, 2, "auto", None, 0.0, max_queue=args.max_queue, extra=extra)
            print(f"# {label}: {python} in {cwd or 'this checkout'}, options {' '.join(extra) or 'none'}", flush=True)
        n_rates = len(args.rate.split(","))
        hogs = start_hogs(args.hog, args.hog_nice, limit_s=n_rates * len(settings) * args.slices
                          * (args.slice_seconds + 3) + 120)
        rows = []
        for rate in [float(x) for x in args.rate.split(",")]:
            pooled = {label: {"results": [], "sent": 0.0, "connections": 0, "rss_peak_mb": None,
                              "generator_cpu_s": 0.0, "generator_wall_s": 0.0, "server_cpu_s": 0.0,
                              "server_loop_cpu_s": 0.0}
                      for label in servers}
            rss0 = {label: process_rss_mb(p.pid) for label, (p, _) in servers.items()}
            for k in range(args.slices):
                for label, (proc, url) in servers.items():
                    r = run_generator(f"open:{rate}", url, qfile, args.slice_seconds, args.top_k, 100 * k + 1, proc.pid)
                    acc = pooled[label]
                    acc["results"] += r["results"]
                    acc["sent"] += r["offered"] * args.slice_seconds
                    acc["connections"] = max(acc["connections"], r["connections"])
                    acc["generator_cpu_s"] += r["generator_cpu_s"]
                    acc["generator_wall_s"] += r["generator_wall_s"]
                    add_cpu(acc, r)
                    n = max(1, len(r["results"]))  # per slice too: its median shrugs off one stalled slice
                    if r.get("server_cpu_s") is not None and r.get("server_loop_cpu_s") is not None:
                        acc.setdefault("cpu_slices", []).append((r["server_cpu_s"] * 1000 / n,
                                                                 r["server_loop_cpu_s"] * 1000 / n))
                    if r.get("rss_peak_mb") is not None:
                        acc["rss_peak_mb"] = max(acc["rss_peak_mb"] or 0.0, r["rss_peak_mb"])
            seconds = args.slices * args.slice_seconds
            for label, (_, url) in servers.items():  # a server started with --debug-stats: its own view of this rate
                st = debug_stats(url, reset=True)
                if st is not None:
                    print(json.dumps({"setting": label, "rate": rate, "debug_stats": {
                        k: st.get(k) for k in ("gc", "loop_lag", "shed", "shed_from_queue")}}), flush=True)
            for label in servers:
                acc = pooled[label]
                acc["offered"] = acc["sent"] / seconds
                row = {"setting": label, **summarize_open(rate, acc, seconds, rss0[label]),
                       "load_average": os.getloadavg()[0]}
                cs = acc.get("cpu_slices") or []
                row["server_cpu_ms_per_request_slice_median"] = statistics.median(c for c, _ in cs) if cs else None
                row["server_loop_cpu_ms_per_request_slice_median"] = statistics.median(c for _, c in cs) if cs else None
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        stop_hogs(hogs)
        stop_servers(servers)
    print()
    print("| setting | rate /s | QPS | p50 ms | p99 ms | slowest ms | shed % | shed p50 / p99 ms | other errors | "
          "server CPU ms/req | of which event loop | generator % of a core | p99 queue+wait ms | p99 engine wait ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
    first: dict[float, dict] = {}
    for r in rows:
        first.setdefault(r["rate"], r)
        bd = r["breakdown"]
        qw = (f"{bd['queue']['p99'] + bd['wait']['p99']:.0f}" if bd and "queue" in bd else "-")
        ew = f"{bd['engine_wait']['p99']:.0f}" if bd and bd.get("engine_wait", {}).get("p99") else "-"
        errs = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"
        scpu, lcpu = r["server_cpu_ms_per_request"], r["server_loop_cpu_ms_per_request"]
        print(f"| {r['setting']} | {r['rate']:.0f} | {r['qps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['max_ms']:.0f} | {r['shed_pct']:.1f} | {r['shed_p50_ms']:.1f} / {r['shed_p99_ms']:.1f} | {errs} | "
              f"{'-' if scpu is None else f'{scpu:.2f}'} | {'-' if lcpu is None else f'{lcpu:.2f}'} | "
              f"{r['generator_core_pct']:.1f} | {qw} | {ew} |")
    print()
    print("The slowest 1 % of the answered searches, mean ms of each phase (Server-Timing; late: sent after its due "
          "time by the generator; outside: client time minus the server's pre + app):")
    print()
    cols = ("late", "outside", "pre", "queue", "prepare", "wait", "engine", "engine_cpu", "answer", "deliver", "total")
    print("| setting | rate /s | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---:|" * len(cols))
    for r in rows:
        bd = r["breakdown"]
        if bd:
            print(f"| {r['setting']} | {r['rate']:.0f} | " + " | ".join(f"{bd[c]['tail_mean']:.1f}" for c in cols) + " |")
    print_machine(rows, "setting")
    print()
    print_shed_split(rows, lambda r: f"{r['setting']} at {r['rate']:.0f}/s", "setting, rate")
    print("Shed answers at the door (the queue full) and from the queue (past --queue-timeout-ms):")
    print()
    print("| setting | rate /s | at the door % | p50 / p99 / max ms | from the queue % |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setting']} | {r['rate']:.0f} | {r['shed_door_pct']:.1f} | {r['shed_door_p50_ms']:.1f} / "
              f"{r['shed_door_p99_ms']:.1f} / {r['shed_door_max_ms']:.1f} | {r['shed_queue_pct']:.1f} |")
    print()
    print("Server CPU per request, median of the slices (each slice's CPU / its requests, shed ones included), "
          f"and its ratio to the same rate's first setting ({settings[0][0]}), measured in the same run:")
    print()
    print("| setting | rate /s | server CPU ms/req | ratio | event loop ms/req | ratio | load average |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = first[r["rate"]]
        c, lc = r["server_cpu_ms_per_request_slice_median"], r["server_loop_cpu_ms_per_request_slice_median"]
        bc, blc = b["server_cpu_ms_per_request_slice_median"], b["server_loop_cpu_ms_per_request_slice_median"]
        ratio = f"{c / bc:.3f}" if c and bc else "-"
        lratio = f"{lc / blc:.3f}" if lc and blc else "-"
        print(f"| {r['setting']} | {r['rate']:.0f} | {'-' if c is None else f'{c:.2f}'} | {ratio} | "
              f"{'-' if lc is None else f'{lc:.2f}'} | {lratio} | {r['load_average']:.2f} |")


if __name__ == "__main__":
    main()
