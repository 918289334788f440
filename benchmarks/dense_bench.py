"""The embedded dense retriever's exact flat search vs FAISS ``IndexFlatIP`` on the same vectors.

    python -m benchmarks.dense_bench --docs 100000 --dims 256 --queries 50

Builds an embedded index of ``--docs`` documents (one token each; the point is the dense side)
whose dense vectors are random unit vectors, written through the real protocol
(:class:`stair_es.dense.DenseStore` ``begin`` -> engine commit -> ``finish``), then times, in the
same run, one query at a time (median and p95 over ``--queries``):

* ``stair_es``: :func:`stair_es.dense.search_embedded` (the view cached, as in a serving
  process), top ``--k``, for float16 and float32 storage;
* ``faiss``: ``IndexFlatIP`` over the same float32 unit vectors (exact as well), if installed.

Both return the exact top k; the script checks that they agree (up to float16 rounding).

``--ingest N`` also times ``EmbeddedBackend.ingest`` of N documents (batches of 256) with and
without dense vectors, in the same run: what the dense store adds to ingestion.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import machine_info, percentiles


def _timed(fn, queries) -> tuple[list[float], list]:
    times, outs = [], []
    for q in queries:
        t0 = time.perf_counter()
        outs.append(fn(q))
        times.append((time.perf_counter() - t0) * 1000)
    return times, outs


def _stats(times: list[float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in percentiles(times, (50, 95)).items()}


def build(home: Path, n: int, dims: int, dtype: str, vecs: np.ndarray) -> object:
    from stair_es.dense import DenseSpec, DenseStore
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema
    from stair_es.vocab import default_vocabulary

    spec = DenseSpec(dims, "cosine", dtype)
    path = home / dtype
    ix = EngineIndex.create(path, IndexSchema())
    from stair_es.dense import write_spec

    write_spec(path, spec)
    store = DenseStore(path, spec)
    tok = default_vocabulary().id("dog")
    step = 50_000
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        ids = [f"d{i}" for i in range(lo, hi)]
        store.begin(ix, ids, list(vecs[lo:hi]))
        ix.add_arrays(ids, {"image": (np.arange(hi - lo + 1, dtype=np.int64), np.full(hi - lo, tok, np.int32),
                                      np.ones(hi - lo, np.float32))})
        store.finish(ix)
    return ix, spec


def ingest_cost(home: Path, n: int, dims: int, vecs: np.ndarray) -> list[dict]:
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.dense import DenseSpec
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector

    out = []
    sv = SparseVector.from_token_map({"dog": 1.0, "cat": 0.5})
    for label, spec in (("ingest without dense vectors", None), ("ingest with float16 dense vectors", DenseSpec(dims))):
        be = EmbeddedBackend(home / label.replace(" ", "-"))
        be.create_index("i", IndexSchema(dense=spec.to_dict() if spec else None))
        docs = [Document(f"d{i}", {"image": sv}, {}, None, None, vecs[i % len(vecs)] if spec else None) for i in range(n)]
        t0 = time.perf_counter()
        rep = be.ingest("i", docs)
        s = time.perf_counter() - t0
        assert not rep.failures
        out.append({"system": label, "docs": n, "seconds": round(s, 2), "us_per_doc": round(s / n * 1e6, 1)})
        be.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--dims", type=int, default=256)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--ingest", type=int, default=0, help="also time ingesting this many documents with/without vectors")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from stair_es.dense import search_embedded, view_of

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((args.docs, args.dims)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    queries = rng.standard_normal((args.queries, args.dims)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ref = None
        try:
            import faiss

            faiss.omp_set_num_threads(1)
            index = faiss.IndexFlatIP(args.dims)
            index.add(vecs)
            times, outs = _timed(lambda q: index.search(q[None, :], args.k)[1][0], queries)
            ref = [set(o.tolist()) for o in outs]
            rows.append({"system": "faiss IndexFlatIP float32 (1 thread)", **_stats(times)})
        except ImportError:
            rows.append({"system": "faiss", "skipped": "faiss-cpu is not installed"})
        for dtype in ("float16", "float32"):
            t0 = time.perf_counter()
            ix, spec = build(Path(tmp), args.docs, args.dims, dtype, vecs)
            build_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            view_of(ix, spec)
            open_ms = (time.perf_counter() - t0) * 1000
            times, outs = _timed(lambda q: search_embedded(ix, spec, q, args.k), queries)
            row = {"system": f"stair_es exact flat, {dtype} memory-mapped", **_stats(times),
                   "build_s": round(build_s, 1), "first_view_ms": round(open_ms, 1)}
            if ref is not None:
                got = [{int(s.seg.doc_id(d)[1:]) for s, d, _ in o} for o in outs]
                row["overlap_with_faiss@k"] = round(float(np.mean([len(a & b) / args.k for a, b in zip(got, ref)])), 4)
            rows.append(row)
            ix.close()
        if args.ingest:
            rows += ingest_cost(Path(tmp), args.ingest, args.dims, vecs)
    for r in rows:
        print(r)
    machine = machine_info()
    report = {"benchmark": "dense_bench", "commit": machine["commit"], "docs": args.docs, "dims": args.dims, "k": args.k,
              "queries": args.queries, "machine": machine, "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
