"""Where the embedded engine's search time goes: ``python -m benchmarks.profile_engine --docs 100000``.

Builds the engine on a cached synthetic corpus (same generator and seed as the configs) and reports

1. cProfile of ``EngineIndex.search`` end to end (Python-side overhead vs the numba kernel);
2. the kernel called directly on array inputs, with its own pruning counters (blocks scored of
   candidate blocks, matched docs) when it reports them, and the time of its set-up pass (block
   upper-bound table and visit order, ``kernels._block_plan``);
3. the engine's own strategies forced one at a time (block-max, term-at-a-time) and the scipy CSC
   brute force, as reference points for what the layout allows;
4. a roofline (:mod:`benchmarks.roofline`): the machine's copy bandwidth and scatter-add rate,
   measured in the same run, beside each figure's postings/s and GB/s; and which strategy
   ``auto`` chose.

The kernel is called exactly as ``EngineIndex._search`` calls it (the same ``search_segment``
arguments, TAAT scratch and ``head_blocks``), and the set-up pass timed is the kernel's own
``_block_plan``: nothing of the kernel is copied here.

It reads engine internals (``_segs``, segment arrays), so it is a diagnostic, not an API; it never
changes the engine. Output is Markdown on stdout (paste it into a report).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np

from . import roofline
from .corpora import CorpusSpec, load_corpus


def _median_ms(fn, n):
    ts = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        ts.append((time.perf_counter() - t) * 1e3)
    return float(np.median(ts))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.profile_engine", description=__doc__.split("\n")[0])
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--k", type=int, default=10)
    a = p.parse_args(argv)

    from stair_es.engine import EngineIndex
    from stair_es.engine import kernels as K
    from stair_es.engine.kernels import blockmax
    from stair_es.query import SearchRequest, SparseClause
    from stair_es.schema import IndexSchema
    from stair_es.sparse import SparseVector
    from stair_es.vocab import default_vocabulary

    corpus = load_corpus(CorpusSpec(n_docs=a.docs, n_queries=500))
    d, qs = corpus.docs, corpus.queries
    nq = min(a.queries, qs.n_rows)
    with tempfile.TemporaryDirectory() as tmp:
        idx = EngineIndex.create(Path(tmp) / "ix", IndexSchema(fields={}, sparse_fields=("image",)))
        t = time.perf_counter()
        for lo in range(0, d.n_rows, 200_000):
            hi = min(d.n_rows, lo + 200_000)
            a0, a1 = int(d.indptr[lo]), int(d.indptr[hi])
            idx.add_arrays([str(i) for i in range(lo, hi)], {"image": (d.indptr[lo : hi + 1] - a0, d.indices[a0:a1], d.weights[a0:a1])})
        idx.optimize()
        build_s = time.perf_counter() - t
        seg = idx._segs[0].seg
        vocab = default_vocabulary()
        reqs = [SearchRequest([SparseClause("image", SparseVector(*qs.row(i), vocab))], top_k=a.k) for i in range(nq)]
        for r in reqs[:5]:
            idx.search(r)
        print(f"## Engine profile: {a.docs:,} docs, {nq} queries, k={a.k}, one segment (built in {build_s:.1f} s)\n")

        # each query's first search reads its terms for the first time (page faults, chunk
        # checksums: see benchmarks/first_query.py); the second is the steady state compared below
        e2e_first = _median_ms(lambda i: idx.search(reqs[i]), nq)
        e2e = _median_ms(lambda i: idx.search(reqs[i]), nq)
        prof = cProfile.Profile()
        prof.enable()
        for r in reqs:
            idx.search(r)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(8)
        print(f"End-to-end `search()` median: {e2e:.3f} ms steady ({e2e_first:.3f} ms on each query's first search)\n\ncProfile (tottime, {nq} searches):\n```")
        print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:3000])
        print("```\n")

        arrays = seg.kernel_arrays()
        qj, qw = [], []
        for i in range(nq):
            tok, w = qs.row(i)
            j = seg.term_index(0, tok)
            qj.append(j[j >= 0].astype(np.int64))
            qw.append(np.ascontiguousarray(w[j >= 0], np.float32))
        plan = blockmax._block_plan
        no_filter = np.zeros(0, np.uint8)

        def kernel(i, hits=None, strategy=K.STRATEGY_BLOCKMAX):
            """One call of the engine's kernel on segment arrays, with the arguments EngineIndex._search passes."""
            top = K.TopK.empty(a.k)
            hs, hq, hr, state = top
            K.search_segment(qj[i], qw[i], arrays, no_filter, np.int64(0), top, K.SearchOptions(strategy, idx.head_blocks),
                             acc, None)
            if hits is not None:
                n = int(state[0])
                order = np.lexsort((hq[:n], -hs[:n]))
                hits.append(((hr[:n][order] & 0xFFFFFFFF).tolist(), hs[:n][order].tolist()))
            return state

        acc = np.zeros(seg.n_docs, np.float32)
        kernel(0)
        kernel(0, strategy=K.STRATEGY_TAAT)
        plan(qj[0], qw[0], arrays, no_filter, idx.head_blocks, 0, -1)
        t_kernel, t_setup, t_taat, states, posts_tot, same = [], [], [], [], 0, 0
        for i in range(nq):
            t0 = time.perf_counter()
            states.append(kernel(i))
            t1 = time.perf_counter()
            plan(qj[i], qw[i], arrays, no_filter, idx.head_blocks, 0, -1)
            t2 = time.perf_counter()
            kernel(i, strategy=K.STRATEGY_TAAT)
            t3 = time.perf_counter()
            eng, taat = [], []
            kernel(i, eng)
            kernel(i, taat, strategy=K.STRATEGY_TAAT)
            same += eng == taat
            t_kernel.append(t1 - t0)
            t_setup.append(t2 - t1)
            t_taat.append(t3 - t2)
            posts_tot += int(sum(seg.post_ptr[j + 1] - seg.post_ptr[j] for j in qj[i]))
        med = lambda x: float(np.median(x)) * 1e3  # noqa: E731
        kernel_ms = med(t_kernel)
        st = np.array(states)
        n_blocks = (seg.n_docs + (1 << seg.bshift) - 1) >> seg.bshift
        print(f"Kernel `search_segment` called directly on arrays: median {kernel_ms:.3f} ms/query "
              f"({kernel_ms / e2e:.0%} of end to end; the rest is request preparation, term lookup and hit materialisation).\n")
        print(f"- query terms' postings: {posts_tot / nq:,.0f} per query; documents matched (scored in visited blocks): "
              f"{st[:, 1].mean():,.0f} of {seg.n_docs:,}")
        if st[:, 4].any():
            print(f"- block-max pruning: {st[:, 3].mean():,.0f} blocks scored of {st[:, 4].mean():,.0f} candidate blocks "
                  f"({st[:, 3].sum() / st[:, 4].sum():.1%}); {n_blocks:,} blocks of {1 << seg.bshift} docs")
        print(f"- the engine's TAAT strategy returns the same ids and bit-identical float32 scores as block-max for {same} of "
              f"{nq} queries (both sum each document's terms in query-term order, like explain)")
        print(f"- block-max set-up pass (the kernel's own `_block_plan`: bound table and visit order): {med(t_setup):.3f} ms "
              f"({med(t_setup) / kernel_ms:.0%} of the kernel)\n")
        # references on the same data
        truth_taat = []
        import scipy.sparse as sp

        post = sp.csr_matrix(d.to_scipy().T)

        def brute(i):
            tok, w = qs.row(i)
            sc = np.asarray(post[tok].T @ w).ravel()
            return np.argpartition(-sc, a.k)[: a.k]

        t_brute = _median_ms(brute, nq)
        # the same gather-and-sum without its top k (numpy 2.4's argpartition of 100k floats takes
        # ~1 ms here, more than the sum): the floor of what a brute force pays, for an honest ratio
        t_sum = _median_ms(lambda i: post[qs.row(i)[0]].T @ qs.row(i)[1], nq)
        print("| exact search on the same corpus | median ms/query |\n|---|---:|")
        print(f"| engine `search()` end to end, each query's first search | {e2e_first:.3f} |")
        print(f"| engine `search()` end to end, steady (second search) | {e2e:.3f} |")
        print(f"| engine kernel `search_segment` on arrays, block-max | {kernel_ms:.3f} |")
        print(f"| engine kernel `search_segment` on arrays, TAAT (document-blocked: L1-resident windows) | {med(t_taat):.3f} |")
        print(f"| scipy CSC brute force (float32) | {t_brute:.3f} |")
        print(f"| scipy CSC gather-and-sum only, no top k | {t_sum:.3f} |")
        print(f"\nengine end to end (steady) / scipy brute force: x{e2e / t_brute:.2f}; / scipy gather-and-sum alone: "
              f"x{e2e / t_sum:.2f} (first searches: x{e2e_first / t_brute:.2f}, x{e2e_first / t_sum:.2f})")
        # the roofline: the same work against this machine's limits, measured now
        limits = roofline.measure_limits(seg.n_docs)
        ppq = posts_tot / nq
        rows = [("engine `search()` end to end (auto), first search", roofline.entry("embedded", e2e_first, ppq, limits)),
                ("engine `search()` end to end (auto), steady", roofline.entry("embedded", e2e, ppq, limits)),
                ("engine kernel, block-max", roofline.entry("embedded", kernel_ms, ppq, limits)),
                ("engine kernel, TAAT", roofline.entry("embedded", med(t_taat), ppq, limits)),
                ("scipy CSC brute force", roofline.entry("bruteforce", t_brute, ppq, limits)),
                ("scipy CSC gather-and-sum, no top k", roofline.entry("bruteforce", t_sum, ppq, limits))]
        print(f"\n{roofline.limits_line(limits)}\n\n{roofline.table(rows)}\n")
        used: dict[str, int] = {}
        example: dict[str, str] = {}
        for r in reqs:
            for row in idx.search(r).plan.to_dict()["segments"]:  # (the plan: what ran and why, per segment)
                key = f"{row['strategy']} ({row['chosen_by']})"
                used[key] = used.get(key, 0) + 1
                example.setdefault(key, row["reason"])
        print(f"`auto` chose, per segment search: {', '.join(f'{k2} {v}' for k2, v in sorted(used.items()))}; "
              "one reason of each kind:\n")
        for key, why in sorted(example.items()):
            print(f"- {key}: {why}")
        print()
        del truth_taat
        idx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
