"""Block-max's sweep over a range of blocks is exact whichever way it is planned: with a head of
best-bound blocks (an empty heap), or, once the heap is full and no filter applies, walking the
block range itself (no list of candidate blocks); the hits are the brute-force top k of the
documents in that range, same ids, bit-identical scores. The terms' order inside a block (bound
per unit of work, then for the survivors bound per visit) changes what is read, never the hits."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine import kernels as K
from stair_es.engine.kernels import blockmax
from stair_es.engine.kernels.seed import PLACEHOLDER_SEQ
from stair_es.engine.layout import STRATEGY_BLOCKMAX, TopK
from stair_es.schema import IndexSchema
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
TOKENS = np.flatnonzero(~VOCAB.special_mask)[3000:3300]
N_DOCS = 6000  # 24 blocks of 256


def _f16(w):
    return np.asarray(w, np.float32).astype(np.float16).astype(np.float32)


@pytest.fixture(scope="module")
def segment(tmp_path_factory):
    """One segment of idf-like documents (frequent tokens light, rare ones heavy) and its dense copy."""
    rng = np.random.default_rng(27)
    p = 1.0 / np.arange(1, TOKENS.size + 1)
    p /= p.sum()
    scale = np.minimum(1.0, np.sqrt(np.arange(1, TOKENS.size + 1) / 30.0))
    indptr, ids, ws = [0], [], []
    for _ in range(N_DOCS):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(10, 50)), replace=False, p=p))
        ids.append(TOKENS[ranks])
        ws.append((np.log1p(rng.lognormal(size=ranks.size)) * scale[ranks]).astype(np.float32))
        indptr.append(indptr[-1] + ranks.size)
    indptr, ids, ws = np.array(indptr, np.int64), np.concatenate(ids).astype(np.int32), np.concatenate(ws)
    ix = EngineIndex.create(tmp_path_factory.mktemp("sweep") / "ix", IndexSchema(fields={}, sparse_fields=("image",)))
    ix.add_arrays([f"d{i}" for i in range(N_DOCS)], {"image": (indptr, ids, ws)})
    dense = np.zeros((N_DOCS, TOKENS.max() + 1), np.float32)
    for i in range(N_DOCS):
        dense[i, ids[indptr[i]:indptr[i + 1]]] = _f16(ws[indptr[i]:indptr[i + 1]])
    seg = ix._segs[0].seg
    assert seg.n_docs == N_DOCS and seg.bshift == 8
    yield seg, dense, p, rng
    ix.close()


def _brute(dense, toks, qw, lo_doc, hi_doc, k, floor):
    """The top k of docs [lo_doc, hi_doc) scoring above ``floor``, summed in query order in float32."""
    s = np.zeros(dense.shape[0], np.float32)
    for t, w in zip(toks, qw):
        s = (s + np.float32(w) * dense[:, t]).astype(np.float32)
    docs = np.arange(lo_doc, min(hi_doc, dense.shape[0]))
    docs = docs[s[docs] > floor]
    order = docs[np.lexsort((docs, -s[docs]))][:k]
    return [(int(d), float(s[d])) for d in order]


def _run(seg, toks, qw, k, head, lo, hi, floor):
    q_j = seg.term_index(0, toks)
    keep = q_j >= 0
    q_j, q_w = np.ascontiguousarray(q_j[keep]), np.ascontiguousarray(qw[keep], np.float32)
    top = TopK.empty(k)
    if floor > 0:  # a full heap of placeholders (as the seed leaves it): the sweep has no head
        top.scores[:] = floor
        top.seqs[:] = PLACEHOLDER_SEQ
        top.refs[:] = -1
        top.state[0] = k
    ran = K.search_segment(q_j, q_w, tuple(seg.kernel_arrays()), np.zeros(0, np.uint8), np.int64(0), tuple(top),
                           (STRATEGY_BLOCKMAX, head, lo, hi, -1.0, -1.0), None, None)
    assert ran == STRATEGY_BLOCKMAX
    n = int(top.state[0])
    got = sorted(((float(top.scores[x]), int(top.refs[x])) for x in range(n) if top.refs[x] >= 0),
                 key=lambda h: (-h[0], h[1]))
    return [(r, s) for s, r in got], top.state


def test_block_ranges_with_and_without_a_head_equal_brute_force(segment):
    seg, dense, p, rng = segment
    n_blocks = (N_DOCS + 255) >> 8
    swept = 0
    for qi in range(60):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(2, 30)), replace=False, p=p))
        toks = TOKENS[ranks]
        qw = (np.log1p(rng.lognormal(size=toks.size)) + 0.05).astype(np.float32)
        k = int(rng.choice([1, 10, 50]))
        lo = int(rng.integers(0, n_blocks))
        hi = int(rng.choice([-1, int(rng.integers(lo, n_blocks + 1))]))
        hi_doc = N_DOCS if hi < 0 else hi << 8
        everything = _brute(dense, toks, qw, lo << 8, hi_doc, N_DOCS, 0.0)
        # a floor at about the k-th score of the range (the heap full from the start), or none
        floor = 0.0
        if qi % 2 and len(everything) > k:
            floor = float(np.float32(everything[k][1] * 0.98))
        want = _brute(dense, toks, qw, lo << 8, hi_doc, k, floor)
        for head in (64, 1, 0):
            got, state = _run(seg, toks, qw, k, head, lo, hi, floor)
            assert got == want, f"query {qi} (head {head}, blocks [{lo}, {hi}), floor {floor})"
            swept += int(state[3])
    assert swept > 0


def test_bound_pass_equals_pair_by_pair_float32_sums(segment):
    """The bound pass (8 pairs a call where the CPU converts float16, with its prefetches) leaves
    every block's and sub-block's bound bit for bit as adding each (term, block) pair's query weight
    x block maximum x sub-block level in float32, term by term in query order, does: the sweep's
    margins assume exactly those sums."""
    seg, _, p, rng = segment
    a = seg.kernel_arrays()
    assert a.pair_sub.size > 0
    n_blocks = (N_DOCS + 255) >> 8
    levels = K.SUB_FRACTIONS
    for qi in range(30):
        ranks = np.sort(rng.choice(TOKENS.size, size=int(rng.integers(1, 40)), replace=False, p=p))
        toks = TOKENS[ranks]
        qw = (np.log1p(rng.lognormal(size=toks.size)) + 0.05).astype(np.float32)
        q_j = seg.term_index(0, toks)
        keep = q_j >= 0
        q_j, q_w = np.ascontiguousarray(q_j[keep]), np.ascontiguousarray(qw[keep], np.float32)
        want = np.zeros((n_blocks, K.SUB_BLOCKS), np.float32)
        for j, w in zip(q_j, q_w):
            pr = slice(a.pair_ptr[j], a.pair_ptr[j + 1])
            m = (np.float32(w) * a.pair_max[pr].view(np.float16).astype(np.float32)).astype(np.float32)
            blocks = a.pair_block[pr].astype(np.int64)  # distinct within a term
            want[blocks] = (want[blocks] + (m[:, None] * levels[a.pair_sub[pr]]).astype(np.float32)).astype(np.float32)
        ub, ubs = blockmax._block_plan(q_j, q_w, a, np.zeros(0, np.uint8), 0, 0, -1)[:2]
        assert (ubs.view(np.uint32) == want.ravel().view(np.uint32)).all(), f"query {qi}"
        assert (ub.view(np.uint32) == want.max(axis=1).view(np.uint32)).all(), f"query {qi}"
