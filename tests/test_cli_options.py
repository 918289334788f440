"""CLI commands build their library dataclasses from click's keyword arguments: every option a
user gives reaches the configuration (no field left behind by a hand copy)."""

from types import SimpleNamespace

from click.testing import CliRunner


def test_every_train_option_reaches_the_training_configuration(tmp_path, monkeypatch):
    import stair_es.stair.data as data_mod
    import stair_es.stair.train as train_mod
    from stair_es.cli.stair_commands import train_cmd

    seen = {}

    def fake_new_model(cfg, device, **kw):
        seen["model"] = {"head": cfg.head, "top_n": cfg.top_n, "device": device, **kw}
        return SimpleNamespace(config=cfg)

    def fake_train(model, data, tc, output, **kw):
        seen["tc"], seen["train"] = tc, kw
        return {"seconds": 0.0, "history": []}

    monkeypatch.setattr(train_mod, "new_model", fake_new_model)
    monkeypatch.setattr(train_mod, "train", fake_train)
    monkeypatch.setattr(data_mod, "load_caption_data", lambda *a, **k: SimpleNamespace(report=SimpleNamespace(summary=str)))
    manifest = tmp_path / "train.jsonl"
    manifest.write_text("")
    r = CliRunner().invoke(train_cmd, [
        str(manifest), "-o", str(tmp_path / "m"), "--head", "visualsparta", "--top-n", "25", "--stages", "1,2",
        "--steps", "5,7", "--batch-size", "16", "--lr", "0.002", "--stage3-lr", "0.0002", "--lambda", "0.01",
        "--warmup", "3", "--flops-warmup", "9", "--accum-steps", "2", "--precision", "bf16", "--checkpoint-every", "11",
        "--log-every", "4", "--seed", "5", "--freeze-image-tower", "--no-cts-mask", "--resume", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    tc = seen["tc"]
    assert (tc.stages, tc.steps, tc.batch_size, tc.lr, tc.stage3_lr) == (("1", "2"), (5, 7), 16, 0.002, 0.0002)
    assert (tc.lambda_image, tc.lambda_text, tc.warmup_steps, tc.flops_warmup_steps) == (0.01, 0.01, 3, 9)
    assert (tc.accum_steps, tc.precision, tc.checkpoint_every, tc.log_every, tc.seed) == (2, "bf16", 11, 4, 5)
    assert tc.freeze_image_tower is True and tc.vdr_cts_mask is False
    assert seen["model"]["head"] == "visualsparta" and seen["model"]["top_n"] == 25 and seen["model"]["seed"] == 5
    assert seen["model"]["device"] == "cpu" and seen["train"]["resume"] is True
