"""``EngineIndex.warm()`` readies a reader for its first query (pages mapped, bytes verified,
kernels loaded) without changing any answer; a damaged byte is found by the warm-up itself;
prefetching a query's postings (``madvise``) changes nothing but timing."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine import pages
from stair_es.errors import DamagedIndexError
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

TOKENS = np.flatnonzero(~default_vocabulary().special_mask)[3000:3100]


def _index(tmp_path, n_docs: int = 2000) -> EngineIndex:
    rng = np.random.default_rng(3)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(sparse_fields=("image",)))
    rows = [np.sort(rng.choice(TOKENS.size, size=15, replace=False)) for _ in range(n_docs)]
    indptr = np.zeros(n_docs + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r in rows])
    ids = TOKENS[np.concatenate(rows)].astype(np.int32)
    ix.add_arrays([f"d{i}" for i in range(n_docs)], {"image": (indptr, ids, rng.uniform(0.1, 2.0, ids.size).astype(np.float32))})
    ix.close()
    return EngineIndex.open(tmp_path / "ix")


def _req(i: int) -> SearchRequest:
    toks = TOKENS[i:i + 12]
    return SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, np.linspace(0.5, 1.5, toks.size)))], top_k=7)


def test_warm_changes_no_answer_and_says_what_it_did(tmp_path):
    cold = _index(tmp_path)
    cold.numpy_max_postings = 0
    want = [[(h.id, h.score) for h in cold.search(_req(i)).hits] for i in range(5)]
    cold.close()
    ix = EngineIndex.open(tmp_path / "ix")
    ix.numpy_max_postings = 0
    took = ix.warm()
    assert set(took) == {"map_s", "import_s", "verify_s", "kernels_s"} and all(v >= 0 for v in took.values())
    assert [[(h.id, h.score) for h in ix.search(_req(i)).hits] for i in range(5)] == want
    again = EngineIndex.open(tmp_path / "ix")
    again.numpy_max_postings, again.prefetch = 0, True  # each query's terms mapped with madvise first: same answers
    assert [[(h.id, h.score) for h in again.search(_req(i)).hits] for i in range(5)] == want


def test_warm_finds_a_damaged_byte(tmp_path):
    _index(tmp_path).close()
    seg_file = next((tmp_path / "ix").glob("*.seg"))
    data = bytearray(seg_file.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside the content, far from header and footer
    seg_file.write_bytes(bytes(data))
    ix = EngineIndex.open(tmp_path / "ix")
    with pytest.raises(DamagedIndexError):
        ix.warm()


def test_advise_is_a_harmless_hint():
    buf = np.zeros(1 << 20, np.uint8)
    assert pages.advise(buf.ctypes.data, 0) is False  # nothing to ask for
    pages.advise(buf.ctypes.data + 100, 5000)  # anonymous memory: the kernel may refuse; nothing breaks
    assert pages.advise_ranges(buf.ctypes.data, [0, 10, 1 << 19], [5, 20, (1 << 19) + 10]) <= 2  # neighbours merged
    assert buf.sum() == 0


def test_stair_es_warm_makes_every_reader_warm_on_open(tmp_path, monkeypatch):
    _index(tmp_path).close()
    calls = []
    real = EngineIndex.warm
    monkeypatch.setattr(EngineIndex, "warm", lambda self: calls.append(1) or real(self))
    EngineIndex.open(tmp_path / "ix").close()
    assert calls == []
    monkeypatch.setenv("STAIR_ES_WARM", "1")
    ix = EngineIndex.open(tmp_path / "ix")
    assert calls == [1]
    assert ix.search(_req(0)).hits
    EngineIndex.open(tmp_path / "ix", writable=True).close()  # a writer is not warmed (it is for readers)
    assert calls == [1]
