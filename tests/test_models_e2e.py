"""A pretrained model carried into a machine with no network, end to end.

On the "online" home a tiny random CLIP checkpoint is served by the local fake hub, pulled
and exported (ONNX towers and vocabulary matrix included); on a second, empty home with the
network disabled it is imported, then ingest, search and `serve` use it by its id, the index
records id, revision and checksum, a query with another model is refused, and search and
ingest run in a process where torch and transformers cannot be imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
skd = pytest.importorskip("skimage.data", reason="scikit-image ships the sample photos")

from stair_es import models  # noqa: E402
from test_models import FakeHub, no_network  # noqa: E402,F401 - fixture

CAPTIONS = {"chelsea": "a cat", "coffee": "a cup of coffee", "astronaut": "an astronaut"}


def cli(*args):
    from stair_es.cli.main import cli as main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def ok_json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root_dir = str(Path(__file__).resolve().parents[1])  # benchmarks/ (on the path under `python -m pytest`)
    if root_dir not in sys.path:
        sys.path.insert(0, root_dir)
    from benchmarks.clip_models import make_clip

    root = tmp_path_factory.mktemp("carried-models")
    return make_clip(root / "tiny-clip"), make_clip(root / "other-clip", seed=1)


@pytest.fixture
def photos(tmp_path):
    from PIL import Image

    folder = tmp_path / "photos"
    folder.mkdir()
    for name, caption in CAPTIONS.items():
        Image.fromarray(getattr(skd, name)()).convert("RGB").save(folder / f"{name}.jpg", quality=90)
        (folder / f"{name}.txt").write_text(caption)
    return folder


@pytest.mark.slow
def test_import_ingest_search_and_serve_with_the_network_disabled(tmp_path, monkeypatch, checkpoints, photos, no_network):
    import huggingface_hub

    tiny, other = checkpoints
    hub = FakeHub(tmp_path / "hub", tmp_path / "hf-cache")
    hub.add("acme/tiny-clip", {p.name: p.read_bytes() for p in tiny.iterdir() if p.is_file()})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
    monkeypatch.setattr(huggingface_hub, "model_info", hub.model_info)

    # --- the machine with internet: pull and export (derived files made in the test run's model cache)
    monkeypatch.setenv("STAIR_ES_HOME", str(tmp_path / "online"))
    monkeypatch.delenv("STAIR_ES_MODEL_STORE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    ok_json(cli("models", "pull", "acme/tiny-clip", "--encoder", "clip-vocab", "--json"))
    bundle = tmp_path / "carry" / "tiny-clip.tar"
    bundle.parent.mkdir()
    manifest = ok_json(cli("models", "export", "acme/tiny-clip", str(bundle), "--json"))
    derived = sorted(r for r in manifest["files"] if r.startswith("cache/"))
    assert any(r.endswith(".onnx") for r in derived) and any(r.endswith(".npy") for r in derived)

    # --- the air-gapped machine: empty home and model cache, no hub, no hub cache, offline
    airgapped = tmp_path / "airgapped"
    env = {"STAIR_ES_HOME": str(airgapped), "STAIR_ES_MODEL_CACHE": str(airgapped / "_models"),
           "HF_HUB_OFFLINE": "1", "STAIR_ES_OFFLINE": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    hub.reachable = False
    shutil.rmtree(hub.cache)
    entry = ok_json(cli("models", "import", str(bundle), "--json"))
    assert entry["id"] == "acme/tiny-clip" and entry["kind"] == "clip-vocab"
    installed = {p.name: p.stat().st_mtime_ns for p in (airgapped / "_models").iterdir() if p.is_file()}
    assert {r[len("cache/"):] for r in derived} <= set(installed)

    report = cli("ingest", "photos", str(photos), "--encoder", "clip-vocab", "--model", "acme/tiny-clip", "--no-progress")
    assert report.exit_code == 0, report.output
    assert "ingested 3" in report.output
    hits = ok_json(cli("search", "photos", "a cup of coffee", "--json"))
    assert hits["hits"][0]["id"] == "coffee.jpg"
    # the derived files carried in were used, not made again
    assert {p.name: p.stat().st_mtime_ns for p in (airgapped / "_models").iterdir()
            if p.is_file() and p.name in installed and p.name != "weights-digests.json"} == \
           {k: v for k, v in installed.items() if k != "weights-digests.json"}

    # the index records the model's id, revision and checksum
    stats = ok_json(cli("index", "stats", "photos", "--json"))
    assert json.dumps(stats).count(manifest["sha256"]) >= 1
    assert manifest["revision"] in json.dumps(stats) and "acme/tiny-clip" in json.dumps(stats)

    # another model is refused at search time (--force overrides)
    refused = cli("search", "photos", "a cat", "--model", str(other))
    assert refused.exit_code != 0 and "--force" in refused.output
    assert cli("search", "photos", "a cat", "--model", str(other), "--force").exit_code == 0

    # `serve` uses the imported model too
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from stair_es.serve.app import create_app
    from stair_es.serve.service import ServeConfig

    config = ServeConfig(backend="embedded", backend_options={"home": str(airgapped)}, encoder="clip-vocab",
                         encoder_options={"model": "acme/tiny-clip"}, default_index="photos", image_roots=[str(photos)])
    with TestClient(create_app(config), base_url="http://localhost") as client:  # a name the server answers to by default
        r = client.post("/v1/search", json={"index": "photos", "text": "a cup of coffee", "top_k": 2})
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "coffee.jpg"
        r = client.post("/v1/encode", json={"inputs": [{"text": "a cat"}, {"image": {"path": "chelsea.jpg"}}]})
        assert r.status_code == 200, r.text
        assert all(res["tokens"] for res in r.json()["results"])
        # the Elasticsearch and OpenSearch inference endpoints encode with it too
        r = client.post("/v1/elasticsearch/sparse_embedding", json={"input": ["chelsea.jpg"], "input_type": "image"})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["sparse_embeddings"][0]["embedding"]
        r = client.post("/v1/opensearch/sparse_encoding", json=["a cup of coffee"])
        assert r.status_code == 200 and r.json()[0], r.text

    # search and ingest in a process that cannot import torch or transformers (nor reach a network)
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "import socket; socket.socket.connect = None; "
            "from stair_es.cli.main import main; sys.argv[0] = 'stair-es'; main()")
    run_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(sys.path)}
    for args in (["search", "photos", "an astronaut", "--json"],
                 ["ingest", "again", str(photos), "--encoder", "clip-vocab", "--model", "acme/tiny-clip", "--no-progress"]):
        done = subprocess.run([sys.executable, "-c", code, *args], env=run_env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert json.loads(subprocess.run([sys.executable, "-c", code, "search", "again", "an astronaut", "--json"], env=run_env,
                                     capture_output=True, text=True, timeout=300).stdout)["hits"][0]["id"] == "astronaut.jpg"
    assert models.find_entry("acme/tiny-clip").folder.is_relative_to(airgapped)
