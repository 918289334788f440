"""The benchmark runner: ``python -m benchmarks.run CONFIG [--out DIR]``.

For each corpus size (and each VisualSparta top-n, if the config sweeps it) the runner starts one
subprocess per system (``--worker``) so peak memory (``VmHWM``) is that system's own; the worker
builds the index, measures single-query latency on one thread, batched throughput on
``batch_threads`` and writes the top-k of every query. The parent then scores recall@10 against
the exact ranking of the same run (sparse: brute force on the full, un-pruned corpus; dense: FAISS
Flat) and hands everything to :mod:`benchmarks.report`.

The exact sparse systems are also put on a roofline (:mod:`benchmarks.roofline`): the machine's
copy/triad bandwidth and scalar scatter-add rate, measured once in the same run, beside each
system's postings scored per second and bytes read per query (printed at the end, and under
``roofline`` in ``results.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .common import machine_info, peak_rss_mb, percentiles, rss_mb, stat
from .corpora import CorpusSpec, load_corpus

log = logging.getLogger("benchmarks")

ROOT = Path(__file__).resolve().parent
RESULTS_DIR = ROOT / "results"
DEFAULT_MEASURE = {
    "k": 10,
    "warmup": 10,
    "latency_queries": 500,  # at most this many timed single queries per setting...
    "time_budget_s": 60.0,  # ...and at most this long (at least `min_queries` are always timed)
    "min_queries": 20,
    "batch": True,
    "batch_threads": 2,
    "worker_timeout_s": 1800,
}
GROUND_TRUTH = {"sparse": "bruteforce", "dense": "faiss_flat"}


# --- config ------------------------------------------------------------------------------------
def load_config(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    candidates = [Path(str(base) + ext) for base in (path, ROOT / "configs" / path) for ext in ("", ".json", ".toml")]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        known = ", ".join(sorted(p.stem for p in (ROOT / "configs").glob("*.*")))
        raise FileNotFoundError(f"no benchmark config {str(path)!r}; shipped configs: {known}")
    path = found
    if path.suffix == ".toml":
        import tomllib

        cfg = tomllib.loads(path.read_text())
    else:
        cfg = json.loads(path.read_text())
    cfg.setdefault("name", path.stem)
    cfg["measure"] = DEFAULT_MEASURE | cfg.get("measure", {})
    try:
        cfg["_path"] = str(path.resolve().relative_to(ROOT.parent))
    except ValueError:
        cfg["_path"] = str(path)
    return cfg


def _with_ground_truth(systems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Exact systems first; add the ground-truth system of each modality that is missing."""
    systems = [dict(s) for s in systems]
    kinds = {s["kind"] for s in systems}
    for modality, kind in GROUND_TRUTH.items():
        needs = any(getattr(_safe_class(s["kind"]), "modality", "sparse") == modality for s in systems)
        if needs and kind not in kinds:
            systems.append({"name": kind, "kind": kind, "auto": True})
    order = {k: i for i, k in enumerate(GROUND_TRUTH.values())}
    return sorted(systems, key=lambda s: order.get(s["kind"], len(order)))


def _safe_class(kind):
    from .systems import system_class

    try:
        return system_class(kind)
    except Exception:  # noqa: BLE001 - an unavailable system is reported by its worker
        return object


# --- worker --------------------------------------------------------------------------------------
def run_worker(job: dict[str, Any]) -> dict[str, Any]:
    """Build one system on one corpus, measure it, write its top-k; runs in its own process."""
    from .systems import SkipSystem, system_class

    m = job["measure"]
    k = int(m["k"])
    out: dict[str, Any] = {"system": job["system"]["name"], "kind": job["system"]["kind"], "status": "ok"}
    system = None
    try:
        cls = system_class(job["system"]["kind"])
        spec = CorpusSpec(**{**job["corpus"], "doc_nnz": tuple(job["corpus"]["doc_nnz"]), "query_nnz": tuple(job["corpus"]["query_nnz"])})
        # memory-mapped: a system pays (in peak RSS) only for the corpus pages it reads
        corpus = load_corpus(spec, Path(job["cache_dir"]) if job.get("cache_dir") else None, mmap=True)
        out["rss_before_build_mb"] = rss_mb()
        workdir = Path(job["workdir"])
        workdir.mkdir(parents=True, exist_ok=True)
        system = cls(job["system"]["name"], job["system"].get("params", {}), workdir)
        out["modality"], out["exact"] = cls.modality, cls.exact
        t0 = time.perf_counter()
        system.warmup(corpus)
        out["warmup_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        system.build(corpus)
        out["build_s"] = time.perf_counter() - t0
        out["rss_after_build_mb"] = rss_mb()
        system.prepare_queries(corpus)
        out["index_bytes"] = system.index_bytes()
        out["extra"] = system.extra_info()
        nq = corpus.queries.n_rows
        out["settings"] = []
        for si, setting in enumerate(system.settings()):
            system.set_threads(1)
            for q in range(min(m["warmup"], nq)):
                system.search_one(q, k, setting)
            topk = np.full((nq, k), -1, dtype=np.int64)
            times = []
            start = time.perf_counter()
            for q in range(min(nq, m["latency_queries"])):
                t = time.perf_counter()
                ids = system.search_one(q, k, setting)
                times.append((time.perf_counter() - t) * 1e3)
                n = min(k, len(ids))
                topk[q, :n] = np.asarray(ids)[:n]
                if len(times) >= m["min_queries"] and time.perf_counter() - start > m["time_budget_s"]:
                    break
            topk = topk[: len(times)]
            res = {"setting": setting, "latency_ms": percentiles(times)}
            np.save(Path(job["topk_prefix"] + f"-{si}.npy"), topk)
            res["topk_file"] = job["topk_prefix"] + f"-{si}.npy"
            if m["batch"]:
                threads = int(m["batch_threads"])
                system.set_threads(threads)
                t = time.perf_counter()
                system.search_batch(k, setting, threads)
                dt = time.perf_counter() - t
                if not cls.native_batch:
                    threads = 1  # a sequential loop of single queries
                elif cls.batch_threads_max:
                    threads = min(threads, cls.batch_threads_max)
                res["batch"] = {"qps": nq / dt, "threads": threads, "queries": nq, "seconds": dt, "native": cls.native_batch}
            out["settings"].append(res)
    except SkipSystem as e:
        out.update(status="skipped", reason=str(e))
    except Exception as e:  # noqa: BLE001 - one failing system must not lose the others' results
        import traceback

        out.update(status="error", reason=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
    finally:
        if system is not None:
            try:
                system.close()
            except Exception:  # noqa: BLE001
                pass
    out["peak_rss_mb"] = peak_rss_mb()
    return out


# --- recall -------------------------------------------------------------------------------------
def sparse_recall(corpus, got: np.ndarray, truth: np.ndarray, k: int, rtol: float = 1e-4) -> float:
    """Mean recall@k against the exact ranking, counting a document whose exact score ties the
    k-th best (within ``rtol``) as correct: which of several equal-score documents an exact system
    returns is arbitrary, and the engine stores weights at reduced precision."""
    from .corpora import VOCAB_SIZE

    d, qs = corpus.docs, corpus.queries
    dense_q = np.zeros(VOCAB_SIZE, dtype=np.float64)

    def score(doc: int) -> float:
        ids, w = d.row(int(doc))
        return float(np.dot(w.astype(np.float64), dense_q[ids]))

    vals = []
    for q in range(got.shape[0]):
        t = truth[q][truth[q] >= 0]
        if t.size == 0:
            continue
        qi, qw = qs.row(q)
        dense_q[qi] = qw
        kth = score(t[-1])
        g = got[q][got[q] >= 0]
        hits = sum(score(x) >= kth * (1 - rtol) for x in g)
        vals.append(min(t.size, hits) / t.size)
        dense_q[qi] = 0.0
    return float(np.mean(vals)) if vals else float("nan")


def id_recall(got: np.ndarray, truth: np.ndarray) -> float:
    vals = []
    for g, t in zip(got, truth):
        t = t[t >= 0]
        if t.size:
            vals.append(len(set(g[g >= 0].tolist()) & set(t.tolist())) / t.size)
    return float(np.mean(vals)) if vals else float("nan")


# --- machine / provenance --------------------------------------------------------------------------
def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("stair-es", "numpy", "scipy", "numba", "faiss-cpu", "pyseismic-lsr", "psutil", "matplotlib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def git_commit() -> dict[str, Any]:
    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "stair_es", "benchmarks"))}
    except OSError:
        return {"commit": "unknown", "dirty": None}


# --- orchestration --------------------------------------------------------------------------------
def _spawn(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    out_path = f.name + ".out"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.run", "--worker", f.name, "--worker-out", out_path],
            cwd=ROOT.parent,
            timeout=timeout,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0 or not Path(out_path).exists():
            return {"status": "error", "reason": f"worker exited {proc.returncode}: {proc.stderr[-2000:]}"}
        return json.loads(Path(out_path).read_text())
    except subprocess.TimeoutExpired:
        return {"status": "skipped", "reason": f"did not finish within worker_timeout_s={timeout:.0f}"}
    finally:
        for p in (f.name, out_path):
            Path(p).unlink(missing_ok=True)


def run_config(cfg: dict[str, Any], out_dir: Path | None = None, *, progress: Callable[[str], None] | None = None,
               cache_dir: Path | None = None) -> dict[str, Any]:
    """Run every (size, top-n, system) of ``cfg``; write and return the report dict."""
    from . import report, roofline

    say = progress or (lambda msg: log.info(msg))
    out_dir = Path(out_dir or RESULTS_DIR / cfg["name"])
    out_dir.mkdir(parents=True, exist_ok=True)
    m = cfg["measure"]
    k = int(m["k"])
    corpus_table = dict(cfg.get("corpus", {}))
    sizes = corpus_table.pop("sizes", [corpus_table.pop("n_docs", 10_000)])
    sweep = cfg.get("visualsparta")  # {"doc_top_n": [50, 100, ..., null], "systems": [names]}
    systems = _with_ground_truth(cfg["systems"])
    t_run = time.perf_counter()
    machine = machine_info()  # load average at the start; the end's is added below
    rows: list[dict[str, Any]] = []
    limits: dict[str, Any] | None = None  # the machine's limits, measured once in this run (benchmarks.roofline)
    roof_rows: list[tuple[str, dict[str, Any]]] = []
    corpora_info = {}
    with tempfile.TemporaryDirectory(prefix="stair-bench-") as tmp:
        for size in sizes:
            spec = CorpusSpec.from_config(corpus_table, size)
            t = time.perf_counter()
            corpus = truth_corpus = load_corpus(spec, cache_dir, mmap=True)  # recall is against the un-pruned corpus
            corpora_info[str(size)] = corpus.info
            say(f"[{size:,} docs] corpus ready in {time.perf_counter() - t:.1f} s ({corpus.info['docs']['nnz_mean']:.0f} tokens/doc)")
            truth: dict[str, np.ndarray] = {}
            ppq: float | None = None  # median postings of the query terms per query (the roofline's work)
            variants: list[tuple[int | None, list[dict[str, Any]]]] = [(None, systems)]
            if sweep:
                names = set(sweep.get("systems", ["engine"]))
                swept = [s for s in systems if s["name"] in names]
                variants += [(n, swept) for n in sweep["doc_top_n"] if n is not None]
            for top_n, group in variants:
                sub_spec = CorpusSpec(**{**asdict(spec), "doc_top_n": top_n})
                for s in group:
                    if s.get("max_docs") and size > s["max_docs"]:
                        rows.append({"system": s["name"], "kind": s["kind"], "size": size, "doc_top_n": top_n,
                                     "status": "skipped", "reason": f"above this config's max_docs={s['max_docs']}"})
                        say(f"[{size:,}] {s['name']}: skipped (max_docs)")
                        continue
                    job = {
                        "corpus": asdict(sub_spec),
                        "system": s,
                        "measure": m | s.get("measure", {}),
                        "workdir": str(Path(tmp) / f"{s['name']}-{size}-{top_n}"),
                        "topk_prefix": str(Path(tmp) / f"topk-{s['name']}-{size}-{top_n}"),
                        "cache_dir": str(cache_dir) if cache_dir else None,
                    }
                    label = s["name"] + (f" top-{top_n}" if top_n else "")
                    say(f"[{size:,}] {label}: running")
                    t = time.perf_counter()
                    res = _spawn(job, float(job["measure"]["worker_timeout_s"]))
                    res.update(system=s["name"], kind=s["kind"], size=size, doc_top_n=top_n, wall_s=time.perf_counter() - t)
                    if res["status"] == "ok":
                        for st in res["settings"]:
                            topk = np.load(st.pop("topk_file"))
                            if s["kind"] in GROUND_TRUTH.values() and top_n is None:
                                truth.setdefault(res["modality"], topk)
                            ref = truth.get(res["modality"])
                            if ref is None:
                                st["recall@10"] = None
                            elif res["modality"] == "sparse":
                                n = min(len(ref), len(topk))
                                st["recall@10"] = sparse_recall(truth_corpus, topk[:n], ref[:n], k)
                            else:
                                n = min(len(ref), len(topk))
                                st["recall@10"] = id_recall(topk[:n], ref[:n])
                        if res.get("exact") and res.get("modality") == "sparse" and top_n is None:
                            if limits is None:
                                limits = roofline.measure_limits(size)
                                say(roofline.limits_line(limits))
                            if ppq is None:
                                from .corpora import VOCAB_SIZE

                                q = truth_corpus.queries
                                ppq = float(np.median(roofline.postings_per_query(
                                    truth_corpus.docs.indices, VOCAB_SIZE, [q.row(i)[0] for i in range(q.n_rows)])))
                            for st in res["settings"]:
                                st["roofline"] = roofline.entry(s["kind"], stat(st["latency_ms"], "p50"), ppq, limits)
                                roof_rows.append((f"{label} @ {size:,}", st["roofline"]))
                        best = min(res["settings"], key=lambda st: stat(st["latency_ms"], "p50"))
                        say(f"[{size:,}] {label}: build {res['build_s']:.1f} s, p50 {stat(best['latency_ms'], 'p50'):.3f} ms, "
                            f"recall@10 {best.get('recall@10')}, peak {res['peak_rss_mb']:.0f} MB")
                    else:
                        say(f"[{size:,}] {label}: {res['status']}: {res.get('reason', '')[:300]}")
                    rows.append(res)
            del corpus, truth_corpus
    result = {
        "config": {k2: v for k2, v in cfg.items() if not k2.startswith("_")},
        "config_path": cfg.get("_path"),
        "git": git_commit(),
        "machine": machine | {"loadavg_end": list(os.getloadavg()), "shared": True},
        "versions": library_versions(),
        "corpora": corpora_info,
        "results": rows,
        "roofline": {"limits": limits, "systems": [{"system": lab, **e} for lab, e in roof_rows]} if limits else None,
        "run_wall_s": time.perf_counter() - t_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(time.time() - (time.perf_counter() - t_run))),
    }
    if limits:
        say("roofline of the exact sparse systems (benchmarks/roofline.py):\n" + roofline.limits_line(limits) + "\n"
            + roofline.table(roof_rows))
    report.write_reports(result, out_dir)
    say(f"report written to {out_dir} (run took {result['run_wall_s']:.0f} s)")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("config", nargs="?", help="config file or name under benchmarks/configs (tiny, 10k, 100k, 1m, visualsparta)")
    p.add_argument("--out", help="output directory (default benchmarks/results/<config-name>)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        res = run_worker(json.loads(Path(a.worker).read_text()))
        Path(a.worker_out).write_text(json.dumps(res, default=float))
        return 0
    if not a.config:
        p.error("a config is required")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    run_config(load_config(a.config), Path(a.out) if a.out else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
