"""Cold `stair-es search` with and without query grounding, in the same run.

    python benchmarks/grounding_cold.py [--runs 7]

Ingests the sample catalog into a fresh embedded index (as ``benchmarks/cold_search.py``
does), then runs, as a new process each time and interleaved so every variant sees the same
machine load:

* ``"a red car"`` -- every word is in the index: the grounding map is never opened;
* ``"a giraffe"`` -- a word the index lacks: the map's header and one block are read;
* ``"a giraffe" --encoder-option grounding=off`` -- the same query without grounding.

Reports the median wall time, peak RSS and CPU of each (``cold_search.run_once``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import provenance_line  # noqa: E402
from cold_search import _user_env, run_once  # noqa: E402

VARIANTS = {
    "a red car (no grounding needed)": ["a red car"],
    "a giraffe (grounded)": ["a giraffe"],
    "a giraffe, grounding=off": ["a giraffe", "--encoder-option", "grounding=off"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    cli = str(Path(sys.executable).with_name("stair-es"))
    work = Path(tempfile.mkdtemp(prefix="stair-es-grounding-cold-"))
    try:
        from stair_es.samples import write_sample_catalog

        write_sample_catalog(work / "catalog")
        env = _user_env(work / "home", work / "pycache")
        subprocess.run([cli, "ingest", "samples", str(work / "catalog" / "manifest.jsonl")], env=env, check=True,
                       capture_output=True)
        cmds = {k: [cli, "search", "samples", *v, "--top-k", "3"] for k, v in VARIANTS.items()}
        for cmd in cmds.values():
            run_once(cmd, env)  # first use: query tower export, bytecode
        print(f"# cold search with/without grounding, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.2f}, "
              f"{args.runs} runs, medians\n# {provenance_line()}")
        res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for k, cmd in cmds.items():
                res[k].append(run_once(cmd, env))
        print(f"{'query':<34} {'wall s':>7} {'RSS MB':>7} {'CPU s':>6}")
        for k, rows in res.items():
            print(f"{k:<34} {statistics.median(r[0] for r in rows):>7.3f} {statistics.median(r[1] for r in rows):>7.1f} "
                  f"{statistics.median(r[2] for r in rows):>6.3f}")
        print(f"# load avg at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
