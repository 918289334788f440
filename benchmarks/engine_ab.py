"""Same-run A/B of the engine's search between two source trees on one index.

    python benchmarks/engine_ab.py --index DIR --tree main=/tmp/ab-main --tree new=. --rounds 5

``DIR`` is an index that both trees read (e.g. one ``benchmarks/engine_bench.py --dir D --reuse``
built: ``D/bench-index-1000000-idf-42-100000``); a tree is a folder holding a ``stair_es``
package (a ``git archive`` of another commit, or this checkout). Each round starts one worker
process per tree, in alternating order, on the same queries (``engine_bench``'s Zipf queries of
10-30 tokens, the same seed): each worker searches every query once untimed (the kernels loaded,
the pages read and verified), then ``--passes`` times timed, and reports per query the wall
clock and the searching thread's CPU time, with the hits. The runner prints, per tree, the
median over rounds of each round's p50 (wall and CPU), the paired ratio to the first tree
per round, the load average beside each round, and whether every tree returned the same ids
with bit-identical scores on every query.

Only the public API (``EngineIndex.open``, ``search``) is used, so any two commits compare.

``--build-corpus N --index DIR`` first builds DIR from the benchmark corpus of N documents
(:mod:`benchmarks.corpora`, the ``100k``/``1m`` configs' generator and seed; one segment, as
``profile_engine`` builds it) and writes its queries to ``DIR.queries.npz`` (then pass
``--queries-npz DIR.queries.npz``), with this checkout's code; every tree reads that index.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def query_pairs(args) -> list:
    """The benchmark's queries as (token ids, weights) pairs: ``--queries-npz`` (CSR arrays
    indptr/indices/weights) when given, else ``--queries`` generated ones."""
    import numpy as np

    if args.queries_npz:
        z = np.load(args.queries_npz)
        qp, qw = z["indptr"], z["weights"]
        qi = z["indices"] if "indices" in z.files else z["ids"]  # (the scale benchmark's query files say "ids")
        return [(qi[qp[i]:qp[i + 1]], qw[qp[i]:qp[i + 1]]) for i in range(min(args.queries, qp.size - 1))]
    return _queries(args.queries, args.seed, args.weights)


def _queries(n: int, seed: int, weights: str):
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    from engine_bench import weight_scale, zipf_tables  # the same generator as engine_bench

    cdf, token_of, _ = zipf_tables(seed)
    scale = weight_scale(weights, token_of)
    rng = np.random.default_rng(seed + 999)
    out = []
    for _ in range(n):
        nq = int(rng.integers(10, 31))
        toks: set[int] = set()
        while len(toks) < nq:
            r = min(int(np.searchsorted(cdf, rng.random())), cdf.size - 1)
            toks.add(int(token_of[r]))
        t_ids = np.array(sorted(toks))
        out.append((t_ids, (np.log1p(np.exp(rng.normal(size=t_ids.size))) * scale[t_ids]).astype(np.float32)))
    return out


def worker(args) -> None:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    import numpy as np

    from stair_es.engine import EngineIndex
    from stair_es.query import SearchRequest, SparseClause
    from stair_es.sparse import SparseVector

    pairs = query_pairs(args)
    reqs = [SearchRequest([SparseClause(args.field, SparseVector.from_arrays(i, w))], top_k=args.k) for i, w in pairs]
    ix = EngineIndex.open(Path(args.index))
    ix.strategy = args.strategy
    hits = []
    t0 = time.perf_counter()
    for r in reqs:  # untimed: kernels loaded, pages read and verified
        res = ix.search(r)
        hits.append([(h.id, np.float32(h.score).view(np.uint32).item()) for h in res.hits])
    first_pass = time.perf_counter() - t0
    wall = [[] for _ in reqs]
    cpu = [[] for _ in reqs]
    for _ in range(args.passes):
        for i, r in enumerate(reqs):
            t, c = time.perf_counter(), time.thread_time()
            ix.search(r)
            cpu[i].append((time.thread_time() - c) * 1e3)
            wall[i].append((time.perf_counter() - t) * 1e3)
    used: dict[str, int] = {}
    for r in reqs:
        ix.search(r)
        for u in getattr(ix, "last_search_strategies", ()):
            used[u] = used.get(u, 0) + 1
    ix.close()
    json.dump({"wall": [min(x) for x in wall], "cpu": [min(x) for x in cpu], "hits": hits, "used": used,
               "first_pass_s": first_pass, "load": os.getloadavg()[0]}, sys.stdout)


def build_corpus_index(n_docs: int, index: Path) -> Path:
    """The benchmark corpus of ``n_docs`` documents as one engine segment at ``index``; its
    queries saved beside it. Returns the queries file."""
    import numpy as np

    sys.path.insert(0, str(HERE.parents[1]))
    from benchmarks.corpora import CorpusSpec, load_corpus
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    corpus = load_corpus(CorpusSpec(n_docs=n_docs, n_queries=500))
    d, qs = corpus.docs, corpus.queries
    qfile = index.with_name(index.name + ".queries.npz")
    np.savez(qfile, indptr=qs.indptr, indices=qs.indices, weights=qs.weights)
    if not (index / "manifest.json").exists():
        ix = EngineIndex.create(index, IndexSchema(fields={}, sparse_fields=("image",)))
        for lo in range(0, d.n_rows, 200_000):
            hi = min(d.n_rows, lo + 200_000)
            a0, a1 = int(d.indptr[lo]), int(d.indptr[hi])
            ix.add_arrays([str(i) for i in range(lo, hi)], {"image": (d.indptr[lo:hi + 1] - a0, d.indices[a0:a1], d.weights[a0:a1])})
        ix.optimize()
        ix.close()
    return qfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", required=True, help="the index folder both trees search")
    ap.add_argument("--tree", action="append", default=[], help="NAME=FOLDER holding a stair_es package (twice or more)")
    ap.add_argument("--index-of", action="append", default=[], metavar="NAME=DIR",
                    help="tree NAME searches index DIR instead of --index (e.g. one tree twice: the same documents "
                         "in 10 segments and in 1; hits must still agree)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--passes", type=int, default=2, help="timed passes per worker (per query: the fastest)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--weights", choices=("idf", "iid"), default="idf")
    ap.add_argument("--queries-npz", help="queries from an .npz of CSR arrays (indptr, indices, weights) instead")
    ap.add_argument("--field", default="image")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--out", help="write every worker's figures (per query wall/CPU, hits) to this JSON file")
    ap.add_argument("--build-corpus", type=int, metavar="N",
                    help="build --index from the benchmark corpus of N documents first (and DIR.queries.npz)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.build_corpus:
        qfile = build_corpus_index(args.build_corpus, Path(args.index))
        print(f"index {args.index} built from the {args.build_corpus:,}-document benchmark corpus; queries in {qfile}")
        args.queries_npz = args.queries_npz or str(qfile)
    trees = [t.split("=", 1) for t in args.tree]
    if len(trees) < 2 or any(len(t) != 2 for t in trees):
        raise SystemExit("give at least two --tree NAME=FOLDER")
    index_of = dict(t.split("=", 1) for t in args.index_of)
    if set(index_of) - {name for name, _ in trees}:
        raise SystemExit(f"--index-of names no tree: {sorted(set(index_of) - {name for name, _ in trees})}")
    import numpy as np

    per: dict[str, list[dict]] = {name: [] for name, _ in trees}
    loads = []
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for name, folder in order:
            env = dict(os.environ, PYTHONPATH=str(Path(folder).resolve()), NUMBA_NUM_THREADS="1")
            cmd = [sys.executable, str(HERE), "--worker", "--index", index_of.get(name, args.index), "--queries", str(args.queries),
                   "--seed", str(args.seed), "--weights", args.weights, "--field", args.field, "--k", str(args.k),
                   "--strategy", args.strategy, "--passes", str(args.passes)]
            if args.queries_npz:
                cmd += ["--queries-npz", str(Path(args.queries_npz).resolve())]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
            if out.returncode:
                raise SystemExit(f"worker for {name} failed:\n{out.stderr[-3000:]}")
            per[name].append(json.loads(out.stdout))
        loads.append(os.getloadavg()[0])
        base = per[trees[0][0]][-1]
        line = [f"round {r + 1}: load {loads[-1]:.2f}"]
        for name, _ in trees:
            res = per[name][-1]
            line.append(f"{name} p50 wall {np.median(res['wall']):.3f} cpu {np.median(res['cpu']):.3f} ms "
                        f"(x{np.median(res['cpu']) / np.median(base['cpu']):.3f} cpu)")
        print("; ".join(line), flush=True)
    ref = per[trees[0][0]][0]["hits"]
    same = all(res["hits"] == ref for name, _ in trees for res in per[name])
    print(f"\n{args.queries} queries, {args.rounds} rounds x {args.passes} timed passes, index {args.index}, "
          f"strategy {args.strategy}, load average per round {', '.join(f'{x:.2f}' for x in loads)}")
    print("| tree | p50 wall ms (median of rounds) | p50 CPU ms | p99 wall / CPU ms | CPU ratio to first (median of paired "
          "rounds) | p99 CPU ratio | first pass s | strategies (last round, after the timed passes) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in trees:
        w = [np.median(x["wall"]) for x in per[name]]
        c = [np.median(x["cpu"]) for x in per[name]]
        w99 = [np.percentile(x["wall"], 99) for x in per[name]]
        c99 = [np.percentile(x["cpu"], 99) for x in per[name]]
        ratios = [np.median(x["cpu"]) / np.median(y["cpu"]) for x, y in zip(per[name], per[trees[0][0]])]
        r99 = [np.percentile(x["cpu"], 99) / np.percentile(y["cpu"], 99) for x, y in zip(per[name], per[trees[0][0]])]
        fp = [x["first_pass_s"] for x in per[name]]
        print(f"| {name} | {np.median(w):.3f} | {np.median(c):.3f} | {np.median(w99):.3f} / {np.median(c99):.3f} | "
              f"x{np.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)}) | x{np.median(r99):.3f} | "
              f"{np.median(fp):.2f} | {per[name][-1].get('used', {})} |")
    print(f"same ids and bit-identical scores on every query in every tree and round: {same}")
    if args.out:
        Path(args.out).write_text(json.dumps({"index": args.index, "index_of": index_of, "trees": dict(trees), "rounds": args.rounds,
                                              "loads": loads, "same": same, "workers": per}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
