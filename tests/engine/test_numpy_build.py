"""The numpy twins of the segment-build kernels (used for small ingests, so a new process
never starts numba) produce exactly the numba kernels' arrays."""

import subprocess
import sys

import numpy as np
import pytest

from stair_es.engine import kernels as NB
from stair_es.engine import npkernels as NP


def _csr(rng, n_docs, vocab=3000, max_len=40):
    lens = rng.integers(0, max_len, n_docs)
    rows = [np.sort(rng.choice(vocab, size=int(k), replace=False)) for k in lens]
    indptr = np.zeros(n_docs + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    ids = np.concatenate(rows).astype(np.int32) if n_docs else np.zeros(0, np.int32)
    w = rng.uniform(0.01, 5.0, ids.size).astype(np.float16).view(np.uint16)
    return indptr, ids, w


@pytest.mark.parametrize("n_docs,bshift,key_base", [(0, 8, 0), (1, 8, 0), (300, 8, 0), (2000, 8, 30522), (700, 4, 0)])
def test_build_postings_twin_is_identical(n_docs, bshift, key_base):
    rng = np.random.default_rng(n_docs + bshift)
    indptr, ids, w = _csr(rng, n_docs)
    a = NP.build_postings(indptr, ids, w, n_docs, key_base, 30522, bshift)
    b = NB.build_postings(indptr, ids, w, n_docs, key_base, 30522, bshift)
    assert len(a) == len(b) == 8
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("n_docs,bshift", [(0, 8), (1, 8), (257, 8), (2000, 8), (700, 4), (300, 2), (50, 1)])
def test_block_subs_twin_is_identical_and_every_bound_is_safe(n_docs, bshift):
    """The sub-block codes (segment format 2) of the numpy and numba kernels are the same bytes,
    and each is an upper bound: code 0 exactly where a sub-block holds no posting of the term,
    else level x block max >= the term's maximum in the sub-block (blocks of 1 doc, blocks smaller
    than 4 sub-blocks and uneven last blocks included)."""
    rng = np.random.default_rng(n_docs * 10 + bshift)
    indptr, ids, w = _csr(rng, n_docs)
    _, _, _, pb, pc, pm, po, pw = NB.build_postings(indptr, ids, w, n_docs, 0, 30522, bshift)
    a = NP.block_subs(pc, pm, po, pw, bshift)
    b = NB.block_subs(pc, pm, po, pw, bshift)
    assert a.dtype == b.dtype == np.uint8 and a.size == pc.size
    np.testing.assert_array_equal(a, b)
    q = 0
    for p in range(pc.size):
        c = int(pc[p]) + 1
        sub = (po[q:q + c].astype(np.int64) * NP.SUB_BLOCKS) >> bshift
        wmax = NP.F16_TABLE[pw[q:q + c]]
        bmax = NP.F16_TABLE[pm[p]]
        for y in range(NP.SUB_BLOCKS):
            code = (int(a[p]) >> (2 * y)) & 3
            here = sub == y
            assert (code == 0) == (not here.any())
            if here.any():
                assert wmax[here].max() <= NP.SUB_LEVELS[code] * bmax
        q += c


def test_check_pack_csr_twin_reports_the_same_first_problem():
    rng = np.random.default_rng(7)
    special = np.zeros(30522, bool)
    special[[0, 100, 101, 102, 103]] = True
    for case in range(200):
        indptr, ids, w16 = _csr(rng, 30, vocab=200, max_len=6)
        ids = ids.astype(np.int64).copy()
        w = w16.view(np.float16).astype(np.float32)
        if ids.size:
            p = int(rng.integers(ids.size))
            kind = case % 7
            if kind == 1:
                ids[p] = 40000
            elif kind == 2:
                w[p] = np.nan if case % 2 else -1.0
            elif kind == 3:
                ids[p] = 101
            elif kind == 4 and p > 0:
                ids[p] = ids[p - 1]
            elif kind == 5:
                w[p] = np.inf
            elif kind == 6:
                w[p] = 70000.0  # finite, but above fp16's largest value
        ids32 = ids.astype(np.int32)
        out_np, out_nb = np.zeros(ids.size, np.uint16), np.zeros(ids.size, np.uint16)
        lo = int(case % 3)  # the twins also agree on a document range not starting at 0
        got = NP.check_pack_csr(indptr, ids32, w, 30522, special, 65504.0, out_np, lo, 30)
        assert got == tuple(NB.check_pack_csr(indptr, ids32, w, 30522, special, 65504.0, out_nb, lo, 30))
        if got[0] == 0:  # a clean batch is packed whole, identically
            np.testing.assert_array_equal(out_np, out_nb)


def test_the_compiled_fp16_cast_is_numpys_bit_for_bit():
    """Weights are stored as fp16: the compiled cast must round exactly as numpy does, across
    normal numbers, fp16 subnormals, values too small for fp16 and ties."""
    rng = np.random.default_rng(11)
    bits = np.concatenate([
        rng.integers(0, 0x477FE000, 400_000, dtype=np.uint32),  # every float32 in [0, 65504]
        np.arange(0x32000000, 0x39000000, 4099, dtype=np.uint32),  # around fp16's subnormal range
        (np.arange(0, 0x477FE000, 0x1000, dtype=np.uint32) | 0x1000),  # exact ties between fp16 values
        np.array([0, 1, 0x33000000, 0x33000001, 0x337FFFFF, 0x387FC000, 0x38800000, 0x477FE000], np.uint32),
    ])
    w = bits.view(np.float32)
    w = w[w <= 65504.0]
    out = np.zeros(w.size, np.uint16)
    ids = np.full(w.size, 2000, np.int32)  # one posting per document, all of token 2000
    one_per_doc = np.arange(w.size + 1, dtype=np.int64)
    status, _, zeros = NB.check_pack_csr(one_per_doc, ids, w, 30522, np.zeros(30522, bool), 65504.0, out, 0, w.size)
    assert status == 0
    expect = w.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(out, expect)
    assert zeros == int(np.count_nonzero(expect == 0))


def test_gather_and_hash_twins_are_identical():
    rng = np.random.default_rng(3)
    strings = [bytes(rng.integers(32, 127, int(rng.integers(0, 40))).astype(np.uint8)) for _ in range(500)]
    offs = np.zeros(len(strings) + 1, np.int64)
    np.cumsum([len(s) for s in strings], out=offs[1:])
    blob = np.frombuffer(b"".join(strings), np.uint8)
    rows = rng.permutation(len(strings))[:300]
    for x, y in zip(NP.gather_strings(blob, offs, rows), NB.gather_strings(blob, offs, rows)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(NP.fnv1a64(blob, offs), NB.fnv1a64(blob, offs))


@pytest.mark.process
@pytest.mark.parametrize("n_docs,bshift", [(1, 8), (300, 8), (2000, 8), (700, 4), (50, 1)])
def test_doc_rows_twin_is_identical_and_gives_each_documents_own_tokens(n_docs, bshift):
    rng = np.random.default_rng(7 * n_docs + bshift)
    indptr, ids, w = _csr(rng, n_docs)
    built = NB.build_postings(indptr, ids, w, n_docs, 0, 30522, bshift)
    keys, post_ptr, pair_ptr, pair_block, pair_cnt, _, post_off, post_w = built
    for docs in (np.arange(n_docs), np.unique(rng.integers(0, n_docs, 7)), np.array([n_docs - 1]), np.zeros(0, np.int64)):
        a = NP.doc_rows(docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, bshift)
        b = NB.doc_rows(docs, keys, post_ptr, pair_ptr, pair_block, pair_cnt, post_off, post_w, bshift)
        order_a, order_b = np.argsort(a[0], kind="stable"), np.argsort(b[0], kind="stable")
        for x, y in zip(a, b):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x[order_a], y[order_b])
        pos, k = a[0][order_a], a[1][order_a]
        for i, d in enumerate(docs.tolist()):  # the document's own tokens, ascending
            np.testing.assert_array_equal(k[pos == i], ids[indptr[d]:indptr[d + 1]])


def test_a_small_ingest_and_search_never_start_numba(tmp_path):
    code = (
        "import sys\n"
        "from stair_es import Document, SparseVector\n"
        "from stair_es.engine import EngineIndex\n"
        "from stair_es.query import SearchRequest, SparseClause\n"
        "from stair_es.schema import IndexSchema\n"
        f"ix = EngineIndex.create({str(tmp_path / 'ix')!r}, IndexSchema())\n"
        "ix.add([Document(f'd{i}', {'image': SparseVector.from_token_map({'red': 1.0 + i, 'car': 2.0})}) for i in range(50)])\n"
        "ix.add([Document('d3', {'image': SparseVector.from_token_map({'boat': 1.0})})])\n"
        "res = ix.search(SearchRequest([SparseClause('image', SparseVector.from_token_map({'red': 1.0}))], top_k=2))\n"
        "doc = ix.get('d7')\n"
        "print([h.id for h in res.hits]); print('numba' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0] == "['d49', 'd48']"
    assert lines[1] == "False", "a 51-document ingest, search and get started numba"
