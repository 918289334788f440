"""Files no commit references are removed by the next writer's commit (as Lucene's
IndexFileDeleter does), never a file the current or the previous commit needs."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from stair_es.engine import EngineIndex, check_index
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector


def _add(ix: EngineIndex, ids: list[str], tok0: int = 2000) -> None:
    n = len(ids)
    indptr = np.arange(n + 1) * 2
    indices = (tok0 + np.arange(2 * n) % 50).astype(np.int32)
    ix.add_arrays(ids, {"image": (indptr, indices, np.ones(2 * n, np.float32))})


def _referenced(path) -> set[str]:
    out = {"manifest.json", "manifest.prev.json", "write.lock"}
    for name in ("manifest.json", "manifest.prev.json"):
        f = path / name
        if f.is_file():
            for e in json.loads(f.read_text())["segments"]:
                out.add(e["file"])
                if e.get("del_file"):
                    out.add(e["del_file"])
    return out


def _index_files(path) -> set[str]:
    return {p.name for p in path.iterdir() if p.is_file()}


def test_the_next_commit_removes_what_a_failed_write_left(tmp_path):
    path = tmp_path / "ix"
    ix = EngineIndex.create(path, IndexSchema())
    _add(ix, [f"a{i}" for i in range(10)])
    ix.delete(["a3"])
    _add(ix, [f"b{i}" for i in range(10)])
    gen = ix.generation
    # what a writer killed (or failing) between writing its files and committing leaves behind,
    # made while this writer is open, so only its next commit can clean them
    orphans = ["seg-000230.seg", f"seg-000001.del.{gen + 5}", ".tmp-seg-000231.seg.x1"]
    for name in orphans:
        (path / name).write_bytes(b"left by a killed writer")
    (path / "notes.txt").write_text("not the index's")
    (path / "dense").mkdir()  # sidecar folders are their owners' business
    assert set(orphans) <= set(check_index(path)["orphans"]) | {orphans[2]}

    _add(ix, [f"c{i}" for i in range(10)])  # the next commit
    names = _index_files(path)
    assert not set(orphans) & names, "a commit kept files no manifest references"
    assert names - {"notes.txt"} <= _referenced(path)
    assert "notes.txt" in names and (path / "dense").is_dir()
    ids = [f"{p}{i}" for p in "abc" for i in range(10)]
    assert ix.contains(ids) == set(ids) - {"a3"}
    ix.close()
    # the previous commit is still whole: a roll back to it is possible
    report = check_index(path)
    assert report["ok"] and report["orphans"] == []
    prev = json.loads((path / "manifest.prev.json").read_text())
    assert all((path / e["file"]).is_file() for e in prev["segments"])


def test_readers_keep_answering_while_commits_delete_old_files(tmp_path):
    path = tmp_path / "ix"
    w = EngineIndex.create(path, IndexSchema())
    _add(w, [f"a{i}" for i in range(20)])
    reader = EngineIndex.open(path)
    q = SearchRequest([SparseClause("image", SparseVector.from_arrays(np.arange(2000, 2050), np.ones(50)))], top_k=100)
    assert len(reader.search(q).hits) == 20
    old = reader.snapshot()  # what a search in flight holds: the segments of one commit
    first = old.segments[0].seg.path
    w.max_segments = 1
    for b in range(3):  # merges: the first segment is the previous commit's, then no commit's
        _add(w, [f"b{b}-{i}" for i in range(5)])
        w.delete([f"a{b}"])
        assert len(reader.search(q).hits) == 20 - (b + 1) + 5 * (b + 1)  # each search sees the newest commit
    assert not first.exists()  # gone with the commit that stopped referencing it ...
    seg = old.segments[0].seg  # ... yet the snapshot's mapped segment still reads
    assert [seg.doc_id(d) for d in old.live_docs(0)[:3]] == ["a0", "a1", "a2"]
    assert _index_files(path) <= _referenced(path)
    reader.close()
    w.close()


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from stair_es.engine import EngineIndex
    path, start = sys.argv[1], int(sys.argv[2])
    ix = EngineIndex.open(path, writable=True)
    ix.max_segments = 2  # merge often: kills land in merges too
    for b in range(start, start + 400):
        if b % 3 == 1:
            ix.delete([f"b{b - 1}-0"])
        n = 50
        ix.add_arrays([f"b{b}-{i}" for i in range(n)],
                      {"image": (np.arange(n + 1) * 4,
                                 (2000 + (np.arange(n) % 90)[:, None] + np.arange(4)[None, :]).ravel().astype(np.int32),
                                 np.ones(4 * n, np.float32))})
        print(b, flush=True)
    """
)


def test_killed_writers_leave_nothing_behind_after_the_next_commit(tmp_path):
    path = tmp_path / "crash"
    EngineIndex.create(path, IndexSchema()).close()
    rng = np.random.default_rng(1)
    acked: list[int] = []
    start = 0
    for _ in range(4):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(start)], stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        if not first:
            pytest.fail(f"the writer exited with status {p.wait()} before its first batch")
        time.sleep(float(rng.uniform(0.0, 0.4)))
        p.send_signal(signal.SIGKILL)
        rest, _ = p.communicate()
        acked += [int(first)] + [int(x) for x in rest.split()]
        start += 1000
    ix = EngineIndex.open(path, writable=True)
    _add(ix, ["last"])  # the next commit
    assert _index_files(path) <= _referenced(path), "files of killed writers survived the next commit"
    deleted = {f"b{b - 1}-0" for b in range(10_000) if b % 3 == 1}
    ids = [f"b{b}-{i}" for b in acked for i in range(50)]
    missing = set(ids) - ix.contains(ids) - deleted
    assert not missing, f"acknowledged documents lost: {sorted(missing)[:5]}"
    assert check_index(path)["ok"]
    ix.close()
