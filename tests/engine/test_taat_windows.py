"""The document-blocked TAAT over many windows (segments larger than one 4,096-document window,
blocks of 4 to 256 documents, filters and deletes across window bounds, windows skipped for the
heap by their bound) returns the brute force's hits with bit-identical scores, as every other
strategy does."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine.layout import TAAT_WINDOW_DOCS
from stair_es.query import Range, SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

TOKENS = np.flatnonzero(~default_vocabulary().special_mask)[5000:5200]
N_DOCS = 3 * TAAT_WINDOW_DOCS + 517  # the last window partial


def f16(w):
    return np.asarray(w, np.float32).astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("bshift", [2, 8])
def test_taat_over_many_windows_equals_brute_force(tmp_path, bshift):
    rng = np.random.default_rng(bshift)
    p = 1.0 / np.arange(1, TOKENS.size + 1)
    p /= p.sum()
    rows, dense = [], np.zeros((N_DOCS, TOKENS.size), np.float32)
    for d in range(N_DOCS):
        r = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(3, 25)), replace=False, p=p))
        w = np.log1p(rng.lognormal(size=r.size)).astype(np.float32) + np.float32(0.01)
        rows.append((r, w))
        dense[d, r] = f16(w)
    indptr = np.zeros(N_DOCS + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r, _ in rows])
    ids = TOKENS[np.concatenate([r for r, _ in rows])].astype(np.int32)
    ws = np.concatenate([w for _, w in rows])
    price = rng.integers(0, 100, N_DOCS).astype(float)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={"price": "number"}, sparse_fields=("image",)), bshift=bshift)
    ix.add_arrays([f"d{i}" for i in range(N_DOCS)], {"image": (indptr, ids, ws)}, [{"price": float(x)} for x in price])
    gone = rng.choice(N_DOCS, 700, replace=False)
    ix.delete([f"d{i}" for i in gone])
    live = np.ones(N_DOCS, bool)
    live[gone] = False
    ix.numpy_max_postings = 0  # the numba kernels
    for qi in range(25):
        r = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(1, 30)), replace=False, p=p))
        qw = (np.log1p(rng.lognormal(size=r.size)) + 0.01).astype(np.float32)
        k = int(rng.choice([1, 10, 100]))
        filtered = qi % 2 == 1
        allow = live & ((price <= 30) if filtered else True)
        flt = Range("price", lte=30) if filtered else None
        scores = np.zeros(N_DOCS, np.float32)
        for t, w in zip(r, qw):  # query-term order, float32: the engine's canonical sum
            scores = (scores + np.float32(w) * dense[:, t]).astype(np.float32)
        hit = np.flatnonzero((scores > 0) & allow)
        order = hit[np.lexsort((hit, -scores[hit]))][:k]
        want = [(f"d{i}", float(scores[i])) for i in order]
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(TOKENS[r], qw))], top_k=k, filter=flt)
        for strategy in ("taat", "blockmax", "auto"):
            ix.strategy = strategy
            got = ix.search(req)
            assert [(h.id, h.score) for h in got.hits] == want, f"query {qi}: {strategy} differs from brute force"
            if strategy == "taat":
                assert got.total == hit.size  # every hit counted, across windows and filters
    ix.close()
