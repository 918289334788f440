"""Benchmark of the embedded engine on a synthetic STAIR-like corpus.

    python benchmarks/engine_bench.py --docs 1000000
    python benchmarks/engine_bench.py --docs 100000

Generates ``--docs`` documents with ~200 distinct tokens each, drawn Zipf-like over the
non-special BERT vocabulary ids, weights ``log1p(lognormal)``; builds an index with
``EngineIndex.add_arrays`` (chunks of ``--chunk`` docs) and ``optimize()``; runs ``--queries``
queries of 10-30 tokens (also Zipf-like) for exact top-10 on one thread; checks the top-10
of a sample against a scipy brute force over the stored (float16) weights.

``--strategy blockmax|taat`` forces one exact search strategy (default: the engine's per-query
choice); ``--dir D --reuse`` keeps the index in D and searches it again on the next run with the
same corpus arguments instead of rebuilding it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

try:
    from benchmarks.common import percentiles, rss_mb
except ImportError:  # run as `python benchmarks/engine_bench.py`: this folder is on sys.path
    from common import percentiles, rss_mb  # type: ignore[no-redef]

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from stair_es.engine import EngineIndex  # noqa: E402
from stair_es.engine.kernels import F16_TABLE  # noqa: E402
from stair_es.query import SearchRequest, SparseClause  # noqa: E402
from stair_es.schema import IndexSchema  # noqa: E402
from stair_es.sparse import SparseVector  # noqa: E402
from stair_es.vocab import VOCAB_SIZE, default_vocabulary  # noqa: E402


@njit(cache=True)
def _gen_rows_fast(n, seed, cdf, token_of, rank_of_token, lo, hi, scale):
    np.random.seed(seed)
    indptr = np.zeros(n + 1, np.int64)
    counts = np.empty(n, np.int64)
    for i in range(n):
        counts[i] = np.random.randint(lo, hi + 1)
        indptr[i + 1] = indptr[i] + counts[i]
    ids = np.empty(indptr[n], np.int32)
    w = np.empty(indptr[n], np.float32)
    seen = np.zeros(cdf.size, np.bool_)
    row = np.empty(hi, np.int32)
    for i in range(n):
        c = 0
        while c < counts[i]:
            r = np.searchsorted(cdf, np.random.random())
            if r >= cdf.size:
                r = cdf.size - 1
            if not seen[r]:
                seen[r] = True
                row[c] = token_of[r]
                c += 1
        srt = np.sort(row[:c])
        for j in range(c):
            ids[indptr[i] + j] = srt[j]
            w[indptr[i] + j] = np.log1p(np.exp(np.random.normal())) * scale[srt[j]]
            seen[rank_of_token[srt[j]]] = False
    return indptr, ids, w


def zipf_tables(seed: int, s: float = 1.0):
    vocab = default_vocabulary()
    usable = np.flatnonzero(~vocab.special_mask).astype(np.int32)
    rng = np.random.default_rng(seed)
    token_of = rng.permutation(usable).astype(np.int32)  # rank -> token id
    p = 1.0 / np.arange(1, token_of.size + 1) ** s
    cdf = np.cumsum(p / p.sum())
    rank_of_token = np.zeros(VOCAB_SIZE, np.int64)
    rank_of_token[token_of] = np.arange(token_of.size)
    return cdf, token_of, rank_of_token


def weight_scale(kind: str, token_of: np.ndarray) -> np.ndarray:
    """Per-token weight scale. ``iid``: 1 for every token (weights independent of frequency: the
    worst case for any exact pruning). ``idf``: min(1, sqrt(rank / 1000)), i.e. frequent tokens get
    small weights, as FLOPS/L1-regularised learned sparse encoders (SPLADE, STAIR) produce."""
    scale = np.ones(VOCAB_SIZE, np.float32)
    if kind == "idf":
        rank = np.arange(1, token_of.size + 1)
        scale[token_of] = np.minimum(1.0, np.sqrt(rank / 1000.0))
    return scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--check", type=int, default=20, help="queries checked against brute force")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--weights", choices=("idf", "iid"), default="idf",
                    help="idf: frequent tokens weigh less (like trained encoders); iid: independent of frequency")
    ap.add_argument("--dir", default=None, help="where to build the index (default: a temp dir, removed after)")
    ap.add_argument("--bshift", type=int, default=None, help="log2 of the block size (default: engine default)")
    ap.add_argument("--strategy", choices=("auto", "blockmax", "taat"), default="auto",
                    help="the engine's exact search strategy (default: auto, chosen per query and segment)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --dir: search the index an earlier run with the same --docs/--weights/--seed/--chunk built there")
    args = ap.parse_args()

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    print(f"# engine_bench  commit={commit}  python={platform.python_version()}  machine={platform.machine()}  "
          f"cpus={os.cpu_count()}  argv={' '.join(sys.argv[1:])}")
    cdf, token_of, rank_of_token = zipf_tables(args.seed)
    scale = weight_scale(args.weights, token_of)
    _gen_rows_fast(10, 0, cdf, token_of, rank_of_token, 150, 250, scale)  # compile
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="engine-bench-"))
    path = base / f"bench-index-{args.docs}-{args.weights}-{args.seed}-{args.chunk}"
    reuse = args.reuse and args.dir and (path / "manifest.json").exists()
    if path.exists() and not reuse:
        shutil.rmtree(path)
    kw = {} if args.bshift is None else {"bshift": args.bshift}
    ix = EngineIndex.create(path, IndexSchema(sparse_fields=("image",)), **kw) if not reuse else EngineIndex.open(path, writable=True)
    ix.max_segments = 1 << 30  # measure raw ingest; merge once with optimize() below
    rss0 = rss_mb()
    ingest_s = 0.0
    ingest_cpu = 0.0
    gen_s = 0.0
    chunks = []
    for c, lo in enumerate(range(0, args.docs, args.chunk)):
        if reuse and not args.check:
            break
        n = min(args.chunk, args.docs - lo)
        t = time.perf_counter()
        indptr, ids, w = _gen_rows_fast(n, args.seed + 1 + c, cdf, token_of, rank_of_token, 150, 250, scale)
        gen_s += time.perf_counter() - t
        doc_ids = [f"doc-{i}" for i in range(lo, lo + n)]
        t, c = time.perf_counter(), time.process_time()
        if not reuse:
            ix.add_arrays(doc_ids, {"image": (indptr, ids, w)})
        ingest_s += time.perf_counter() - t
        ingest_cpu += time.process_time() - c
        if args.check:
            chunks.append((indptr, ids, w))
    t = time.perf_counter()
    if not reuse:
        ix.optimize()
    opt_s = time.perf_counter() - t
    st = ix.stats()
    print(f"corpus: {args.docs} docs, {st['postings']} postings ({st['postings'] / args.docs:.1f}/doc), generated in {gen_s:.1f}s")
    if reuse:
        print(f"ingest: skipped (--reuse of {path})")
    else:
        print(f"ingest (add_arrays, {args.chunk}-doc commits): {ingest_s:.2f}s = {args.docs / ingest_s:,.0f} docs/s; "
              f"optimize() to 1 segment: {opt_s:.2f}s; end-to-end {args.docs / (ingest_s + opt_s):,.0f} docs/s; "
              f"CPU time of ingest {ingest_cpu:.2f}s = {args.docs / max(ingest_cpu, 1e-9):,.0f} docs per CPU-second "
              f"(load average {os.getloadavg()[0]:.2f})")
    print(f"storage: {st['bytes_on_disk'] / 2**20:.1f} MiB on disk, postings structure {st['bytes_per_posting']:.3f} bytes/posting "
          f"(whole directory {st['bytes_on_disk'] / st['postings']:.3f} bytes/posting)")

    # queries
    rng = np.random.default_rng(args.seed + 999)
    reqs = []
    for _ in range(args.queries):
        nq = int(rng.integers(10, 31))
        toks = set()
        while len(toks) < nq:
            r = min(int(np.searchsorted(cdf, rng.random())), cdf.size - 1)
            toks.add(int(token_of[r]))
        t_ids = np.array(sorted(toks))
        t_w = (np.log1p(np.exp(rng.normal(size=t_ids.size))) * scale[t_ids]).astype(np.float32)
        reqs.append(SearchRequest([SparseClause("image", SparseVector.from_arrays(t_ids, t_w))], top_k=10))
    reader = EngineIndex.open(path)
    reader.strategy = args.strategy
    for r in reqs[:5]:
        reader.search(r)  # warm up (JIT, page cache)
    rss1 = rss_mb()
    lat, cpu = [], []
    results = []
    used: dict[str, int] = {}
    streamed = []
    blocks = []
    for r in reqs:
        t, c = time.perf_counter(), time.thread_time()
        res = reader.search(r)
        cpu.append((time.thread_time() - c) * 1000)
        lat.append((time.perf_counter() - t) * 1000)
        results.append(res)
        for u in getattr(reader, "last_search_strategies", ()):
            used[u] = used.get(u, 0) + 1
        stats = getattr(reader, "last_search_stats", np.zeros(0))
        if len(stats) >= 6:
            streamed.append(int(stats[5]))
            blocks.append((int(stats[3]), int(stats[4])))
    wall_ms, cpu_ms = percentiles(lat), percentiles(cpu)
    print(f"exact top-10, one thread, {len(reqs)} queries of 10-30 tokens: p50 {wall_ms['p50_ms']:.2f} ms, "
          f"p95 {wall_ms['p95_ms']:.2f} ms, p99 {wall_ms['p99_ms']:.2f} ms, mean {wall_ms['mean_ms']:.2f} ms (wall clock)")
    print(f"  same queries, CPU time of the searching thread (less sensitive to other load on a shared machine): "
          f"p50 {cpu_ms['p50_ms']:.2f} ms, p95 {cpu_ms['p95_ms']:.2f} ms, p99 {cpu_ms['p99_ms']:.2f} ms; "
          f"load average {os.getloadavg()[0]:.2f}")
    if used:
        mix = ", ".join(f"{k} {v}" for k, v in sorted(used.items()))
        extra = f"; postings streamed per query: median {np.median(streamed):,.0f}" if streamed else ""
        print(f"  strategy {args.strategy}: segment searches by {mix}{extra}")
    if blocks:
        sc, cb = np.median([b[0] for b in blocks]), np.median([b[1] for b in blocks])
        print(f"  blocks scored per query: median {sc:,.0f} of {cb:,.0f} candidate blocks")
    if len(reader.snapshot().segments) == 1:  # profile: the block-max set-up pass alone (a diagnostic)
        from stair_es.engine.kernels import blockmax

        seg = reader.snapshot().segments[0].seg
        plan = []
        for r in reqs[:100]:
            v = r.clauses[0].vector
            j = seg.term_index(0, v.ids)
            q_j, q_w = j[j >= 0].astype(np.int64), v.weights[j >= 0].astype(np.float32)
            c = time.thread_time()
            blockmax._block_plan(q_j, q_w, seg.kernel_arrays(), np.zeros(0, np.uint8), reader.head_blocks, 0, -1)
            plan.append((time.thread_time() - c) * 1000)
        print(f"  profile: the block plan (block bounds, visit order, the head blocks' run table) takes CPU p50 "
              f"{np.median(plan):.2f} ms of the {cpu_ms['p50_ms']:.2f} ms")
    # throughput: the same queries through search_batch on 1 and 2 threads (the kernel releases the
    # GIL), interleaved 3 times so both see the same machine load; CPU time of the process beside
    qps: dict[int, list[float]] = {1: [], 2: []}
    cpu_q: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(3):
        for threads in (1, 2):
            t, c = time.perf_counter(), time.process_time()
            reader.search_batch(reqs, threads=threads)
            qps[threads].append(len(reqs) / (time.perf_counter() - t))
            cpu_q[threads].append((time.process_time() - c) * 1000 / len(reqs))
    q1, q2 = float(np.median(qps[1])), float(np.median(qps[2]))
    print(f"throughput (search_batch, {len(reqs)} queries, median of 3 interleaved runs): 1 thread {q1:,.0f} QPS, "
          f"2 threads {q2:,.0f} QPS = x{q2 / q1:.2f} (runs x{', x'.join(f'{b / a:.2f}' for a, b in zip(qps[1], qps[2]))}); "
          f"CPU per query {np.median(cpu_q[1]):.2f} / {np.median(cpu_q[2]):.2f} ms; load average {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs")
    # latency of one query on 2 threads (search(threads=2) splits block-max work by block ranges)
    split: dict[int, list[float]] = {1: [], 2: []}
    for r in reqs:
        for threads in (1, 2):
            t = time.perf_counter()
            reader.search(r, threads=threads)
            split[threads].append((time.perf_counter() - t) * 1000)
    s1, s2 = float(np.median(split[1])), float(np.median(split[2]))
    print(f"one query on 2 threads (search(threads=2), interleaved with threads=1): p50 {s2:.2f} ms against {s1:.2f} ms "
          f"= x{s1 / s2:.2f} faster; load average {os.getloadavg()[0]:.2f}")
    print(f"memory: reader RSS after queries {rss1:.0f} MiB (writer+reader process; start {rss0:.0f} MiB); "
          f"mapped posting arrays {st['posting_bytes'] / 2**20:.0f} MiB = {st['bytes_per_posting']:.3f} bytes/posting")

    if args.check:
        import scipy.sparse as sp

        indptr = np.concatenate([[0]] + [c[0][1:] + sum(int(x[0][-1]) for x in chunks[:i]) for i, c in enumerate(chunks)])
        ids = np.concatenate([c[1] for c in chunks])
        w = np.concatenate([c[2] for c in chunks])
        stored = F16_TABLE[np.minimum(w, 65504).astype(np.float16).view(np.uint16)]
        X = sp.csr_matrix((stored, ids, indptr), shape=(args.docs, VOCAB_SIZE))
        bad = 0
        for r, res in zip(reqs[: args.check], results[: args.check]):
            q = np.zeros(VOCAB_SIZE, np.float32)
            c = r.clauses[0]
            q[c.vector.ids] = c.vector.weights
            scores = X @ q
            top = np.argsort(-scores, kind="stable")[:10]
            want = scores[top]
            got = np.array([h.score for h in res.hits])
            kth = want[-1]
            ok = np.allclose(got, want, rtol=1e-5) and all(
                abs(scores[int(h.id.split("-")[1])] - h.score) <= 1e-5 * h.score for h in res.hits)
            strict = {f"doc-{i}" for i in top if scores[i] > kth * (1 + 1e-5)}
            ok = ok and strict <= {h.id for h in res.hits}
            bad += not ok
        print(f"exactness: {args.check - bad}/{args.check} sampled queries have the brute-force top-10 (scipy over stored weights)")
    reader.close()
    ix.close()
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
