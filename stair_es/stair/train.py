"""The three-stage STAIR training recipe (section 3) and its single-stage ablation.

Stage 1: both towers train, the text embedding masked to the caption's own tokens (eq. 8).
Stage 2: the image tower is frozen -- and with it the shared vocabulary projection ``e``
(the text token-embedding table), since ``e`` is part of the image head: leaving it trainable
would move the frozen teacher's outputs. The text mask is removed.
Stage 3: everything trains, with the lower ``stage3_lr``.
``stages=("single",)`` trains everything at once without the mask (the appendix A ablation);
dense (CLIP-style) configs train the same way as single-stage.

Owns the loop, checkpoints (``<out>/checkpoint/``), resume, and the JSONL metrics log
(``<out>/metrics.jsonl``). Knows nothing about backends or the CLI.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import InvalidInputError, ModelError
from .config import StairConfig
from .data import CaptionData, pad_tokens
from .evaluate import evaluate
from .losses import contrastive_loss, flops_loss, flops_weight
from .model import StairModel, resolve_device

log = logging.getLogger(__name__)


@dataclass
class TrainConfig:
    stages: tuple[str, ...] = ("1", "2", "3")
    steps: tuple[int, ...] = (300, 300, 300)
    batch_size: int = 64
    lr: float = 1e-3
    stage3_lr: float = 1e-4
    weight_decay: float = 1e-2
    warmup_steps: int = 50
    lambda_image: float = 1e-3
    lambda_text: float = 1e-3
    flops_warmup_steps: int = 200
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 25
    eval_every: int = 0
    # Locked image tower (LiT-style): the pretrained image backbone never trains, its outputs are
    # computed once per image and cached; only the image head (TRANSFORM + projection) learns.
    freeze_image_tower: bool = False

    def __post_init__(self) -> None:
        self.stages = tuple(str(s) for s in self.stages)
        self.steps = tuple(int(s) for s in self.steps)
        bad = [s for s in self.stages if s not in ("1", "2", "3", "single")]
        if bad or not self.stages:
            raise InvalidInputError(f"stages must be drawn from 1, 2, 3 or be 'single'; got {list(self.stages)}")
        if "single" in self.stages and len(self.stages) > 1:
            raise InvalidInputError("'single' is a stage plan on its own (no 1/2/3 with it)")
        if len(self.steps) == 1 and len(self.stages) > 1:
            self.steps = self.steps * len(self.stages)
        if len(self.steps) != len(self.stages):
            raise InvalidInputError(f"give one step count per stage: {len(self.stages)} stages, {len(self.steps)} step counts")
        if min(self.steps) < 0 or self.batch_size < 2:
            raise InvalidInputError("steps must be >= 0 and batch_size >= 2 (contrastive learning needs negatives)")


@dataclass
class TrainState:
    stage_index: int = 0
    step: int = 0  # within the current stage
    global_step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


def _stage_setup(model: StairModel, stage: str, tc: TrainConfig) -> tuple[list[torch.nn.Parameter], float, bool]:
    """(trainable parameters, peak lr, mask text to its input?) for a stage."""
    for p in model.parameters():
        p.requires_grad_(True)
    if stage == "2":
        for p in model.image_parameters():
            p.requires_grad_(False)
        model.token_embedding.requires_grad_(False)
    if tc.freeze_image_tower:
        for p in model.image_backbone_parameters():
            p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = tc.stage3_lr if stage == "3" else tc.lr
    return params, lr, stage == "1" and model.is_sparse


def _lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def train(
    model: StairModel,
    data: CaptionData,
    tc: TrainConfig,
    out_dir: str | Path,
    *,
    resume: bool = False,
    eval_data: CaptionData | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``model`` in place through ``tc.stages``; saves the final model into ``out_dir``."""
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    state = TrainState()
    dev = model.device
    metrics_file = out / "metrics.jsonl"
    opt_state = None
    np_rng_state = None
    if resume and not (ckpt / "trainer_state.pt").exists() and (out / "checkpoint.old" / "trainer_state.pt").exists():
        ckpt = out / "checkpoint.old"  # a crash between the two renames of _checkpoint
    if resume and (ckpt / "trainer_state.pt").exists():
        saved = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
        if saved["train_config"] != _tc_dict(tc):
            raise ModelError(f"cannot resume from {ckpt}: it was trained with another training config ({saved['train_config']})")
        loaded = StairModel.from_pretrained(ckpt, device=dev)
        model.load_state_dict(loaded.state_dict())
        state = TrainState(**saved["state"])
        opt_state = saved["optimizer"]
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["py_rng"])
        np_rng_state = saved.get("np_rng")
        log.info("resuming at stage %s step %d", tc.stages[state.stage_index] if state.stage_index < len(tc.stages) else "done", state.step)
    else:
        torch.manual_seed(tc.seed)
        random.seed(tc.seed)
        metrics_file.write_text("", encoding="utf-8")
    _log(metrics_file, {"event": "data", **data.report.to_dict()})
    rng = np.random.default_rng(tc.seed)
    if np_rng_state is not None:  # the batch sampler continues exactly where it stopped
        rng.bit_generator.state = np_rng_state
    ckpt = out / "checkpoint"
    hidden_cache = None
    t0 = time.time()
    while state.stage_index < len(tc.stages):
        stage = tc.stages[state.stage_index]
        total = tc.steps[state.stage_index]
        params, peak, masked = _stage_setup(model, stage, tc)
        opt = torch.optim.AdamW(params, lr=peak, weight_decay=tc.weight_decay)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
            opt_state = None
        model.train()
        if tc.freeze_image_tower:
            model.image.eval()  # a locked tower keeps its batch-norm statistics and has no dropout
            if hidden_cache is None:
                hidden_cache = _image_hidden_cache(model, data)
        bar = tqdm(total=total, initial=state.step, desc=f"stage {stage}", disable=not progress, leave=False)
        while state.step < total:
            lr = _lr_at(state.step, total, peak, min(tc.warmup_steps, total // 5))
            for g in opt.param_groups:
                g["lr"] = lr
            batch = _sample(rng, data, tc.batch_size)
            ids, mask = torch.from_numpy(batch["ids"]).to(dev), torch.from_numpy(batch["mask"]).to(dev)
            if hidden_cache is not None:
                img = model.encode_image_hidden(hidden_cache[torch.from_numpy(batch["images"])].to(dev, torch.float32))
            else:
                img = model.encode_image(model.pixels(data.images[batch["images"]]))
            txt = model.encode_text(ids, mask, mask_to_input=masked)
            con = contrastive_loss(img, txt, model.logit_scale)
            loss = con
            row: dict[str, Any] = {"stage": stage, "step": state.step, "global_step": state.global_step, "lr": lr, "contrastive": float(con.detach())}
            if model.is_sparse:
                li = flops_weight(tc.lambda_image, state.step, tc.flops_warmup_steps) if stage != "2" else 0.0
                lt = flops_weight(tc.lambda_text, state.step, tc.flops_warmup_steps)
                fi, ft = flops_loss(img), flops_loss(txt)
                loss = loss + li * fi + lt * ft
                row.update(flops_image=float(fi.detach()), flops_text=float(ft.detach()), active_image=float((img > 0).sum(1).float().mean()), active_text=float((txt > 0).sum(1).float().mean()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state.step += 1
            state.global_step += 1
            row.update(loss=float(loss.detach()), temperature=float(1.0 / model.logit_scale.detach().exp()), elapsed_s=round(time.time() - t0, 1))
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            if state.step % tc.log_every == 0 or state.step == total:
                _log(metrics_file, row)
            if tc.eval_every and eval_data is not None and state.step % tc.eval_every == 0:
                _log(metrics_file, {"event": "eval", "stage": stage, "step": state.step, **evaluate(model, eval_data, mask_text=masked)})
                model.train()
            if tc.checkpoint_every and state.step % tc.checkpoint_every == 0 and state.step < total:
                _checkpoint(model, opt, state, tc, ckpt, rng)
        bar.close()
        state.stage_index += 1
        state.step = 0
        if eval_data is not None:
            res = evaluate(model, eval_data, mask_text=masked)
            state.history.append({"stage": stage, **res})
            _log(metrics_file, {"event": "eval", "stage": stage, "step": total, **res})
        _checkpoint(model, None, state, tc, ckpt, rng)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    model.save_pretrained(out)
    (out / "train_config.json").write_text(json.dumps(_tc_dict(tc), indent=2) + "\n", encoding="utf-8")
    return {"history": state.history, "seconds": round(time.time() - t0, 1), "data": data.report.to_dict()}


@torch.no_grad()
def _image_hidden_cache(model: StairModel, data: CaptionData, batch_size: int = 32) -> torch.Tensor:
    """The locked image tower's hidden states for every training image, once (float16, CPU)."""
    from tqdm.auto import tqdm

    model.image.eval()
    out = []
    for i in tqdm(range(0, len(data.images), batch_size), desc="caching image tower outputs", leave=False):
        out.append(model.image_hidden(model.pixels(data.images[i : i + batch_size])).to("cpu", torch.float16))
    return torch.cat(out)


def _tc_dict(tc: TrainConfig) -> dict[str, Any]:
    d = asdict(tc)
    d["stages"], d["steps"] = list(tc.stages), list(tc.steps)
    return d


def _sample(rng: np.random.Generator, data: CaptionData, batch_size: int) -> dict[str, np.ndarray]:
    """A batch of pairs with distinct images (two captions of one image are not negatives)."""
    order = rng.permutation(len(data))
    chosen, seen = [], set()
    for p in order:
        i = int(data.pair_image[p])
        if i not in seen:
            seen.add(i)
            chosen.append(p)
            if len(chosen) == batch_size:
                break
    ids, mask = pad_tokens([data.pair_tokens[p] for p in chosen])
    return {"images": data.pair_image[chosen], "ids": ids, "mask": mask}


def _checkpoint(model: StairModel, opt, state: TrainState, tc: TrainConfig, ckpt: Path, rng: np.random.Generator) -> None:
    """Weights and trainer state are written together into a fresh folder that then replaces
    ``ckpt`` by renames, so a crash never leaves weights and state from different steps."""
    tmp, old = ckpt.with_name(ckpt.name + ".tmp"), ckpt.with_name(ckpt.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    payload = {
        "state": asdict(state),
        "optimizer": opt.state_dict() if opt is not None else None,
        "train_config": _tc_dict(tc),
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
        "np_rng": rng.bit_generator.state,
    }
    torch.save(payload, tmp / "trainer_state.pt")
    shutil.rmtree(old, ignore_errors=True)
    if ckpt.exists():
        ckpt.rename(old)
    tmp.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)


def _log(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def new_model(config: StairConfig, device: str | None = None, seed: int = 0, *, text_tower: str | None = None,
              image_tower: str | None = None) -> StairModel:
    """A model to train: random towers, or pretrained ones (any transformers id or folder).

    ``text_tower`` is a BERT-family MLM: its encoder becomes the text tower, its word embeddings
    the shared projection ``e``, and its MLM head (TRANSFORM + bias) the text token head, so at
    step 0 the text tower already predicts related vocabulary tokens (eq. 4). ``image_tower``
    (ViT, CLIP vision, SigLIP vision, DINOv2 or ``efficientnet-lite0``) feeds its patch tokens to a
    fresh image head. The tower sizes replace the config's (``text_width``, ``image_size``...).
    """
    from . import towers

    torch.manual_seed(seed)
    text = towers.load_text_tower(text_tower) if text_tower else None
    image = towers.load_image_tower(image_tower) if image_tower else None
    changes: dict[str, Any] = {}
    if text is not None:
        max_pos = int(text.config.get("max_position_embeddings", 512))
        if max_pos < config.text_max_length:
            raise ModelError(f"text tower {text_tower!r} takes at most {max_pos} positions but the config's text_max_length is {config.text_max_length}; lower text_max_length")
        changes.update(text_tower=text.source, text_tower_config=text.config, head_act=text.act, **towers.text_dims(text.config))
    if image is not None:
        changes.update(image_tower=image.source, image_tower_config=image.config, image_mean=image.mean, image_std=image.std,
                       **towers.image_dims(image.config))
    if changes:
        config = config.replace(**changes)
    model = StairModel(config)
    if text is not None:
        model.text.load_state_dict(text.backbone.state_dict())
        if model.is_sparse:
            model.text_head.load_state_dict(text.head_state)
    if image is not None:
        model.image.load_state_dict(image.backbone.state_dict())
    return model.to(resolve_device(device))
