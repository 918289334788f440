"""One system at one corpus size, in its own process (so its peak RSS, ``VmHWM``, is its own).

``python -m benchmarks.scale.worker JOB.json OUT.json``: the job names the system, the corpus
spec, the work directory (where the queries and the engine's exact results are shared between
workers) and the measurement settings. The result JSON holds build figures, latency percentiles
(wall clock and the searching thread's CPU time), QPS on 1 and 2 threads, and the top-10 of every
query so the parent scores recall against the exact ranking of the same run.

A watchdog thread ends the worker with a message when the machine's available memory falls
under ``min_free_gb`` (the machine is shared: a benchmark must not take the others down).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..common import peak_rss_mb, percentiles, rss_mb
from .corpus import DENSE_DIM, SELECTIVITY, Generator, ScaleSpec, buckets, project, projection

K = 10


def available_gb() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def start_watchdog(min_free_gb: float, out: Path, partial: dict) -> None:
    def watch():
        while True:
            free = available_gb()
            if free < min_free_gb:
                partial["error"] = (f"stopped: the machine's available memory fell to {free:.1f} GB "
                                    f"(< {min_free_gb} GB floor, --min-free-gb) at RSS {rss_mb():.0f} MB")
                partial["peak_rss_mb"] = peak_rss_mb()
                out.write_text(json.dumps(partial, default=float))
                print(partial["error"], file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def time_queries(fn, n: int, budget_s: float, warmup: int = 5) -> tuple[list[np.ndarray], dict, dict]:
    """Run ``fn(i)`` for every query (all are needed for recall); latency statistics cover
    those timed within ``budget_s`` (at least 20)."""
    for i in range(min(warmup, n)):
        fn(i)
    wall, cpu, ids = [], [], []
    t_start = time.perf_counter()
    for i in range(n):
        t, c = time.perf_counter(), time.thread_time()
        r = fn(i)
        c1, t1 = time.thread_time(), time.perf_counter()
        if len(wall) < 20 or t1 - t_start < budget_s:
            wall.append((t1 - t) * 1000)
            cpu.append((c1 - c) * 1000)
        ids.append(np.asarray(r, dtype=np.int64)[:K])
    return ids, percentiles(wall), percentiles(cpu)


def pad_ids(rows: list[np.ndarray]) -> list[list[int]]:
    out = []
    for r in rows:
        r = [int(x) for x in r[:K]]
        out.append(r + [-1] * (K - len(r)))
    return out


def load_queries(workdir: Path, spec: ScaleSpec):
    f = workdir / f"queries-{spec.weights}-{spec.n_docs}.npz"
    z = np.load(f)
    return z["indptr"], z["ids"], z["weights"]


# --- the embedded engine -----------------------------------------------------------------------
def search_lock(job: dict, res: dict) -> None:
    """With ``job["search_lock"]`` (``--search-lock FILE``): wait (up to 30 min) for an exclusive flock
    on that file, then run at priority 0 (the build ran at the caller's nice), so the timed searches
    hold the benchmark lock and nothing before them does. Held until the process exits."""
    path = job.get("search_lock")
    if not path:
        return
    import fcntl
    import signal

    t = time.perf_counter()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)

    def late(signum, frame):
        raise TimeoutError(f"the search lock {path} was not free within 30 min")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(1800)
    try:  # (a blocking wait, as `flock -w` waits: polling would lose the lock to every blocked waiter)
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:  # (not allowed to raise it back: the searches run at the caller's nice)
        pass
    res["search_lock_wait_s"] = time.perf_counter() - t
    res["load_at_search"] = os.getloadavg()[0]


def run_engine(job: dict, partial: dict) -> dict:
    from stair_es.engine import EngineIndex
    from stair_es.query import Range, SearchRequest, SparseClause
    from stair_es.schema import IndexSchema
    from stair_es.sparse import SparseVector

    spec = ScaleSpec(**job["spec"])
    workdir = Path(job["workdir"])
    m = job["measure"]
    gen = Generator(spec)
    path = workdir / f"engine-{spec.weights}-{spec.n_docs}"
    with_meta = spec.weights in job.get("filters_on", ["idf"])
    res: dict[str, Any] = {"index_path": str(path), "metadata_column": with_meta}
    reuse = job.get("reuse") and (path / "manifest.json").exists()
    if not reuse:
        import shutil

        # untimed: load numba's compiled kernels (build, search) on 64 documents of the same array types
        warm = workdir / f"warmup-engine-{os.getpid()}"
        shutil.rmtree(warm, ignore_errors=True)
        ip, ids, w = gen.chunk(0)
        m64 = min(64, ip.size - 1)
        wx = EngineIndex.create(warm, IndexSchema(sparse_fields=("image",)))
        wx.add_arrays([str(i) for i in range(m64)], {"image": (ip[: m64 + 1], ids[: ip[m64]], w[: ip[m64]])},
                      columns={"bucket": buckets(0, m64)} if with_meta else None)
        wreq = SearchRequest([SparseClause("image", SparseVector.from_arrays(ids[: ip[1]], w[: ip[1]]))], top_k=K)
        for strategy in ("auto", "taat", "blockmax"):
            wx.strategy = strategy
            wx.search(wreq)
        wx.close()
        shutil.rmtree(warm, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        ix = EngineIndex.create(path, IndexSchema(sparse_fields=("image",)))
        ix.max_segments = 1 << 30  # one segment per add_arrays call of `segment_docs`: no merge of 10M documents in RAM
        seg_docs = int(job.get("segment_docs", 1_000_000))
        gen_s = add_s = 0.0
        add_cpu = [0.0]
        pending: list = []

        def flush():
            nonlocal add_s
            if not pending:
                return
            first = pending[0][0]
            n = sum(p[1].size - 1 for p in pending)
            indptr = np.zeros(n + 1, np.int64)
            o = r = 0
            for _, ip, _, _ in pending:
                indptr[r + 1 : r + ip.size] = ip[1:] + o
                o += int(ip[-1])
                r += ip.size - 1
            ids = np.concatenate([p[2] for p in pending])
            w = np.concatenate([p[3] for p in pending])
            pending.clear()
            names = [str(i) for i in range(first, first + n)]
            cols = {"bucket": buckets(first, n)} if with_meta else None
            t, c = time.perf_counter(), time.process_time()
            ix.add_arrays(names, {"image": (indptr, ids, w)}, columns=cols)
            add_s += time.perf_counter() - t
            add_cpu[0] += time.process_time() - c

        t = time.perf_counter()
        for first, ip, ids, w in gen.chunks():
            gen_s += time.perf_counter() - t
            pending.append((first, ip, ids, w))
            if sum(p[1].size - 1 for p in pending) >= seg_docs:
                flush()
            t = time.perf_counter()
        flush()
        st = ix.stats()
        ix.close()
        res.update({"generate_s": gen_s, "build_s": add_s, "ingest_docs_per_s": spec.n_docs / add_s,
                    "build_cpu_s": add_cpu[0], "ingest_docs_per_cpu_s": spec.n_docs / add_cpu[0], "segment_docs": seg_docs})
        partial.update(res)
    search_lock(job, res)
    reader = EngineIndex.open(path)
    st = reader.stats()
    res.update({"postings": st["postings"], "segments": st["segments"], "bytes_per_posting": st["bytes_per_posting"],
                "posting_bytes": st["posting_bytes"], "index_bytes": st["bytes_on_disk"],
                "rss_after_build_mb": rss_mb()})
    qp, qi, qw = load_queries(workdir, spec)
    nq = qp.size - 1
    vecs = [SparseVector.from_arrays(qi[qp[i]:qp[i + 1]], qw[qp[i]:qp[i + 1]]) for i in range(nq)]
    reqs = [SearchRequest([SparseClause("image", v)], top_k=K) for v in vecs]

    work: list[tuple[int, int, tuple]] = []  # per query: postings streamed, blocks scored, strategies

    def hits(r):
        st = getattr(reader, "last_search_stats", None)
        if st is not None and len(st) >= 6:
            work.append((int(st[5]), int(st[3]), tuple(getattr(reader, "last_search_strategies", ()))))
        return np.array([int(h.id) for h in r.hits], dtype=np.int64)

    def work_summary() -> dict:
        if not work:
            return {}
        used: dict[str, int] = {}
        for _, _, ss in work:
            for x in ss:
                used[x] = used.get(x, 0) + 1
        out = {"postings_streamed_p50": float(np.median([w[0] for w in work])),
               "blocks_scored_p50": float(np.median([w[1] for w in work])), "segment_searches": used}
        work.clear()
        return out

    runs: dict[str, Any] = {}
    for label, strategy in (("engine", "auto"), ("engine-taat", "taat")):
        if label not in job.get("engine_modes", ["engine", "engine-taat"]):
            continue
        reader.strategy = strategy
        ids, wall, cpu = time_queries(lambda i: hits(reader.search(reqs[i])), nq, m["budget_s"])
        entry = {"latency_ms": wall, "cpu_ms": cpu, "ids": pad_ids(ids), "work": work_summary(), "passes": 1}
        for _ in range(int(job.get("passes", 2)) - 1):
            # the first pass reads (and checksum-verifies) each posting chunk for the first time in this
            # process; later passes are the steady state. Both are kept.
            entry.setdefault("first_pass", {"latency_ms": wall, "cpu_ms": cpu})
            _, wall, cpu = time_queries(lambda i: hits(reader.search(reqs[i])), nq, m["budget_s"], warmup=0)
            work_summary()
            entry.update({"latency_ms": wall, "cpu_ms": cpu, "passes": entry["passes"] + 1})
        if label == "engine":
            # one query on 2 threads (search(threads=2): a multi-segment index shares its segments
            # out among the threads), timed right after the steady pass; same top 10 as 1 thread
            ids2, wall2, _ = time_queries(lambda i: hits(reader.search(reqs[i], threads=2)), nq, m["budget_s"], warmup=0)
            work_summary()
            entry["query_threads_2"] = {"latency_ms": wall2,
                                        "same_ids": all(np.array_equal(a, b) for a, b in zip(ids, ids2))}
        sub = reqs[: max(20, min(nq, wall["n"] if wall else nq))]
        for threads in (1, 2):
            t, c = time.perf_counter(), time.process_time()
            reader.search_batch(sub, threads=threads)
            wall_s = time.perf_counter() - t
            entry[f"qps_{threads}"] = len(sub) / wall_s
            # cores this process actually got during the batch: on a shared machine 2 threads may not get 2
            entry[f"cores_used_{threads}"] = (time.process_time() - c) / wall_s
        runs[label] = entry
        partial.setdefault("runs", {})[label] = entry
        if label == "engine" and with_meta:
            for name, bound in SELECTIVITY.items():
                freqs = [SearchRequest([SparseClause("image", v)], top_k=K, filter=Range("bucket", lt=bound)) for v in vecs]
                ids, wall, cpu = time_queries(lambda i: hits(reader.search(freqs[i])), nq, m["budget_s"])
                fe = {"latency_ms": wall, "cpu_ms": cpu, "ids": pad_ids(ids), "filter": f"bucket < {bound}",
                      "work": work_summary()}
                t = time.perf_counter()
                reader.search_batch(freqs[:max(20, wall["n"])], threads=2)
                fe["qps_2"] = max(20, wall["n"]) / (time.perf_counter() - t)
                runs[f"engine filtered {name}"] = fe
    res["runs"] = runs
    reader.close()
    if not job.get("keep_index"):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    return res


# --- peers through the benchmarks.systems adapters ---------------------------------------------
def _corpus(spec: ScaleSpec, workdir: Path, dense: bool):
    """A :class:`benchmarks.corpora.Corpus` of numpy arrays for the adapters; dense systems see
    each document's sparse vector projected to DENSE_DIM dimensions."""
    from types import SimpleNamespace

    from ..corpora import Corpus, Csr

    gen = Generator(spec)
    t = time.perf_counter()
    docs = Csr(*gen.materialize())
    gen_s = time.perf_counter() - t
    queries = Csr(*load_queries(workdir, spec))
    proj = projection(spec.seed) if dense else None

    class ScaleCorpus(Corpus):
        def dense_doc_chunks(self):
            d = self.docs
            for a in range(0, d.n_rows, 100_000):
                b = min(d.n_rows, a + 100_000)
                lo, hi = int(d.indptr[a]), int(d.indptr[b])
                yield project(d.indptr[a : b + 1] - lo, d.indices[lo:hi], d.weights[lo:hi], proj)

        def dense_queries(self):
            q = self.queries
            return project(q.indptr, q.indices, q.weights, proj)

    return ScaleCorpus(SimpleNamespace(n_docs=spec.n_docs, dense_dim=DENSE_DIM, seed=spec.seed), docs, queries), gen_s


def run_peer(job: dict, partial: dict) -> dict:
    from ..systems import system_class

    spec = ScaleSpec(**job["spec"])
    workdir = Path(job["workdir"])
    m = job["measure"]
    kind = job["kind"]
    cls = system_class(kind)
    sysdir = workdir / f"{kind}-{spec.weights}-{spec.n_docs}"
    sysdir.mkdir(parents=True, exist_ok=True)
    system = cls(kind, job.get("params", {}), sysdir)
    corpus, gen_s = _corpus(spec, workdir, dense=getattr(cls, "modality", "sparse") == "dense")
    res: dict[str, Any] = {"generate_s": gen_s, "rss_corpus_mb": rss_mb()}
    system.warmup(corpus)
    t, c = time.perf_counter(), time.process_time()
    system.build(corpus)
    res["build_s"] = time.perf_counter() - t
    res["build_cpu_s"] = time.process_time() - c  # all threads of the process
    res["rss_after_build_mb"] = rss_mb()
    partial.update(res)
    system.prepare_queries(corpus)
    search_lock(job, res)
    try:
        res["index_bytes"] = system.index_bytes()
    except Exception:  # noqa: BLE001 - informational
        res["index_bytes"] = None
    nq = corpus.queries.n_rows
    runs = {}
    for setting in system.settings():
        system.set_threads(1)
        ids, wall, cpu = time_queries(lambda i: system.search_one(i, K, setting), nq, m["budget_s"])
        entry = {"setting": setting, "latency_ms": wall, "cpu_ms": cpu, "ids": pad_ids(ids)}
        for threads in (1, 2):
            if threads > (getattr(system, "batch_threads_max", None) or 2):
                continue
            system.set_threads(threads)
            t, c = time.perf_counter(), time.process_time()
            system.search_batch(K, setting, threads)
            wall_s = time.perf_counter() - t
            entry[f"qps_{threads}"] = nq / wall_s
            entry[f"cores_used_{threads}"] = (time.process_time() - c) / wall_s
        label = kind + ("" if setting == {} else " " + ",".join(f"{k}={v}" for k, v in setting.items()))
        runs[label] = entry
        partial.setdefault("runs", {})[label] = entry
    if kind == "bruteforce" and job.get("filters"):
        # the exact filtered ranking by a second route: scores of excluded documents set to 0
        from ..systems.base import topk_from_scores

        b = buckets(0, spec.n_docs)
        for name, bound in SELECTIVITY.items():
            mask = b < bound

            def one(i):
                tok, w = corpus.queries.row(i)
                s = np.asarray(system.postings[tok].T @ w).ravel()
                s[~mask] = 0
                return topk_from_scores(s, K)

            ids, wall, cpu = time_queries(one, nq, m["budget_s"])
            runs[f"bruteforce filtered {name}"] = {"latency_ms": wall, "cpu_ms": cpu, "ids": pad_ids(ids),
                                                   "filter": f"bucket < {bound}"}
    res["runs"] = runs
    res["extra"] = system.extra_info()
    system.close()
    return res


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    partial: dict[str, Any] = {"system": job["kind"]}
    start_watchdog(float(job.get("min_free_gb", 2.0)), out, partial)
    t0 = time.perf_counter()
    try:
        if job["kind"] == "engine":
            res = run_engine(job, partial)
        else:
            res = run_peer(job, partial)
    except Exception as e:  # noqa: BLE001 - reported per system; the run goes on
        from ..systems.base import SkipSystem

        partial["skipped" if isinstance(e, SkipSystem) else "error"] = f"{type(e).__name__}: {e}" if not isinstance(e, SkipSystem) else str(e)
        partial["peak_rss_mb"] = peak_rss_mb()
        out.write_text(json.dumps(partial, default=float))
        return 0
    res["system"] = job["kind"]
    res["peak_rss_mb"] = peak_rss_mb()
    res["wall_s"] = time.perf_counter() - t0
    out.write_text(json.dumps(res, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
