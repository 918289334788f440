"""The streamed merge (bounded memory) writes the same segment file, byte for byte, as the merge
that held every posting in memory; ``optimize(max_segments=N)`` packs consecutive segments into
at most N and searches return the same hits with bit-identical scores."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine.merge import merge_segments, merge_segments_to_file
from stair_es.engine.segment import build_segment
from stair_es.errors import InvalidInputError
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
USABLE = np.flatnonzero(~VOCAB.special_mask)[3000:3300]


def _csr(rng, n, lo, hi):
    ptr, toks, ws = [0], [], []
    for _ in range(n):
        t = np.unique(USABLE[np.minimum(rng.zipf(1.3, size=int(rng.integers(lo, hi))) - 1, USABLE.size - 1)])
        toks.append(t)
        ws.append(np.log1p(rng.lognormal(size=t.size)).astype(np.float32) + 0.01)
        ptr.append(ptr[-1] + t.size)
    return np.array(ptr, np.int64), np.concatenate(toks).astype(np.int64), np.concatenate(ws)


def _index(path, sizes, seed=5, bshift=5):
    rng = np.random.default_rng(seed)
    ix = EngineIndex.create(path, IndexSchema(fields={"brand": "keyword", "price": "number"}), bshift=bshift)
    ix.max_segments = 100
    start = 0
    for n in sizes:
        ids = [f"d{i}" for i in range(start, start + n)]
        ix.add_arrays(ids, {"image": _csr(rng, n, 5, 40), "caption": _csr(rng, n, 0, 5)},
                      columns={"brand": np.array(["acme", "globex", None], object)[np.arange(n) % 3],
                               "price": rng.integers(0, 100, n).astype(np.float64)},
                      captions=[f"caption {i}" if i % 4 else None for i in range(start, start + n)])
        start += n
    return ix, start


@pytest.mark.parametrize("chunk", [1, 50, 1 << 25])
def test_streamed_merge_writes_the_same_file(tmp_path, chunk):
    ix, n = _index(tmp_path / "ix", [700, 45, 900, 300])
    ix.delete([f"d{i}" for i in range(0, n, 9)])
    segs = [s.seg for s in ix._segs]
    keeps = [np.arange(s.seg.n_docs) if s.deleted is None else np.flatnonzero(~s.deleted) for s in ix._segs]
    fields = ix.schema.sparse_fields
    batch, postings = merge_segments(segs, keeps, ix.bshift)
    a = build_segment(tmp_path / "a.seg", "seg-x", batch, fields, ix.bshift, postings=postings)
    b = merge_segments_to_file(tmp_path / "b.seg", "seg-x", segs, keeps, fields, ix.bshift, chunk_postings=chunk)
    assert a.n_docs == b.n_docs == sum(len(k) for k in keeps)
    assert (tmp_path / "a.seg").read_bytes() == (tmp_path / "b.seg").read_bytes()
    b.verify_all()  # every chunk checksum holds
    ix.close()


def test_optimize_max_segments_keeps_results(tmp_path):
    ix, n = _index(tmp_path / "ix", [400] * 6, seed=9)
    ix.delete([f"d{i}" for i in range(0, n, 11)])
    rng = np.random.default_rng(1)
    reqs = []
    for i in range(12):
        t = rng.choice(USABLE[:120], size=int(rng.integers(2, 15)), replace=False)
        reqs.append(SearchRequest([SparseClause("image", SparseVector.from_arrays(t, rng.random(t.size) + 0.1))],
                                  filter=Term("brand", "acme") if i % 3 == 0 else None, top_k=10))
    before = [[(h.id, h.score) for h in ix.search(r).hits] for r in reqs]
    with pytest.raises(InvalidInputError):
        ix.optimize(max_segments=0)
    ix.optimize(max_segments=4)  # 6 x ~365 live: packed into at most 4 groups
    assert 2 <= len(ix._segs) <= 4
    assert [[(h.id, h.score) for h in ix.search(r).hits] for r in reqs] == before
    ix.optimize(max_segments=2)
    assert len(ix._segs) == 2
    assert [[(h.id, h.score) for h in ix.search(r).hits] for r in reqs] == before
    ix.optimize()
    assert len(ix._segs) == 1 and ix.stats()["docs"] == n - len(range(0, n, 11))
    assert [[(h.id, h.score) for h in ix.search(r).hits] for r in reqs] == before
    ix.close()
    with EngineIndex.open(tmp_path / "ix") as r:
        assert [[(h.id, h.score) for h in r.search(q).hits] for q in reqs] == before
