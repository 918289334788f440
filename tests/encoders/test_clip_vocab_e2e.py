"""clip-vocab end to end through the CLI: ingest a folder, search it, refuse another model."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from benchmarks.clip_models import make_clip, make_siglip  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip-models-e2e")
    return {"clip": make_clip(root / "clip"), "siglip": make_siglip(root / "siglip")}


@pytest.fixture
def catalog(tmp_path, photos):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name, image in photos.items():
        image.save(folder / f"{name}.jpg", quality=92)
        (folder / f"{name}.txt").write_text(f"a photo called {name}")
    return folder


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # stderr may hold log lines of the first export


def test_ingest_search_and_refuse_another_model(run, models, catalog, photos):
    clip = str(models["clip"])
    _json(run("ingest", "pics", str(catalog), "--encoder", "clip-vocab", "--model", clip, "--json"))
    info = _json(run("index", "stats", "pics", "--json"))
    assert "clip-vocab" in json.dumps(info)
    # every image got words; a word of one image finds that image first
    doc = _json(run("get", "pics", "chelsea.jpg", "--json"))
    top = next(iter(doc["top_tokens"]["image"]))
    assert doc["nnz"]["image"] > 0
    hits = _json(run("search", "pics", top, "--json"))
    assert hits["hits"][0]["id"] == "chelsea.jpg"
    # query by example: the same picture comes first
    hits = _json(run("search", "pics", "--image", str(catalog / "coffee.jpg"), "--json"))
    assert hits["hits"][0]["id"] == "coffee.jpg"
    # another model's words are not comparable: refused with the way out, unless --force
    refused = run("search", "pics", top, "--model", str(models["siglip"]))
    assert refused.exit_code != 0 and "--force" in refused.output and "clip-vocab" in refused.output
    forced = run("search", "pics", top, "--model", str(models["siglip"]), "--force", "--json")
    assert forced.exit_code == 0, forced.output
    # and ingesting with another model into the same index is refused too
    again = run("ingest", "pics", str(catalog), "--encoder", "clip-vocab", "--model", str(models["siglip"]))
    assert again.exit_code != 0


def test_encode_shows_words_and_projection(run, models):
    out = _json(run("encode", "--text", "a red dog", "--encoder", "clip-vocab", "--model", str(models["siglip"]),
                    "--encoder-option", "threshold=0", "--json"))
    [item] = out
    assert set(item["sources"]) == {"words", "projection"}
    assert {"red", "dog"} <= set(item["sources"]["words"])
    table = run("encode", "--text", "a red dog", "--encoder", "clip-vocab", "--model", str(models["siglip"]),
                "--encoder-option", "threshold=0")
    assert table.exit_code == 0 and "words" in table.output and "projection" in table.output
