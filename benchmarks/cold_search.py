"""Cold `stair-es search`: what a user waits for when typing one query in a new shell.

    python benchmarks/cold_search.py                                  # this checkout
    python benchmarks/cold_search.py --baseline /path/to/old/.venv/bin/stair-es --runs 5
    python benchmarks/cold_search.py --threshold     # numpy vs numba search latency by postings touched

Ingests the sample catalog (``stair-es demo``'s photos) into a fresh embedded index with
each CLI, then runs ``stair-es search samples "a red car"`` ``--runs`` times as a new
process each time (the two CLIs interleaved, so both see the same machine load), reporting
the median wall time and the median peak RSS of the search process (``os.wait4`` in a
small launcher, so the figure is not inflated by this benchmark's own size). Bytecode is
cached as in a user's shell (under this run's temporary folder). The ONNX towers are exported
beforehand with ``stair-es encoders export``, as ``scripts/setup.sh`` does (which also installs
the default encoder's objects detector, so the index is the one a set-up user gets). Then prints the ``python -X importtime`` breakdown
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import provenance_line, user_shell_env  # noqa: E402

QUERY = "a red car"


#: A small launcher that forks the command and reports its resource usage. Linux keeps a
#: process's peak RSS across exec (``ru_maxrss`` includes the address space it replaced), and
#: a child of this benchmark starts as a copy of it (with the sample catalog's libraries
#: loaded, ~250 MB): measured directly, every search would report at least that. Started with
#: ``-S -I`` the launcher is ~10 MB, far under any search, so the child's figure is its own.
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[2], sys.argv[2:])\n"
    "_, status, ru = os.wait4(pid, 0)\n"
    "os.write(int(sys.argv[1]), f'{os.waitstatus_to_exitcode(status)} {ru.ru_maxrss} {ru.ru_utime + ru.ru_stime}'.encode())\n"
)


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, peak RSS MB, CPU s = user + sys) of one command, the RSS and CPU the command's
    own (see ``_LAUNCHER``)."""
    r, w = os.pipe()
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-S", "-I", "-c", _LAUNCHER, str(w), *cmd], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env, pass_fds=(w,))
    os.close(w)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.wait()
    wall = time.perf_counter() - t
    with os.fdopen(r, "rb") as f:
        report = f.read().decode().split()
    if proc.returncode != 0 or not report or report[0] != "0":
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-1500:]}")
    return wall, int(report[1]) / 1024.0, float(report[2])  # RSS: Linux reports KB


def _user_env(home: Path, pycache: Path) -> dict[str, str]:
    """The environment of a user's shell (:func:`benchmarks.common.user_shell_env`) with ``home``
    as stair_es's data home and model cache."""
    return user_shell_env(pycache, STAIR_ES_HOME=str(home), STAIR_ES_MODEL_CACHE=str(home / "_models"))


def threshold_table() -> None:
    """Per-segment search latency of the numpy path against the warm numba kernels (auto), by
    postings touched: where numpy stops being about as fast is ``NUMPY_MAX_POSTINGS``."""
    import numpy as np

    from stair_es.engine import EngineIndex
    from stair_es.engine.npkernels import NUMPY_MAX_POSTINGS, postings_touched
    from stair_es.query import SearchRequest, SparseClause
    from stair_es.schema import IndexSchema
    from stair_es.sparse import SparseVector

    rng = np.random.default_rng(0)
    work = Path(tempfile.mkdtemp(prefix="stair-es-threshold-"))
    try:
        print(f"# numpy vs warm numba per segment (top 10, 20-token queries), NUMPY_MAX_POSTINGS = {NUMPY_MAX_POSTINGS}")
        print(f"{'docs':>8} {'postings touched':>17} {'numpy ms':>9} {'numba ms':>9} {'ratio':>6}")
        for n in (1_000, 10_000, 50_000, 200_000):
            ix = EngineIndex.create(work / f"ix{n}", IndexSchema(fields={}, sparse_fields=("image",)))
            per = 60
            p = 1.0 / np.arange(1, 3001) ** 0.8
            p /= p.sum()
            toks = np.sort(np.stack([rng.choice(3000, size=per, replace=False, p=p) for _ in range(n)]), axis=1) + 2000
            ix.add_arrays([f"d{i}" for i in range(n)], {"image": (np.arange(n + 1, dtype=np.int64) * per, toks.reshape(-1),
                                                                  rng.lognormal(size=n * per).astype(np.float32))})
            seg = ix._segs[0].seg
            for q in range(3):
                qt = np.sort(rng.choice(3000, size=20, replace=False, p=p)) + 2000
                req = SearchRequest([SparseClause("image", SparseVector.from_arrays(qt, rng.uniform(0.5, 2, 20)))], top_k=10)
                touched = postings_touched(seg.term_index(0, qt)[seg.term_index(0, qt) >= 0], seg.post_ptr)
                times = {}
                for strat in ("numpy", "auto"):
                    ix.strategy = strat
                    ix.numpy_max_postings = 0
                    ix.search(req)
                    best = min(_timed(ix.search, req) for _ in range(5))
                    times[strat] = best * 1000
                print(f"{n:>8} {touched:>17} {times['numpy']:>9.2f} {times['auto']:>9.2f} {times['numpy'] / times['auto']:>6.1f}")
            ix.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="another stair-es executable measured in the same run")
    ap.add_argument("--threshold", action="store_true", help="only print numpy vs numba latency by postings touched")
    args = ap.parse_args()
    if args.threshold:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        return threshold_table()
    here = str(Path(sys.executable).with_name("stair-es"))
    work = Path(tempfile.mkdtemp(prefix="stair-es-cold-"))
    try:
        catalog = work / "catalog"
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from stair_es.samples import write_sample_catalog

        write_sample_catalog(catalog)
        manifest = catalog / "manifest.jsonl"
        print(f"# cold search {QUERY!r}, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.2f}\n# {provenance_line()}")
        rows = [("this checkout", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        cmds, envs = {}, {}
        for label, cli in rows:
            home = work / label.replace(" ", "-")
            envs[label] = _user_env(home, work / f"pycache-{label.replace(' ', '-')}")
            # as scripts/setup.sh does (the default encoder's objects detector installed); tolerated if it fails
            subprocess.run([cli, "encoders", "export"], env=envs[label], capture_output=True, check=False)
            subprocess.run([cli, "ingest", "samples", str(manifest)], env=envs[label], check=True, capture_output=True)
            cmds[label] = [cli, "search", "samples", QUERY, "--top-k", "3"]
            run_once(cmds[label], envs[label])  # first use: exports the query tower (once per machine), writes bytecode
        walls: dict[str, list[float]] = {label: [] for label, _ in rows}
        rss: dict[str, list[float]] = {label: [] for label, _ in rows}
        cpus: dict[str, list[float]] = {label: [] for label, _ in rows}
        for _ in range(args.runs):  # interleaved, so both see the same machine load
            for label, _ in rows:
                w, r, c = run_once(cmds[label], envs[label])
                walls[label].append(w)
                rss[label].append(r)
                cpus[label].append(c)
        for label, _ in rows:
            print(f"{label:<14} median wall {statistics.median(walls[label]):5.2f} s   median CPU "
                  f"{statistics.median(cpus[label]):5.2f} s   median peak RSS "
                  f"{statistics.median(rss[label]):6.0f} MB   (runs: {', '.join(f'{w:.2f}' for w in walls[label])} s)")
        if args.baseline:
            # CPU time (user + sys) is disturbed far less than wall time by other load on the machine
            print(f"ratio this/baseline: wall x{statistics.median(walls['this checkout']) / statistics.median(walls['baseline']):.2f}, "
                  f"CPU x{statistics.median(cpus['this checkout']) / statistics.median(cpus['baseline']):.2f}, "
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
