"""Where one query class's time goes, on an index the scale benchmark kept:

    python -m benchmarks.scale --docs 10000000 --weights iid,idf --systems engine --workdir W --keep-index
    python -m benchmarks.scale.profile --workdir W --docs 10000000 --weights iid
    python -m benchmarks.scale.profile --workdir W --docs 10000000 --weights idf --filter "bucket < 1"

Each query is searched once untimed (pages read and verified), then timed ``--repeat`` times
on one thread. The end-to-end time of ``EngineIndex.search`` is split, per query, into the
compiled kernel (``kernels.search_segment``, all segments), the filter masks
(``EngineIndex._allowed``: the metadata columns evaluated with numpy), and the rest (Python per
segment: term lookup, checks; merging the top k, building the hits). Also per query: segments,
blocks scored and postings streamed (the kernel's own counters), and the postings in the
query's terms' lists (what an exhaustive scan reads). Medians over the queries; the kernel's
nanoseconds per streamed posting and per block scored are ratios of the medians. It reads
engine internals (a diagnostic, never an API) and changes nothing on disk.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="the scale benchmark's --workdir (with --keep-index)")
    ap.add_argument("--docs", type=int, required=True, help="corpus size of the kept index, e.g. 10000000")
    ap.add_argument("--weights", default="idf", choices=("idf", "iid"))
    ap.add_argument("--filter", default=None, help="a where-expression on the bucket column, e.g. 'bucket < 1'")
    ap.add_argument("--queries", type=int, default=50, help="queries profiled (default 50)")
    ap.add_argument("--repeat", type=int, default=3, help="timed searches per query (the median is kept)")
    args = ap.parse_args(argv)

    from stair_es.engine import EngineIndex
    from stair_es.engine import index as index_mod
    from stair_es.engine import kernels
    from stair_es.query import SearchRequest, SparseClause, parse_where
    from stair_es.sparse import SparseVector

    path = args.workdir / f"engine-{args.weights}-{args.docs}"
    qfile = args.workdir / f"queries-{args.weights}-{args.docs}.npz"
    if not (path / "manifest.json").exists() or not qfile.exists():
        raise SystemExit(f"no kept index or query set for {args.weights} at {args.docs:,} documents in {args.workdir}: "
                         "run the scale benchmark with --keep-index and this --workdir first")
    z = np.load(qfile)
    qp, qi, qw = z["indptr"], z["ids"], z["weights"]
    flt = parse_where(args.filter) if args.filter else None
    reqs = [SearchRequest([SparseClause("image", SparseVector.from_arrays(qi[qp[i]:qp[i + 1]], qw[qp[i]:qp[i + 1]]))],
                          top_k=10, filter=flt) for i in range(min(args.queries, qp.size - 1))]
    ix = EngineIndex.open(path)
    clock = {"kernel": 0.0, "filter": 0.0}
    real_kernel, real_allowed = kernels.search_segment, index_mod.EngineIndex._allowed

    def timed_kernel(*a):
        t = time.perf_counter()
        try:
            return real_kernel(*a)
        finally:
            clock["kernel"] += time.perf_counter() - t

    def timed_allowed(self, s, f):
        t = time.perf_counter()
        try:
            return real_allowed(self, s, f)
        finally:
            clock["filter"] += time.perf_counter() - t

    kernels.search_segment = timed_kernel
    index_mod.EngineIndex._allowed = timed_allowed
    try:
        rows = []
        for r in reqs:
            ix.search(r)  # untimed: the pages this query reads, read and verified once
            per = []
            for _ in range(args.repeat):
                clock.update(kernel=0.0, filter=0.0)
                t = time.perf_counter()
                ix.search(r)
                total = time.perf_counter() - t
                per.append((total, clock["kernel"], clock["filter"]))
            total, kern, filt = sorted(per)[len(per) // 2]
            st = ix.last_search_stats
            listed = 0
            for s in ix._segs:
                j = s.seg.term_index(0, r.clauses[0].vector.ids)
                j = j[j >= 0]
                listed += int((s.seg.post_ptr[j + 1] - s.seg.post_ptr[j]).sum())
            rows.append({"total": total * 1e3, "kernel": kern * 1e3, "filter": filt * 1e3,
                         "rest": (total - kern - filt) * 1e3, "blocks": int(st[3]), "streamed": int(st[5]),
                         "listed": listed, "tokens": int(r.clauses[0].vector.ids.size)})
    finally:
        kernels.search_segment = real_kernel
        index_mod.EngineIndex._allowed = real_allowed
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    n_blocks = sum((s.seg.n_docs + (1 << s.seg.bshift) - 1) >> s.seg.bshift for s in ix._segs)
    what = f"{args.weights} queries{f', filter {args.filter}' if args.filter else ''}"
    print(f"## Profile: {what}, {args.docs:,} documents in {len(ix._segs)} segments, {len(rows)} queries, 1 thread")
    print(f"load average {__import__('os').getloadavg()[0]:.2f}; medians over queries (each the median of {args.repeat} searches)\n")
    print("| part | ms p50 | share of the total p50 |")
    print("|---|---|---|")
    for k, label in (("total", "search, end to end"), ("kernel", "compiled kernel (all segments)"),
                     ("filter", "filter masks (numpy, per segment)"), ("rest", "Python: term lookup, checks, top-k merge, hits")):
        print(f"| {label} | {med[k]:.2f} | {med[k] / med['total'] * 100:.0f} % |")
    print(f"\nper query (p50): {med['tokens']:.0f} tokens; {med['blocks']:,.0f} blocks scored of {n_blocks:,}; "
          f"{med['streamed']:,.0f} postings streamed of {med['listed']:,.0f} in the query's lists "
          f"({med['streamed'] / max(med['listed'], 1) * 100:.0f} %); kernel {med['kernel'] * 1e6 / max(med['streamed'], 1):.1f} ns "
          f"per streamed posting, {med['kernel'] * 1e3 / max(med['blocks'], 1):.2f} us per block scored")
    ix.close()


if __name__ == "__main__":
    main()
