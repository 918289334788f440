"""Ingest speed of already-encoded vectors: ``EngineIndex.add_arrays`` on the scale corpus.

    python benchmarks/arrays_ingest.py --docs 1000000                      # this checkout
    python benchmarks/arrays_ingest.py --docs 2000000 --runs 3 --baseline /path/to/old/checkout
    python benchmarks/arrays_ingest.py --docs 1000000 --metadata dicts,columns,none

Documents come from the scale benchmark's generator (``benchmarks/scale/corpus.py``: ~200
Zipf-distributed tokens per document, idf-shaped weights, the ``bucket`` metadata column),
in calls of ``--batch`` documents (one segment each, as the scale benchmark ingests 10M). Only
``add_arrays`` is timed -- checks, fp16 cast, metadata, the segment build, the write, the
fsyncs and the commit -- not the generation. Each run is a fresh process and a fresh index,
with the compiled kernels loaded first on 64 documents (untimed). ``--metadata`` chooses how
the ``bucket`` values are given: ``columns`` (one numpy array per field), ``dicts`` (one dict
per document) or ``none``. A ``--baseline`` checkout (a source tree, e.g. ``git worktree add
../old COMMIT``) runs the same jobs with its own ``stair_es``, alternating with this one so
that the machine's load hits both alike; a baseline without ``columns`` is given dicts, and
the table says so. Prints wall-clock documents/s and documents per CPU second (all threads of
the process), medians of ``--runs``, the ratios, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> None:
    """One run in this process: ingest ``--docs`` documents, print one JSON line."""
    import inspect

    import numpy as np

    from benchmarks.procstat import peak_rss_mb
    from benchmarks.scale.corpus import Generator, ScaleSpec, buckets
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    mode = args.metadata
    has_columns = "columns" in inspect.signature(EngineIndex.add_arrays).parameters
    if mode == "columns" and not has_columns:
        mode = "dicts"

    def meta(first: int, n: int) -> dict:
        if mode == "columns":
            return {"columns": {"bucket": buckets(first, n)}}
        if mode == "dicts":
            return {"metadata": [{"bucket": int(b)} for b in buckets(first, n)]}
        return {}

    gen = Generator(ScaleSpec(n_docs=args.docs, weights="idf", chunk=min(args.batch, 100_000)))
    work = Path(args.workdir)
    ip, ids, w = gen.chunk(0)
    warm = EngineIndex.create(work / "warm", IndexSchema(sparse_fields=("image",)))
    warm.add_arrays([str(i) for i in range(64)], {"image": (ip[:65], ids[: ip[64]], w[: ip[64]])}, **meta(0, 64))
    warm.close()
    ix = EngineIndex.create(work / "ix", IndexSchema(sparse_fields=("image",)))
    ix.max_segments = 1 << 30  # one segment per call, no merges: the build is what is measured
    batches, pending = [], []

    def flush() -> None:
        first, n = pending[0][0], sum(p[1].size - 1 for p in pending)
        indptr = np.zeros(n + 1, np.int64)
        o = r = 0
        for _, p, _, _ in pending:
            indptr[r + 1 : r + p.size] = p[1:] + o
            o, r = o + int(p[-1]), r + p.size - 1
        toks = np.concatenate([p[2] for p in pending])
        wts = np.concatenate([p[3] for p in pending])
        pending.clear()
        names = [str(i) for i in range(first, first + n)]
        kw = meta(first, n)
        t, c = time.perf_counter(), time.process_time()
        ix.add_arrays(names, {"image": (indptr, toks, wts)}, **kw)
        batches.append({"docs": n, "postings": int(toks.size), "wall_s": time.perf_counter() - t,
                        "cpu_s": time.process_time() - c})

    for first, p, t, wt in gen.chunks():
        pending.append((first, p, t, wt))
        if sum(x[1].size - 1 for x in pending) >= args.batch:
            flush()
    if pending:
        flush()
    ix.close()
    wall = sum(b["wall_s"] for b in batches)
    cpu = sum(b["cpu_s"] for b in batches)
    print(json.dumps({"docs": args.docs, "metadata": mode, "wall_s": wall, "cpu_s": cpu, "docs_per_s": args.docs / wall,
                      "docs_per_cpu_s": args.docs / cpu, "batches": batches, "peak_rss_mb": peak_rss_mb()}))


def run_one(src: Path, args: argparse.Namespace, mode: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stair-es-arrays-", dir=args.workdir))
    try:
        env = dict(os.environ, PYTHONPATH=str(src))
        cmd = [sys.executable, str(HERE / "benchmarks" / "arrays_ingest.py"), "--child", "--docs", str(args.docs),
               "--batch", str(args.batch), "--metadata", mode, "--workdir", str(work)]
        out = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"the run with {src} failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000, help="documents per run (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=1_000_000, help="documents per add_arrays call, i.e. per segment")
    ap.add_argument("--metadata", default="columns", help="comma-separated: columns, dicts, none (default columns)")
    ap.add_argument("--runs", type=int, default=3, help="runs per checkout and metadata mode; medians are printed")
    ap.add_argument("--baseline", type=Path, help="an older source checkout to run alternately with this one")
    ap.add_argument("--workdir", default=None, help="where the indexes are written (default: the system's temp dir)")
    ap.add_argument("--out", type=Path, help="write every run's figures here as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.docs < 64 or args.batch < 1:
        ap.error("--docs must be at least 64 and --batch positive")
    if args.child:
        child(args)
        return
    modes = [m.strip() for m in args.metadata.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("columns", "dicts", "none")]
    if bad:
        ap.error(f"unknown --metadata {bad}; use columns, dicts or none")
    sides = [("this", HERE)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    results: dict = {}
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.docs:,} documents in calls of {args.batch:,}")
    for r in range(args.runs):
        for mode in modes:
            for name, src in sides:
                res = run_one(src, args, mode)
                results.setdefault((name, mode), []).append(res)
                print(f"  run {r + 1} {name:8s} {mode:7s} ({res['metadata']}): {res['docs_per_s']:>9,.0f} docs/s wall, "
                      f"{res['docs_per_cpu_s']:>9,.0f} per CPU s, peak RSS {res['peak_rss_mb']:,.0f} MB "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)
    print("\n| checkout | metadata | docs/s wall (median) | docs per CPU s | ratio to baseline (wall / CPU) |")
    print("|---|---|---|---|---|")
    for mode in modes:
        med = {name: (statistics.median(x["docs_per_s"] for x in results[(name, mode)]),
                      statistics.median(x["docs_per_cpu_s"] for x in results[(name, mode)])) for name, _ in sides}
        for name, _ in sides:
            ratio = ""
            if name == "this" and "baseline" in med:
                ratio = f"{med['this'][0] / med['baseline'][0]:.2f}x / {med['this'][1] / med['baseline'][1]:.2f}x"
            shown = results[(name, mode)][0]["metadata"]
            print(f"| {name} | {mode}{'' if shown == mode else f' (given as {shown})'} | {med[name][0]:,.0f} | "
                  f"{med[name][1]:,.0f} | {ratio} |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"docs": args.docs, "batch": args.batch, "baseline": str(args.baseline or ""),
                                        "runs": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}, indent=1))


if __name__ == "__main__":
    main()
