"""``auto`` between the numba strategies: block-max first, then the cost model fed with what
block-max did on the segment (TAAT where block-max cannot prune), block-max again after
``AUTO_RETRY`` TAAT queries; every choice returns the same hits with bit-identical scores."""

from __future__ import annotations

import numpy as np

from stair_es.engine import EngineIndex
from stair_es.engine.searcher import AUTO_RETRY
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
TOKENS = np.flatnonzero(~VOCAB.special_mask)[2000:2040]  # few tokens, each in a third of the docs


def _dense_index(tmp_path, n_docs: int = 20000) -> EngineIndex:
    """Weights independent of frequency and every query token in most blocks: block-max's bounds
    cannot prune, so it streams nearly every posting."""
    rng = np.random.default_rng(7)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(sparse_fields=("image",)))
    rows = [np.sort(rng.choice(TOKENS.size, size=12, replace=False)) for _ in range(n_docs)]
    indptr = np.zeros(n_docs + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r in rows])
    ids = TOKENS[np.concatenate(rows)].astype(np.int32)
    w = rng.uniform(0.5, 1.5, ids.size).astype(np.float32)
    ix.add_arrays([f"d{i}" for i in range(n_docs)], {"image": (indptr, ids, w)})
    ix.numpy_max_postings = 0  # the numba kernels, as on segments too large for numpy
    return ix


def test_auto_learns_that_block_max_cannot_prune_here_and_takes_taat(tmp_path):
    ix = _dense_index(tmp_path)
    # few query terms and a small k: with no record yet, the rescoring rule keeps block-max
    req = SearchRequest([SparseClause("image", SparseVector.from_arrays(TOKENS[:5], np.linspace(1.0, 2.0, 5)))],
                        top_k=3)
    ix.strategy = "taat"
    want = [(h.id, h.score) for h in ix.search(req).hits]
    ix.strategy = "auto"
    seen = []
    for _ in range(AUTO_RETRY + 3):
        got = [(h.id, h.score) for h in ix.search(req).hits]
        assert got == want  # same ids, bit-identical scores, whatever auto chose
        seen += ix.last_search_strategies
    # no record yet: block-max; its record (it scored nearly every block) then sends the query to
    # TAAT, whose cost the model predicts lower ...
    assert seen[0] == "blockmax" and seen[1] == "taat", seen
    rec = next(iter(ix.auto_record().values()))
    assert rec["scored_share"] > 0.5, rec
    # ... and after AUTO_RETRY TAAT queries in a row block-max runs once more to renew the record
    assert seen[1:AUTO_RETRY + 1] == ["taat"] * AUTO_RETRY, seen
    assert seen[AUTO_RETRY + 1] == "blockmax" and seen[AUTO_RETRY + 2] == "taat", seen


def test_forced_strategies_leave_no_record(tmp_path):
    ix = _dense_index(tmp_path, 3000)
    req = SearchRequest([SparseClause("image", SparseVector.from_arrays(TOKENS[:10], np.ones(10)))], top_k=5)
    for strategy in ("blockmax", "taat"):
        ix.strategy = strategy
        ix.search(req)
        assert ix.last_search_strategies == [strategy]
    assert ix.auto_record() == {}


def test_cost_model_keeps_block_max_where_its_record_says_it_prunes_despite_many_pairs():
    """The 10M idf case (ten 1M-document segments): 30 query terms in every block (117k (term,
    block) pairs, 3M postings) but block-max's record on the segment says it scores a third of
    the blocks and streams 1.3 % of the postings. Block-max took ~0.4 ms there against TAAT's
    ~2 ms; the constants before the refit (25 ns a pair) sent such queries to TAAT."""
    from stair_es.engine import kernels as K
    from stair_es.engine.layout import PLAN, STRATEGY_BLOCKMAX, STRATEGY_TAAT, SegmentArrays, TopK

    n_docs, nq, n_blocks, per_term = 1_000_000, 30, 3907, 100_000
    post_ptr = np.arange(nq + 1, dtype=np.int64) * per_term
    pair_ptr = np.arange(nq + 1, dtype=np.int64) * n_blocks
    u8, u16 = np.zeros(1, np.uint8), np.zeros(1, np.uint16)
    seg = tuple(SegmentArrays(n_docs, 8, post_ptr, pair_ptr, u16, u8, u16, u8, u8, u16, np.zeros(1, np.uint64),
                              np.zeros(65536, np.float32)))
    top = TopK.empty(10)
    q_j = np.arange(nq, dtype=np.int64)
    pruning = (0, 64, 0, -1, 0.013, 0.35)  # auto, with block-max's record: streamed share, scored share
    assert K.choose_strategy(q_j, seg, tuple(top), pruning) == STRATEGY_BLOCKMAX
    assert top.state[PLAN + 4] > 2 * top.state[PLAN + 5]  # TAAT's estimate well above block-max's
    no_pruning = (0, 64, 0, -1, 0.6, 1.0)  # block-max opens every block and streams most postings: TAAT
    assert K.choose_strategy(q_j, seg, tuple(top), no_pruning) == STRATEGY_TAAT
