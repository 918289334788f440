"""Cold `stair-es search`: what a user waits for when typing one query in a new shell.

    python benchmarks/cold_search.py                                  # this checkout
    python benchmarks/cold_search.py --baseline /path/to/old/.venv/bin/stair-es --runs 5

Ingests the sample catalog (``stair-es demo``'s photos) into a fresh embedded index with
each CLI, then runs ``stair-es search samples "a red car"`` ``--runs`` times as a new
process each time (the two CLIs interleaved, so both see the same machine load), reporting
the median wall time and the median peak RSS of the process (``os.wait4``). Bytecode is
cached as in a user's shell (under this run's temporary folder). The ONNX towers are exported once beforehand (first use), as they are on a
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


def _user_env(home: Path, pycache: Path) -> dict[str, str]:
    """The environment of a user's shell: bytecode is cached (in a folder of this run, so the
    checkout is not written to), whatever PYTHONDONTWRITEBYTECODE this shell has."""
    env = dict(os.environ, STAIR_ES_HOME=str(home), STAIR_ES_MODEL_CACHE=str(home / "_models"),
               PYTHONPYCACHEPREFIX=str(pycache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


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
        cmds, envs = {}, {}
        for label, cli in rows:
            home = work / label.replace(" ", "-")
            envs[label] = _user_env(home, work / f"pycache-{label.replace(' ', '-')}")
            subprocess.run([cli, "ingest", "samples", str(manifest)], env=envs[label], check=True, capture_output=True)
            cmds[label] = [cli, "search", "samples", QUERY, "--top-k", "3"]
            run_once(cmds[label], envs[label])  # first use: exports the query tower (once per machine), writes bytecode
        walls: dict[str, list[float]] = {label: [] for label, _ in rows}
        rss: dict[str, list[float]] = {label: [] for label, _ in rows}
        for _ in range(args.runs):  # interleaved, so both see the same machine load
            for label, _ in rows:
                w, r = run_once(cmds[label], envs[label])
                walls[label].append(w)
                rss[label].append(r)
        for label, _ in rows:
            print(f"{label:<14} median wall {statistics.median(walls[label]):5.2f} s   median peak RSS "
                  f"{statistics.median(rss[label]):6.0f} MB   (runs: {', '.join(f'{w:.2f}' for w in walls[label])} s)")
        if args.baseline:
            print(f"ratio this/baseline: wall x{statistics.median(walls['this checkout']) / statistics.median(walls['baseline']):.2f}, "
                  f"RSS x{statistics.median(rss['this checkout']) / statistics.median(rss['baseline']):.2f}; "
                  f"load avg now {os.getloadavg()[0]:.2f}")
        env = envs["this checkout"]
        out = subprocess.run([sys.executable, "-X", "importtime", "-m", "stair_es.cli.main", "search", "samples", QUERY],
                             env=env, capture_output=True, text=True)
        rows_t, imported = [], set()
        for line in out.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                _, cum, name = line.split(":", 1)[1].split("|")
                cum = cum.strip()
                imported.add(name.strip())
                if cum.isdigit() and not name[1:].startswith(" "):  # top-level imports only
                    rows_t.append((int(cum), name.strip()))
        heavy = [m for m in ("torch", "transformers", "numba", "scipy", "onnxruntime", "tokenizers", "tqdm") if m in imported]
        print(f"top-level imports of one search (top 12 by cumulative time); heavy modules imported: {', '.join(heavy) or 'none'}")
        for cum, name in sorted(rows_t, reverse=True)[:12]:
            print(f"  {cum / 1000:7.1f} ms  {name}")
        prof = work / "search.prof"
        subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "stair_es.cli.main", "search", "samples", QUERY],
                       env=env, capture_output=True, check=True)
        import pstats

        st = pstats.Stats(str(prof))
        calls = [(ct, f"{Path(fn).name}:{line}({func})") for (fn, line, func), (_, _, _, ct, _) in st.stats.items()  # type: ignore[attr-defined]
                 if "stair_es" in fn or "cli" in Path(fn).parts[-2:-1]]
        print(f"cProfile of one search: {st.total_tt * 1000:.0f} ms in all (profiled); stair_es calls by cumulative time:")  # type: ignore[attr-defined]
        for ct, name in sorted(calls, reverse=True)[:12]:
            print(f"  {ct * 1000:7.1f} ms  {name}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
