"""One compiled call for all segments (``kernels.multi.search_segments``) gives what the search
segment by segment gives: the same hits with bit-identical scores, totals, work counters, plans
and ``auto``'s records, with filters, deletions, several clauses, numpy-sized segments among
numba-sized ones, and every strategy."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine import kernels as KN
from stair_es.query import Range, SearchRequest, SparseClause, Term
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
USABLE = np.flatnonzero(~VOCAB.special_mask)[2000:2400]


def _csr(rng, n, lo, hi, zipf):
    ptr, toks, ws = [0], [], []
    for _ in range(n):
        m = int(rng.integers(lo, hi))
        if zipf:
            t = np.unique(USABLE[np.minimum(rng.zipf(1.2, size=m) - 1, USABLE.size - 1)])
        else:
            t = np.sort(rng.choice(USABLE, size=m, replace=False))
        toks.append(t)
        ws.append(np.log1p(rng.lognormal(size=t.size)).astype(np.float32) + 0.01)
        ptr.append(ptr[-1] + t.size)
    return np.array(ptr, np.int64), np.concatenate(toks).astype(np.int64), np.concatenate(ws)


@pytest.fixture(scope="module")
def index_path(tmp_path_factory):
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("fused") / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={"brand": "keyword", "price": "number"}), bshift=6)
    ix.max_segments = 100
    start = 0
    for n, zipf in ((3000, False), (2500, True), (60, False), (4000, True), (1500, False), (3000, False)):
        ids = [f"d{i}" for i in range(start, start + n)]
        vecs = {"image": _csr(rng, n, 10, 60, zipf), "caption": _csr(rng, n, 1, 8, False)}
        ix.add_arrays(ids, vecs, columns={"brand": np.array(["acme", "globex", "initech"])[np.arange(n) % 3],
                                          "price": rng.integers(0, 100, n).astype(np.float64)})
        start += n
    ix.delete([f"d{i}" for i in range(0, start, 7)])
    assert len(ix._segs) == 6
    ix.close()
    return path


def _query(rng, i):
    def vec(n):
        t = rng.choice(USABLE[:250], size=n, replace=False)
        return SparseVector.from_arrays(t, np.log1p(rng.lognormal(size=n)) + 0.01)

    clauses = [SparseClause("image", vec(int(rng.integers(3, 30))), float(rng.choice([0.5, 1.0, 2.0])))]
    if i % 3 == 1:
        clauses.append(SparseClause("caption", vec(int(rng.integers(1, 6))), 0.7))
    flt = [None, Term("brand", "acme"), Range("price", gte=10, lt=60)][i % 3 if i % 2 else 0]
    return SearchRequest(clauses, filter=flt, top_k=int(rng.choice([1, 10, 40])))


def _same(a, b):
    assert [(h.id, np.float32(h.score).tobytes()) for h in a.hits] == [(h.id, np.float32(h.score).tobytes()) for h in b.hits]
    assert a.total == b.total


@pytest.mark.parametrize("strategy", ["auto", "blockmax", "taat"])
def test_fused_equals_segment_by_segment(index_path, monkeypatch, strategy):
    calls = []
    real = KN.search_segments

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(KN, "search_segments", spy)
    fused, apart = EngineIndex.open(index_path), EngineIndex.open(index_path)
    apart._search_fused = lambda *a, **k: None  # the segment-by-segment path
    for ix in (fused, apart):
        ix.strategy = strategy
        ix.numpy_max_postings = 400  # the small segment's work goes to numpy under auto, the others' to numba
    rng = np.random.default_rng(11)
    seen = set()
    try:
        for i in range(60):
            req = _query(rng, i)
            a, b = fused.search(req), apart.search(req)
            _same(a, b)
            assert fused.last_search_strategies == apart.last_search_strategies
            np.testing.assert_array_equal(fused.last_search_stats, apart.last_search_stats)
            assert a.plan.to_dict() == b.plan.to_dict()
            seen.update(fused.last_search_strategies)
        assert fused.auto_record() == apart.auto_record()
    finally:
        fused.close()
        apart.close()
    assert len(calls) >= 59  # (the first search may load numba on the segment-by-segment path)
    if strategy == "auto":
        assert "numpy" in seen and seen & {"blockmax", "taat"}
    else:
        assert seen == {strategy}


def test_fused_threads_groups_and_unknown_terms(index_path):
    """Two threads share the segments out (each group one compiled call); a query whose tokens
    no segment holds, and an empty query, return no hits."""
    rng = np.random.default_rng(3)
    with EngineIndex.open(index_path) as ix, EngineIndex.open(index_path) as ref:
        ref._search_fused = lambda *a, **k: None
        ix.numpy_max_postings = ref.numpy_max_postings = 0
        for i in range(20):
            req = _query(rng, i)
            _same(ix.search(req, threads=2), ref.search(req))
        none = SearchRequest([SparseClause("image", SparseVector.from_arrays(np.array([int(USABLE[-1]) + 1]), np.array([1.0])))])
        assert ix.search(none).hits == []
