"""The threaded postings build (``kernels.build_postings_threaded``) gives exactly the arrays of
the serial kernel, whatever the threads and chunks, and an index built with it answers
searches as one built on one thread (issue 15)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine import index as index_mod
from stair_es.engine import kernels as K
from stair_es.engine import segment as segment_mod
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import VOCAB_SIZE, default_vocabulary

ARRAYS = ("keys", "post_ptr", "pair_ptr", "pair_block", "pair_cnt", "pair_max", "post_off", "post_w")


def csr(rng, lens, vocab=VOCAB_SIZE, first=0):
    """CSR rows of ``lens`` distinct sorted tokens (Zipf-like: low ids are frequent), random
    positive fp16 weights; the rows start at posting ``first`` of the arrays."""
    p = 1.0 / np.arange(10, vocab + 10)
    p /= p.sum()
    rows = [np.sort(rng.choice(vocab, size=int(k), replace=False, p=p if k < vocab // 4 else None)) for k in lens]
    indptr = np.full(len(lens) + 1, first, np.int64)
    np.cumsum(lens, out=indptr[1:])
    indptr[1:] += first
    ids = np.concatenate([rng.integers(0, vocab, first)] + rows).astype(np.int32)
    w = rng.uniform(0.01, 5.0, ids.size).astype(np.float16).view(np.uint16)
    return indptr, ids, w


def assert_same(got, want):
    assert len(got) == len(want) == 8
    for name, g, w in zip(ARRAYS, got, want):
        assert g.dtype == w.dtype, name
        np.testing.assert_array_equal(g, w, err_msg=name)


CASES = {
    "no documents": lambda rng: [],
    "no postings": lambda rng: [0] * 300,
    "one document": lambda rng: [57],
    "empty documents among others": lambda rng: rng.integers(0, 40, 700) * (rng.random(700) < 0.6),
    "a document with most of the vocabulary": lambda rng: np.r_[rng.integers(1, 30, 200), 25000, rng.integers(1, 30, 90)],
    "a partial last block": lambda rng: rng.integers(1, 60, 1037),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("bshift,key_base", [(8, 0), (4, 30522), (1, 2 * 30522)])
def test_threaded_build_equals_the_serial_kernel(case, bshift, key_base):
    rng = np.random.default_rng(len(case) * 10 + bshift)
    lens = CASES[case](rng)
    for first in (0, 5):
        indptr, ids, w = csr(rng, lens, first=first)
        n = len(lens)
        want = K.build_postings(indptr, ids, w, n, key_base, VOCAB_SIZE, bshift)
        nnz = int(indptr[-1] - indptr[0])
        # chunks of one block each, chunks cut inside a long run of blocks, one chunk, the default
        for chunk in (1, max(1, nnz // 7 + 3), nnz + 1, None):
            for threads in (1, 2, 3, 4):
                got = K.build_postings_threaded(indptr, ids, w, n, key_base, VOCAB_SIZE, bshift, threads, chunk)
                assert_same(got, want)


@pytest.mark.parametrize("target", [1, 100, 5000, 10**9])
def test_chunks_are_whole_blocks_covering_every_document(target):
    """No (term, block) pair may span two chunks: every cut is on a block boundary, whatever
    the postings per chunk asked for and however long the documents."""
    rng = np.random.default_rng(target)
    lens = np.r_[rng.integers(0, 50, 900), 3000, np.zeros(40, np.int64), rng.integers(0, 50, 77)]
    indptr = np.zeros(lens.size + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    for bshift in (1, 4, 8):
        b = K.build._chunk_bounds(indptr, lens.size, bshift, target)
        assert b[0] == 0 and b[-1] == lens.size and np.all(np.diff(b) > 0)
        assert np.all(b[1:-1] % (1 << bshift) == 0)
        if target == 1:  # every block with postings a chunk of its own
            starts = np.arange(0, lens.size, 1 << bshift)
            full = np.add.reduceat(lens, starts) > 0
            assert np.all(np.add.reduceat(full, np.searchsorted(starts, b[:-1])) == 1)


def test_threaded_build_rejects_more_documents_than_a_segment_holds():
    indptr = np.zeros((1 << 24) + 2, np.int64)
    with pytest.raises(ValueError, match="at most 16777216 documents"):
        K.build_postings_threaded(indptr, np.zeros(0, np.int32), np.zeros(0, np.uint16), (1 << 24) + 1, 0, VOCAB_SIZE, 8, 2)


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("bshift", [8, 4, 1])
def test_threaded_sub_block_codes_equal_the_serial_kernel(threads, bshift):
    """The segment's sub-block codes (format 2) computed on threads, in chunks of whole terms,
    are the serial kernel's bytes; a field without postings gives none."""
    rng = np.random.default_rng(threads * 10 + bshift)
    for lens in (rng.integers(0, 80, 900), np.zeros(5, np.int64), [0, 3000, 0, 1]):
        indptr, ids, w = csr(rng, lens, vocab=3000)
        keys, post_ptr, pair_ptr, pb, pc, pm, po, pw = K.build_postings(indptr, ids, w, len(lens), 0, VOCAB_SIZE, bshift)
        want = K.block_subs(pc, pm, po, pw, bshift)
        got = K.block_subs_threaded(pair_ptr, post_ptr, pc, pm, po, pw, bshift, threads)
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, want)


def _index(path, monkeypatch, threads, data, threaded=True):
    """An index of two sparse fields (so the second's keys start at VOCAB_SIZE) from ``data``
    (one add_arrays call per element), its segments built on ``threads`` threads."""
    monkeypatch.setattr(segment_mod, "THREADED_BUILD_MIN", 0 if threaded else 10**12)
    monkeypatch.setattr(index_mod, "build_segment", functools.partial(segment_mod.build_segment, threads=threads))
    ix = EngineIndex.create(path, IndexSchema(fields={}, sparse_fields=("image", "text")), bshift=6)
    for start, vectors in data:
        n = vectors["image"][0].size - 1
        ix.add_arrays([f"d{start + i}" for i in range(n)], vectors)
    return ix


def test_an_index_built_on_threads_answers_as_one_built_on_one(tmp_path, monkeypatch):
    rng = np.random.default_rng(15)
    usable = np.flatnonzero(~default_vocabulary().special_mask)[:4000].astype(np.int32)
    data, start = [], 0
    for n in (3000, 1700):
        fields = {}
        for f in ("image", "text"):
            indptr, ids, w = csr(rng, rng.integers(0, 60, n), vocab=4000)
            fields[f] = (indptr, usable[ids], w.view(np.float16).astype(np.float32))
        data.append((start, fields))
        start += n
    serial = _index(tmp_path / "serial", monkeypatch, 1, data, threaded=False)
    one = _index(tmp_path / "one", monkeypatch, 1, data)
    three = _index(tmp_path / "three", monkeypatch, 3, data)
    for a, b, c in zip(serial._segs, one._segs, three._segs):
        for name in ARRAYS + ("pair_sub",):
            np.testing.assert_array_equal(getattr(a.seg, name), getattr(b.seg, name), err_msg=name)
            np.testing.assert_array_equal(getattr(a.seg, name), getattr(c.seg, name), err_msg=name)
    for qi in range(40):
        f = ("image", "text")[qi % 2]
        toks = usable[np.sort(rng.choice(4000, size=int(rng.integers(1, 25)), replace=False))]
        req = SearchRequest([SparseClause(f, SparseVector.from_arrays(toks, rng.uniform(0.05, 2.0, toks.size)))], top_k=20)
        want = [(h.id, h.score) for h in one.search(req).hits]
        assert want, f"query {qi} found nothing"
        assert [(h.id, h.score) for h in three.search(req).hits] == want, f"query {qi}"
        assert [(h.id, h.score) for h in serial.search(req).hits] == want, f"query {qi}"
    for ix in (serial, one, three):
        ix.close()
