"""`stair-es rank-eval` on the sample catalog: its figures, and the time of one query encoder per run
against one per query (what ``stair_es.search.make_request`` does when called query by query).

    python benchmarks/rank_eval_bench.py [--home DIR] [--runs 3]

Builds the 18 sample photos (``stair_es.samples``) into an embedded index with the default
encoder and no captions (so a caption cannot answer its own query), rates each photo relevant
to its own catalog caption (photos sharing a caption are all relevant), and prints the
metrics of the default query encoder, then the timing. Prints the git commit and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import provenance_line  # noqa: E402


def build(home: Path) -> Path:
    """The sample index (once per home) and its ratings file."""
    from stair_es.samples import write_sample_catalog

    folder = home.parent / "rank-eval-samples"
    manifest = folder / "manifest.jsonl"
    if not manifest.exists():
        write_sample_catalog(folder)
    if not (home / "samples").exists():
        env = {**os.environ, "STAIR_ES_HOME": str(home)}
        subprocess.run([sys.executable, "-m", "stair_es.cli.main", "ingest", "samples", str(manifest), "--no-captions",
                        "--no-progress"], check=True, env=env)
    by_caption = defaultdict(list)
    for line in manifest.read_text().splitlines():
        row = json.loads(line)
        by_caption[row["caption"]].append(row["id"])
    ratings = folder / "ratings.jsonl"
    ratings.write_text("".join(json.dumps({"query": c, "relevant": {i: 1 for i in ids}}) + "\n"
                               for c, ids in by_caption.items()))
    return ratings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, help="embedded home to build (or reuse) the index in [default: a temp dir]")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="rank-eval-bench-")) / "home"
    home.mkdir(parents=True, exist_ok=True)
    os.environ["STAIR_ES_HOME"] = str(home)
    ratings = build(home)

    from stair_es.backends.base import get_backend
    from stair_es.rankeval import QueryConfig, evaluate, read_ratings
    from stair_es.search import make_request

    backend = get_backend("embedded", home=str(home))
    rated = read_ratings(ratings)
    print(f"{provenance_line()}; {len(rated.queries)} rated queries on the sample photos")
    ev = evaluate(backend, "samples", rated.queries)  # also warms the ONNX towers and numba kernels
    print("default query encoder: " + ", ".join(f"{k} {v:.3f}" for k, v in ev.metrics.items()))
    for _ in range(args.runs):
        t = time.perf_counter()
        evaluate(backend, "samples", rated.queries)
        once = time.perf_counter() - t
        t = time.perf_counter()
        for q in rated.queries:
            request, _ = make_request(backend, "samples", QueryConfig().spec(q, 10))
            backend.search("samples", request)
        each = time.perf_counter() - t
        print(f"rank-eval (one encoder per run) {once:.2f} s; make_request query by query (one encoder per query) "
              f"{each:.2f} s; x{each / once:.1f}; load {os.getloadavg()[0]:.1f}")
    backend.close()


if __name__ == "__main__":
    main()
