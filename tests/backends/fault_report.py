"""Fault-injection figures for the cluster backends' ingestion (not a test; prints a table).

    .venv/bin/python tests/backends/fault_report.py [N_DOCS]

Each scenario ingests N_DOCS documents through the real client into the fake node while it
injects faults, then counts: faults injected, documents reported ok / failed, and documents lost
(reported ok but not stored, or neither reported nor stored).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_cluster import FakeCluster, Faults  # noqa: E402

from stair_es.backends.base import get_backend  # noqa: E402
from stair_es.schema import IndexSchema  # noqa: E402


def corpus(n):
    import numpy as np

    from stair_es.schema import Document
    from stair_es.sparse import SparseVector
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    rng = np.random.default_rng(0)
    ok = np.flatnonzero(~vocab.special_mask)
    return [Document(f"d{i:05d}", {"image": SparseVector.from_arrays(rng.choice(ok, 40, replace=False), rng.pareto(2.0, 40) + 0.05)},
                     {"brand": "acme"}) for i in range(n)]


SCENARIOS = {
    "429 storm (60% of bulk requests)": Faults(seed=1, bulk_status={429: 0.6}),
    "502/503/504 (50%)": Faults(seed=2, bulk_status={503: 0.3, 502: 0.1, 504: 0.1}),
    "partial bulk: 30% of items 429": Faults(seed=3, item_429=0.3),
    "dropped connection after write (40%)": Faults(seed=4, drop=0.4),
    "dropped connection before write (40%)": Faults(seed=12, drop=0.4, drop_after_apply=False),
    "slow response > timeout (30%)": Faults(seed=6, slow=0.3, slow_seconds=1.2),
    "all of the above": Faults(seed=7, bulk_status={429: 0.2, 503: 0.1}, item_429=0.1, drop=0.1, slow=0.1, slow_seconds=1.2),
}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    docs = corpus(n)
    ids = {d.id for d in docs}
    rows = []
    for flavor in ("elasticsearch", "opensearch"):
        for name, faults in SCENARIOS.items():
            with FakeCluster(flavor, faults=faults) as c:
                b = get_backend(flavor, urls=c.url, timeout=1.0, backoff=0.02, backoff_max=0.5, max_retries=15, chunk_docs=100)
                b.create_index("cat", IndexSchema())
                t0 = time.perf_counter()
                rep = b.ingest("cat", docs)
                dt = time.perf_counter() - t0
                stored = set(c.docs("cat"))
                ok = {i.id for i in rep.items if i.ok}
                failed = {i.id for i in rep.failures}
                lost = len(ok - stored) + len(ids - ok - failed)
                rows.append((flavor, name, c.counts["faults"], c.counts["item_faults"], n, len(ok), len(failed), lost,
                             b.stats["retried_items"], f"{dt:.1f}"))
    head = ("engine", "scenario", "faulty requests", "items rejected", "docs", "ok", "failed", "lost", "items re-sent", "s")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    total_faults = sum(r[2] for r in rows)
    print(f"\ntotal: {total_faults} faulty requests, {sum(r[3] for r in rows)} rejected items, "
          f"{sum(r[4] for r in rows)} documents, {sum(r[7] for r in rows)} lost, {sum(r[6] for r in rows)} failed")


if __name__ == "__main__":
    main()
