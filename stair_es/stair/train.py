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

import contextlib
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import towers
from ..errors import InvalidInputError, ModelError
from .config import StairConfig
from .data import CaptionData, pad_tokens
from .datasets import PairStream
from .evaluate import evaluate
from .losses import contrastive_loss, flops_loss, flops_weight, vdr_loss, visualsparta_loss
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
    # Scaling: micro-batches per step (same negatives as one big batch), bf16 autocast
    accum_steps: int = 1
    precision: str = "fp32"
    # VDR head: deal the batch's unused vocabulary entries to the queries (the paper's contrastive mask)
    vdr_cts_mask: bool = True

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
        if self.precision not in ("fp32", "bf16"):
            raise InvalidInputError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if self.accum_steps < 1 or self.batch_size % self.accum_steps:
            raise InvalidInputError(f"accum_steps must be >= 1 and divide batch_size {self.batch_size}; got {self.accum_steps}")
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
    return params, lr, stage == "1" and model.head == "stair"


def _lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (total - step) / max(1, total - warmup))


def train(model: StairModel, data: CaptionData | PairStream, tc: TrainConfig, out_dir: str | Path, *,
          resume: bool = False, eval_data: CaptionData | None = None, progress: bool = True) -> dict[str, Any]:
    """Train ``model`` in place through ``tc.stages``; saves the final model into ``out_dir``.

    ``data`` is in memory (:class:`CaptionData`, sampled with distinct images per batch) or a
    :class:`~.datasets.PairStream`. Under ``torchrun`` (``torch.distributed`` initialised, see
    :func:`init_distributed`) each process encodes its share of the global ``batch_size`` and
    the contrastive and FLOPs losses run over the embeddings gathered from all processes, so the
    loss and the update are those of one process with the whole batch (within float error).
    ``accum_steps`` splits each process's share into micro-batches without changing the
    negatives: embeddings of the whole batch are first computed without gradients, then each
    micro-batch is re-encoded with gradients in its place (as open_clip's ``--accum-freq``).
    Only rank 0 writes files.
    """
    # lazy: progress bars load only for long work
    from tqdm.auto import tqdm

    if model.head in ("visualsparta", "vdr") and tc.stages != ("single",):
        raise InvalidInputError(f"the {model.head} head trains in one stage (the three-stage plan is STAIR's): use stages 'single' (--stages single)")
    world, rank = dist_info()
    if tc.batch_size % (world * tc.accum_steps):
        raise InvalidInputError(f"batch_size {tc.batch_size} must be divisible by processes x accum_steps = {world} x {tc.accum_steps}")
    local_bs = tc.batch_size // world
    streaming = isinstance(data, PairStream)
    if streaming and world > 1:
        data.shard(rank, world)
    out = Path(out_dir)
    if rank == 0:
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
        diff = _config_diff(saved["train_config"], _tc_dict(tc))
        if diff:
            raise ModelError(f"cannot resume from {ckpt}: it was trained with other training settings ({diff}); use the same flags or a new --output")
        loaded = StairModel.from_pretrained(ckpt, device=dev)
        mdiff = _config_diff(loaded.config.to_dict(), model.config.to_dict())
        if mdiff:
            raise ModelError(f"cannot resume from {ckpt}: it holds another model config ({mdiff}); use the same --config/--text-tower/--image-tower or a new --output")
        model.load_state_dict(loaded.state_dict())
        state = TrainState(**saved["state"])
        opt_state = saved["optimizer"]
        torch.set_rng_state(saved["torch_rng"])
        random.setstate(saved["py_rng"])
        np_rng_state = saved.get("np_rng")
        streams = saved.get("stream_states")
        if streaming and streams:
            if len(streams) != world:
                raise ModelError(f"cannot resume from {ckpt}: it was written by {len(streams)} process(es) reading the stream, this run has {world}; resume with the same number of processes")
            data.restore(streams[rank])
        log.info("resuming at stage %s step %d", tc.stages[state.stage_index] if state.stage_index < len(tc.stages) else "done", state.step)
    else:
        torch.manual_seed(tc.seed)
        random.seed(tc.seed)
        if rank == 0:
            metrics_file.write_text("", encoding="utf-8")
    if world > 1:
        _broadcast_parameters(model)
    if rank == 0 and not streaming:
        _log(metrics_file, {"event": "data", **data.report.to_dict()})
    rng = np.random.default_rng(tc.seed)
    if np_rng_state is not None:  # the batch sampler continues exactly where it stopped
        rng.bit_generator.state = np_rng_state
    ckpt = out / "checkpoint"
    hidden_cache = None
    autocast = (contextlib.nullcontext() if tc.precision == "fp32"
                else torch.autocast(device_type=dev.type, dtype=torch.bfloat16))
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
            if hidden_cache is None and not streaming:
                hidden_cache = _image_hidden_cache(model, data)
        bar = tqdm(total=total, initial=state.step, desc=f"stage {stage}", disable=not progress or rank != 0, leave=False)
        while state.step < total:
            lr = _lr_at(state.step, total, peak, min(tc.warmup_steps, total // 5))
            for g in opt.param_groups:
                g["lr"] = lr
            if streaming:
                batch = data.next_batch(local_bs)
            else:  # every process draws the same global batch and keeps its slice
                batch = _sample(rng, data, tc.batch_size)
                batch = {k: v[rank * local_bs : (rank + 1) * local_bs] for k, v in batch.items()}
                width = max(1, int(batch["mask"].sum(1).max()))  # this slice's longest caption
                batch["ids"], batch["mask"] = batch["ids"][:, :width], batch["mask"][:, :width]
            li = lt = 0.0
            if model.head == "stair":
                li = flops_weight(tc.lambda_image, state.step, tc.flops_warmup_steps) if stage != "2" else 0.0
                lt = flops_weight(tc.lambda_text, state.step, tc.flops_warmup_steps)

            def encode(sl: slice) -> tuple[torch.Tensor, torch.Tensor]:
                ids = torch.from_numpy(batch["ids"][sl]).to(dev)
                mask = torch.from_numpy(batch["mask"][sl]).to(dev)
                with autocast:
                    if hidden_cache is not None:
                        h = hidden_cache[torch.from_numpy(batch["images"][sl])].to(dev, torch.float32)
                    else:
                        pix = model.pixels(batch["pixels"][sl] if streaming else data.images[batch["images"][sl]])
                        with torch.no_grad() if tc.freeze_image_tower else contextlib.nullcontext():
                            h = model.image_hidden(pix)
                    img = model.encode_image_hidden(h, prune=False)
                    txt = model.encode_text(ids, mask, mask_to_input=masked, prune=False)
                return img.float(), txt.float()

            micro = local_bs // tc.accum_steps
            slices = [slice(j * micro, (j + 1) * micro) for j in range(tc.accum_steps)]
            cached: list[tuple[torch.Tensor, torch.Tensor]] = []
            if len(slices) > 1:
                with torch.no_grad():
                    cached = [encode(sl) for sl in slices]
            if model.head == "vdr":  # the captions' own tokens, for the gate and the non-parametric entry
                bow = gather_with_grad(model.bag_of_words(torch.from_numpy(batch["ids"]).to(dev), torch.from_numpy(batch["mask"]).to(dev)))
            opt.zero_grad(set_to_none=True)
            for j, sl in enumerate(slices):
                img_j, txt_j = encode(sl)
                if cached:
                    img_loc = torch.cat([img_j if k == j else c[0] for k, c in enumerate(cached)])
                    txt_loc = torch.cat([txt_j if k == j else c[1] for k, c in enumerate(cached)])
                else:
                    img_loc, txt_loc = img_j, txt_j
                img, txt = gather_with_grad(img_loc), gather_with_grad(txt_loc)
                if model.head == "vdr":
                    con = vdr_loss(img, txt, bow, model.config.vdr_k, model.logit_scale, model.keep_mask, cts_mask=tc.vdr_cts_mask)
                elif model.head == "visualsparta":
                    con = visualsparta_loss(img, txt)
                else:
                    con = contrastive_loss(img, txt, model.logit_scale)
                loss = con
                if model.head == "stair":
                    fi, ft = flops_loss(img), flops_loss(txt)
                    loss = loss + li * fi + lt * ft
                loss.backward()
            _reduce_gradients(model, params, world, tc.accum_steps)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            state.step += 1
            state.global_step += 1
            row: dict[str, Any] = {"stage": stage, "step": state.step - 1, "global_step": state.global_step - 1, "lr": lr, "contrastive": float(con.detach())}
            if model.head == "stair":
                row.update(flops_image=float(fi.detach()), flops_text=float(ft.detach()))
            if model.is_sparse:  # in the training form (before VDR's gate / VisualSparta's pruning)
                row.update(active_image=float((img > 0).sum(1).float().mean()), active_text=float((txt > 0).sum(1).float().mean()))
            row.update(loss=float(loss.detach()), temperature=float(1.0 / model.logit_scale.detach().exp()), elapsed_s=round(time.time() - t0, 1))
            bar.update(1)
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            if rank == 0 and (state.step % tc.log_every == 0 or state.step == total):
                _log(metrics_file, row)
            if rank == 0 and tc.eval_every and eval_data is not None and state.step % tc.eval_every == 0:
                _log(metrics_file, {"event": "eval", "stage": stage, "step": state.step, **evaluate(model, eval_data, mask_text=masked)})
                model.train()
                if tc.freeze_image_tower:
                    model.image.eval()
            if tc.checkpoint_every and state.step % tc.checkpoint_every == 0 and state.step < total:
                _checkpoint(model, opt, state, tc, ckpt, rng, data if streaming else None)
        bar.close()
        state.stage_index += 1
        state.step = 0
        if eval_data is not None and rank == 0:
            res = evaluate(model, eval_data, mask_text=masked)
            state.history.append({"stage": stage, **res})
            _log(metrics_file, {"event": "eval", "stage": stage, "step": total, **res})
        _checkpoint(model, None, state, tc, ckpt, rng, data if streaming else None)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    if rank == 0:
        if streaming:
            _log(metrics_file, {"event": "data", **data.report.to_dict()})
        model.save_pretrained(out)
        (out / "train_config.json").write_text(json.dumps(_tc_dict(tc), indent=2) + "\n", encoding="utf-8")
    _barrier()
    return {"history": state.history, "seconds": round(time.time() - t0, 1), "data": data.report.to_dict()}


# --- distributed ------------------------------------------------------------------------------
def dist_info() -> tuple[int, int]:
    """(world size, rank); (1, 0) outside ``torchrun``."""
    return (dist.get_world_size(), dist.get_rank()) if dist.is_available() and dist.is_initialized() else (1, 0)


def init_distributed() -> str | None:
    """Join the ``torchrun`` process group when launched by it (``WORLD_SIZE`` > 1).

    NCCL with one GPU per process (``cuda:LOCAL_RANK``) when CUDA is there, else gloo on CPU.
    Returns the device this process should use, or None outside ``torchrun``.
    """

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    else:
        device = "cpu"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device != "cpu" else "gloo")
    return device


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """All processes' rows of ``x`` concatenated in rank order; gradient flows to the local rows only.

    Every process then computes the same global loss; the gradient of that loss reaches each
    process's parameters through its own rows, and summing the gradients over processes
    (:func:`_reduce_gradients`) gives exactly the one-process gradient.
    """
    world, rank = dist_info()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank] = x
    return torch.cat(parts)


def _reduce_gradients(model: StairModel, params: list[torch.nn.Parameter], world: int, accum: int) -> None:
    """Sum gradients over processes (one flat buffer); undo the repeats of the temperature's.

    The temperature enters the global loss directly, so every process and every micro-batch
    already holds its whole gradient: it is divided by processes x micro-batches.
    """
    if world > 1:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            off = 0
            for g in grads:
                n = g.numel()
                g.copy_(flat[off : off + n].view_as(g))
                off += n
    if model.logit_scale.grad is not None and world * accum > 1:
        model.logit_scale.grad /= world * accum


def _broadcast_parameters(model: StairModel) -> None:
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def _barrier() -> None:
    world, _ = dist_info()
    if world > 1:
        dist.barrier()


def _config_diff(saved: dict[str, Any], now: dict[str, Any]) -> str:
    """``key: saved -> now`` for every setting that differs (missing keys compare as defaults)."""
    defaults = {**_tc_dict(TrainConfig()), **StairConfig().to_dict()}
    out = []
    for k in sorted(set(saved) | set(now)):
        a, b = saved.get(k, defaults.get(k)), now.get(k, defaults.get(k))
        if a != b:
            sa, sb = (json.dumps(v, default=str)[:60] for v in (a, b))
            out.append(f"{k}: {sa} -> {sb}")
    return "; ".join(out)


@torch.no_grad()
def _image_hidden_cache(model: StairModel, data: CaptionData, batch_size: int = 32) -> torch.Tensor:
    """The locked image tower's hidden states for every training image, once (float16, CPU)."""
    # lazy: progress bars load only for long work
    from tqdm.auto import tqdm

    model.image.eval()
    starts = tqdm(range(0, len(data.images), batch_size), desc="caching image tower outputs", leave=False)
    return torch.cat([model.image_hidden(model.pixels(data.images[i : i + batch_size])).to("cpu", torch.float16)
                      for i in starts])


def _tc_dict(tc: TrainConfig) -> dict[str, Any]:
    d = asdict(tc)
    d["stages"], d["steps"] = list(tc.stages), list(tc.steps)
    return d


def _sample(rng: np.random.Generator, data: CaptionData, batch_size: int) -> dict[str, np.ndarray]:
    """A batch of pairs with distinct images (two captions of one image are not negatives)."""
    order = rng.permutation(len(data))
    _, first = np.unique(data.pair_image[order], return_index=True)  # each image's first pair in that order
    chosen = order[np.sort(first)[:batch_size]]
    ids, mask = pad_tokens([data.pair_tokens[p] for p in chosen])
    return {"images": data.pair_image[chosen], "ids": ids, "mask": mask}


def _checkpoint(model: StairModel, opt, state: TrainState, tc: TrainConfig, ckpt: Path, rng: np.random.Generator, stream: Any = None) -> None:
    """Weights and trainer state are written together into a fresh folder that then replaces
    ``ckpt`` by renames, so a crash never leaves weights and state from different steps.
    Every process's stream position is gathered into it; only rank 0 writes."""
    world, rank = dist_info()
    streams = None
    if stream is not None:
        streams = [stream.state()]
        if world > 1:
            streams = [None] * world
            dist.all_gather_object(streams, stream.state())
    if rank != 0:
        _barrier()
        return
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
        "stream_states": streams,
    }
    torch.save(payload, tmp / "trainer_state.pt")
    shutil.rmtree(old, ignore_errors=True)
    if ckpt.exists():
        ckpt.rename(old)
    tmp.rename(ckpt)
    shutil.rmtree(old, ignore_errors=True)
    _barrier()


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
        if model.head == "stair":
            model.text_head.load_state_dict(text.head_state)
    if image is not None:
        model.image.load_state_dict(image.backbone.state_dict())
    return model.to(resolve_device(device))
