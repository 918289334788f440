"""Mechanics of the STAIR model, training stages, save/load, encoder, localisation and CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from click.testing import CliRunner
from PIL import Image

from stair_es.encoders.base import get_encoder
from stair_es.errors import ModelError
from stair_es.sparse import SparseVector
from stair_es.stair.config import load_config
from stair_es.stair.data import load_caption_data
from stair_es.stair.localize import localize
from stair_es.stair.losses import flops_loss
from stair_es.stair.model import StairModel
from stair_es.stair.scenes import make_scenes
from stair_es.stair.train import TrainConfig, new_model, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    out = tmp_path_factory.mktemp("scenes")
    return make_scenes(out, n_train=40, n_test=12, seed=3, size=32)


@pytest.fixture(scope="module")
def data(scenes, cfg):
    return load_caption_data(scenes["train"], image_size=cfg.image_size)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data, cfg):
    out = tmp_path_factory.mktemp("model")
    model = new_model(cfg, "cpu", seed=0)
    train(model, data, TrainConfig(steps=(3, 3, 3), batch_size=8, log_every=1, checkpoint_every=0), out, progress=False)
    return out


def _batch(model, n=4):
    x = torch.randn(n, 3, model.config.image_size, model.config.image_size)
    ids, mask, _ = model.tokenize(["a small red circle", "a large blue square left of a red circle", "green", "a triangle"][:n])
    return x, ids, mask


def test_shapes_nonnegative_and_special_tokens_zero(cfg):
    m = new_model(cfg, "cpu")
    x, ids, mask = _batch(m)
    img, txt = m.encode_image(x), m.encode_text(ids, mask)
    assert img.shape == txt.shape == (4, cfg.vocab_size)
    assert (img >= 0).all() and (txt >= 0).all()
    special = torch.from_numpy(m.vocab.special_mask.copy())
    assert (img[:, special] == 0).all() and (txt[:, special] == 0).all()


def test_stage1_mask_keeps_only_caption_tokens(cfg):
    m = new_model(cfg, "cpu")
    _, ids, mask = _batch(m)
    txt = m.encode_text(ids, mask, mask_to_input=True)
    for row, i, k in zip(txt, ids, mask):
        allowed = set(i[k.bool()].tolist()) - {m.vocab.id("[CLS]"), m.vocab.id("[SEP]")}
        assert set(torch.nonzero(row).flatten().tolist()) <= allowed


def test_dense_head_shape(cfg):
    m = new_model(cfg.replace(head="dense"), "cpu")
    x, ids, mask = _batch(m)
    assert m.encode_image(x).shape == (4, cfg.dense_dim) == m.encode_text(ids, mask).shape


def test_flops_term_lowers_activations(cfg):
    torch.manual_seed(0)
    m = new_model(cfg, "cpu")
    x, _, _ = _batch(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    before = float(flops_loss(m.encode_image(x)).detach())
    for _ in range(5):
        opt.zero_grad()
        flops_loss(m.encode_image(x)).backward()
        opt.step()
    after_enc = m.encode_image(x)
    assert float(flops_loss(after_enc).detach()) < before
    assert int((after_enc > 0).sum()) < cfg.vocab_size * 4


def test_stage2_freezes_image_tower_and_training_lowers_loss(tmp_path, data, cfg):
    m = new_model(cfg, "cpu", seed=1)
    train(m, data, TrainConfig(stages=("1",), steps=(12,), batch_size=8, lr=3e-3, log_every=1, checkpoint_every=0), tmp_path / "s1", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "s1" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["contrastive"] for r in rows if "contrastive" in r]
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    frozen = {k: v.clone() for k, v in m.state_dict().items() if k.startswith(("image.", "image_head.")) or k == "text.embeddings.word_embeddings.weight"}
    text_before = m.text_head.dense.weight.clone()
    train(m, data, TrainConfig(stages=("2",), steps=(3,), batch_size=8, log_every=1, checkpoint_every=0), tmp_path / "s2", progress=False)
    after = m.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in frozen.items())
    assert not torch.equal(text_before, m.text_head.dense.weight)


def test_save_load_round_trip(trained, cfg):
    m = StairModel.from_pretrained(trained, device="cpu")
    m2 = StairModel.from_pretrained(str(trained), device="cpu")
    x, ids, mask = _batch(m)
    with torch.no_grad():
        assert torch.equal(m.encode_image(x), m2.encode_image(x))
        assert torch.equal(m.encode_text(ids, mask), m2.encode_text(ids, mask))
    assert (trained / "vocab.txt").exists() and (trained / "metrics.jsonl").exists()


def test_resume_continues_from_checkpoint(tmp_path, data, cfg):
    tc = TrainConfig(stages=("1", "2"), steps=(2, 2), batch_size=8, checkpoint_every=1, log_every=1)
    train(new_model(cfg, "cpu"), data, tc, tmp_path, progress=False)
    res = train(new_model(cfg, "cpu"), data, tc, tmp_path, resume=True, progress=False)
    assert res["history"] == [] and (tmp_path / "model.safetensors").exists()


def test_bad_checkpoints_raise_model_error(trained, tmp_path):
    import shutil

    other = tmp_path / "other_vocab"
    shutil.copytree(trained, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 1000
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="vocab"):
        StairModel.from_pretrained(other)
    trunc = tmp_path / "truncated"
    shutil.copytree(trained, trunc)
    w = trunc / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(ModelError, match="corrupt or truncated"):
        StairModel.from_pretrained(trunc)
    wrong = tmp_path / "wrong_shape"
    shutil.copytree(trained, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["text_width"] = 64
    (wrong / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="does not match"):
        StairModel.from_pretrained(wrong)
    with pytest.raises(ModelError, match="no STAIR checkpoint"):
        StairModel.from_pretrained(tmp_path / "missing")


def test_stair_encoder_via_registry(trained):
    enc = get_encoder("stair", model=str(trained), device="cpu")
    imgs = [Image.new("RGB", (50, 40), (200, 10, 10)), Image.new("RGB", (32, 32), (0, 0, 200))]
    vi = enc.encode_images(imgs, batch_size=1)
    vt = enc.encode_texts(["a red circle", "a blue square"])
    assert all(isinstance(v, SparseVector) for v in vi + vt) and len(vi) == 2
    assert all(abs(float(np.linalg.norm(v.weights)) - 1) < 1e-4 for v in vi if v.nnz)
    masked = get_encoder("stair", model=str(trained), text_mode="mask").encode_texts(["a red circle"])[0]
    assert sorted(masked.to_token_map()) == ["circle", "red"]  # stopwords dropped, as in bow
    assert enc.config()["name"] == "stair"


def test_localize_shape(trained, cfg):
    m = StairModel.from_pretrained(trained)
    h = localize(m, Image.new("RGB", (64, 64), (255, 0, 0)), "red circle")
    assert h.shape == (cfg.grid, cfg.grid) and (h >= 0).all()


def test_scenes_deterministic_by_seed(tmp_path):
    a = make_scenes(tmp_path / "a", n_train=5, n_test=2, seed=7, size=32)
    b = make_scenes(tmp_path / "b", n_train=5, n_test=2, seed=7, size=32)
    c = make_scenes(tmp_path / "c", n_train=5, n_test=2, seed=8, size=32)
    assert a["train"].read_text() == b["train"].read_text() != c["train"].read_text()
    assert (tmp_path / "a/train/000003.png").read_bytes() == (tmp_path / "b/train/000003.png").read_bytes()


def test_data_reports_bad_images_long_and_empty_captions(tmp_path, scenes):
    (tmp_path / "bad.png").write_bytes(b"not a png")
    good = scenes["train"].parent / "train" / "000000.png"
    lines = [
        {"image": str(good), "caption": "red " * 100},
        {"image": str(tmp_path / "bad.png"), "caption": "a circle"},
        {"image": str(good), "caption": "   "},
        {"image": str(tmp_path / "nope.png"), "captions": ["x", "y"]},
    ]
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n{broken\n")
    d = load_caption_data(f, image_size=32, max_length=16)
    r = d.report
    assert len(d) == 1 and len(d.pair_tokens[0]) == 16
    assert r.truncated_captions == 1 and len(r.skipped_images) == 2
    assert any("empty caption" in why for _, why in r.rejected) and any("JSON" in why for _, why in r.rejected)
    csv = tmp_path / "d.csv"
    csv.write_text(f"image,caption\n{good},a red circle\n{good},a red shape\n")
    assert len(load_caption_data(csv, image_size=32)) == 2


def test_cli_commands(tmp_path, trained, scenes):
    from stair_es.cli.stair_commands import COMMANDS

    cmds = {c.name: c for c in COMMANDS}
    assert set(cmds) == {"train", "eval", "localize", "make-scenes"}
    runner = CliRunner()
    r = runner.invoke(cmds["make-scenes"], [str(tmp_path / "sc"), "--n-train", "16", "--n-test", "4", "--size", "32"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cmds["train"], [str(tmp_path / "sc/train.jsonl"), "-o", str(tmp_path / "m"), "--steps", "1", "--batch-size", "4",
                                      "--eval-data", str(tmp_path / "sc/test.jsonl"), "--threads", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cmds["eval"], [str(tmp_path / "m"), str(tmp_path / "sc/test.jsonl"), "--json"])
    assert r.exit_code == 0 and "t2i_r@1" in json.loads(r.output.strip().splitlines()[-1])
    out = tmp_path / "heat.png"
    r = runner.invoke(cmds["localize"], [str(tmp_path / "sc/test/000000.png"), "red", "-o", str(out), "--model", str(trained)])
    assert r.exit_code == 0 and Image.open(out).size == (128, 128)
    r = runner.invoke(cmds["eval"], [str(tmp_path / "missing_model"), str(tmp_path / "sc/test.jsonl")])
    assert r.exit_code == 1 and "no STAIR checkpoint" in r.output
    r = runner.invoke(cmds["train"], [str(tmp_path / "sc/train.jsonl"), "-o", str(tmp_path / "m2"), "--stages", "1,4"])
    assert r.exit_code == 1 and "stages" in r.output


def test_interrupted_training_resumes_to_the_same_weights(tmp_path, data, cfg, monkeypatch):
    import stair_es.stair.train as T

    tc = TrainConfig(stages=("1", "2"), steps=(3, 3), batch_size=8, checkpoint_every=1, log_every=1)
    full = new_model(cfg, "cpu", seed=3)
    train(full, data, tc, tmp_path / "full", progress=False)

    real, calls = T._sample, {"n": 0}

    def crash_on_fifth(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(T, "_sample", crash_on_fifth)
    with pytest.raises(KeyboardInterrupt):
        train(new_model(cfg, "cpu", seed=3), data, tc, tmp_path / "cut", progress=False)
    monkeypatch.setattr(T, "_sample", real)
    resumed = new_model(cfg, "cpu", seed=99)
    train(resumed, data, tc, tmp_path / "cut", resume=True, progress=False)
    a, b = full.state_dict(), resumed.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
