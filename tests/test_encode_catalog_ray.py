"""`stair-es encode-catalog --engine ray` on a local Ray (``ray.init(num_cpus=2)``): the same
shards as the local process pool, GPU option plumbing, a SIGKILLed driver resumed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pyarrow", reason="Parquet shards need the 'distributed' extra (pyarrow)")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the test Ray listens on 127.0.0.1 only (before import)
ray = pytest.importorskip("ray", reason="--engine ray needs the 'distributed' extra (ray)")
import pyarrow.parquet as pq  # noqa: E402

from encode_catalog_util import add_poison, broken_encoder, color_encoder, dying_color_encoder, make_catalog  # noqa: E402

from stair_es import get_backend  # noqa: E402
from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog  # noqa: E402
from stair_es.errors import InvalidInputError  # noqa: E402
from stair_es.ingest import ingest_catalog  # noqa: E402

TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def local_ray():
    if ray.is_initialized():
        ray.shutdown()
    # the test helpers (tests/) must import in Ray's worker processes too
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}})
    yield
    ray.shutdown()


def rows_of(out: Path) -> dict[str, dict]:
    rows = {}
    for f in sorted(out.glob("part-*.parquet")):
        for r in pq.read_table(f).to_pylist():
            rows[r["id"]] = r
    return rows


def test_ray_shards_equal_the_local_pools_and_ingest(local_ray, tmp_path):
    cat = make_catalog(tmp_path / "cat", n_drawings=6, bad=True)
    opts = dict(workers=2, shard_size=4, batch_size=4)
    local = encode_catalog(str(cat), str(tmp_path / "local"), color_encoder, EncodeCatalogOptions(engine="local", **opts))
    rep = encode_catalog(str(cat), str(tmp_path / "ray"), color_encoder, EncodeCatalogOptions(engine="ray", **opts))
    assert rep.summary()["documents"] == local.summary()["documents"] > 0
    assert {f["id"] for f in rep.failures} == {"notes.jpg", "empty.png", "cut.jpg"}
    a, b = rows_of(tmp_path / "local"), rows_of(tmp_path / "ray")
    assert a == b  # ids, captions, metadata, token ids and float32 weights, row for row
    assert sorted(e["shard"] for e in rep.shards) == list(range(rep.shards_total))
    # resuming a finished folder does nothing; ingesting it gives every document once
    again = encode_catalog(str(cat), str(tmp_path / "ray"), color_encoder, EncodeCatalogOptions(engine="ray", **opts))
    assert again.summary()["written"] == 0 and again.shards_done_before == rep.shards_total
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", tmp_path / "ray", None)
    assert r.summary()["ok"] == len(b) and {f.id for f in r.failures} == {"notes.jpg", "empty.png", "cut.jpg"}


def test_a_shard_whose_actor_dies_is_retried_max_retries_times_then_its_inputs_are_reported(local_ray, tmp_path):
    import functools

    src = make_catalog(tmp_path / "cat", n_drawings=4)
    add_poison(src, "drawing-1b.png")  # the actor encoding it is SIGKILLed every time
    out, attempts = tmp_path / "out", tmp_path / "attempts.txt"
    expected = {p.name for p in src.iterdir() if p.suffix in (".jpg", ".png")}
    rep = encode_catalog(str(src), str(out), functools.partial(dying_color_encoder, attempts_file=str(attempts)),
                         EncodeCatalogOptions(engine="ray", workers=2, shard_size=2, batch_size=2, max_retries=1))
    assert len(attempts.read_text().split()) == 2  # tried, retried once, then given up
    assert len(rep.failed_shards) == 1
    reason = rep.failed_shards[0]["error"]
    assert "died 2 time(s)" in reason and "run encode-catalog again" in reason
    lost = {f["id"] for f in rep.failures}
    assert "drawing-1b.png" in lost and len(lost) == 2 and all(f["reason"] == reason for f in rep.failures)
    ids = list(rows_of(out))
    assert set(ids) == expected - lost and rep.summary()["written"] == rep.shards_total - 1
    failed = [r for f in out.glob("failures-*.parquet") for r in pq.read_table(f).to_pylist()]
    assert {r["id"] for r in failed} == lost


def test_an_encoder_that_cannot_load_stops_the_run_with_its_reason(local_ray, tmp_path):
    from stair_es.distributed.pipeline import WorkerSetupError

    src = make_catalog(tmp_path / "cat", n_drawings=2)
    with pytest.raises(WorkerSetupError, match="could not load the encoder: FileNotFoundError: model.onnx"):
        encode_catalog(str(src), str(tmp_path / "out"), broken_encoder,
                       EncodeCatalogOptions(engine="ray", workers=1, shard_size=2, max_retries=1))


def test_gpus_per_worker_reaches_the_actors_and_is_checked_against_the_cluster(local_ray, tmp_path, monkeypatch):
    cat = make_catalog(tmp_path / "cat", n_drawings=2)
    opts = EncodeCatalogOptions(engine="ray", workers=1, shard_size=4, gpus_per_worker=1)
    with pytest.raises(InvalidInputError, match="the Ray cluster has 0 GPU"):
        encode_catalog(str(cat), str(tmp_path / "o"), color_encoder, opts)
    # on a cluster with a GPU, each actor asks Ray for it
    seen = {}

    class Stop(Exception):
        pass

    def fake_options(self, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 1.0})
    monkeypatch.setattr(ray.actor.ActorClass, "options", fake_options)
    with pytest.raises(Stop):
        encode_catalog(str(cat), str(tmp_path / "o2"), color_encoder, opts)
    assert seen["num_gpus"] == 1 and seen["num_cpus"] == 1 and seen["max_task_retries"] == 0


DRIVER = textwrap.dedent("""
    import functools, os, sys, ray
    from encode_catalog_util import slow_color_encoder
    from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    rep = encode_catalog(sys.argv[1], sys.argv[2], functools.partial(slow_color_encoder, delay=0.2),
                         EncodeCatalogOptions(engine="ray", workers=2, shard_size=2, batch_size=2))
    print("DONE", rep.summary()["written"], rep.summary()["resumed"], flush=True)
""")


def _kill_tree(pid: int) -> None:
    """SIGKILL a driver and every process it started (its local Ray), by pid."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


@pytest.mark.slow
def test_sigkill_of_a_ray_driver_then_resume(tmp_path):
    pytest.importorskip("psutil")
    src = make_catalog(tmp_path / "cat", n_drawings=12)
    out = tmp_path / "out"
    expected = {p.name for p in src.iterdir() if p.suffix in (".jpg", ".png")}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-c", DRIVER, str(src), str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.time() + 180
    manifest = out / "_manifest"
    while proc.poll() is None and time.time() < deadline and len(list(manifest.glob("*.json")) if manifest.is_dir() else []) < 2:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be killed"
    done_before = len(list(manifest.glob("*.json")))
    _kill_tree(proc.pid)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=300)
    finally:
        _kill_tree(proc.pid)
    assert proc.returncode == 0, stdout
    written, resumed = map(int, stdout.split("DONE", 1)[1].split()[:2])
    assert resumed >= done_before >= 2 and written + resumed == -(-len(expected) // 2)
    ids = [r["id"] for f in sorted(out.glob("part-*.parquet")) for r in pq.read_table(f).to_pylist()]
    assert len(ids) == len(set(ids)) and set(ids) == expected


NICE_DRIVER = textwrap.dedent("""
    import os, sys
    from stair_es.distributed.pipeline import start_ray
    ray = start_ray(num_cpus=1)

    @ray.remote(num_cpus=1)
    def niceness():
        return os.nice(0)

    print("NICE", os.nice(0), ray.get(niceness.remote()), flush=True)
""")


@pytest.mark.process
def test_a_local_ray_started_by_encode_catalog_runs_its_workers_at_the_callers_niceness(tmp_path):
    # Ray's default (15) leaves its workers the CPU that other jobs of the machine do not want
    argv = ["nice", "-n", "3", sys.executable, "-c", NICE_DRIVER]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=180, start_new_session=True)
    except FileNotFoundError:
        pytest.skip("no `nice` command on this machine")
    assert "NICE" in out.stdout, out.stderr[-2000:]
    driver, worker = map(int, out.stdout.split("NICE", 1)[1].split()[:2])
    assert worker == driver >= 3


def test_the_local_ray_listens_on_loopback_only(local_ray):
    psutil = pytest.importorskip("psutil")
    mine = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    addrs = {c.laddr.ip for c in psutil.net_connections(kind="inet") if c.status == "LISTEN" and c.pid in mine}
    assert addrs and all(a in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for a in addrs), addrs
