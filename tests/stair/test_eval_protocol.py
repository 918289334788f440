"""The standard retrieval protocol (COCO 5K / Flickr30K 1K): each caption belongs to one image,
t2i over all captions, i2t right when any of the image's captions ranks high; ties count
against the query; `stair-es eval` prints the paper's table layout."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner
from PIL import Image

from stair_es.stair.config import load_config
from stair_es.stair.datasets import KarpathySource
from stair_es.stair.evaluate import evaluate_retrieval
from stair_es.stair.train import new_model

torch.set_num_threads(1)
RGB = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 255, 0)}


def _karpathy(tmp_path, captions):
    root = tmp_path / "flickr30k-images"
    root.mkdir()
    images = []
    for i, (color, caps) in enumerate(captions.items()):
        Image.new("RGB", (16, 16), RGB[color]).save(root / f"{i}.jpg")
        images.append({"filename": f"{i}.jpg", "imgid": i, "split": "test", "sentences": [{"raw": c} for c in caps]})
    images.append({"filename": "gone.jpg", "imgid": 9, "split": "test", "sentences": [{"raw": "a red thing"}]})
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"dataset": "flickr30k", "images": images}))
    return path, root


def _colour_model(mode="colour"):
    """A tiny STAIR model whose encoders are replaced by known functions of the input."""
    m = new_model(load_config("tiny"), "cpu")
    ids = {c: m.vocab.id(c) for c in RGB}
    V = m.config.vocab_size

    def enc_image(pix):
        out = torch.zeros(pix.shape[0], V)
        if mode == "flat":
            return out + 1.0
        for i, p in enumerate(pix):
            ch = int(p.mean((1, 2)).argmax())
            out[i, ids[("red", "green", "blue")[ch]]] = 1.0
        return out

    def enc_text(input_ids, attention_mask, mask_to_input=False):
        out = torch.zeros(input_ids.shape[0], V)
        if mode == "flat":
            return out + 1.0
        for i, row in enumerate(input_ids):
            for c, t in ids.items():
                if t in row.tolist():
                    out[i, t] = 1.0
        return out

    m.encode_image, m.encode_text = enc_image, enc_text
    return m


def test_hand_computed_recall(tmp_path):
    path, root = _karpathy(tmp_path, {"red": ["red", "blue"], "blue": ["blue", "green"], "green": ["green", "red"]})
    res = evaluate_retrieval(_colour_model(), KarpathySource(path, root, ("test",)))
    assert (res["n_images"], res["n_captions"]) == (3, 6)
    # t2i: the three first captions rank their image 1st, the three second ones tie at 0 with all -> rank 3
    assert (res["t2i_r@1"], res["t2i_r@5"]) == (0.5, 1.0)
    # i2t: every image ties its best caption (score 1) with one caption of another image -> rank 2
    assert (res["i2t_r@1"], res["i2t_r@5"]) == (0.0, 1.0)
    assert res["data"]["skipped_count"] == 1  # gone.jpg is listed but missing


def test_perfect_and_flat_models(tmp_path):
    path, root = _karpathy(tmp_path, {"red": ["red", "a red one"], "blue": ["blue"], "green": ["green"]})
    perfect = evaluate_retrieval(_colour_model(), KarpathySource(path, root, ("test",)))
    assert perfect["t2i_r@1"] == perfect["i2t_r@1"] == 1.0
    flat = evaluate_retrieval(_colour_model("flat"), KarpathySource(path, root, ("test",)))
    assert flat["t2i_r@1"] == flat["i2t_r@1"] == 0.0  # everything ties: no credit


def test_real_tiny_model_and_cli_table(tmp_path):
    path, root = _karpathy(tmp_path, {"red": ["a red square"], "blue": ["a blue square"], "green": ["a green square"]})
    m = new_model(load_config("tiny"), "cpu")
    m.save_pretrained(tmp_path / "model")
    from stair_es.cli.main import cli

    r = CliRunner().invoke(cli, ["eval", str(tmp_path / "model"), str(path), "--images", str(root), "--prompt", "a photo of "])
    assert r.exit_code == 0, r.output
    assert "Flickr30K 3: 3 images, 3 captions" in r.output and "text -> image" in r.output and "R@10" in r.output
    assert "1 images skipped" in r.output
    r = CliRunner().invoke(cli, ["eval", str(tmp_path / "model"), str(path), "--images", str(root), "--json"])
    res = json.loads(r.output)
    assert set(res) >= {"t2i_r@1", "t2i_r@5", "t2i_r@10", "i2t_r@1", "i2t_r@5", "i2t_r@10"}
    r = CliRunner().invoke(cli, ["eval", str(tmp_path / "model"), str(path)])
    assert r.exit_code != 0 and "give the image folder" in r.output
