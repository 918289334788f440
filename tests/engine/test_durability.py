"""Crash safety (SIGKILL during ingest), the writer lock, and readers during writes."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from fakes import writer_lock_held
from stair_es.engine import EngineIndex
from stair_es.errors import IndexLockedError
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector

PY = sys.executable

# Ingests batches forever (bounded), printing each acknowledged batch number after add() returns.
WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from stair_es.engine import EngineIndex
    from stair_es.schema import Document
    from stair_es.sparse import SparseVector
    path, start = sys.argv[1], int(sys.argv[2])
    ix = EngineIndex.open(path, writable=True)
    ix.max_segments = 3  # merge often, so kills land inside merges too
    rng = np.random.default_rng(start)
    for b in range(start, start + 400):
        docs = []
        for i in range(20):
            toks = rng.choice(np.arange(2000, 2400), size=8, replace=False)
            docs.append(Document(f"b{b}-{i}", {"image": SparseVector.from_arrays(toks, np.ones(8))}, {"batch": b}))
        if b % 7 == 3:
            ix.delete([f"b{b - 1}-0"])
        ix.add(docs)
        print(b, flush=True)
    """
)


def _ingest_and_kill(path, start: int, delay: float) -> list[int]:
    """Run the writer, SIGKILL it ``delay`` seconds after its first acknowledged batch.

    Counting from the first acknowledgement, not from the start, keeps the kill inside the
    ingest loop on a fresh machine, where the first batch also compiles numba's kernels.
    """
    p = subprocess.Popen([PY, "-c", WRITER, str(path), str(start)], stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    first = threading.Event()

    def read() -> None:
        for line in p.stdout:
            acked.append(int(line))
            first.set()

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.monotonic() + 180
    while not first.wait(0.2) and time.monotonic() < deadline:
        if p.poll() is not None:  # the writer died before acknowledging anything: fail now, not in minutes
            reader.join()
            pytest.fail(f"the writer process exited with status {p.returncode} before its first batch (see stderr above)")
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    reader.join()
    return acked


def test_sigkill_keeps_every_acknowledged_batch(tmp_path):
    path = tmp_path / "crash"
    EngineIndex.create(path, IndexSchema(fields={"batch": "number"})).close()
    rng = np.random.default_rng(0)
    all_acked: list[int] = []
    deleted: set[str] = set()
    start = 0
    for round_ in range(4):
        acked = _ingest_and_kill(path, start, delay=float(rng.uniform(0.05, 1.5)))
        all_acked += acked
        # the next batch deletes doc 0 of a batch b with (b + 1) % 7 == 3, in its own commit
        deleted |= {f"b{b}-0" for b in acked if (b + 1) % 7 == 3}
        ix = EngineIndex.open(path, writable=True)  # cleans leftovers, must not raise
        assert not [p for p in path.iterdir() if p.name.startswith(".tmp-")]
        ids = [f"b{b}-{i}" for b in all_acked for i in range(20)]
        present = ix.contains(ids)
        missing = set(ids) - present - deleted
        assert not missing, f"acknowledged docs lost after kill #{round_}: {sorted(missing)[:5]}"
        # no partial batch: every batch is there entirely (except its deleted doc) or not at all
        st = ix.stats()
        everything = ix.contains([f"b{b}-{i}" for b in range(start, start + 400) for i in range(20)])
        per_batch = {}
        for d in everything:
            b = int(d[1:].split("-")[0])
            per_batch[b] = per_batch.get(b, 0) + 1
        for b, c in per_batch.items():
            assert c in (19, 20), f"batch {b} partially visible ({c} docs)"
        # the index answers searches consistently with its document count
        q = SearchRequest([SparseClause("image", SparseVector.from_arrays(np.arange(2000, 2400), np.ones(400)))], top_k=10_000)
        r = ix.search(q)
        assert len(r.hits) == min(st["docs"], 10_000) == len({h.id for h in r.hits})
        assert r.total in (None, st["docs"])
        ix.close()
        start = (max(all_acked) + 1 if all_acked else start) + 1000
    assert len(all_acked) > 0


def test_writer_lock_held_by_another_process(tmp_path):
    path = tmp_path / "locked"
    EngineIndex.create(path, IndexSchema()).close()
    with writer_lock_held(path):
        with pytest.raises(IndexLockedError, match=str(path)):
            EngineIndex.open(path, writable=True)
        EngineIndex.open(path).close()  # readers take no lock
    EngineIndex.open(path, writable=True).close()  # the lock died with the process


def test_reader_sees_only_committed_state_while_writer_ingests(tmp_path):
    path = tmp_path / "rw"
    w = EngineIndex.create(path, IndexSchema())
    w.max_segments = 3
    reader = EngineIndex.open(path)
    q = SearchRequest([SparseClause("image", SparseVector.from_arrays([2000], [1.0]))], top_k=10_000)
    errors: list[BaseException] = []
    stop = threading.Event()
    seen: list[int] = []

    def read_loop():
        try:
            while not stop.is_set():
                r = reader.search(q)
                n = len(r.hits)
                assert n % 25 == 0, f"reader saw a partial batch: {n} docs"
                assert not seen or n >= seen[-1]
                seen.append(n)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=read_loop)
    t.start()
    for b in range(40):
        ids = [f"{b}-{i}" for i in range(25)]
        indptr = np.arange(26)
        w.add_arrays(ids, {"image": (indptr, np.full(25, 2000, np.int32), np.ones(25, np.float32))})
    time.sleep(0.05)
    stop.set()
    t.join()
    assert not errors, errors[0]
    assert len(reader.search(q).hits) == 1000
    assert len(set(seen)) > 1
    w.close()
    reader.close()


def test_writable_open_removes_leftovers_only(tmp_path):
    path = tmp_path / "left"
    ix = EngineIndex.create(path, IndexSchema())
    ix.add_arrays(["a"], {"image": (np.array([0, 1]), np.array([2000], np.int32), np.ones(1, np.float32))})
    ix.close()
    (path / ".tmp-seg-000009.seg.abc").write_bytes(b"partial")
    (path / "seg-000009.seg").write_bytes(b"never committed")
    (path / "notes.txt").write_text("not ours")
    EngineIndex.open(path).close()  # readers never delete anything
    assert (path / "seg-000009.seg").exists()
    ix = EngineIndex.open(path, writable=True)
    names = {p.name for p in path.iterdir()}
    assert ".tmp-seg-000009.seg.abc" not in names and "seg-000009.seg" not in names
    assert "notes.txt" in names and ix.contains(["a"]) == {"a"}
    ix.close()
