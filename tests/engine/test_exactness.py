"""Exact top-k against a brute-force reference on random data, with filters, deletes,
updates, multi-field weighted clauses and segment merges."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.query import HasTokens, Range, SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
USABLE = np.flatnonzero(~VOCAB.special_mask)[1000:1300]  # a small token range: many overlaps
BRANDS = ["acme", "globex", "initech"]


def f16(w):
    return np.asarray(w, np.float32).astype(np.float16).astype(np.float32)


def random_doc(rng, i: int, zipf: bool) -> Document:
    vecs = {}
    for field, lo, hi in (("image", 5, 40), ("caption", 0, 8)):
        n = int(rng.integers(lo, hi))
        if n == 0:
            continue
        if zipf:
            ranks = np.minimum(rng.zipf(1.3, size=n) - 1, USABLE.size - 1)
            toks = USABLE[ranks]
        else:
            toks = rng.choice(USABLE, size=n, replace=False)
        w = rng.choice([0.5, 1.0, 2.0], size=len(toks)) if rng.random() < 0.2 else np.log1p(rng.lognormal(size=len(toks)))
        vecs[field] = SparseVector.from_arrays(toks, w)
    meta = {"brand": BRANDS[i % 3], "price": float(rng.integers(0, 100))}
    if i % 4 == 0:
        meta["tags"] = ["x", "y"] if i % 8 == 0 else ["y"]
    return Document(f"d{i}", vecs, meta)


def brute(docs: dict[str, Document], order: dict[str, int], req: SearchRequest, allow) -> list[tuple[str, float]]:
    out = []
    for did, d in docs.items():
        if not allow(d):
            continue
        s = np.float32(0)
        for c in req.clauses:
            v = d.vectors.get(c.field)
            if v is None:
                continue
            qmap = dict(zip(c.vector.ids.tolist(), (c.vector.weights * np.float32(c.weight)).astype(np.float32)))
            for t, w in zip(v.ids.tolist(), f16(v.weights)):
                if t in qmap:
                    s = np.float32(s + np.float32(qmap[t] * w))
        if s > 0:
            out.append((did, float(s)))
    out.sort(key=lambda x: (-x[1], order[x[0]]))
    return out


def assert_same_topk(got, want, k):
    want = want[:k]
    assert len(got.hits) == len(want)
    gs = np.array([h.score for h in got.hits])
    ws = np.array([s for _, s in want])
    np.testing.assert_allclose(gs, ws, rtol=2e-6)
    if len(want):
        kth = ws[-1]
        must = {i for i, s in want if s > kth * (1 + 2e-6)}
        assert must <= {h.id for h in got.hits}


def random_query(rng, with_caption: bool) -> SearchRequest:
    clauses = [SparseClause("image", SparseVector.from_arrays(*_qv(rng)), float(rng.choice([0.5, 1.0, 3.0])))]
    if with_caption:
        clauses.append(SparseClause("caption", SparseVector.from_arrays(*_qv(rng)), float(rng.choice([0.25, 1.0, 2.0]))))
    return SearchRequest(clauses, top_k=int(rng.choice([1, 3, 10, 50])))


def _qv(rng):
    n = int(rng.integers(1, 25))
    toks = rng.choice(USABLE[:200], size=n, replace=False)
    return toks, np.log1p(rng.lognormal(size=n)) + 0.01


FILTERS = [
    (None, lambda d: True),
    (Term("brand", "acme"), lambda d: d.metadata["brand"] == "acme"),
    (Range("price", gte=20, lt=70) & ~Term("brand", "globex"),
     lambda d: 20 <= d.metadata["price"] < 70 and d.metadata["brand"] != "globex"),
    (Term("tags", "x") | Term("brand", "initech"), lambda d: "x" in d.metadata.get("tags", ()) or d.metadata["brand"] == "initech"),
]


STRATEGIES = ("auto", "blockmax", "taat", "numpy")


def search_all_strategies(ix, req):
    """Search once per strategy; every strategy must return the same hits with bit-identical scores
    (numpy, used for small work, included), and the same total where a strategy counts it exactly."""
    out = {}
    for strat in STRATEGIES:
        ix.strategy = strat
        out[strat] = ix.search(req)
    ix.strategy = "auto"
    ref = [(h.id, h.score) for h in out["taat"].hits]
    for strat, res in out.items():
        assert [(h.id, h.score) for h in res.hits] == ref, f"{strat} differs from taat"
        if res.total is not None:
            assert res.total == out["numpy"].total, f"{strat} counts differently from numpy"
    return out


@pytest.mark.parametrize("seed,zipf,bshift,strategy", [(1, False, 7, "auto"), (2, True, 7, "blockmax"), (3, True, 2, "taat"),
                                                        (4, False, 3, "blockmax"), (5, True, 8, "taat"), (6, True, 4, "numpy"),
                                                        (7, False, 8, "auto-numba")])
def test_exact_against_brute_force(tmp_path, seed, zipf, bshift, strategy):
    rng = np.random.default_rng(seed)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={"brand": "keyword", "price": "number", "tags": "keyword"}), bshift=bshift)
    ix.max_segments = 4  # force automatic merges
    ix.head_blocks = 2  # most blocks go through the sequential sweep
    if strategy == "auto-numba":  # auto's choice between the numba kernels, as on segments too large for numpy
        strategy = "auto"
        ix.numpy_max_postings = 0
    ix.strategy = strategy
    docs: dict[str, Document] = {}
    order: dict[str, int] = {}
    seq = 0
    for batch in range(8):
        new = [random_doc(rng, int(i), zipf) for i in rng.integers(0, 700, size=int(rng.integers(30, 120)))]
        ix.add(new)
        for d in new:
            docs[d.id] = d
            order[d.id] = seq  # a re-added id counts as newly inserted
            seq += 1
        if batch % 3 == 2:
            gone = [i for i in docs if rng.random() < 0.1]
            ix.delete(gone)
            for i in gone:
                del docs[i]
    assert ix.stats()["docs"] == len(docs)
    tok = int(USABLE[3])
    extra = [(HasTokens([VOCAB.token(tok)]), lambda d: tok in d.vectors.get("image", SparseVector.empty()).ids),
             (~HasTokens([VOCAB.token(tok)]), lambda d: tok not in d.vectors.get("image", SparseVector.empty()).ids)]
    for qi in range(40):
        req = random_query(rng, with_caption=qi % 2 == 1)
        flt, allow = (FILTERS + extra)[qi % (len(FILTERS) + len(extra))]
        req.filter = flt
        got = ix.search(req)
        auto = {"blockmax", "taat"} if ix.numpy_max_postings == 0 else {"numpy"}  # these segments are small
        assert set(ix.last_search_strategies) <= (auto if strategy == "auto" else {strategy})
        if qi % 5 == 0:
            search_all_strategies(ix, req)
            ix.strategy = strategy
        want = brute(docs, order, req, allow)
        assert_same_topk(got, want, req.top_k)
        if got.total is not None:
            assert got.total == len(want)
        if got.hits:
            e = ix.explain(got.hits[0].id, req)
            assert e.score == got.hits[0].score
    before = [ix.search(random_query(np.random.default_rng(99 + i), True)) for i in range(5)]
    ix.optimize()
    assert ix.stats()["segments"] == 1 and ix.stats()["deleted"] == 0
    after = [ix.search(random_query(np.random.default_rng(99 + i), True)) for i in range(5)]
    for b, a in zip(before, after):
        assert [(h.id, h.score) for h in b.hits] == [(h.id, h.score) for h in a.hits]
    ix.close()


def test_many_small_batches_merge_automatically(tmp_path):
    rng = np.random.default_rng(7)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema())
    docs = {}
    for b in range(40):
        new = [random_doc(rng, b * 10 + i, True) for i in range(10)]
        ix.add(new)
        docs.update({d.id: d for d in new})
    assert ix.stats()["segments"] <= ix.max_segments
    order = {d: i for i, d in enumerate(docs)}
    req = random_query(rng, True)
    assert_same_topk(ix.search(req), brute(docs, order, req, lambda d: True), req.top_k)
    got = ix.get("d123")
    for f, v in docs["d123"].vectors.items():
        assert got.vectors[f].ids.tolist() == v.ids.tolist()
        np.testing.assert_array_equal(got.vectors[f].weights, f16(v.weights))
    ix.close()


def _dense_corpus(rng, n_docs, n_tok, per_doc):
    """Docs holding most of a few frequent tokens with weights independent of frequency: pruning
    cannot skip blocks, only postings inside them (the engine's worst case)."""
    p = 1.0 / np.arange(1, n_tok + 1)
    p /= p.sum()
    indptr = [0]
    ids, ws = [], []
    for _ in range(n_docs):
        toks = np.sort(rng.choice(USABLE[:n_tok], size=per_doc, replace=False, p=p))
        ids.append(toks)
        ws.append(np.log1p(rng.lognormal(size=per_doc)).astype(np.float32))
        indptr.append(indptr[-1] + per_doc)
    return np.array(indptr, np.int64), np.concatenate(ids).astype(np.int32), np.concatenate(ws)


def test_strategies_agree_where_pruning_fails(tmp_path):
    """Block-max's in-block pruning (term skipping and per-document lookups) against TAAT and a
    brute force, on data where both must work hard; counters prove each path ran."""
    rng = np.random.default_rng(11)
    n = 3000
    indptr, ids, ws = _dense_corpus(rng, n, 60, 25)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={}, sparse_fields=("image",)))
    ix.add_arrays([f"d{i}" for i in range(n)], {"image": (indptr, ids, ws)})
    ix.delete([f"d{i}" for i in range(0, n, 17)])
    dense = np.zeros((n, int(USABLE[:60].max()) + 1), np.float32)
    for d in range(n):
        dense[d, ids[indptr[d]:indptr[d + 1]]] = f16(ws[indptr[d]:indptr[d + 1]])
    streamed = looked_up = total = 0
    for qi in range(30):
        toks = np.sort(rng.choice(USABLE[:60], size=int(rng.integers(3, 20)), replace=False))
        qw = np.log1p(rng.lognormal(size=toks.size)).astype(np.float32)
        k = int(rng.choice([1, 10, 100, 5000]))
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=k)
        out = search_all_strategies(ix, req)
        if k <= 10:
            ix.strategy = "blockmax"
            ix.search(req)
            st = ix.last_search_stats
            streamed += int(st[5])
            looked_up += int(st[6])
            ix.strategy = "taat"
            ix.search(req)
            total += int(ix.last_search_stats[5])
        ix.strategy = "auto"
        ix.numpy_max_postings = 0
        ix.search(req)
        if k == 5000:
            assert ix.last_search_strategies == ["taat"]
        ix.numpy_max_postings = 10**9
        ix.search(req)
        assert ix.last_search_strategies == ["numpy"]
        scores = np.zeros(n, np.float32)
        for t, w in zip(toks, qw):  # query-term order, float32, like the engine
            scores = (scores + np.float32(w) * dense[:, t]).astype(np.float32)
        scores[::17] = 0
        order = np.lexsort((np.arange(n), -scores))
        want = [(f"d{i}", float(scores[i])) for i in order[:k] if scores[i] > 0]
        got = out["taat"]
        assert [(h.id, h.score) for h in got.hits] == want
        assert got.total == int((scores > 0).sum())
        e = ix.explain(got.hits[0].id, req)
        assert e.score == got.hits[0].score
    assert streamed < total * 0.9  # block-max skipped postings inside the blocks it scored
    assert looked_up > 0  # and looked some documents up instead of streaming a run
    ix.close()


def test_search_batch_matches_search(tmp_path):
    rng = np.random.default_rng(5)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={"brand": "keyword", "price": "number", "tags": "keyword"}))
    for _ in range(3):  # several segments
        ix.add([random_doc(rng, int(i), True) for i in rng.integers(0, 400, size=150)])
    reqs = []
    for qi in range(12):
        r = random_query(rng, with_caption=qi % 2 == 1)
        r.filter = FILTERS[qi % len(FILTERS)][0]
        reqs.append(r)
    one = [ix.search(r) for r in reqs]
    for threads in (1, 2, None):
        got = ix.search_batch(reqs, threads=threads)
        assert [[(h.id, h.score) for h in g.hits] for g in got] == [[(h.id, h.score) for h in o.hits] for o in one]
        assert [g.total for g in got] == [o.total for o in one]
    assert ix.search_batch([]) == []
    ix.close()


def test_numpy_twins_of_lookup_and_frequency_kernels_agree(tmp_path):
    """Id hashing, token filters and document frequencies give the same answers in numpy
    (small work, cold processes) as in the numba kernels."""
    from stair_es.engine import kernels as NK
    from stair_es.engine import npkernels as NP
    from stair_es.engine.segment import encode_ids

    ids = ["", "a", "d1", "ünïcødé-id", "x" * 300, "d1 "]
    blob, offs = encode_ids(ids)
    assert NP.fnv1a64(blob, offs).tolist() == NK.fnv1a64(blob, offs).tolist()
    rng = np.random.default_rng(3)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={"brand": "keyword", "price": "number", "tags": "keyword"}), bshift=3)
    ix.add([random_doc(rng, i, True) for i in range(300)])
    ix.delete([f"d{i}" for i in range(0, 300, 7)])
    seg = ix._segs[0].seg
    live = (~ix._segs[0].deleted).view(np.uint8)
    for lv in (np.zeros(0, np.uint8), live):
        a, b = np.zeros(30522, np.int64), np.zeros(30522, np.int64)
        args = (seg.keys, seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.bshift, lv, 0, 30522)
        NP.term_freqs(*args, a)
        NK.term_freqs(*args, b)
        assert a.tolist() == b.tolist()
    for j in range(0, seg.keys.size, 5):
        mask = np.zeros(seg.n_docs, np.uint8)
        NK.term_docs(j, seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.bshift, mask)
        got = NP.term_docs(j, seg.post_ptr, seg.pair_ptr, seg.pair_block, seg.pair_cnt, seg.post_off, seg.bshift)
        assert got.tolist() == np.flatnonzero(mask).tolist()
    assert ix.contains(["d1", "d7", "nope", "d299"]) == {"d1", "d299"}
    ix.close()
