"""Cold `stair-es search`: what a user waits for when typing one query in a new shell.

    python benchmarks/cold_search.py                                  # this checkout
    python benchmarks/cold_search.py --baseline /path/to/old/.venv/bin/stair-es --runs 5

Ingests the sample catalog (``stair-es demo``'s photos) into a fresh embedded index with
each CLI, then runs ``stair-es search samples "a red car"`` ``--runs`` times as a new
process each time, reporting the median wall time and the median peak RSS of the process
(``os.wait4``). The ONNX towers are exported once beforehand (first use), as they are on a
user's machine after the first ingest. Then prints the ``python -X importtime`` breakdown
(top modules by cumulative import time) and the cProfile top of one search with this
checkout, so a regression shows where it comes from.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = "a red car"


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-1500:]}")
    return wall, usage.ru_maxrss / 1024.0  # MB (Linux reports KB)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="another stair-es executable measured in the same run")
    args = ap.parse_args()
    here = str(Path(sys.executable).with_name("stair-es"))
    work = Path(tempfile.mkdtemp(prefix="stair-es-cold-"))
    try:
        catalog = work / "catalog"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from stair_es.samples import write_sample_catalog

        write_sample_catalog(catalog)
        manifest = catalog / "manifest.jsonl"
        print(f"# cold search {QUERY!r}, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.2f}")
        rows = [("this checkout", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        for label, cli in rows:
            home = work / label.replace(" ", "-")
            env = dict(os.environ, STAIR_ES_HOME=str(home), STAIR_ES_MODEL_CACHE=str(home / "_models"))
            subprocess.run([cli, "ingest", "samples", str(manifest)], env=env, check=True, capture_output=True)
            cmd = [cli, "search", "samples", QUERY, "--top-k", "3"]
            run_once(cmd, env)  # first use: exports the query tower (once per machine)
            walls, rss = zip(*(run_once(cmd, env) for _ in range(args.runs)))
            print(f"{label:<14} median wall {statistics.median(walls):5.2f} s   median peak RSS {statistics.median(rss):6.0f} MB"
                  f"   (runs: {', '.join(f'{w:.2f}' for w in walls)} s)")
        env = dict(os.environ, STAIR_ES_HOME=str(work / "this-checkout"),
                   STAIR_ES_MODEL_CACHE=str(work / "this-checkout" / "_models"))
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "stair_es.cli.main", "search", "samples", QUERY],
                             env=env, capture_output=True, text=True)
        rows_t = []
        for line in out.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                _, cum, name = line.split(":", 1)[1].split("|")
                cum = cum.strip()
                if cum.isdigit() and not name[1:].startswith(" "):  # top-level imports only
                    rows_t.append((int(cum), name.strip()))
        heavy = [m for m in ("torch", "transformers", "numba", "onnxruntime", "tokenizers", "tqdm") if any(n.strip() == m for _, n in rows_t)]
        print(f"top-level imports of one search (top 12 by cumulative time); heavy modules imported: {', '.join(heavy) or 'none'}")
        for cum, name in sorted(rows_t, reverse=True)[:12]:
            print(f"  {cum / 1000:7.1f} ms  {name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
