"""A reader maps the page-cache-resident pages of the big segments it opens in a background thread
(so a first query faults no cached page): the pages are mapped without a disk read, answers do not
change, ``STAIR_ES_MAP_AHEAD=0`` and writers do without, and closing the reader stops it."""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import pytest

from stair_es.engine import EngineIndex, pages
from stair_es.engine import searcher as searcher_mod
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

TOKENS = np.flatnonzero(~default_vocabulary().special_mask)[2000:2150]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore/MADV_POPULATE_READ are Linux calls")


def _build(path, n_docs: int = 3000) -> None:
    rng = np.random.default_rng(5)
    ix = EngineIndex.create(path, IndexSchema(sparse_fields=("image",)))
    rows = [np.sort(rng.choice(TOKENS.size, size=20, replace=False)) for _ in range(n_docs)]
    indptr = np.zeros(n_docs + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r in rows])
    ids = TOKENS[np.concatenate(rows)].astype(np.int32)
    for lo in (0, n_docs // 2):  # two segments
        hi = lo + n_docs // 2
        a, b = int(indptr[lo]), int(indptr[hi])
        ix.add_arrays([f"d{i}" for i in range(lo, hi)],
                      {"image": (indptr[lo:hi + 1] - a, ids[a:b], rng.uniform(0.1, 2.0, b - a).astype(np.float32))})
    ix.close()


def _req(i: int) -> SearchRequest:
    toks = TOKENS[i:i + 15]
    return SearchRequest([SparseClause("image", SparseVector.from_arrays(toks, np.linspace(0.4, 1.6, toks.size)))], top_k=9)


def _hits(ix) -> list:
    return [[(h.id, h.score) for h in ix.search(_req(i)).hits] for i in range(8)]


def _resident(mm_addr: int, n: int) -> int:
    lib = pages._madvise()
    vec = np.zeros((n + pages.PAGE - 1) // pages.PAGE, np.uint8)
    assert lib.mincore(mm_addr, n, vec.ctypes.data) == 0
    return int((vec & 1).sum())


@linux_only
def test_map_resident_maps_cached_pages_and_reads_no_disk(tmp_path):
    f = tmp_path / "data"
    n = 64 * pages.PAGE
    f.write_bytes(os.urandom(n))
    with open(f, "rb") as fh:
        fh.read()  # in the page cache
        mm = mmap.mmap(fh.fileno(), n, prot=mmap.PROT_READ)
    addr = np.frombuffer(mm, np.uint8).ctypes.data
    if not pages._madvise():
        pytest.skip("no C library madvise here")
    assert pages.map_resident(addr, n) == n  # every page was cached: all mapped
    del addr
    mm.close()  # (mapped pages stay in the page cache)
    # dropped from the page cache: nothing is read back in
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    with open(f, "rb") as fh:
        mm2 = mmap.mmap(fh.fileno(), n, prot=mmap.PROT_READ)
    addr2 = np.frombuffer(mm2, np.uint8).ctypes.data
    if _resident(addr2, n) != 0:
        pytest.skip("the page cache kept the file (posix_fadvise is only a hint)")
    assert pages.map_resident(addr2, n) == 0
    assert _resident(addr2, n) == 0
    del addr2
    mm2.close()


@linux_only
def test_a_reader_maps_its_segments_in_the_background_and_answers_alike(tmp_path, monkeypatch):
    _build(tmp_path / "ix")
    monkeypatch.setenv("STAIR_ES_MAP_AHEAD", "0")
    plain = EngineIndex.open(tmp_path / "ix")
    assert "_mapping" not in plain.__dict__  # turned off: no thread, no queue
    want = _hits(plain)
    plain.close()
    monkeypatch.delenv("STAIR_ES_MAP_AHEAD")
    monkeypatch.setattr(searcher_mod, "MAP_AHEAD_MIN_BYTES", 0)  # (the test's segments are small)
    ix = EngineIndex.open(tmp_path / "ix")
    assert ix.mapping_done(timeout=30)
    if pages._populate:
        assert ix._mapping["mapped"] > 0
    assert _hits(ix) == want
    ix.close()
    assert ix._mapping["stop"].is_set()
    writer = EngineIndex.open(tmp_path / "ix", writable=True)  # a writer's segments are its own: not queued
    assert "_mapping" not in writer.__dict__
    writer.close()


def test_small_segments_are_left_to_faults(tmp_path):
    _build(tmp_path / "ix")
    ix = EngineIndex.open(tmp_path / "ix")  # segments of ~100 KB, far below MAP_AHEAD_MIN_BYTES
    assert "_mapping" not in ix.__dict__
    assert ix.mapping_done(timeout=0)
    ix.close()


@linux_only
def test_the_background_thread_verifies_what_it_maps_and_leaves_damage_to_the_search(tmp_path, monkeypatch):
    """After the mapping, the thread verifies the chunk checksums of the mapped pages (numba's
    CRC-32), so searches find them verified; a damaged chunk stays unverified and the search that
    reads it raises. ``STAIR_ES_MAP_AHEAD_VERIFY=0`` leaves every chunk to the searches."""
    from stair_es.errors import DamagedIndexError

    _build(tmp_path / "ix")
    monkeypatch.setattr(searcher_mod, "MAP_AHEAD_MIN_BYTES", 0)
    monkeypatch.setenv("STAIR_ES_MAP_AHEAD_VERIFY", "0")
    with EngineIndex.open(tmp_path / "ix") as ix:
        assert ix.mapping_done(timeout=30)
        assert not any(s.seg.verifier.ok.all() for s in ix._segs)  # (open verifies the header and tables only)
        want = _hits(ix)
    monkeypatch.delenv("STAIR_ES_MAP_AHEAD_VERIFY")
    from stair_es.engine import storage

    storage._CHUNK_STATE.clear()  # (verified flags are per process and file version: start afresh)
    with EngineIndex.open(tmp_path / "ix") as ix:
        assert ix.mapping_done(timeout=60)
        if pages._populate:
            assert all(s.seg.verifier.ok.all() for s in ix._segs)
        assert _hits(ix) == want
    # one byte of a postings chunk flipped (same size and mtime kept aside: a new file version anyway)
    seg_file = sorted((tmp_path / "ix").glob("seg-*.seg"))[0]
    with EngineIndex.open(tmp_path / "ix") as ix:
        s0 = ix._segs[0].seg
        off = s0.offsets["post_w"] + s0.post_w.nbytes // 2
    data = bytearray(seg_file.read_bytes())
    data[off] ^= 0xFF
    seg_file.write_bytes(bytes(data))
    storage._CHUNK_STATE.clear()
    with EngineIndex.open(tmp_path / "ix") as ix:
        assert ix.mapping_done(timeout=60)
        v = ix._segs[0].seg.verifier
        assert not v.ok[off >> v.shift]  # the damaged chunk was not marked verified
        with pytest.raises(DamagedIndexError):
            for i in range(len(TOKENS) - 15):
                ix.strategy = "taat"  # (reads every posting of the query terms)
                ix.search(_req(i))
