"""A trained STAIR model -- including one on pretrained towers -- exports to ONNX (image and
text towers separately) and ingest/search use the ONNX Runtime path with the same vectors."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from click.testing import CliRunner
from PIL import Image

from stair_es.stair.config import load_config
from stair_es.stair.encoder import StairEncoder
from stair_es.stair.train import new_model
from stair_es.vocab import default_vocabulary

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def towered_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("towers")
    torch.manual_seed(0)
    bert = tf.BertForMaskedLM(tf.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                             intermediate_size=64, max_position_embeddings=128))
    bert.save_pretrained(d / "bert")
    (d / "bert" / "vocab.txt").write_text("\n".join(default_vocabulary().tokens) + "\n", encoding="utf-8")
    clip = tf.CLIPVisionModel(tf.CLIPVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                                  image_size=32, patch_size=8))
    clip.save_pretrained(d / "clip")
    m = new_model(load_config("tiny"), "cpu", text_tower=str(d / "bert"), image_tower=str(d / "clip"))
    return m.save_pretrained(d / "stair")


def _images():
    return [Image.new("RGB", (40, 30), (200, 20, 20)), Image.new("RGB", (32, 32), (10, 10, 220)), Image.new("RGB", (20, 50), (0, 160, 0))]


def test_onnx_towers_match_pytorch(towered_model, tmp_path, monkeypatch):
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "cache"))
    onnx = StairEncoder(model=str(towered_model), device="cpu", runtime="onnx")
    ref = StairEncoder(model=str(towered_model), device="cpu", runtime="torch")
    texts = ["a red square", "a small blue thing on a table", "green"]
    for a, b in zip(onnx.encode_images(_images()) + onnx.encode_texts(texts), ref.encode_images(_images()) + ref.encode_texts(texts)):
        da, db = a.to_token_map(), b.to_token_map()
        keys = set(da) | set(db)
        assert max(abs(da.get(k, 0.0) - db.get(k, 0.0)) for k in keys) < 1e-3
    exported = sorted(p.name for p in (tmp_path / "cache").rglob("*.onnx"))
    assert len(exported) == 2, exported  # image and text towers, separately


@pytest.mark.slow
def test_ingest_and_search_run_through_onnx(towered_model, tmp_path, monkeypatch):
    from stair_es.cli.main import cli

    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, im in enumerate(_images()):
        im.save(folder / f"{i}.png")
    home = tmp_path / "home"
    opts = ["--encoder", "stair", "--model", str(towered_model), "--encoder-option", "runtime=onnx", "--home", str(home)]
    r = CliRunner().invoke(cli, ["ingest", "pics", str(folder), *opts, "--no-progress"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["search", "pics", "a red square", "--json", *opts])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)
    assert len(hits["hits"] if isinstance(hits, dict) else hits) >= 1
    assert len(list((tmp_path / "cache").rglob("*.onnx"))) == 2
