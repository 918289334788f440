"""Learned sparse alone vs BM25 alone vs both fused (RRF, linear) on the encoder evaluation sets.

    python -m benchmarks.encoders.hybrid                       # samples, tuxpaint, openclipart
    python -m benchmarks.encoders.hybrid --limit 300 --rrf-k 60 --rrf-k 10 --weights 0.5,0.5 --weights 0.3,0.7 \
        --out benchmarks/results/encoders/hybrid.json

Each item's own description is the query, as in ``benchmarks.encoders.run``. The **sparse**
side is the ``default`` encoder (image side for the items, text side with the set's IDF for
the queries), scored by the dot product. The **BM25** side searches each item's *metadata
text*, never its description (which is the query):

* samples: the sample's id and its keyword metadata (source package, kind, tags), e.g.
  ``chelsea scikit-image photo animal pet``;
* Tux Paint: the stamp's path words (``animals/mammals/cat`` -> ``animals mammals cat``);
* openclipart: the SVG's path words (folder and file name).

BM25 is :mod:`stair_es.lexical` (the analyzer and scoring ``stair-es search --hybrid`` uses);
fusion is :mod:`stair_es.fusion` over the top ``--window`` of each side, as the embedded
backend does. Ranks count ties against the query (``benchmarks.encoders.run.rank_metrics``);
an item outside both windows scores 0 in the fused list.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run import _dense, _encode_queries, _git_commit, _relevance, rank_metrics  # type: ignore[no-redef]
    from sets import SETS, SetUnavailable  # type: ignore[no-redef]
else:
    from .run import _dense, _encode_queries, _git_commit, _relevance, rank_metrics
    from .sets import SETS, SetUnavailable

_SPLIT = re.compile(r"[/_\-.]+")


def metadata_text(set_name: str, item) -> str:
    """The text BM25 indexes for an item: its metadata, not its description."""
    if set_name == "samples":
        from stair_es.lexical import document_text
        from stair_es.samples import SAMPLES

        s = next(x for x in SAMPLES if x.id == item.id)
        return item.id + "\n" + document_text(None, s.metadata)
    return _SPLIT.sub(" ", item.id)


def fused_matrix(sparse: np.ndarray, bm25: np.ndarray, method: str, window: int, **kw) -> np.ndarray:
    """Per query, the fused score of every item (0 outside both windows)."""
    from stair_es.fusion import Ranked, fuse

    out = np.zeros_like(sparse, dtype=np.float64)
    for i in range(sparse.shape[0]):
        lists = []
        for name, row in (("sparse", sparse[i]), ("bm25", bm25[i])):
            nz = np.flatnonzero(row > 0)
            top = nz[np.lexsort((nz, -row[nz]))][:window]
            lists.append(Ranked(name, [str(j) for j in top], [float(row[j]) for j in top]))
        for f in fuse(lists, method, **kw):
            out[i, int(f.id)] = f.score
    return out


def evaluate(set_name: str, items, encoder, window: int, rrf_ks: list[int], weight_sets: list[list[float]]) -> list[dict]:
    from stair_es.lexical import BM25Index

    images = [it.load() for it in items]
    texts = [it.query for it in items]
    img = _dense(encoder.encode_images(images, batch_size=32))
    sparse = _encode_queries("default", texts, img, encoder) @ img.T
    t = time.perf_counter()
    docs = [metadata_text(set_name, it) for it in items]
    n = len(docs)
    bm = BM25Index.build(docs, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), key=(0, 0))
    bm25 = np.zeros((len(texts), n), np.float32)
    for i, q in enumerate(texts):
        bm25[i, bm.local] = bm.scores(q)  # rows without text are left out of the BM25 index
    bm25_ms = (time.perf_counter() - t) * 1000 / max(len(texts), 1)
    rel = _relevance(texts)
    runs = {"sparse": sparse, "bm25": bm25}
    for k in rrf_ks:
        runs[f"rrf k={k}"] = fused_matrix(sparse, bm25, "rrf", window, k=k)
    for w in weight_sets:
        runs[f"linear {w[0]:.2g}/{w[1]:.2g}"] = fused_matrix(sparse, bm25, "linear", window, weights=w)
    rows = []
    for name, m in runs.items():
        r = rank_metrics(m, rel)
        rows.append({"set": set_name, "n": n, "ranking": name, **{k: round(v, 4) for k, v in r.items()},
                     "bm25_ms_per_query": round(bm25_ms, 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="samples,tuxpaint,openclipart")
    ap.add_argument("--limit", type=int, default=300, help="items per set (fixed-seed sample of larger sets)")
    ap.add_argument("--window", type=int, default=100, help="candidates per retriever before fusion")
    ap.add_argument("--rrf-k", type=int, action="append", help="RRF k (repeatable; default 60)")
    ap.add_argument("--weights", action="append", help="sparse,bm25 for the linear fusion (repeatable; default 0.5,0.5)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from stair_es.encoders import get_encoder
    from stair_es.fusion import parse_weights

    import os
    import platform

    weight_sets = [parse_weights(w) for w in (args.weights or ["0.5,0.5"])]
    rrf_ks = args.rrf_k or [60]
    encoder = get_encoder("default")
    report = {"command": "python -m benchmarks.encoders.hybrid " + " ".join(argv if argv is not None else sys.argv[1:]),
              "commit": _git_commit(), "encoder": encoder.config(),
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "load_avg_1m_at_start": round(os.getloadavg()[0], 2)},
              "results": [], "skipped": {}}
    print(f"# hybrid eval  commit {report['commit']}  window {args.window}")
    print(f"{'set':<12} {'n':>4} {'ranking':<16} {'P@1':>6} {'MRR':>6} {'R@5':>6}")
    for name in [s for s in args.sets.split(",") if s]:
        try:
            items = SETS[name](limit=args.limit)
        except SetUnavailable as e:
            print(f"{name:<12} skipped: {e}")
            report["skipped"][name] = str(e)
            continue
        for row in evaluate(name, items, encoder, args.window, rrf_ks, weight_sets):
            report["results"].append(row)
            print(f"{row['set']:<12} {row['n']:>4} {row['ranking']:<16} {row['p1']:>6.3f} {row['mrr']:>6.3f} {row['r5']:>6.3f}",
                  flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
