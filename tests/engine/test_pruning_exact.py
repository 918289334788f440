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
    from stair_es.engine import index as index_mod
    from stair_es.errors import InvalidInputError

    monkeypatch.setattr(index_mod, "SPLIT_MIN_DOCS", 0)  # these segments are small: split them anyway
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
    from stair_es.engine import index as index_mod

    monkeypatch.setattr(index_mod, "SPLIT_MIN_DOCS", 0)  # a small segment: split it anyway
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
