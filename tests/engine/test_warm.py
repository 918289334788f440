"""``EngineIndex.warm()`` readies a reader for its first query (pages mapped, bytes verified,
kernels loaded) without changing any answer; a damaged byte is found by the warm-up itself;
a ``madvise`` hint changes nothing but timing."""

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


def test_warm_with_huge_pages_reads_the_segments_back_and_changes_no_answer(tmp_path, monkeypatch):
    """``warm(huge_pages=True)`` reads big segments back into the page cache as 2 MiB folios
    (Linux with transparent huge pages): the same answers, and it says what it did."""
    import sys

    from stair_es.engine import searcher as searcher_mod

    cold = _index(tmp_path, n_docs=6000)
    cold.numpy_max_postings = 0
    want = [[(h.id, h.score) for h in cold.search(_req(i)).hits] for i in range(5)]
    cold.close()
    monkeypatch.setattr(searcher_mod, "MAP_AHEAD_MIN_BYTES", 0)  # (the test's segment is small)
    ix = EngineIndex.open(tmp_path / "ix")
    ix.numpy_max_postings = 0
    took = ix.warm(huge_pages=True)
    if not (sys.platform.startswith("linux") and pages.huge_pages_enabled() and pages._madvise()):
        assert "huge_s" not in took
        pytest.skip("no transparent huge pages (or no madvise) here: warm() maps 4 KiB pages as before")
    assert took["huge_s"] >= 0 and 0.0 <= took["huge_share"] <= 1.0
    assert [[(h.id, h.score) for h in ix.search(_req(i)).hits] for i in range(5)] == want
    seg = ix.snapshot().segments[0].seg
    assert 0.0 <= seg.huge_share() <= 1.0
    ix.close()
    monkeypatch.setenv("STAIR_ES_WARM_HUGE", "1")  # the same through the environment
    again = EngineIndex.open(tmp_path / "ix")
    again.numpy_max_postings = 0
    assert "huge_s" in again.warm()
    assert [[(h.id, h.score) for h in again.search(_req(i)).hits] for i in range(5)] == want
    again.close()


def test_pmd_mapped_reads_this_process_maps():
    import mmap

    m = mmap.mmap(-1, 4 << 20)
    addr = np.frombuffer(m, np.uint8).ctypes.data
    assert pages.pmd_mapped(addr, 4 << 20) == 0  # anonymous memory: no file pages mapped at all
    del addr
    m.close()
