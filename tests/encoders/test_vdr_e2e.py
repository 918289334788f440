"""vdr end to end through the CLI on the tiny reference checkpoint: ingest a folder, search it,
refuse another model; a hub id with no network says how to carry the model in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vdr_tiny"


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.fixture
def catalog(tmp_path):
    folder = tmp_path / "shapes"
    folder.mkdir()
    for png in FIXTURE.glob("*.png"):
        shutil.copy(png, folder / png.name)
    (folder / "red_square.txt").write_text("a red square")
    return folder


def test_ingest_search_and_refuse_another_model(run, catalog, tmp_path):
    model = tmp_path / "vdr_tiny"
    shutil.copytree(FIXTURE, model)
    out = _json(run("ingest", "shapes", str(catalog), "--encoder", "vdr", "--model", str(model), "--json"))
    assert out["summary"]["ok"] == 4 and out["summary"]["failed"] == 0
    info = _json(run("index", "stats", "shapes", "--json"))
    recorded = info["schema"]["encoder"]
    assert recorded["name"] == "vdr" and recorded["model"] == str(model.resolve()) and len(recorded["weights"]) == 16
    # every image got the checkpoint's top-k (48) tokens
    doc = _json(run("get", "shapes", "noise.png", "--json"))
    assert doc["nnz"]["image"] == 48
    # a text query is encoded by the recorded model (text tower) and finds images
    hits = _json(run("search", "shapes", "a red square", "--json"))
    assert hits["hits"], hits
    # query by example: the same picture comes first (its own vector is its best match)
    hits = _json(run("search", "shapes", "--image", str(catalog / "blue_circle.png"), "--json"))
    assert hits["hits"][0]["id"] == "blue_circle.png"
    # other weights are refused with the way out, unless --force
    other = tmp_path / "other"
    shutil.copytree(FIXTURE, other)
    import torch

    state = torch.load(other / "pytorch_model.bin", weights_only=True)
    state["encoder_q.ln.bias"] = state["encoder_q.ln.bias"] + 0.05
    torch.save(state, other / "pytorch_model.bin")
    refused = run("search", "shapes", "a red square", "--model", str(other))
    assert refused.exit_code != 0 and "--force" in refused.output and "vdr" in refused.output
    forced = run("search", "shapes", "a red square", "--model", str(other), "--force", "--json")
    assert forced.exit_code == 0, forced.output


def test_hub_id_offline_says_how_to_carry_it_in(run, monkeypatch, tmp_path):
    monkeypatch.setenv("STAIR_ES_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("STAIR_ES_MODEL_STORE", str(tmp_path / "store"))
    result = run("encode", "--text", "a red square", "--encoder", "vdr", "--model", "vsearch/vdr-cross-modal")
    assert result.exit_code != 0
    assert "models pull vsearch/vdr-cross-modal" in result.output and "models import" in result.output


def _hf_cache(root: Path, commit: str) -> Path:
    """The fixture as the Hugging Face client caches a hub repository (refs, snapshots -> blobs)."""
    import hashlib

    repo = root / "models--vsearch--vdr-cross-modal"
    snap = repo / "snapshots" / commit
    for d in (repo / "refs", snap, repo / "blobs"):
        d.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    for name in ("config.json", "pytorch_model.bin", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        data = (FIXTURE / name).read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / digest)
    return root


@pytest.mark.slow
def test_export_then_import_ingest_and_search_with_no_network_and_no_torch(tmp_path, catalog):
    """Machine A has the model (here: in its Hugging Face cache) and exports it; machine B,
    offline, imports the bundle, ingests and searches; its search imports neither torch nor
    transformers."""
    import os
    import subprocess
    import sys

    commit = "0123456789abcdef0123456789abcdef01234567"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("STAIR_ES_", "HF_"))}
    base.update(HF_HUB_OFFLINE="1", STAIR_ES_OFFLINE="1")
    driver = ("import json, sys\nfrom stair_es.cli.main import cli\n"
              "try:\n    cli(sys.argv[1:], standalone_mode=False)\n"
              "finally:\n    print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n")

    def stair(env: dict, *args: str) -> dict:
        out = subprocess.run([sys.executable, "-c", driver, *args], capture_output=True, text=True, env=env, timeout=600)
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    a = {**base, "STAIR_ES_HOME": str(tmp_path / "A"), "HF_HUB_CACHE": str(_hf_cache(tmp_path / "hf", commit))}
    stair(a, "models", "pull", "vsearch/vdr-cross-modal")
    stair(a, "models", "export", "vsearch/vdr-cross-modal", str(tmp_path / "vdr.tar"))
    b = {**base, "STAIR_ES_HOME": str(tmp_path / "B"), "HF_HOME": str(tmp_path / "B-hf")}
    stair(b, "models", "import", str(tmp_path / "vdr.tar"))
    assert len(list((tmp_path / "B" / "_models").glob("vdr-*.onnx"))) == 2
    stair(b, "ingest", "shapes", str(catalog), "--encoder", "vdr", "--model", "vsearch/vdr-cross-modal")
    imported = stair(b, "search", "shapes", "a red square", "--json")
    assert imported == {"torch": False, "transformers": False}


def test_serve_encodes_and_searches_with_vdr(run, catalog, tmp_path):
    """`stair-es serve` with the vdr encoder: /v1/encode gives the model's tokens, /v1/search
    encodes the query with the index's recorded vdr model."""
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx")
    from fastapi.testclient import TestClient

    from stair_es.serve.app import create_app
    from stair_es.serve.service import ServeConfig

    _json(run("ingest", "shapes", str(catalog), "--encoder", "vdr", "--model", str(FIXTURE), "--json"))
    home = next(p for p in tmp_path.iterdir() if p.name == "home")
    cfg = ServeConfig(backend="embedded", backend_options={"home": str(home)}, encoder="vdr",
                      encoder_options={"model": str(FIXTURE)}, image_roots=[str(catalog)], default_index="shapes")
    with TestClient(create_app(cfg), base_url="http://localhost") as client:  # a name the server answers to by default
        r = client.post("/v1/encode", json={"inputs": [{"text": "a red square"}, {"image": {"path": "noise.png"}}]})
        assert r.status_code == 200, r.text
        text, image = r.json()["results"]
        assert text["kind"] == "text" and {"red", "square"} <= set(text["tokens"])  # a text keeps its own words
        assert image["kind"] == "image" and len(image["tokens"]) == 48  # the checkpoint's top-k
        r = client.post("/v1/search", json={"text": "a red square", "top_k": 4})
        assert r.status_code == 200, r.text
        r = client.post("/v1/search", json={"image": {"path": "blue_circle.png"}, "top_k": 1})
        assert r.status_code == 200, r.text
        assert r.json()["hits"][0]["id"] == "blue_circle.png"
