"""Training that scales: streamed data with exact resume mid-stage, gradient accumulation
with the whole batch's negatives, refused resumes, and torchrun DDP (gloo, 2 CPU processes)
giving the loss trajectory of one process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from stair_es.errors import ModelError
from stair_es.stair import train as train_mod
from stair_es.stair.config import load_config
from stair_es.stair.data import load_caption_data
from stair_es.stair.datasets import PairStream, TarShardSource
from stair_es.stair.model import StairModel
from stair_es.stair.scenes import make_scenes
from stair_es.stair.train import TrainConfig, new_model, train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return make_scenes(tmp_path_factory.mktemp("scenes"), n_train=24, n_test=4, seed=1, size=32)


@pytest.fixture(scope="module")
def shards(scenes, tmp_path_factory):
    """The training scenes as 3 WebDataset-style tar shards."""
    import tarfile

    out = tmp_path_factory.mktemp("shards")
    recs = [json.loads(x) for x in scenes["train"].read_text().splitlines()]
    for s in range(3):
        with tarfile.open(out / f"s-{s}.tar", "w") as tar:
            for i, r in enumerate(recs[s::3]):
                key = f"{s}{i:04d}"
                tar.add(scenes["train"].parent / r["image"], arcname=f"{key}.png")
                cap = (r.get("captions") or [r["caption"]])[0].encode()
                info = tarfile.TarInfo(f"{key}.txt")
                info.size = len(cap)
                import io

                tar.addfile(info, io.BytesIO(cap))
    return out


def _metrics(path):
    return [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


def _tc(**kw):
    base = dict(stages=("single",), steps=(4,), batch_size=8, log_every=1, checkpoint_every=2, warmup_steps=1, flops_warmup_steps=2)
    return TrainConfig(**{**base, **kw})


def test_streamed_training_resumes_mid_stage_exactly(shards, tmp_path, monkeypatch):
    cfg = load_config("tiny")

    def stream():
        return PairStream(TarShardSource(shards), image_size=cfg.image_size, seed=0, buffer=5)

    full = tmp_path / "full"
    train(new_model(cfg, "cpu"), stream(), _tc(), full, progress=False)
    part = tmp_path / "part"
    real = train_mod.contrastive_loss
    calls = {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated crash in step 3")
        return real(*a, **k)

    monkeypatch.setattr(train_mod, "contrastive_loss", crash)
    with pytest.raises(KeyboardInterrupt):
        train(new_model(cfg, "cpu"), stream(), _tc(), part, progress=False)
    monkeypatch.setattr(train_mod, "contrastive_loss", real)
    assert (part / "checkpoint" / "trainer_state.pt").exists()
    train(new_model(cfg, "cpu"), stream(), _tc(), part, resume=True, progress=False)
    a, b = StairModel.from_pretrained(full), StairModel.from_pretrained(part)
    for (k, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6), k
    assert [r["loss"] for r in _metrics(full)][2:] == pytest.approx([r["loss"] for r in _metrics(part)][-2:], abs=1e-6)


def test_accumulation_keeps_the_whole_batch_loss(scenes, tmp_path):
    cfg = load_config("tiny")
    data = load_caption_data(scenes["train"], image_size=cfg.image_size)
    train(new_model(cfg, "cpu"), data, _tc(checkpoint_every=0), tmp_path / "one", progress=False)
    train(new_model(cfg, "cpu"), data, _tc(checkpoint_every=0, accum_steps=4), tmp_path / "acc", progress=False)
    one, acc = _metrics(tmp_path / "one"), _metrics(tmp_path / "acc")
    assert [r["loss"] for r in one] == pytest.approx([r["loss"] for r in acc], rel=1e-4)


def test_resume_with_other_settings_names_the_difference(scenes, tmp_path):
    cfg = load_config("tiny")
    data = load_caption_data(scenes["train"], image_size=cfg.image_size)
    train(new_model(cfg, "cpu"), data, _tc(steps=(2,)), tmp_path, progress=False)
    with pytest.raises(ModelError, match=r"batch_size: 8 -> 4"):
        train(new_model(cfg, "cpu"), data, _tc(steps=(2,), batch_size=4), tmp_path, resume=True, progress=False)
    with pytest.raises(ModelError, match=r"another model config \(.*text_width: 32 -> 64"):
        train(new_model(cfg.replace(text_width=64), "cpu"), data, _tc(steps=(2,)), tmp_path, resume=True, progress=False)


def test_bf16_autocast_trains_on_cpu(scenes, tmp_path):
    cfg = load_config("tiny")
    data = load_caption_data(scenes["train"], image_size=cfg.image_size)
    train(new_model(cfg, "cpu"), data, _tc(steps=(2,), checkpoint_every=0, precision="bf16"), tmp_path, progress=False)
    rows = _metrics(tmp_path)
    assert len(rows) == 2 and all(r["loss"] == r["loss"] for r in rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.process
@pytest.mark.slow
def test_two_gloo_processes_follow_the_one_process_loss(scenes, tmp_path):
    args = ["train", str(scenes["train"]), "--config", "tiny", "--stages", "1,2", "--steps", "3", "--batch-size", "8",
            "--flops-warmup", "2", "--device", "cpu", "--threads", "1", "--checkpoint-every", "0", "--log-every", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "stair_es.cli.main", *args, "-o", str(tmp_path / "one")], env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                          "--master_port", str(_free_port()), "-m", "stair_es.cli.main", *args, "-o", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert len(a) == len(b) == 6
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-4, abs=1e-5), (x, y)
        assert y["contrastive"] == pytest.approx(x["contrastive"], rel=1e-4, abs=1e-5)
    ma, mb = StairModel.from_pretrained(tmp_path / "one"), StairModel.from_pretrained(tmp_path / "two")
    for (k, x), y in zip(ma.state_dict().items(), mb.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-4), k
