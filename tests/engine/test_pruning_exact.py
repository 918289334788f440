"""Dynamic pruning is exact: block-max (and every other strategy) returns the brute-force top k,
same ids and bit-identical scores, on random queries over several segments with deletes and
filters -- 100 queries per weight shape in the default run, 1,000 in the slow one (issue 15)."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.errors import EmptyQueryError
from stair_es.query import HasTokens, Range, SearchRequest, SparseClause, Term
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
TOKENS = np.flatnonzero(~VOCAB.special_mask)[2000:2400]  # 400 usable tokens, ranked Zipf-like below
BRANDS = ("acme", "globex", "initech", "umbrella")


def f16(w):
    return np.asarray(w, np.float32).astype(np.float16).astype(np.float32)


def corpus(rng, n: int, shape: str):
    """CSR rows of 15-60 Zipf-drawn tokens; ``idf``: frequent tokens weigh less (as trained encoders
    make them), ``iid``: weights independent of frequency (the worst case for pruning)."""
    p = 1.0 / np.arange(1, TOKENS.size + 1)
    p /= p.sum()
    scale = np.minimum(1.0, np.sqrt(np.arange(1, TOKENS.size + 1) / 40.0)) if shape == "idf" else np.ones(TOKENS.size)
    indptr, ids, ws = [0], [], []
    for _ in range(n):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(15, 61)), replace=False, p=p))
        ids.append(TOKENS[ranks])
        ws.append((np.log1p(rng.lognormal(size=ranks.size)) * scale[ranks]).astype(np.float32))
        indptr.append(indptr[-1] + ranks.size)
    return np.array(indptr, np.int64), np.concatenate(ids).astype(np.int32), np.concatenate(ws), scale


@pytest.fixture(scope="module", params=["idf", "iid"])
def world(request, tmp_path_factory):
    """An index of 4 segments (12,000 documents, deletes in three of them) and its dense copy."""
    shape = request.param
    rng = np.random.default_rng(15 if shape == "idf" else 16)
    path = tmp_path_factory.mktemp(f"prune-{shape}") / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={"brand": "keyword", "price": "number"}, sparse_fields=("image",)))
    n_seg, per = 4, 3000
    dense = np.zeros((n_seg * per, TOKENS.max() + 1), np.float32)
    meta = []
    for s in range(n_seg):
        indptr, ids, ws, scale = corpus(rng, per, shape)
        md = [{"brand": BRANDS[int(x)], "price": float(y)} for x, y in zip(rng.integers(0, 4, per), rng.integers(0, 100, per))]
        ix.add_arrays([f"d{s * per + i}" for i in range(per)], {"image": (indptr, ids, ws)}, md)
        for i in range(per):
            dense[s * per + i, ids[indptr[i]:indptr[i + 1]]] = f16(ws[indptr[i]:indptr[i + 1]])
        meta += md
    gone = [int(i) for i in rng.choice(n_seg * per, 900, replace=False) if i < (n_seg - 1) * per]
    ix.delete([f"d{i}" for i in gone])
    live = np.ones(n_seg * per, bool)
    live[gone] = False
    assert ix.stats()["segments"] == n_seg
    yield ix, dense, live, meta, scale, rng
    ix.close()


def filters(meta, dense):
    brand = np.array([m["brand"] for m in meta])
    price = np.array([m["price"] for m in meta])
    tok = int(TOKENS[5])
    return [
        (None, np.ones(len(meta), bool)),
        (Term("brand", "acme"), brand == "acme"),  # 25 %
        (Range("price", gte=10, lt=15) & ~Term("brand", "globex"), (price >= 10) & (price < 15) & (brand != "globex")),  # ~4 %
        (Term("price", 42.0), price == 42.0),  # 1 %
        (HasTokens([VOCAB.token(tok)]), dense[:, tok] > 0),
    ]


def brute(dense, live, allow, toks, qw, k):
    """Scores summed in query-term order in float32 (as the engine and explain sum them); ties:
    older (lower) document first."""
    scores = np.zeros(dense.shape[0], np.float32)
    for t, w in zip(toks, qw):
        scores = (scores + np.float32(w) * dense[:, t]).astype(np.float32)
    scores[~(live & allow)] = 0
    order = np.lexsort((np.arange(scores.size), -scores))
    return [(f"d{i}", float(scores[i])) for i in order[:k] if scores[i] > 0]


def run_queries(world, n_queries: int, seed: int):
    ix, dense, live, meta, scale, _ = world
    rng = np.random.default_rng(seed)
    flts = filters(meta, dense)
    p = 1.0 / np.arange(1, TOKENS.size + 1) ** 0.7
    p /= p.sum()
    pruned = 0
    for qi in range(n_queries):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(1, 41)), replace=False, p=p))
        toks = TOKENS[ranks]
        qw = (np.log1p(rng.lognormal(size=ranks.size)) * scale[ranks] + 0.01).astype(np.float32)
        k = int(rng.choice([1, 10, 10, 10, 100]))
        flt, allow = flts[qi % len(flts)]
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=k, filter=flt)
        want = brute(dense, live, allow, toks, qw, k)
        # the numba kernels (these segments are small enough for numpy otherwise) and numpy itself;
        # block-max twice: with the default head (these 12-block segments are then visited best bound
        # first), and with a head of one block, so the sequential sweep's per-term cursors do the rest
        for strategy, numpy_max, head in (("blockmax", 0, 64), ("blockmax", 0, 1), ("auto", 0, 64), ("taat", 0, 64),
                                          ("numpy", 0, 64)):
            ix.strategy, ix.numpy_max_postings, ix.head_blocks = strategy, numpy_max, head
            got = ix.search(req)
            assert [(h.id, h.score) for h in got.hits] == want, f"query {qi} ({strategy}, head {head}) differs from brute force"
            if strategy == "blockmax" and head == 64:
                st = ix.last_search_stats
                pruned += int(st[3] < st[4])  # some block was skipped
    ix.strategy, ix.numpy_max_postings, ix.head_blocks = "auto", 16384, 64
    return pruned


def test_pruned_search_equals_brute_force(world):
    pruned = run_queries(world, 100, seed=1)
    assert pruned > 0  # the pruning paths ran (otherwise this test proves nothing)


@pytest.mark.slow
def test_pruned_search_equals_brute_force_on_1000_queries(world):
    run_queries(world, 1000, seed=2)


def test_a_query_of_thousands_of_tokens_is_exact(world):
    ix, dense, live, meta, scale, _ = world
    rng = np.random.default_rng(7)
    toks = np.flatnonzero(~VOCAB.special_mask)[1000:6000]  # 5,000 tokens, 400 of them in the corpus
    qw = rng.uniform(0.01, 1.0, toks.size).astype(np.float32)
    req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=10)
    want = brute(dense, live, np.ones(len(meta), bool), toks[np.isin(toks, TOKENS)], qw[np.isin(toks, TOKENS)], 10)
    for strategy in ("auto", "blockmax", "taat", "numpy"):
        ix.strategy = strategy
        assert [(h.id, h.score) for h in ix.search(req).hits] == want
    ix.strategy = "auto"


def test_zero_weights_are_dropped_and_an_all_zero_query_is_a_clear_error(world):
    ix = world[0]
    toks = TOKENS[:300]
    with pytest.raises(EmptyQueryError, match="no tokens left"):
        ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, np.zeros(toks.size)))], top_k=10))
    w = np.zeros(toks.size)
    w[[3, 70, 250]] = [0.5, 1.0, 2.0]
    mostly_zero = ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, w))], top_k=10))
    only = ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays(toks[[3, 70, 250]], w[[3, 70, 250]]))], top_k=10))
    assert [(h.id, h.score) for h in mostly_zero.hits] == [(h.id, h.score) for h in only.hits] != []


def test_one_query_on_several_threads_gives_the_same_hits(world, monkeypatch):
    """Intra-query threads over several segments: the segments are shared out among the
    threads, each searching its own into its own heap; the merged top k is exact."""
    from stair_es.engine import searcher as searcher_mod
    from stair_es.errors import InvalidInputError

    monkeypatch.setattr(searcher_mod, "SPLIT_MIN_DOCS", 0)  # these segments are small: split them anyway
    ix, dense, live, meta, scale, _ = world
    rng = np.random.default_rng(21)
    flts = filters(meta, dense)
    ix.numpy_max_postings = 0
    for qi in range(40):
        toks = np.sort(rng.choice(TOKENS[:200], size=int(rng.integers(1, 30)), replace=False))
        qw = rng.uniform(0.05, 2.0, toks.size).astype(np.float32)
        flt, allow = flts[qi % len(flts)]
        k = int(rng.choice([1, 10, 100]))
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=k, filter=flt)
        want = brute(dense, live, allow, toks, qw, k)
        for threads in (1, 2, 3):
            ix.strategy = "blockmax" if qi % 2 else "auto"
            got = ix.search(req, threads=threads)
            assert [(h.id, h.score) for h in got.hits] == want, f"query {qi}, {threads} threads"
    ix.strategy, ix.numpy_max_postings = "auto", 16384
    with pytest.raises(InvalidInputError, match="threads must be an integer from 1 to 64"):
        ix.search(req, threads=0)


def test_one_query_on_several_threads_over_one_segment_gives_the_same_hits(tmp_path, monkeypatch):
    """A single segment is split by block ranges, each part into its own heap; exact too."""
    from stair_es.engine import searcher as searcher_mod

    monkeypatch.setattr(searcher_mod, "SPLIT_MIN_DOCS", 0)  # a small segment: split it anyway
    rng = np.random.default_rng(23)
    indptr, ids, ws, _ = corpus(rng, 4000, "idf")
    ix = EngineIndex.create(tmp_path / "one", IndexSchema(fields={}, sparse_fields=("image",)))
    ix.add_arrays([f"d{i}" for i in range(4000)], {"image": (indptr, ids, ws)})
    assert ix.stats()["segments"] == 1
    dense = np.zeros((4000, TOKENS.max() + 1), np.float32)
    for i in range(4000):
        dense[i, ids[indptr[i]:indptr[i + 1]]] = f16(ws[indptr[i]:indptr[i + 1]])
    everyone = np.ones(4000, bool)
    ix.numpy_max_postings = 0
    ix.strategy = "blockmax"
    for qi in range(30):
        toks = np.sort(rng.choice(TOKENS[:200], size=int(rng.integers(1, 30)), replace=False))
        qw = rng.uniform(0.05, 2.0, toks.size).astype(np.float32)
        k = int(rng.choice([1, 10, 100]))
        want = brute(dense, everyone, everyone, toks, qw, k)
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=k)
        for threads in (2, 3):
            got = ix.search(req, threads=threads)
            assert [(h.id, h.score) for h in got.hits] == want, f"query {qi}, {threads} threads"
    ix.close()


def _as_format_1(seg_file) -> None:
    """Rewrite a segment file as segment format 1 wrote it: the same arrays without the sub-block
    codes (``pair_sub``)."""
    from stair_es.engine.storage import read_container, write_arrays

    c = read_container(seg_file)
    arrays = {n: np.array(a) for n, a in c.arrays.items() if n != "pair_sub"}  # copies: the file is replaced
    write_arrays(seg_file, arrays, {**c.meta, "format": 1})


def test_format_1_segments_are_searched_exactly_and_optimize_upgrades_them(tmp_path, monkeypatch):
    """Segments written before sub-block bounds (format 1) are still searched exactly, with block
    bounds only, alone or next to format 2 ones, on one thread or several; the sub-block bounds
    open fewer blocks for the same hits; `optimize` rewrites format 1 segments with them."""
    from stair_es.engine import searcher as searcher_mod
    from stair_es.engine.segment import SEGMENT_FORMAT

    monkeypatch.setattr(searcher_mod, "SPLIT_MIN_DOCS", 0)  # small segments: share them out among threads anyway
    rng = np.random.default_rng(31)
    path = tmp_path / "ix"
    ix = EngineIndex.create(path, IndexSchema(fields={"price": "number"}, sparse_fields=("image",)))
    n_seg, per = 3, 3000
    dense = np.zeros((n_seg * per, TOKENS.max() + 1), np.float32)
    price = rng.integers(0, 100, n_seg * per)
    for s in range(n_seg):
        indptr, ids, ws, scale = corpus(rng, per, "idf")
        ix.add_arrays([f"d{s * per + i}" for i in range(per)], {"image": (indptr, ids, ws)},
                      [{"price": float(x)} for x in price[s * per:(s + 1) * per]])
        for i in range(per):
            dense[s * per + i, ids[indptr[i]:indptr[i + 1]]] = f16(ws[indptr[i]:indptr[i + 1]])
    gone = [int(i) for i in rng.choice(n_seg * per, 300, replace=False)]
    ix.delete([f"d{i}" for i in gone])
    live = np.ones(n_seg * per, bool)
    live[gone] = False
    p = 1.0 / np.arange(1, TOKENS.size + 1) ** 0.7
    p /= p.sum()
    queries = []
    for qi in range(40):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(1, 41)), replace=False, p=p))
        qw = (np.log1p(rng.lognormal(size=ranks.size)) * scale[ranks] + 0.01).astype(np.float32)
        flt, allow = ((None, np.ones(live.size, bool)) if qi % 2 else (Range("price", gte=20, lt=60), (price >= 20) & (price < 60)))
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(TOKENS[ranks], qw))], top_k=10, filter=flt)
        queries.append((req, brute(dense, live, allow, TOKENS[ranks], qw, 10)))
    toks = np.flatnonzero(~VOCAB.special_mask)[1000:6000]  # 5,000 tokens, 400 of them in the corpus
    qw = rng.uniform(0.01, 1.0, toks.size).astype(np.float32)
    queries.append((SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=10),
                    brute(dense, live, np.ones(live.size, bool), toks[np.isin(toks, TOKENS)], qw[np.isin(toks, TOKENS)], 10)))
    ix.close()

    def check(ix):
        """Every query as brute force, with block-max on 1 and 2 threads; blocks scored on 1 thread."""
        ix.strategy, ix.numpy_max_postings = "blockmax", 0
        scored = 0
        for qi, (req, want) in enumerate(queries):
            for threads in (1, 2):
                got = ix.search(req, threads=threads)
                assert [(h.id, h.score) for h in got.hits] == want, f"query {qi}, {threads} threads"
                if threads == 1:
                    scored += int(ix.last_search_stats[3])
        return scored

    with EngineIndex.open(path) as ix:
        assert [s.seg.outdated for s in ix._segs] == [False] * n_seg
        scored_new = check(ix)
    files = sorted(path.glob("seg-*.seg"))
    for f in files[:2]:
        _as_format_1(f)
    with EngineIndex.open(path) as ix:  # two format 1 segments beside a format 2 one
        assert [s.seg.outdated for s in ix._segs] == [True, True, False]
        assert [s.seg.pair_sub.size > 0 for s in ix._segs] == [False, False, True]
        check(ix)
    for f in files[2:]:
        _as_format_1(f)
    with EngineIndex.open(path) as ix:
        assert check(ix) > scored_new  # the same hits, more blocks opened without sub-block bounds
    with EngineIndex.open(path, writable=True) as ix:
        ix.optimize()
        (s,) = ix._segs
        assert not s.seg.outdated and s.seg.meta["format"] == SEGMENT_FORMAT
        assert s.seg.pair_sub.size == s.seg.pair_cnt.size > 0
        check(ix)


@pytest.mark.parametrize("bshift,n_docs", [(8, 257), (8, 1), (2, 9), (1, 5)])
def test_sub_block_bounds_at_the_edges(tmp_path, bshift, n_docs):
    """A last block of one document, a one-document segment, and blocks of 4 or 2 documents
    (a sub-block of one document, or none): block-max with sub-block bounds is exact."""
    rng = np.random.default_rng(bshift * 1000 + n_docs)
    indptr, ids, ws, _ = corpus(rng, n_docs, "idf")
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={}, sparse_fields=("image",)), bshift=bshift)
    ix.add_arrays([f"d{i}" for i in range(n_docs)], {"image": (indptr, ids, ws)})
    assert ix._segs[0].seg.pair_sub.size == ix._segs[0].seg.pair_cnt.size
    dense = np.zeros((n_docs, TOKENS.max() + 1), np.float32)
    for i in range(n_docs):
        dense[i, ids[indptr[i]:indptr[i + 1]]] = f16(ws[indptr[i]:indptr[i + 1]])
    everyone = np.ones(n_docs, bool)
    ix.strategy, ix.numpy_max_postings = "blockmax", 0
    for qi in range(30):
        toks = np.sort(rng.choice(TOKENS[:120], size=int(rng.integers(1, 30)), replace=False))
        qw = rng.uniform(0.05, 2.0, toks.size).astype(np.float32)
        k = int(rng.choice([1, 3, 10]))
        req = SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, qw))], top_k=k)
        for head in (64, 1):
            ix.head_blocks = head
            assert [(h.id, h.score) for h in ix.search(req).hits] == brute(dense, everyone, everyone, toks, qw, k)
    ix.close()
