"""Reading hits' tokens back from the embedded engine: what re-ranking by meaning pays per query.

    python benchmarks/readback.py --docs 100000,1000000                  # both corpus shapes
    python benchmarks/readback.py --docs 1000000 --shapes image --workdir /big/disk --keep

`stair-es search --rerank` reads the tokens of its best 100 hits back (``EngineIndex.vectors_of``)
to embed them. An inverted index keeps no document rows: a document's row is found by walking
every term's block table, so the cost grows with the index, not with the hit. This benchmark
builds an index per shape and size and times, in the same run and on the same random hits:

* ``one by one``: ``vectors_of`` asked for one hit at a time (one walk per hit: how the engine
  read rows before they were read together);
* ``together``: one ``vectors_of`` call for all ``--hits`` hits (one walk per segment).

Shapes: ``scale`` is the scale benchmark's corpus (100-300 Zipf tokens per document over the
whole vocabulary, a worst case); ``image`` has 40-80 tokens per document out of 2,000, nearer
what the ``default`` encoder gives photos (about 60 tokens each, over about 1,800 distinct tokens
on the four public sets; the table prints each index's distinct tokens). Medians over ``--rounds``, in
milliseconds, with the ratio; the first round of each (page faults, numba's cache load) is
reported apart.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Timer, provenance_line  # noqa: E402
from benchmarks.scale.corpus import Generator, ScaleSpec  # noqa: E402

SHAPES = ("image", "scale")
IMAGE_TERMS = 2000  # distinct tokens of the image shape


def image_chunks(n_docs: int, seed: int = 0, chunk: int = 100_000):
    """(first doc, indptr, tokens, weights) chunks of the ``image`` shape: 40-80 distinct tokens
    per document from IMAGE_TERMS tokens drawn with Zipf-like odds (rank + 2) ** -1.1."""
    rng = np.random.default_rng(seed)
    odds = (np.arange(IMAGE_TERMS) + 2.0) ** -1.1
    vocab = np.sort(rng.choice(np.arange(1996, 30522), IMAGE_TERMS, replace=False)).astype(np.int32)  # words, no specials
    for first in range(0, n_docs, chunk):
        m = min(chunk, n_docs - first)
        draws = np.sort(rng.choice(IMAGE_TERMS, size=(m, 120), p=odds / odds.sum()), axis=1)
        fresh = np.ones_like(draws, bool)
        fresh[:, 1:] = draws[:, 1:] != draws[:, :-1]
        fresh &= np.cumsum(fresh, axis=1) <= rng.integers(40, 81, m)[:, None]
        indptr = np.concatenate([[0], np.cumsum(fresh.sum(axis=1))]).astype(np.int64)
        tokens = vocab[draws[fresh]]
        yield first, indptr, tokens, rng.gamma(2.0, 0.4, tokens.size).astype(np.float32)


def build(path: Path, n_docs: int, shape: str) -> None:
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    chunks = (image_chunks(n_docs) if shape == "image"
              else Generator(ScaleSpec(n_docs=n_docs, weights="idf", chunk=min(n_docs, 100_000))).chunks())
    ix = EngineIndex.create(path, IndexSchema(sparse_fields=("image",)))
    for first, indptr, tokens, weights in chunks:
        ix.add_arrays([str(i) for i in range(first, first + indptr.size - 1)], {"image": (indptr, tokens, weights)})
    ix.close()


def measure(path: Path, n_docs: int, hits: int, rounds: int, seed: int) -> dict:
    from stair_es.engine import EngineIndex

    ix = EngineIndex.open(path)
    rng = np.random.default_rng(seed)
    one, together = [], []
    for _ in range(rounds + 1):
        ids = [str(i) for i in rng.integers(0, n_docs, hits)]
        with Timer() as t:
            rows = ix.vectors_of(ids, "image")
        together.append(t.wall_ms)
        with Timer() as t:
            single = [ix.vectors_of([i], "image")[0] for i in ids]
        one.append(t.wall_ms)
        assert all(np.array_equal(a.ids, b.ids) and np.array_equal(a.weights, b.weights)
                   for a, b in zip(rows, single)), "rows read together differ from rows read one by one"
    tokens = float(np.mean([r.nnz for r in rows if r is not None]))
    terms = int(np.count_nonzero(ix.doc_freqs("image")[0]))
    ix.close()
    return {"first_one_by_one_ms": one[0], "first_together_ms": together[0],
            "one_by_one_ms": statistics.median(one[1:]), "together_ms": statistics.median(together[1:]),
            "tokens_per_doc": tokens, "terms": terms}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", default="100000,1000000", help="comma-separated index sizes")
    ap.add_argument("--shapes", default="image,scale", help=f"comma-separated, from {', '.join(SHAPES)}")
    ap.add_argument("--hits", type=int, default=100, help="hits read back per query (re-ranking's window)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", default=None, help="where the indices are built (default: the system's temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the indices in --workdir and reuse them next time")
    args = ap.parse_args(argv)
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="stair-es-readback-"))
    print(f"# {provenance_line()}")
    print(f"{'shape':<6} {'docs':>9} {'tokens':>6} {'terms':>6} {'one by one':>11} {'together':>9} {'ratio':>6}   first round")
    try:
        for shape in args.shapes.split(","):
            for n in (int(x) for x in args.docs.split(",")):
                path = work / f"readback-{shape}-{n}"
                if not (args.keep and path.exists()):
                    shutil.rmtree(path, ignore_errors=True)
                    build(path, n, shape)
                m = measure(path, n, args.hits, args.rounds, seed=n)
                print(f"{shape:<6} {n:>9,} {m['tokens_per_doc']:>6.0f} {m['terms']:>6,} {m['one_by_one_ms']:>8.1f} ms "
                      f"{m['together_ms']:>6.1f} ms {m['one_by_one_ms'] / m['together_ms']:>5.1f}x   "
                      f"{m['first_one_by_one_ms']:.0f} / {m['first_together_ms']:.0f} ms", flush=True)
                if not args.keep:
                    shutil.rmtree(path, ignore_errors=True)
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
