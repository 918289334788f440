"""Damage at rest: every damaged copy of an index gives a clear error or the same answers, never a
different answer, never a crash, and never fewer documents after a following ingest."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.engine.storage import _ALIGN, _HEAD
from stair_es.errors import StairError
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

QUERIES = [{2000 + i: 1.0, 2100 + i: 0.5} for i in range(0, 40, 4)]
N_BATCH, BATCH = 3, 60


def _doc(i: int, rng) -> Document:
    toks = np.sort(rng.choice(np.arange(2000, 2200), size=10, replace=False))
    return Document(f"d{i}", {"image": SparseVector.from_arrays(toks, rng.uniform(0.1, 2.0, 10))}, {"n": i})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """3 segments and tombstones (merging off so each batch stays its own segment)."""
    path = tmp_path_factory.mktemp("damage") / "ix"
    rng = np.random.default_rng(7)
    ix = EngineIndex.create(path, IndexSchema(fields={"n": "number"}))
    ix.max_segments = 100
    for b in range(N_BATCH):
        ix.add([_doc(b * BATCH + i, rng) for i in range(BATCH)])
    ix.delete(["d3", "d70", "d150"])
    ix.close()
    return path


def _answers(path: Path):
    with EngineIndex.open(path) as ix:
        out = []
        for q in QUERIES:
            ids = np.array(sorted(q), np.int64)
            vec = SparseVector.from_arrays(ids, np.array([q[i] for i in ids]))
            res = ix.search(SearchRequest([SparseClause("image", vec)], top_k=10))
            out.append([(h.id, round(h.score, 4)) for h in res.hits])
            for h in res.hits:
                assert np.isfinite(h.score)
        out.append(sorted(ix.get("d5").vectors["image"].to_token_map().items()))
        out.append(ix.doc_count)
        return out


def _segments(path: Path) -> list[Path]:
    return sorted(path.glob("seg-*.seg"))


def _array_region(seg: Path, name: str) -> tuple[int, int]:
    with open(seg, "rb") as f:
        _, hlen = _HEAD.unpack(f.read(_HEAD.size))
        header = json.loads(f.read(hlen))
    data_start = (_HEAD.size + hlen + _ALIGN - 1) // _ALIGN * _ALIGN
    dtype, shape, off = header["arrays"][name]
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return data_start + off, n


def _flip(path: Path, offset: int, bit: int = 3) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ (1 << bit)]))


def _flip_in(name: str, which: int = 0, at: float = 0.5):
    def damage(p: Path) -> None:
        seg = _segments(p)[which]
        start, n = _array_region(seg, name)
        _flip(seg, start + int(n * at))
    return damage


def _manifest_edit(fn):
    def damage(p: Path) -> None:
        m = json.loads((p / "manifest.json").read_text())
        m = fn(m)
        (p / "manifest.json").write_text(json.dumps(m))
    return damage


def _set(m, **kw):
    m.update(kw)
    return m


def _tombstone(p: Path) -> Path:
    return sorted(p.glob("seg-*.del.*"))[0]


def _truncate(path_fn, keep: float):
    def damage(p: Path) -> None:
        f = path_fn(p)
        data = f.read_bytes()
        f.write_bytes(data[: int(len(data) * keep)])
    return damage


def _swap(p: Path) -> None:
    a, b = _segments(p)[:2]
    tmp = a.with_suffix(".swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _zero_page(p: Path) -> None:
    seg = _segments(p)[1]
    with open(seg, "r+b") as f:
        f.seek(4096)
        f.write(b"\0" * 4096)


def _garbage(p: Path) -> None:
    seg = _segments(p)[0]
    start, n = _array_region(seg, "post_w")
    with open(seg, "r+b") as f:
        f.seek(start + n // 3)
        f.write(os.urandom(64))


def _dir_in_place(p: Path) -> None:
    seg = _segments(p)[2]
    seg.unlink()
    seg.mkdir()


def _symlink_loop(p: Path) -> None:
    seg = _segments(p)[0]
    seg.unlink()
    seg.symlink_to(seg)


def _manifest_loop(p: Path) -> None:
    (p / "manifest.json").unlink()
    (p / "manifest.json").symlink_to(p / "manifest.json")


def _rename_digit(m):
    e = m["segments"][1]
    e["name"] = e["name"][:-1] + str((int(e["name"][-1]) + 5) % 10)
    e["file"] = e["name"] + ".seg"
    return m


CASES = {
    "flip postings weights": _flip_in("post_w"),
    "flip postings offsets": _flip_in("post_off", 1),
    "flip term postings pointer": _flip_in("post_ptr", 0, 0.3),
    "flip block pointer": _flip_in("pair_ptr", 2, 0.6),
    "flip block numbers": _flip_in("pair_block", 1),
    "flip block counts": _flip_in("pair_cnt", 0),
    "flip block max": _flip_in("pair_max", 2),
    "flip sub-block bounds": _flip_in("pair_sub", 0),
    "flip doc ids": _flip_in("id_blob", 0),
    "flip segment header": lambda p: _flip(_segments(p)[0], 40),
    "flip segment magic": lambda p: _flip(_segments(p)[1], 2),
    "flip footer": lambda p: _flip(_segments(p)[0], _segments(p)[0].stat().st_size - 10),
    "flip footer table checksum": lambda p: _flip(_segments(p)[1], _segments(p)[1].stat().st_size - 23),
    "flip chunk checksum table": lambda p: _flip(_segments(p)[2], _content_length(_segments(p)[2]) + 1),
    "flip captions of every doc": _flip_in("cap_offs", 0, 0.9),
    "flip metadata column": _flip_in("m.n.v", 1, 0.5),
    "flip insertion order": _flip_in("seq", 2, 0.5),
    "header length 2**40": lambda p: _segments(p)[0].open("r+b").write(struct.pack("<8sQ", b"STAIRSEG", 1 << 40)),
    "truncate segment end": _truncate(lambda p: _segments(p)[2], 0.97),
    "truncate segment half": _truncate(lambda p: _segments(p)[0], 0.5),
    "zeroed 4 KiB page": _zero_page,
    "garbage bytes in weights": _garbage,
    "two segment files swapped": _swap,
    "segment is a directory": _dir_in_place,
    "segment symlink loop": _symlink_loop,
    "segment file missing": lambda p: _segments(p)[1].unlink(),
    "tombstone bit flip": lambda p: _flip(_tombstone(p), 2, 5),
    "tombstone truncated": _truncate(_tombstone, 0.5),
    "tombstone missing": lambda p: _tombstone(p).unlink(),
    "manifest missing": lambda p: (p / "manifest.json").unlink(),
    "manifest symlink loop": _manifest_loop,
    "manifest is a directory": lambda p: ((p / "manifest.json").unlink(), (p / "manifest.json").mkdir()),
    "manifest truncated": _truncate(lambda p: p / "manifest.json", 0.6),
    "manifest bit flip": lambda p: _flip(p / "manifest.json", 200, 1),
    "manifest null": lambda p: (p / "manifest.json").write_text("null"),
    "manifest list": lambda p: (p / "manifest.json").write_text("[1, 2]"),
    "manifest without segments": _manifest_edit(lambda m: {k: v for k, v in m.items() if k not in ("segments", "checksum")}),
    "manifest segments as string": _manifest_edit(lambda m: _set(m, segments="seg-000001", checksum=None)),
    "manifest path outside folder": _manifest_edit(
        lambda m: _set(m, segments=[{**m["segments"][0], "file": "../outside.seg"}] + m["segments"][1:])),
    "manifest segment listed twice": _manifest_edit(lambda m: _set(m, segments=m["segments"] + m["segments"][:1])),
    "manifest next_segment on a live segment": _manifest_edit(lambda m: _set(m, next_segment=1)),
    "manifest segment name digit changed": _manifest_edit(_rename_digit),
    "manifest doc count changed (no checksum)": _manifest_edit(
        lambda m: _set({k: v for k, v in m.items() if k != "checksum"},
                       segments=[{**m["segments"][0], "docs": m["segments"][0]["docs"] + 1}] + m["segments"][1:])),
    "write.lock is a directory": lambda p: (p / "write.lock").mkdir() if not (p / "write.lock").exists()
    else ((p / "write.lock").unlink(), (p / "write.lock").mkdir()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_damaged_copy_gives_a_clear_error_or_the_same_answers_and_loses_nothing(pristine, tmp_path, case):
    expected = _answers(pristine)
    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy, symlinks=True)
    CASES[case](copy)

    try:
        got = _answers(copy)
    except StairError as e:
        message = str(e)
        assert message and "Traceback" not in message and len(message) < 600
    else:
        assert got == expected, f"{case}: a damaged index answered differently"

    # a following ingest never loses or duplicates documents: it refuses, or every old document is still there
    rng = np.random.default_rng(99)
    new = [_doc(10_000 + i, rng) for i in range(5)]
    try:
        with EngineIndex.open(copy, writable=True) as ix:
            ix.add(new)
    except StairError:
        return
    with EngineIndex.open(copy) as ix:
        old_ids = [f"d{i}" for i in range(N_BATCH * BATCH) if f"d{i}" not in ("d3", "d70", "d150")]
        assert ix.contains(old_ids) == set(old_ids), f"{case}: an ingest after the damage lost documents"
        assert ix.doc_count == len(old_ids) + 5, f"{case}: an ingest after the damage duplicated documents"


def _content_length(seg: Path) -> int:
    from stair_es.engine.storage import read_footer

    return read_footer(seg, seg.stat().st_size).content


def _as_old_format(seg: Path, fmt: str) -> None:
    """Rewrite a segment as an older stair_es wrote it: "none" (no footer) or "whole" (one
    CRC-32 of the whole content in a 24-byte ``STAIRSUM`` footer)."""
    import zlib

    from stair_es.engine.storage import _FOOT, _FOOT_MAGIC

    content = seg.read_bytes()[: _content_length(seg)]
    tail = b"" if fmt == "none" else _FOOT.pack(_FOOT_MAGIC, zlib.crc32(content), 0, len(content))
    seg.write_bytes(content + tail)


@pytest.mark.parametrize("fmt", ["none", "whole"])
def test_old_segment_formats_still_open(pristine, tmp_path, fmt):
    """Indexes written before chunked checksums (a whole-file CRC, or no footer at all) keep
    working; a whole-file CRC is still verified, and structure checks still guard both."""
    from stair_es.engine import check_index

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    for seg in _segments(copy):
        _as_old_format(seg, fmt)
    assert _answers(copy) == _answers(pristine)
    assert all(s["checksummed"] == (fmt == "whole") for s in check_index(copy)["segments"])
    if fmt == "whole":
        start, n = _array_region(_segments(copy)[0], "post_w")
        _flip(_segments(copy)[0], start + n // 2)
        with pytest.raises(StairError, match="checksum mismatch"):
            _answers(copy)


def test_a_flipped_postings_bit_is_an_error_before_any_answer_that_reads_it(tmp_path):
    """Chunked checksums are verified lazily: a query reading a damaged postings chunk gets a
    clear error naming the file; a query that reads only whole chunks answers as before; `index
    check` finds the damage either way."""
    from stair_es.engine import check_index
    from stair_es.engine.storage import CHUNK_SHIFT
    from stair_es.errors import DamagedIndexError

    rng = np.random.default_rng(5)
    path = tmp_path / "big"
    vocab_lo = 2000
    with EngineIndex.create(path, IndexSchema()) as ix:  # ~100 KB of post_w: several 16 KiB chunks
        docs = []
        for i in range(5000):
            toks = np.sort(rng.choice(np.arange(vocab_lo, vocab_lo + 400), size=10, replace=False))
            docs.append(Document(f"d{i}", {"image": SparseVector.from_arrays(toks, rng.uniform(0.1, 2.0, 10))}))
        ix.add(docs)
    seg = _segments(path)[0]
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with EngineIndex.open(path) as ix:
        s = ix._segs[0].seg
        start, _ = _array_region(seg, "post_w")
        j_good, j_bad = 0, s.keys.size * 3 // 4  # the good term's weights start post_w, the bad one's are far on
        bad_at = start + 2 * int(s.post_ptr[j_bad] + 3)
        # the bad chunk holds only post_w, of terms after the good one (seq, read by every search, comes after)
        assert start >> CHUNK_SHIFT < bad_at >> CHUNK_SHIFT < s.offsets["seq"] >> CHUNK_SHIFT
        tok_bad, tok_good = int(s.keys[j_bad]), int(s.keys[j_good])

        def query(ix, tok):
            vec = SparseVector.from_arrays(np.array([tok]), np.array([1.0]))
            return [(h.id, h.score) for h in ix.search(SearchRequest([SparseClause("image", vec)], top_k=5)).hits]

        want_good = query(ix, tok_good)
    _flip(copy / seg.name, bad_at)
    with EngineIndex.open(copy) as ix:  # opening reads only the header and term tables: no error yet
        assert query(ix, tok_good) == want_good
        with pytest.raises(DamagedIndexError, match=r"seg-000001\.seg: checksum mismatch in bytes"):
            query(ix, tok_bad)
        with pytest.raises(DamagedIndexError):  # still an error on the next try: nothing was cached as good
            query(ix, tok_bad)
    report = check_index(copy)
    assert not report["ok"] and "checksum mismatch" in report["segments"][0]["error"]
    with EngineIndex.open(copy, writable=True) as ix:
        ix.delete(["d1"])  # reads only ids
        with pytest.raises(DamagedIndexError):  # a merge verifies every byte it rewrites first
            ix.optimize()


@pytest.mark.parametrize("strategy", ["blockmax", "taat", "auto"])
def test_the_numba_kernels_verify_each_postings_run_before_they_read_it(tmp_path, strategy):
    """On the numba path the search kernel verifies postings at the granularity it reads them: a
    query whose block-max pruning never reads the damaged run answers as before, one that reads it
    is a clear error naming the byte range (never a different answer)."""
    from stair_es.errors import DamagedIndexError

    n, a, r = 256 * 160, 2500, 2600  # token a in every doc (weight 1: 120 KiB of postings), r in block 0 only (weight 10)
    indptr = np.concatenate([[0], np.cumsum(np.where(np.arange(n) < 256, 2, 1))]).astype(np.int64)
    ids = np.concatenate([[a, r] if i < 256 else [a] for i in range(n)]).astype(np.int64)
    w = np.concatenate([[1.0, 10.0] if i < 256 else [1.0] for i in range(n)]).astype(np.float32)
    path = tmp_path / "ix"
    with EngineIndex.create(path, IndexSchema()) as ix:
        ix.add_arrays([f"d{i}" for i in range(n)], {"image": (indptr, ids, w)})
    seg_file = _segments(path)[0]
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)

    def search(ix, toks, k):
        ix.strategy, ix.numpy_max_postings = strategy, 0  # the numba kernels, not the numpy twins
        vec = SparseVector.from_arrays(np.array(toks), np.ones(len(toks)))
        return [(h.id, h.score) for h in ix.search(SearchRequest([SparseClause("image", vec)], top_k=k)).hits]

    with EngineIndex.open(path) as ix:
        s = ix._segs[0].seg
        j = int(s.term_index(0, np.array([a]))[0])
        bad_at = s.offsets["post_w"] + 2 * (int(s.post_ptr[j]) + 30 * 256 + 5)  # a's weight of doc 30*256+5
        want_pruned = search(ix, [a, r], 1)
        want_all = search(ix, [a], 20)
    assert want_pruned == [("d0", 11.0)]
    _flip(copy / seg_file.name, bad_at)
    with EngineIndex.open(copy) as ix:
        if strategy == "taat":  # reads every posting of its terms: the damaged run too
            with pytest.raises(DamagedIndexError, match=r"seg-000001\.seg: checksum mismatch in bytes"):
                search(ix, [a, r], 1)
        else:  # block-max scores block 0 (bound 11), then skips every other block (bound 1)
            assert search(ix, [a, r], 1) == want_pruned
        with pytest.raises(DamagedIndexError, match=rf"checksum mismatch in bytes {bad_at >> 12 << 12}-"):
            search(ix, [a], 10_000)  # (almost) every document: the damaged run is read
        with pytest.raises(DamagedIndexError):  # still an error on the next try: nothing was marked good
            search(ix, [a], 10_000)
    with EngineIndex.open(path) as ix:
        assert search(ix, [a], 20) == want_all


def test_a_crash_while_writing_block_max_tables_leaves_the_last_commit(pristine, tmp_path, monkeypatch):
    """A writer dying in the middle of a new segment's block-max tables (``pair_max``) leaves a
    half-written temporary file: the index opens at its last commit with the same answers, the
    next writer removes the leftover and ingests normally."""
    from stair_es.engine import segment as segmod
    from stair_es.engine import storage

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    want = _answers(copy)
    real = storage.write_arrays

    class Crash(Exception):
        pass

    def dying_write(path, arrays, meta, *, sync_dir=True):
        scratch = tmp_path / "scratch.seg"
        real(scratch, arrays, meta, sync_dir=False)
        start, n = _array_region(scratch, "pair_max")
        assert n > 0
        # what a killed writer leaves: its temporary file, cut in the middle of pair_max
        (path.parent / f"{storage.TMP_PREFIX}{path.name}.crash").write_bytes(scratch.read_bytes()[: start + n // 2])
        raise Crash()

    monkeypatch.setattr(segmod, "write_arrays", dying_write)
    rng = np.random.default_rng(3)
    with EngineIndex.open(copy, writable=True) as ix:
        with pytest.raises(Crash):
            ix.add([_doc(500 + i, rng) for i in range(20)])
    assert list(copy.glob(f"{storage.TMP_PREFIX}*"))
    assert _answers(copy) == want  # readers never see the half-written segment
    monkeypatch.setattr(segmod, "write_arrays", real)
    with EngineIndex.open(copy, writable=True) as ix:  # the next writer cleans up and goes on
        assert not list(copy.glob(f"{storage.TMP_PREFIX}*"))
        ix.add([_doc(500 + i, rng) for i in range(20)])
        assert ix.doc_count == want[-1] + 20


def test_index_check_reports_the_damaged_segment_and_repair_lists_the_lost_documents(pristine, tmp_path):
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    home = tmp_path / "home"
    shutil.copytree(pristine, home / "ix")
    ok = CliRunner().invoke(cli, ["index", "check", "ix", "--home", str(home)])
    assert ok.exit_code == 0 and "ok: no damage found" in ok.output
    _flip_in("post_w", 1)(home / "ix")
    bad = CliRunner().invoke(cli, ["index", "check", "ix", "--home", str(home), "--json"])
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert [s["error"] is not None for s in report["segments"]] == [False, True, False]
    assert "checksum mismatch" in report["segments"][1]["error"] and not report["repaired"]
    fixed = CliRunner().invoke(cli, ["index", "check", "ix", "--repair", "--home", str(home), "--json"])
    assert fixed.exit_code == 0, fixed.output
    report = json.loads(fixed.output)
    lost = set(report["lost_ids"])
    assert report["repaired"] and len(lost) == BATCH and lost == {f"d{i}" for i in range(BATCH, 2 * BATCH)}
    with EngineIndex.open(home / "ix") as ix:  # what is left answers again, and holds exactly the rest
        assert ix.doc_count == 2 * BATCH - 2  # d3 and d150 were deleted before
    assert CliRunner().invoke(cli, ["index", "check", "ix", "--home", str(home)]).exit_code == 0


def test_disk_full_during_an_ingest_keeps_the_last_commit_and_says_so(pristine, tmp_path, monkeypatch):
    import errno

    import stair_es.engine.segment as segment_mod
    from stair_es.errors import IndexWriteError

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    before = _answers(copy)
    real = segment_mod.write_arrays

    def full(path, *a, **kw):
        with open(path.with_name(".tmp-partial"), "wb") as f:  # a half-written temp file, as a real ENOSPC leaves
            f.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(segment_mod, "write_arrays", full)
    rng = np.random.default_rng(5)
    with EngineIndex.open(copy, writable=True) as ix:
        with pytest.raises(IndexWriteError, match="No space left on device.*last commit.*intact"):
            ix.add([_doc(20_000 + i, rng) for i in range(5)])
    assert _answers(copy) == before
    monkeypatch.setattr(segment_mod, "write_arrays", real)
    with EngineIndex.open(copy, writable=True) as ix:  # space freed: the same ingest now succeeds
        ix.add([_doc(20_000 + i, rng) for i in range(5)])
        assert ix.doc_count == before[-1] + 5
    assert not (copy / ".tmp-partial").exists()  # the next writer removed the leftover


def test_a_read_only_index_folder_gives_a_clear_error(pristine, tmp_path, monkeypatch):
    import errno

    import stair_es.engine.segment as segment_mod
    from stair_es.errors import IndexWriteError

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)

    def read_only(path, *a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(segment_mod, "write_arrays", read_only)
    with EngineIndex.open(copy, writable=True) as ix:
        with pytest.raises(IndexWriteError, match="Permission denied"):
            ix.add([_doc(30_000, np.random.default_rng(1))])


@pytest.mark.parametrize("damage", ["manifest missing", "manifest bit flip", "manifest list", "manifest is a directory"])
def test_repair_rolls_a_damaged_manifest_back_to_the_previous_commit(pristine, tmp_path, damage):
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    home = tmp_path / "home"
    shutil.copytree(pristine, home / "ix")
    CASES[damage](home / "ix")
    r = CliRunner().invoke(cli, ["index", "check", "ix", "--home", str(home)])
    assert r.exit_code == 1 and "--repair rolls back" in r.output
    r = CliRunner().invoke(cli, ["index", "check", "ix", "--repair", "--home", str(home)])
    assert r.exit_code == 0 and "rolled back to the previous commit" in r.output, r.output
    with EngineIndex.open(home / "ix") as ix:  # the commit before the last one: the 3 deletes are undone
        assert ix.doc_count == N_BATCH * BATCH and ix.contains(["d3", "d70"]) == {"d3", "d70"}


def test_a_writer_keeps_every_file_of_the_previous_commit(pristine, tmp_path):
    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    with EngineIndex.open(copy, writable=True) as ix:
        ix.optimize()  # replaces every segment
    prev = json.loads((copy / "manifest.prev.json").read_text())
    for e in prev["segments"]:
        assert (copy / e["file"]).is_file() and (not e.get("del_file") or (copy / e["del_file"]).is_file())
    with EngineIndex.open(copy, writable=True) as ix:  # the next commit frees the generation before
        ix.delete(["d5"])
    assert len(list(copy.glob("seg-*.seg"))) == 1


def test_optimize_upgrades_old_segments_to_checksummed_ones(pristine, tmp_path):
    from stair_es.engine import check_index

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    for seg in _segments(copy):  # as an older stair_es wrote them: no footer
        _as_old_format(seg, "none")
    assert not any(s["checksummed"] for s in check_index(copy)["segments"])
    expected = _answers(copy)
    with EngineIndex.open(copy, writable=True) as ix:
        ix.optimize()
    report = check_index(copy)
    assert report["ok"] and report["segments"] and all(s["checksummed"] for s in report["segments"])
    from stair_es.engine.storage import read_footer

    live = [copy / e["file"] for e in json.loads((copy / "manifest.json").read_text())["segments"]]
    assert live and all(read_footer(seg, seg.stat().st_size).kind == "chunks" for seg in live)
    got = _answers(copy)
    assert got == expected  # same hits, scores, vectors and counts after the merge


@pytest.mark.parametrize("fmt", ["none", "whole", "16k-chunks"])
def test_optimize_upgrades_a_lone_segment_of_an_older_format(pristine, tmp_path, fmt):
    """One segment, no deletes: nothing to merge, but an older file format is still rewritten."""
    from stair_es.engine import storage
    from stair_es.engine.storage import CHUNK_SHIFT, read_footer

    copy = tmp_path / "ix"
    shutil.copytree(pristine, copy)
    with EngineIndex.open(copy, writable=True) as ix:
        ix.optimize()
    expected = _answers(copy)
    (seg,) = [copy / e["file"] for e in json.loads((copy / "manifest.json").read_text())["segments"]]
    if fmt == "16k-chunks":  # as the previous release wrote it
        content = seg.read_bytes()[: _content_length(seg)]
        crcs = storage._ChunkCrcs(14)
        crcs.update(content)
        table = crcs.table()
        seg.write_bytes(content + table.tobytes() + storage._FOOT2.pack(storage._FOOT2_MAGIC, storage.crc32_of(table), 14,
                                                                           len(content), table.size))
    else:
        _as_old_format(seg, fmt)
    assert _answers(copy) == expected
    with EngineIndex.open(copy, writable=True) as ix:
        ix.optimize()
    (new,) = [copy / e["file"] for e in json.loads((copy / "manifest.json").read_text())["segments"]]
    foot = read_footer(new, new.stat().st_size)
    assert new != seg and foot.kind == "chunks" and foot.shift == CHUNK_SHIFT
    assert _answers(copy) == expected


def _kernel_index(tmp_path: Path) -> Path:
    """One segment of 3,000 docs with a keyword column; even docs have a caption, docs divisible
    by 3 a source (several 4 KiB chunks per array, so damage in one chunk is local)."""
    rng = np.random.default_rng(11)
    path = tmp_path / "ix"
    with EngineIndex.create(path, IndexSchema(fields={"n": "number", "tag": "keyword"})) as ix:
        docs = []
        for i in range(3000):
            toks = np.sort(rng.choice(np.arange(2000, 2300), size=12, replace=False))
            docs.append(Document(f"d{i}", {"image": SparseVector.from_arrays(toks, rng.uniform(0.1, 2.0, 12))},
                                 {"n": i, "tag": [f"t{i % 7}", f"u{i % 5}"]},
                                 caption=f"caption of {i}" if i % 2 == 0 else None,
                                 source=f"/photos/{i}.jpg" if i % 3 == 0 else None))
        ix.add(docs)
    return path


@pytest.mark.parametrize("where", ["pair_block", "pair_cnt", "pair_max", "pair_sub", "id_offs", "id_blob", "cap_present",
                                   "cap_offs", "cap_blob", "src_offs", "m.n.v", "m.tag.ptr", "m.tag.codes"])
def test_compiled_verification_of_block_tables_and_hits_names_the_file(tmp_path, where):
    """With numba loaded, a search verifies its terms' block tables and its hits' stored fields in
    compiled code (kernels.verify_rows / verify_docs): a flipped bit in what a search or get reads
    is a DamagedIndexError naming the file and byte range, never a different answer."""
    from stair_es.engine import kernels  # noqa: F401 - loads the compiled CRC-32 and verifiers
    from stair_es.engine import checksum
    from stair_es.errors import DamagedIndexError

    assert checksum.range_verifier() is not None
    path = _kernel_index(tmp_path)
    seg_file = _segments(path)[0]

    def answer(p: Path, tok: int, doc: str | None):
        with EngineIndex.open(p) as ix:
            ix.numpy_max_postings = 0  # the numba kernels, not the numpy twins
            vec = SparseVector.from_arrays(np.array([tok, tok + 1]), np.array([1.0, 0.5]))
            res = ix.search(SearchRequest([SparseClause("image", vec)], top_k=3000))
            if doc is None:  # the search alone (a get verifies every postings table)
                return [(h.id, h.score, h.caption, h.source, h.metadata) for h in res.hits]
            got = ix.get(doc)
            return ([(h.id, h.score, h.caption, h.source, h.metadata) for h in res.hits],
                    (got.caption, got.source, got.metadata))

    with EngineIndex.open(path) as ix:
        s = ix._segs[0].seg
        a = s.a
        tok = 2150
        j = int(s.term_index(0, np.array([tok]))[0])
        hits = [h for h in ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays(
            np.array([tok]), np.array([1.0])))], top_k=3000)).hits]
        d_cap = next(int(h.id[1:]) for h in hits if int(h.id[1:]) % 2 == 0 and int(h.id[1:]) % 3 == 0)
        item = lambda n: a[n].itemsize  # noqa: E731
        p0 = int(s.pair_ptr[j])
        at = {  # a byte the search (or get) reads, per array
            "pair_block": s.offsets["pair_block"] + item("pair_block") * p0,
            "pair_cnt": s.offsets["pair_cnt"] + p0,
            "pair_max": s.offsets["pair_max"] + item("pair_max") * p0 + 1,
            "pair_sub": s.offsets["pair_sub"] + p0,
            "id_offs": s.offsets["id_offs"] + 8 * d_cap,
            "id_blob": s.offsets["id_blob"] + int(a["id_offs"][d_cap]),
            "cap_present": s.offsets["cap_present"] + d_cap,
            "cap_offs": s.offsets["cap_offs"] + 8 * (d_cap + 1),
            "cap_blob": s.offsets["cap_blob"] + int(a["cap_offs"][d_cap]) + 2,
            "src_offs": s.offsets["src_offs"] + 8 * d_cap,
            "m.n.v": s.offsets["m.n.v"] + item("m.n.v") * d_cap,
            "m.tag.ptr": s.offsets["m.tag.ptr"] + 8 * d_cap,
            "m.tag.codes": s.offsets["m.tag.codes"] + item("m.tag.codes") * int(a["m.tag.ptr"][d_cap]),
        }[where]
        doc = f"d{d_cap}"
    want = answer(path, tok, doc)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    _flip(copy / seg_file.name, at)
    with pytest.raises(DamagedIndexError, match=rf"{seg_file.name}: checksum mismatch in bytes"):
        answer(copy, tok, None if where.startswith("pair_") or where.startswith("id_") else doc)

    assert answer(path, tok, doc) == want
