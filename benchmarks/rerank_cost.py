"""What re-ranking by meaning adds to a text search in `stair-es serve` (its Service, in process).

    python -m benchmarks.encoders.run --export-ratings /tmp/photos      # the public photos + queries
    stair-es ingest photos /tmp/photos --home /tmp/photos-idx
    python benchmarks/rerank_cost.py --home /tmp/photos-idx --index photos --queries /tmp/photos/ratings.jsonl

Runs every query of ``--queries`` (JSONL with a ``"query"`` per line, as `stair-es rank-eval`
reads) through ``Service.search`` one by one and through ``Service.search_many`` in batches of
``--batch`` (as the server's batcher prepares them: the texts of a batch embedded in one call),
with ``rerank`` off and auto, alternating the two over ``--rounds`` so that the machine's load
hits both alike. Prints medians over the rounds of the per-search p50 and p95 (one by one) and
of the mean per search in batches, in milliseconds. Texts with nothing to search in the index
(an error for that query alone) are counted apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import percentiles, provenance_line  # noqa: E402


def one_round(home: str, index: str, texts: list[str], rerank: str, batch: int) -> dict:
    from stair_es.errors import StairError
    from stair_es.serve.service import ServeConfig, Service

    svc = Service(ServeConfig(backend="embedded", backend_options={"home": home}, default_index=index, rerank=rerank))
    svc.search({"text": texts[0]})  # the encoders and the sentence model load here, not in the figures
    times, refused = [], 0
    for q in texts:
        t0 = time.perf_counter()
        try:
            svc.search({"text": q, "top_k": 10})
        except StairError:
            refused += 1
        times.append((time.perf_counter() - t0) * 1000)
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        svc.search_many([{"text": q, "top_k": 10} for q in texts[i:i + batch]])
    per_search = (time.perf_counter() - t0) * 1000 / len(texts)
    p = percentiles(times)
    return {"p50_ms": p["p50_ms"], "p95_ms": p["p95_ms"], "batched_ms": per_search, "refused": refused}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="the embedded engine's home holding --index")
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", type=Path, required=True, help="JSONL, one {\"query\": ...} per line")
    ap.add_argument("--limit", type=int, default=120, help="queries used (the first ones)")
    ap.add_argument("--batch", type=int, default=16, help="searches prepared together (serve's --max-batch)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    texts = []
    for line in args.queries.read_text("utf-8").splitlines():
        try:
            q = json.loads(line).get("query")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(q, str) and q.strip():
            texts.append(q)
    texts = texts[: args.limit]
    if not texts:
        sys.exit(f"error: no {{\"query\": ...}} lines in {args.queries}")
    print(f"# {provenance_line()}")
    print(f"# {len(texts)} queries on {args.index!r}, {args.rounds} rounds, batches of {args.batch}")
    runs: dict[str, list[dict]] = {"off": [], "auto": []}
    for _ in range(args.rounds):
        for mode in runs:
            runs[mode].append(one_round(args.home, args.index, texts, mode, args.batch))
    print(f"{'rerank':<7} {'p50':>8} {'p95':>8} {'batched':>9}  refused")
    for mode, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("p50_ms", "p95_ms", "batched_ms")}
        print(f"{mode:<7} {med['p50_ms']:>5.1f} ms {med['p95_ms']:>5.1f} ms {med['batched_ms']:>6.1f} ms  {rs[0]['refused']}")


if __name__ == "__main__":
    main()
