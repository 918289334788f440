"""Cost of neighbour statistics on the embedded engine: first computation (scan + count +
store), a use with a current file (load + verify), and the upkeep added to an ingest call.

    python -m benchmarks.neighbours_bench [--docs 5000] [--batch 256] [--batches 10]

Synthetic documents: 60 image tokens and a 10-word caption each, drawn from 2,000 frequent
tokens (Zipf-like). Prints medians of 3 runs; ratios against a plain ingest measured in the
same run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from benchmarks.common import provenance_line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=256, help="documents per ingest batch (commit)")
    ap.add_argument("--batches", type=int, default=10, help="batches in the measured ingest call")
    args = ap.parse_args(argv)

    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.neighbours import index_counts
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    rng = np.random.default_rng(0)
    pool = np.asarray([i for i in range(2000, 30000) if vocab.token(i).isalpha()][:2000])
    p = 1.0 / np.arange(1, pool.size + 1)
    p /= p.sum()

    def make(i):
        ids = np.unique(rng.choice(pool, 60, p=p))
        words = [vocab.token(int(t)) for t in rng.choice(pool, 10, p=p)]
        return Document(f"d{i}", {"image": SparseVector.from_arrays(ids, np.ones(ids.size, np.float32), vocab)},
                        caption=" ".join(words))

    docs = [make(i) for i in range(args.docs)]
    extra = [make(args.docs + i) for i in range(args.batch * args.batches)]
    first, use, plain, kept = [], [], [], []
    for rep in range(3):
        with tempfile.TemporaryDirectory() as home:
            b = EmbeddedBackend(home, batch_size=args.batch)
            b.create_index("x", IndexSchema())
            b.ingest("x", docs)
            t = time.perf_counter()
            b.ingest("x", [Document(f"p{rep}-{d.id}", d.vectors, caption=d.caption) for d in extra])
            plain.append(time.perf_counter() - t)
            t = time.perf_counter()
            index_counts(b, "x")
            first.append(time.perf_counter() - t)
            t = time.perf_counter()
            index_counts(b, "x")
            use.append(time.perf_counter() - t)
            t = time.perf_counter()
            b.ingest("x", [Document(f"k{rep}-{d.id}", d.vectors, caption=d.caption) for d in extra])
            kept.append(time.perf_counter() - t)
            b.close()
    m = statistics.median
    print(f"# neighbour statistics, {args.docs} documents (60 image tokens, 10-word captions); measured ingest: "
          f"one call of {len(extra)} documents in batches of {args.batch}\n# {provenance_line()}")
    print(f"first use (scan + count + store): {m(first):.2f} s")
    print(f"use with a current file (load + verify): {m(use) * 1000:.0f} ms")
    print(f"ingest call: {m(plain) * 1000:.0f} ms without statistics, {m(kept) * 1000:.0f} ms keeping them "
          f"current (x{m(kept) / m(plain):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
