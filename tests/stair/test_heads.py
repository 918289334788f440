"""The stair, visualsparta and vdr heads over the shared towers: training, vectors, errors."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from click.testing import CliRunner

from stair_es.errors import ModelError, UnknownNameError
from stair_es.stair.config import load_config
from stair_es.stair.data import load_caption_data
from stair_es.stair.model import StairModel
from stair_es.stair.scenes import make_scenes
from stair_es.stair.train import TrainConfig, new_model, train

torch.set_num_threads(1)
SPARSE_HEADS = ("stair", "visualsparta", "vdr")


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny").replace(top_n=40, vdr_k=12)


@pytest.fixture(scope="module")
def data(tmp_path_factory, cfg):
    out = tmp_path_factory.mktemp("scenes")
    sc = make_scenes(out, n_train=48, n_test=8, seed=3, size=32)
    return load_caption_data(sc["train"], image_size=cfg.image_size)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data, cfg):
    """Each head trained for a few steps on a fixed batch plan; returns head -> (folder, losses)."""
    out = {}
    for head in SPARSE_HEADS:
        folder = tmp_path_factory.mktemp(head)
        model = new_model(cfg.replace(head=head), "cpu", seed=0)
        tc = TrainConfig(stages=("single",), steps=(12,), batch_size=12, lr=3e-3, warmup_steps=0, log_every=1, checkpoint_every=0)
        train(model, data, tc, folder, progress=False)
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        out[head] = (folder, [r["loss"] for r in rows if "loss" in r])
    return out


def _inputs(model, n=3):
    x = torch.randn(n, 3, model.config.image_size, model.config.image_size)
    ids, mask, _ = model.tokenize(["a small red circle", "a large blue square left of a red circle", "green triangle"][:n])
    return x, ids, mask


@pytest.mark.parametrize("head", SPARSE_HEADS)
def test_each_head_learns_and_gives_sparse_nonnegative_vectors_over_the_bert_vocabulary(trained, data, head):
    folder, losses = trained[head]
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4, losses
    model = StairModel.from_pretrained(folder, device="cpu")
    assert model.head == head
    x, ids, mask = _inputs(model)
    with torch.no_grad():
        img, txt = model.encode_image(x), model.encode_text(ids, mask)
    assert img.shape == txt.shape == (3, 30522)
    assert (img >= 0).all() and (txt >= 0).all()
    special = torch.from_numpy(model.vocab.special_mask.copy())
    assert (img[:, special] == 0).all() and (txt[:, special] == 0).all()
    if head != "stair":  # stair's sparsity is learned (FLOPs) over hundreds of steps, see test_stair.py
        assert ((img > 0).sum(1) < 30522 // 10).all() and ((txt > 0).sum(1) < 30522 // 10).all()


def test_visualsparta_keeps_at_most_top_n_terms_per_image_and_queries_are_bags_of_words(cfg):
    model = new_model(cfg.replace(head="visualsparta", top_n=7), "cpu")
    x, ids, mask = _inputs(model)
    with torch.no_grad():
        img = model.encode_image(x)
        full = model.encode_image(x, prune=False)
        txt = model.encode_text(ids, mask)
    assert ((img > 0).sum(1) <= 7).all() and ((full > 0).sum(1) > 7).all()
    kept = img > 0  # the kept terms are the image's strongest, unchanged
    assert torch.equal(img[kept], full[kept])
    assert (full.masked_fill(kept, 0).amax(1) <= img.masked_fill(~kept, float("inf")).amin(1)).all()
    # "a large blue square left of a red circle": each token counted, nothing else
    assert txt[1, model.vocab.id("a")] == 2 and txt[1, model.vocab.id("red")] == 1 and set(torch.nonzero(txt[0]).flatten().tolist()) == {model.vocab.id(w) for w in ("a", "small", "red", "circle")}


def test_vdr_gate_keeps_at_most_k_image_tokens_and_k_plus_own_tokens_for_text(cfg):
    model = new_model(cfg.replace(head="vdr", vdr_k=5), "cpu")
    x, ids, mask = _inputs(model)
    with torch.no_grad():
        img, txt = model.encode_image(x), model.encode_text(ids, mask)
        dense = model.encode_image(x, prune=False)
    assert ((img > 0).sum(1) <= 5).all()
    assert ((dense > 0).sum(1) == 30522 - int(model.vocab.special_mask.sum())).all()  # elu1p is never 0
    own = model.bag_of_words(ids, mask)
    assert ((txt > 0).sum(1) <= 5 + own.sum(1)).all()
    assert (txt[own > 0] > 0).all()  # every token of the text is kept


def test_loading_a_checkpoint_as_another_head_names_both(trained):
    folder, _ = trained["vdr"]
    with pytest.raises(ModelError, match=r"'vdr' head.*'visualsparta' head"):
        StairModel.from_pretrained(folder, device="cpu", head="visualsparta")
    from stair_es.encoders.base import get_encoder

    with pytest.raises(ModelError, match="'vdr'.*'stair'"):
        get_encoder("stair", model=str(folder), head="stair")
    assert get_encoder("stair", model=str(folder), head="vdr", runtime="torch").config()["head"] == "vdr"


def test_unknown_head_lists_the_choices(cfg):
    with pytest.raises(UnknownNameError, match="stair, visualsparta, vdr, dense"):
        cfg.replace(head="splade")
    from stair_es.cli.stair_commands import train_cmd

    res = CliRunner().invoke(train_cmd, ["x.jsonl", "-o", "out", "--head", "nope"])
    assert res.exit_code != 0 and "'nope'" in res.output and all(h in res.output for h in ("stair", "visualsparta", "vdr", "dense"))


def test_visualsparta_encoder_keeps_raw_image_scores_and_searches_by_dot_product(trained):
    from PIL import Image

    from stair_es.encoders.base import get_encoder

    folder, _ = trained["visualsparta"]
    enc = get_encoder("stair", model=str(folder), runtime="torch")
    im = Image.new("RGB", (32, 32), (200, 30, 30))
    [v] = enc.encode_images([im])
    with torch.no_grad():
        raw = enc.model.encode_image(enc.model.preprocess_images([im]))[0]
    weights = v.to_token_map()
    assert 0 < len(weights) <= enc.model.config.top_n
    tok = max(weights, key=weights.get)
    assert weights[tok] == pytest.approx(float(raw[enc.vocab.id(tok)]), rel=1e-5)


def test_three_stage_plan_is_refused_for_the_heads_that_train_in_one_stage(cfg, data, tmp_path):
    from stair_es.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="--stages single"):
        train(new_model(cfg.replace(head="vdr"), "cpu"), data, TrainConfig(steps=(1, 1, 1), batch_size=4), tmp_path, progress=False)


def test_cli_trains_a_head_in_one_stage_and_records_it(tmp_path):
    from stair_es.cli.stair_commands import eval_cmd, train_cmd

    sc = make_scenes(tmp_path / "sc", n_train=24, n_test=8, seed=1, size=32)
    out = tmp_path / "vs"
    res = CliRunner().invoke(train_cmd, [str(sc["train"]), "-o", str(out), "--head", "visualsparta", "--top-n", "25", "--steps", "2",
                                         "--batch-size", "8", "--checkpoint-every", "0", "--threads", "1"])
    assert res.exit_code == 0, res.output
    saved = json.loads((out / "config.json").read_text())
    assert saved["head"] == "visualsparta" and saved["top_n"] == 25
    assert json.loads((out / "train_config.json").read_text())["stages"] == ["single"]
    res = CliRunner().invoke(eval_cmd, [str(out), str(sc["test"]), "--head", "vdr", "--json"])
    assert res.exit_code != 0 and "'visualsparta' head" in res.output and "'vdr' head" in res.output
    res = CliRunner().invoke(eval_cmd, [str(out), str(sc["test"]), "--json"])
    assert res.exit_code == 0 and json.loads(res.output.strip().splitlines()[-1])["active_tokens_image"] <= 25


def test_old_head_name_sparse_still_loads_as_stair(cfg):
    assert cfg.replace(head="sparse").head == "stair"


def test_vdr_contrastive_mask_deals_the_unused_tokens_to_the_queries_without_overlap():
    from stair_es.stair.losses import contrastive_mask

    gate = torch.zeros(4, 50)
    gate[0, :5] = 1
    gate[2, 3:9] = 1
    keep = torch.ones(50)
    keep[:2] = 0  # two "special" entries
    m = contrastive_mask(gate, keep)
    used = set(range(9)) | {0, 1}
    assert (m.sum(1) == (50 - len(used)) // 4).all()  # an even share each
    assert (m.sum(0) <= 1).all()  # no entry given to two queries
    assert not set(torch.nonzero(m.sum(0)).flatten().tolist()) & used
