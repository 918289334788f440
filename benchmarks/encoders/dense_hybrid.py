"""Sparse vs dense vs BM25 vs fused (P@1, MRR, R@5) on the synthetic scenes, through the product path.

    python -m benchmarks.encoders.dense_hybrid --scenes W/scenes --sparse-model W/runs/visualsparta \
        --dense-model W/runs/dense --out benchmarks/results/encoders/dense_hybrid.json

The scenes' test split is ingested into a fresh embedded index exactly as a user would
(:func:`stair_es.ingest.ingest_catalog` with ``--encoder stair --model SPARSE`` and
``--dense-model DENSE``), from a manifest that keeps each scene's keyword metadata (its shapes
and colours) but **not** its caption: BM25 then searches tag-like metadata, never the text that
is the query. Every query goes through :func:`stair_es.hybrid.hybrid_search`, the code behind
``stair-es search --retrievers ...``.

Queries: each test image's first caption. Relevant: every test image that has that caption
among its captions (several scenes share "a small blue circle"). Ties count against the query:
the rank of the first relevant hit is 1 + the number of irrelevant hits scoring at least as
much (a single retriever's own score; the fused score for a fusion), so BM25 over tags, which
ties whole groups of scenes, gets no credit from the tie order. P@1: that rank is 1; MRR:
1 / that rank (0 when no relevant hit is in the top ``--depth``); R@5: that rank <= 5.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import _git_commit  # type: ignore[no-redef]
else:
    from .run import _git_commit

RUNS = [
    ("sparse", ("sparse",), "rrf", None),
    ("dense", ("dense",), "rrf", None),
    ("bm25 (metadata)", ("bm25",), "rrf", None),
    ("sparse+dense RRF", ("sparse", "dense"), "rrf", None),
    ("sparse+dense linear", ("sparse", "dense"), "linear", (0.5, 0.5)),
    ("sparse+bm25 RRF", ("sparse", "bm25"), "rrf", None),
    ("sparse+bm25+dense RRF", ("sparse", "bm25", "dense"), "rrf", None),
    ("sparse+bm25+dense linear", ("sparse", "bm25", "dense"), "linear", (1, 1, 1)),
]


def _manifest(scenes: Path, out: Path) -> tuple[Path, list[tuple[str, set[str]]]]:
    """A test manifest without captions (metadata only) and the queries with their relevant ids."""
    rows = [json.loads(line) for line in (scenes / "test.manifest.jsonl").read_text().splitlines() if line.strip()]
    caps = [json.loads(line) for line in (scenes / "test.jsonl").read_text().splitlines() if line.strip()]
    by_image = {c["image"]: c["captions"] for c in caps}
    lines = []
    for r in rows:
        lines.append(json.dumps({"id": r["id"], "path": str((scenes / r["path"]).resolve()), "metadata": r["metadata"]}))
    man = out / "test.nocaption.jsonl"
    man.write_text("\n".join(lines) + "\n")
    queries = []
    for r in rows:
        q = by_image[r["path"]][0]
        queries.append((q, {x["id"] for x in rows if q in by_image[x["path"]]}))
    return man, queries


def pessimistic_rank(hits, relevant: set[str], retriever: str | None) -> int:
    """1 + irrelevant hits scoring >= the best relevant one (0: no relevant hit)."""
    def score(h):
        return h.retrievers[retriever]["score"] if retriever else h.score

    best = max((score(h) for h in hits if h.id in relevant), default=None)
    if best is None:
        return 0
    return 1 + sum(1 for h in hits if h.id not in relevant and score(h) >= best)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenes", required=True, type=Path, help="a folder made by `stair-es make-scenes`")
    ap.add_argument("--sparse-model", required=True, help="a sparse checkpoint (stair / visualsparta / vdr head)")
    ap.add_argument("--dense-model", required=True, help="a `--head dense` checkpoint")
    ap.add_argument("--depth", type=int, default=100, help="hits per query the metrics look at")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--rrf-k", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.encoders import get_encoder
    from stair_es.hybrid import HybridOptions, hybrid_search
    from stair_es.ingest import IngestOptions, ingest_catalog
    from stair_es.search import QuerySpec, make_request

    with tempfile.TemporaryDirectory() as tmp:
        man, queries = _manifest(args.scenes, Path(tmp))
        be = EmbeddedBackend(Path(tmp) / "home")
        t0 = time.perf_counter()
        rep = ingest_catalog(be, "scenes", man, lambda: get_encoder("stair", model=args.sparse_model),
                             IngestOptions(batch_size=32, dense_model=args.dense_model, dense_dtype="float16"))
        ingest_s = time.perf_counter() - t0
        if rep.failures:
            raise SystemExit(f"ingest failed for {len(rep.failures)} items, e.g. {rep.failures[0].error}")
        rows = []
        for label, names, fusion, weights in RUNS:
            opts = HybridOptions(fusion, args.rrf_k, weights, args.window, retrievers=names)
            p1 = mrr = r5 = 0.0
            t0 = time.perf_counter()
            for text, relevant in queries:
                req, _ = make_request(be, "scenes", QuerySpec(text=text, top_k=args.depth, caption_weight=0.0))
                hits = hybrid_search(be, "scenes", req, text, opts).hits
                rank = pessimistic_rank(hits, relevant, names[0] if len(names) == 1 else None)
                p1 += rank == 1
                mrr += 1.0 / rank if rank else 0.0
                r5 += bool(rank and rank <= 5)
            n = len(queries)
            rows.append({"ranking": label, "retrievers": list(names), "fusion": fusion, "weights": weights,
                         "P@1": round(p1 / n, 3), "MRR": round(mrr / n, 3), "R@5": round(r5 / n, 3),
                         "ms_per_query": round((time.perf_counter() - t0) * 1000 / n, 1)})
            print(f"{label:28s} P@1 {p1 / n:.3f}  MRR {mrr / n:.3f}  R@5 {r5 / n:.3f}  ({rows[-1]['ms_per_query']} ms/query)")
        be.close()
    report = {"benchmark": "dense_hybrid", "commit": _git_commit(), "argv": sys.argv[1:] if argv is None else argv,
              "scenes": str(args.scenes), "sparse_model": args.sparse_model, "dense_model": args.dense_model,
              "queries": len(queries), "docs": len(queries), "ingest_seconds": round(ingest_s, 1),
              "window": args.window, "rrf_k": args.rrf_k, "depth": args.depth, "ties": "against the query",
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
              "rows": rows}
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
