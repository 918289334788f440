"""The CLI as a user runs it: separate processes, a kill -9 in the middle of an ingest, a held lock."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fakes import writer_lock_held
from stair_es.engine import EngineIndex

pytestmark = pytest.mark.process
STAIR_ES = [sys.executable, "-m", "stair_es.cli.main"]


def _manifest(path: Path, n: int) -> Path:
    rng = np.random.default_rng(0)
    words = ["dog", "cat", "beach", "park", "red", "blue", "shoe", "hat", "sea", "tree"]
    with path.open("w") as fh:
        for i in range(n):
            picks = rng.choice(len(words), size=3, replace=False)
            vec = {words[j]: round(float(rng.uniform(0.1, 2.0)), 3) for j in picks}
            fh.write(json.dumps({"id": f"doc-{i:05d}", "vectors": {"image": vec}, "metadata": {"n": i}}) + "\n")
    return path


def _count(index_dir: Path) -> int:
    if not (index_dir / "manifest.json").exists():
        return 0
    ix = EngineIndex.open(index_dir)
    try:
        return ix.stats()["docs"]
    finally:
        ix.close()


def test_kill_9_during_ingest_then_resume_without_duplicates(tmp_path):
    n = 4000
    manifest = _manifest(tmp_path / "m.jsonl", n)
    home = tmp_path / "home"
    cmd = STAIR_ES + ["ingest", "big", str(manifest), "--batch-size", "20", "--home", str(home), "--no-progress"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300  # the first batch also compiles numba kernels on a fresh machine
    while _count(home / "big") < 200 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)
    if p.poll() is not None:
        pytest.skip("ingest finished before it could be interrupted (machine too fast for this test)")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    before = _count(home / "big")
    assert 0 < before < n

    r = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)["summary"]
    assert summary["skipped"] == before and summary["ok"] == n - before and summary["failed"] == 0
    assert _count(home / "big") == n  # every document once


def test_ingest_into_an_index_locked_by_another_writer(tmp_path):
    home = tmp_path / "home"
    manifest = _manifest(tmp_path / "m.jsonl", 5)
    subprocess.run(STAIR_ES + ["index", "create", "shop", "--encoder", "none", "--home", str(home)], check=True,
                   capture_output=True)
    with writer_lock_held(home / "shop"):
        r = subprocess.run(STAIR_ES + ["ingest", "shop", str(manifest), "--home", str(home)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 4
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "lock" in lines[0] and "Traceback" not in r.stderr
        # searching needs no lock
        s = subprocess.run(STAIR_ES + ["search", "shop", "--tokens", '{"dog": 1}', "--home", str(home)],
                           capture_output=True, text=True, timeout=120)
        assert s.returncode == 0, s.stderr


def test_missing_and_incompatible_index_directories(tmp_path):
    home = tmp_path / "home"
    r = subprocess.run(STAIR_ES + ["search", "nope", "--tokens", '{"dog": 1}', "--home", str(home)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "nope" in r.stderr and "Traceback" not in r.stderr
    subprocess.run(STAIR_ES + ["index", "create", "old", "--encoder", "none", "--home", str(home)], check=True,
                   capture_output=True)
    mpath = home / "old" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["format_version"] = 999
    mpath.write_text(json.dumps(m))
    r = subprocess.run(STAIR_ES + ["index", "stats", "old", "--home", str(home)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "999" in r.stderr and len(r.stderr.strip().splitlines()) == 1
