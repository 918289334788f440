"""A search that starts from a lower bound of its k-th best score (``kernels.seed``: the heap
filled with placeholders at the k-th best exact score of a few candidate documents) returns what
a search without it returns: the same ids in the same order with bit-identical scores, with ties
of many equal scores (broken by age), the segments visited best candidates first, deleted documents and filters that rule out the heaviest
candidates, several clauses and every k."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine.kernels import multi
from stair_es.engine.layout import F16_TABLE
from stair_es.query import Range, SearchRequest, SparseClause, Term
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import VOCAB_SIZE, default_vocabulary

VOCAB = default_vocabulary()
USABLE = np.flatnonzero(~VOCAB.special_mask)[3000:3300]


def _csr(rng, n, lo, hi):
    ptr, toks, ws = [0], [], []
    for _ in range(n):
        t = np.unique(USABLE[np.minimum(rng.zipf(1.3, size=int(rng.integers(lo, hi))) - 1, USABLE.size - 1)])
        toks.append(t)
        ws.append((np.log1p(rng.lognormal(size=t.size)) + 0.01).astype(np.float32))
        ptr.append(ptr[-1] + t.size)
    return np.array(ptr, np.int64), np.concatenate(toks).astype(np.int64), np.concatenate(ws)


def _hits(res):
    return [(h.id, np.float32(h.score).tobytes()) for h in res.hits]


def _both(ix, req):
    """(hits with the seed, hits without it), the seed forced on whatever the index's size
    (block-max forced: ``auto`` leaves the seed out where it runs TAAT); with the seed, the
    segments visited in their own order or in the seed's (best candidates first), and ``auto``,
    give the same hits."""
    ix.seed_min_docs = 0
    ix.seed_terms, ix.seed_postings = 2, 20
    ix.strategy = "blockmax"
    ix.seed_order = False
    a0 = ix.search(req)
    ix.seed_order = True
    a = ix.search(req)
    assert _hits(a) == _hits(a0)
    ix.strategy = "auto"
    assert _hits(ix.search(req)) == _hits(a)
    ix.seed_terms = 0
    b = ix.search(req)
    ix.seed_terms = 2
    return a, b


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("seed") / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={"brand": "keyword", "price": "number"}), bshift=6)
    ix.max_segments = 100
    start = 0
    for n in (3000, 2000, 4000, 50):
        ids = [f"d{i}" for i in range(start, start + n)]
        ix.add_arrays(ids, {"image": _csr(rng, n, 10, 60), "caption": _csr(rng, n, 1, 8)},
                      columns={"brand": np.array(["acme", "globex", "initech"])[np.arange(n) % 3],
                               "price": rng.integers(0, 100, n).astype(np.float64)})
        start += n
    ix.delete([f"d{i}" for i in range(0, start, 9)])
    yield ix
    ix.close()


def test_same_hits_with_and_without_the_seed(index):
    rng = np.random.default_rng(5)
    for i in range(60):
        t = rng.choice(USABLE[:120], size=int(rng.integers(2, 25)), replace=False)
        clauses = [SparseClause("image", SparseVector.from_arrays(t, np.log1p(rng.lognormal(size=t.size)) + 0.01))]
        if i % 4 == 1:
            c = rng.choice(USABLE[:40], size=3, replace=False)
            clauses.append(SparseClause("caption", SparseVector.from_arrays(c, np.ones(3)), 0.7))
        flt = [None, None, Term("brand", "acme"), Range("price", gte=10, lt=60)][i % 4]
        req = SearchRequest(clauses, filter=flt, top_k=int(rng.choice([1, 10, 40])))
        a, b = _both(index, req)
        assert _hits(a) == _hits(b)
        assert all(h.id for h in a.hits)


def test_the_bound_is_a_real_kth_score_and_prunes(index):
    """The bound the seed finds is positive and at most the k-th best score of the search."""
    rng = np.random.default_rng(9)
    index.seed_min_docs = 0
    req0 = SearchRequest([SparseClause("image", SparseVector.from_arrays(USABLE[:3], np.ones(3)))], top_k=10)
    index.search(req0)  # (the compiled search's tables made)
    desc, allowed, checks, tmax, rec, every = index._fused(index._segs)[:6]
    found = 0
    for _ in range(20):
        t = np.sort(rng.choice(USABLE[:60], size=12, replace=False))
        w = (np.log1p(rng.lognormal(size=t.size)) + 0.01).astype(np.float32)
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(t, w))], top_k=10)
        kth = np.float32(index.search(req).hits[-1].score)
        fi = index.schema.sparse_fields.index("image")
        keys = (t + fi * VOCAB_SIZE).astype(np.int64)
        wq = SparseVector.from_arrays(t, w).weights.astype(np.float32)
        bound = multi.seed_bound(keys, wq, every, 0, desc, allowed, checks, tmax, F16_TABLE, 10, 2, 20, np.zeros(every.size, np.float32))
        assert bound <= kth
        found += bound > 0
    assert found >= 15


@pytest.mark.parametrize("k", [1, 5, 10, 50])
def test_ties_break_by_age_as_without_the_seed(tmp_path, k):
    """Hundreds of documents with the same vector (equal scores): the same, oldest, ones come back."""
    path = tmp_path / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={}), bshift=6)
    ix.max_segments = 100
    t = USABLE[:4]
    rng = np.random.default_rng(3)
    start = 0
    for n in (700, 500, 900):
        ptr = np.arange(n + 1, dtype=np.int64) * 4
        toks = np.tile(t, n).astype(np.int64)
        ws = np.tile(np.array([1.5, 0.25, 0.75, 2.0], np.float32), n)
        odd = rng.random(n) < 0.3  # some documents a little lighter on one term
        ws.reshape(n, 4)[odd, 0] = 1.25
        ix.add_arrays([f"t{i}" for i in range(start, start + n)], {"image": (ptr, toks, ws)})
        start += n
    ix.delete([f"t{i}" for i in range(0, 40)])  # the oldest of the heaviest ones: never returned
    req = SearchRequest([SparseClause("image", SparseVector.from_arrays(t, np.array([1.0, 0.5, 0.3, 0.9])))], top_k=k)
    a, b = _both(ix, req)
    assert _hits(a) == _hits(b)
    assert len(a.hits) == k and len({h.score for h in a.hits}) == 1
    assert [h.id for h in a.hits] == sorted((h.id for h in a.hits), key=lambda s: int(s[1:]))
    assert all(int(h.id[1:]) >= 40 for h in a.hits)
    ix.close()


def test_heaviest_documents_deleted_or_filtered_out(tmp_path):
    """The heaviest postings of the query's heaviest term belong to deleted or filtered-out
    documents: they are no candidates, and the hits are those of a search without the seed."""
    path = tmp_path / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={"keep": "keyword"}), bshift=6)
    ix.max_segments = 100
    rng = np.random.default_rng(4)
    start = 0
    for n in (1500, 1500):
        ptr, toks, ws = _csr(rng, n, 5, 30)
        heavy = np.flatnonzero(toks == USABLE[0])
        ws[heavy[:60]] = 50.0  # the heaviest postings of the heaviest term
        keep = np.where(np.arange(n) % 2 == 0, "yes", "no")
        ix.add_arrays([f"h{i}" for i in range(start, start + n)], {"image": (ptr, toks, ws)}, columns={"keep": keep})
        start += n
    q = SparseVector.from_arrays(USABLE[:6], np.array([3.0, 1.0, 1.0, 0.5, 0.5, 0.5]))
    top = [h.id for h in ix.search(SearchRequest([SparseClause("image", q)], top_k=80)).hits]
    heavy_docs = top[:40]
    ix.delete(heavy_docs)
    for flt in (None, Term("keep", "yes"), Term("keep", "no")):
        r = SearchRequest([SparseClause("image", q)], filter=flt, top_k=10)
        a, b = _both(ix, r)
        assert _hits(a) == _hits(b)
        assert not set(h.id for h in a.hits) & set(heavy_docs)
    ix.close()


def test_threads_share_segments_out_each_group_seeded(index, monkeypatch):
    """With two threads the segments are shared out and each group's heap is seeded from its own
    segments; the merged hits are those of one thread without the seed."""
    from stair_es.engine import searcher

    monkeypatch.setattr(searcher, "SPLIT_MIN_DOCS", 1000)  # (the test's segments count as big)
    rng = np.random.default_rng(21)
    index.seed_min_docs = 0
    index.strategy = "blockmax"
    for _ in range(20):
        t = rng.choice(USABLE[:100], size=int(rng.integers(3, 20)), replace=False)
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(t, np.log1p(rng.lognormal(size=t.size)) + 0.01))],
                            top_k=int(rng.choice([1, 10, 30])))
        index.seed_terms = 2
        a = index.search(req, threads=2)
        index.seed_terms = 0
        b = index.search(req, threads=1)
        assert _hits(a) == _hits(b)
    index.seed_terms = 2
    index.strategy = "auto"


def test_term_maxima_filled_at_once_are_those_the_search_finds_itself(index):
    """``Segment.fill_term_max`` (the background thread and ``warm()`` fill the seed's per-term
    block maxima at once) gives every slot the value a search computes for it on first use, and
    the hits do not change."""
    rng = np.random.default_rng(21)
    reqs = []
    for _ in range(12):
        t = rng.choice(USABLE[:150], size=int(rng.integers(3, 20)), replace=False)
        reqs.append(SearchRequest([SparseClause("image", SparseVector.from_arrays(t, np.log1p(rng.lognormal(size=t.size)) + 0.01))],
                                  top_k=10))
    index.seed_min_docs = 0
    index.seed_terms, index.seed_postings = 2, 20
    want = [_hits(index.search(r)) for r in reqs]  # slots filled by the searches themselves
    for st in index._segs:
        seg = st.seg
        lazy = seg.term_max().copy()
        seg.term_max()[:] = 0
        if seg.n_docs < 100:
            continue
        v = seg.verifier
        if v is not None:
            lo = seg.offsets["pair_max"] >> v.shift
            if not v.ok[lo:(seg.offsets["pair_max"] + seg.pair_max.nbytes - 1 >> v.shift) + 1].all():
                assert not seg.fill_term_max()  # (block maxima not all verified yet: nothing read)
            seg.verify_arrays(("pair_max",))
        assert seg.fill_term_max()
        full = seg.term_max()
        seen = lazy != 0
        assert (full[seen] == lazy[seen]).all()
        pp = seg.pair_ptr
        for j in np.flatnonzero(pp[1:] > pp[:-1])[:50]:
            assert full[j] == seg.pair_max[pp[j]:pp[j + 1]].max()
    assert [_hits(index.search(r)) for r in reqs] == want


def test_candidates_scored_as_the_search_sums_a_hit(index):
    """The seed's scores of a segment's candidates (two passes: the runs found, then read) are
    each document's weights of the query terms times their query weights, summed in query order
    in float32, bit for bit, for documents anywhere in the segment (first and last block, a term
    absent from a document's block, documents of one block); and its search for a block's pair
    finds the first pair at or after the block wherever it starts."""
    from stair_es.engine.kernels.seed import _first_pair_at, score_docs

    rng = np.random.default_rng(5)
    seg = index._segs[0].seg
    a = seg.kernel_arrays()
    n_blocks = (seg.n_docs + (1 << seg.bshift) - 1) >> seg.bshift
    for _ in range(40):
        t = np.sort(rng.choice(USABLE[:80], size=int(rng.integers(1, 20)), replace=False))
        q_j = seg.term_index(0, t)
        q_j = np.ascontiguousarray(q_j[q_j >= 0], np.int64)
        q_w = (np.log1p(rng.lognormal(size=q_j.size)) + 0.01).astype(np.float32)
        docs = np.unique(np.concatenate([[0, seg.n_docs - 1], rng.integers(0, seg.n_docs, int(rng.integers(1, 12)))]))
        got = np.zeros(docs.size, np.float32)
        score_docs(q_j, q_w, a, None, docs.astype(np.int64), got)
        want = np.zeros(docs.size, np.float32)
        for j, w in zip(q_j, q_w):
            pr = np.arange(a.pair_ptr[j], a.pair_ptr[j + 1])
            starts = a.post_ptr[j] + np.concatenate([[0], np.cumsum(a.pair_cnt[pr].astype(np.int64) + 1)])
            for y, d in enumerate(docs):
                b = d >> seg.bshift
                at = int(np.searchsorted(a.pair_block[pr], b))
                for lo in (a.pair_ptr[j], a.pair_ptr[j] + at // 2, a.pair_ptr[j] + at):
                    assert _first_pair_at(a.pair_block, lo, a.pair_ptr[j + 1], b, n_blocks) == a.pair_ptr[j] + at
                if at < pr.size and a.pair_block[pr[at]] == b:
                    offs = a.post_off[starts[at]:starts[at + 1]]
                    hit = np.flatnonzero(offs == (d & ((1 << seg.bshift) - 1)))
                    if hit.size:
                        v = a.post_w[starts[at] + hit[0]:starts[at] + hit[0] + 1].view(np.float16).astype(np.float32)[0]
                        want[y] = np.float32(want[y] + np.float32(w) * v)
        assert (got.view(np.uint32) == want.view(np.uint32)).all()
