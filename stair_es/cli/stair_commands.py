"""`stair-es train | eval | localize | make-scenes`: train and inspect STAIR models.

Thin: flags in, ``stair_es.stair`` calls, results out. Library errors (stair_es.errors)
become one-line ``click.ClickException`` messages.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from stair_es.errors import ImageError, StairError


def _errors(f: Callable) -> Callable:
    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except StairError as e:
            raise click.ClickException(str(e)) from e

    return wrapper


def _floats(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


@click.command("train")
@click.argument("data")
@click.option("-o", "--output", required=True, type=click.Path(file_okay=False), help="Folder for the trained model, checkpoint/ and metrics.jsonl.")
@click.option("--config", "model_config", default="tiny", show_default=True, help="Model size: a shipped config name (tiny, cpu, small, paper) or a JSON file.")
@click.option("--head", type=click.Choice(["stair", "visualsparta", "vdr", "dense", "sparse"]), help="stair (default; 'sparse' is its old name): token projection heads; visualsparta: word embeddings scored against image patches, bag-of-words queries; vdr: elu1p + top-k gate, trained with a bag-of-words entry; dense: the CLIP-style baseline. All share the towers. See docs/stair.md.")
@click.option("--top-n", type=int, help="visualsparta: terms kept per image at index time (default 1000).")
@click.option("--vdr-k", type=int, help="vdr: k of the top-k gate (default 256).")
@click.option("--no-cts-mask", is_flag=True, help="vdr: train without the contrastive mask (the paper's ablation).")
@click.option("--text-tower", help="Pretrained text tower: a BERT-family MLM (transformers hub id or local folder) over the BERT WordPiece vocabulary; its MLM head initialises the token projection.")
@click.option("--image-tower", help="Pretrained image tower: a ViT, CLIP, SigLIP or DINOv2 hub id or folder, or efficientnet-lite0 (offline package).")
@click.option("--freeze-image-tower", is_flag=True, help="Keep the pretrained image backbone fixed (its outputs are cached once); only the image head trains.")
@click.option("--stages", default=None, help="Stage plan: '1,2,3' (paper; any subset in order) or 'single' (one stage, no mask: the ablation). Default: 1,2,3 for the stair and dense heads, single for visualsparta and vdr.")
@click.option("--steps", default="300", show_default=True, help="Steps per stage: one number for all stages, or one per stage ('300,300,600').")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Peak learning rate of stages 1, 2 and single.")
@click.option("--stage3-lr", type=float, default=1e-4, show_default=True, help="Peak learning rate of stage 3 (lower, against forgetting).")
@click.option("--lambda", "lam", type=float, default=1e-3, show_default=True, help="FLOPs weight for both modalities (grows quadratically at the start of a stage).")
@click.option("--warmup", "warmup_steps", type=int, default=50, show_default=True, help="Learning-rate warm-up steps per stage (capped at a fifth of the stage).")
@click.option("--flops-warmup", "flops_warmup_steps", type=int, default=200, show_default=True, help="Steps over which lambda grows from 0.")
@click.option("--eval-data", type=click.Path(exists=True, dir_okay=False), help="A held-out JSONL/CSV evaluated after every stage (logged to metrics.jsonl).")
@click.option("--images", "image_root", type=click.Path(file_okay=False), help="Image folder for a Karpathy split file (COCO: the folder holding train2014/ and val2014/) or for a JSONL's relative paths.")
@click.option("--split", "splits", default="train,restval", show_default=True, help="Karpathy splits to train on.")
@click.option("--stream", is_flag=True, help="Stream a JSONL (decode images per batch) instead of loading it into memory; Karpathy files and tar shards always stream.")
@click.option("--shuffle-buffer", type=int, default=2000, show_default=True, help="Pairs held in the streaming shuffle buffer (images are not decoded there).")
@click.option("--accum-steps", type=int, default=1, show_default=True, help="Micro-batches per step (gradient accumulation with the whole batch's negatives).")
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True, help="bf16 autocast (GPUs with bf16; optional on CPU).")
@click.option("--checkpoint-every", type=int, default=200, show_default=True, help="Write OUTPUT/checkpoint every N steps (and after each stage).")
@click.option("--log-every", type=int, default=25, show_default=True, help="Write a metrics.jsonl line every N steps.")
@click.option("--resume", is_flag=True, help="Continue from OUTPUT/checkpoint with the same settings.")
@click.option("--device", default=None, help="cpu, cuda, cuda:N (default: CUDA when present).")
@click.option("--threads", type=int, default=None, help="CPU threads for torch.")
@click.option("--seed", type=int, default=0, show_default=True)
@_errors
def train_cmd(data, output, model_config, stages, steps, lam, no_cts_mask, **opts):
    """Train a model with the --head of choice (STAIR by default; VisualSparta, VDR, dense) on DATA: JSONL lines
    {"image": path, "caption": str | "captions": [...]}, a CSV with image,caption columns,
    a Karpathy split file (dataset_coco.json / dataset_flickr30k.json, with --images), or
    WebDataset-style tar shards (a .tar, a glob in quotes, or a folder: key.jpg + key.txt/.json).

    Undecodable or missing images are skipped, empty or unreadable captions rejected, long
    captions truncated; all are counted in the summary and in metrics.jsonl. Under torchrun,
    each process takes batch-size / processes pairs and the loss sees all of them.
    """
    from dataclasses import fields

    import torch

    from stair_es.stair.config import load_config
    from stair_es.stair.data import load_caption_data
    from stair_es.stair.datasets import PairStream, open_source
    from stair_es.stair.train import TrainConfig, dist_info, init_distributed, new_model, train

    device = init_distributed() or opts["device"]
    # one voice under torchrun: only rank 0 prints
    echo = click.echo if dist_info()[1] == 0 else (lambda *a, **k: None)
    if opts["threads"]:
        torch.set_num_threads(opts["threads"])
    cfg = load_config(model_config)
    changes = {k: opts[k] for k in ("head", "top_n", "vdr_k") if opts[k] is not None}
    if changes:
        cfg = cfg.replace(**changes)
    if stages is None:
        stages = "single" if cfg.head in ("visualsparta", "vdr") else "1,2,3"
    stage_list = ("single",) if stages.strip() == "single" else _floats(stages)
    try:
        step_list = tuple(int(s) for s in _floats(steps))
    except ValueError:
        raise click.BadParameter(f"--steps wants integers separated by commas, got {steps!r}") from None
    # the options named as TrainConfig's fields go in as they are
    tc = TrainConfig(stages=stage_list, steps=step_list, lambda_image=lam, lambda_text=lam, vdr_cts_mask=not no_cts_mask,
                     **{f.name: opts[f.name] for f in fields(TrainConfig) if f.name in opts})
    seed, text_tower, image_tower = tc.seed, opts["text_tower"], opts["image_tower"]
    model = new_model(cfg, device, seed=seed, text_tower=text_tower, image_tower=image_tower)
    cfg = model.config
    if text_tower or image_tower:
        echo(f"towers: text {cfg.text_tower or 'random'} ({cfg.text_width} wide), image {cfg.image_tower or 'random'} "
                   f"({cfg.image_width} wide, {cfg.image_size} px)", err=True)
    if opts["stream"] or not data.lower().endswith((".jsonl", ".ndjson", ".csv", ".tsv")):
        source = open_source(data, image_root=opts["image_root"], splits=_floats(opts["splits"]))
        train_data = PairStream(source, image_size=cfg.image_size, max_length=cfg.text_max_length, seed=seed,
                                buffer=opts["shuffle_buffer"])
        echo(f"streaming {source.name}", err=True)
    else:
        train_data = load_caption_data(data, image_size=cfg.image_size, max_length=cfg.text_max_length)
        echo(train_data.report.summary(), err=True)
    eval_data = opts["eval_data"]
    held = load_caption_data(eval_data, image_size=cfg.image_size, max_length=cfg.text_max_length) if eval_data else None
    res = train(model, train_data, tc, output, resume=opts["resume"], eval_data=held)
    if isinstance(train_data, PairStream):
        echo(train_data.report.summary(), err=True)
    echo(f"model saved to {output} ({res['seconds']:.0f} s)")
    for h in res["history"]:
        echo(json.dumps(h))


@click.command("eval")
@click.argument("model")
@click.argument("data")
@click.option("--images", "image_root", type=click.Path(file_okay=False), help="Image folder of a Karpathy split file (COCO: the folder holding val2014/; Flickr30k: flickr30k-images/).")
@click.option("--split", default="test", show_default=True, help="Karpathy split to evaluate (test = COCO 5K / Flickr30K 1K).")
@click.option("--prompt", default="", help='Text put before every caption (the paper reports with "a photo of ").')
@click.option("--standard", is_flag=True, help="Use the standard protocol on a JSONL too (each caption belongs to its own image only).")
@click.option("--max-images", type=int, help="Evaluate the first N images only (a quick check; not the standard figure).")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--device", default=None, help="cpu, cuda, cuda:N (default: CUDA when present).")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@click.option("--head", help="The head MODEL must have been trained with (stair, visualsparta, vdr, dense); a mismatch is an error.")
@click.option("--text-mode", type=click.Choice(["model", "bow"]), default="model", show_default=True,
              help="bow: captions as bags of their own tokens, no text network (VDR's non-parametric inference); synthetic-scene protocol only.")
@_errors
def eval_cmd(model, data, image_root, split, prompt, standard, max_images, batch_size, device, as_json, head, text_mode):
    """Evaluate MODEL (a directory or hub id) on DATA.

    A Karpathy split file (dataset_coco.json / dataset_flickr30k.json, with --images) or tar
    shards use the standard protocol: every caption queries all images (text->image), and an
    image is right at K when any of its captions is in the top K of all captions
    (image->text); R@1/5/10 printed in the paper's Table 1 layout. Ties count against the query.

    A JSONL/CSV (e.g. `stair-es make-scenes`) uses the synthetic-scene protocol: the first
    caption of each image is its query, and every image carrying that exact caption is right;
    plus interpretability (label words among the image's top tokens; needs "labels").
    """
    from stair_es.stair.model import StairModel

    m = StairModel.from_pretrained(model, device=device, head=head)
    lower = data.lower()
    if standard or not lower.endswith((".jsonl", ".ndjson", ".csv", ".tsv")):
        if text_mode != "model":
            raise click.BadParameter("--text-mode bow is implemented for the synthetic-scene protocol (a JSONL/CSV without --standard) only")
        from stair_es.stair.datasets import KarpathySource, open_source
        from stair_es.stair.evaluate import evaluate_retrieval, format_table

        source = open_source(data, image_root=image_root, splits=_floats(split))
        res = evaluate_retrieval(m, source, batch_size=batch_size, prompt=prompt, max_images=max_images, progress=not as_json)
        if as_json:
            click.echo(json.dumps(res))
            return
        n = res["n_images"]
        names = {"coco": "COCO", "flickr30k": "Flickr30K", "flickr8k": "Flickr8K"}
        ds = names.get(getattr(source, "dataset", ""), "") if isinstance(source, KarpathySource) else ""
        size = f"{n // 1000}K" if n % 1000 == 0 else f"{n}"
        title = f"{ds} {size}".strip() if ds else f"{source.name} ({n} images)"
        click.echo(format_table(res, f"{title}: {n} images, {res['n_captions']} captions", str(model)))
        for k, v in res.items():
            if k.startswith(("active", "interp")):
                click.echo(f"{k:22s} {v:.4f}")
        click.echo(res_summary(res), err=True)
        return
    from stair_es.stair.data import load_caption_data
    from stair_es.stair.evaluate import evaluate

    d = load_caption_data(data, image_size=m.config.image_size, max_length=m.config.text_max_length)
    res = evaluate(m, d, text_mode=text_mode)
    if as_json:
        click.echo(json.dumps(res))
        return
    for k, v in res.items():
        click.echo(f"{k:22s} {v:.4f}" if isinstance(v, float) else f"{k:22s} {v}")


def res_summary(res: dict) -> str:
    d = res["data"]
    return (f"data: {d['images']} images, {d['pairs']} captions used; {d['skipped_count']} images skipped (missing or undecodable), "
            f"{d['rejected_captions']} captions rejected (empty or unreadable), {d['truncated_captions']} truncated")


@click.command("localize")
@click.argument("image", type=click.Path(exists=True, dir_okay=False))
@click.argument("query")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="PNG to write: the image with the heatmap over it.")
@click.option("--model", required=True, help="A STAIR model directory or hub id.")
@click.option("--alpha", type=float, default=0.5, show_default=True, help="Heatmap opacity.")
@click.option("--scale", type=int, default=4, show_default=True, help="Enlarge the output image this many times.")
@_errors
def localize_cmd(image, query, output, model, alpha, scale):
    """Show where QUERY's tokens fire in IMAGE (per-patch activations, no text encoder)."""
    from PIL import Image, UnidentifiedImageError

    from stair_es.stair.localize import write_heatmap
    from stair_es.stair.model import StairModel

    try:
        img = Image.open(image)
        img.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ImageError(f"cannot decode {image}: {e}") from e
    m = StairModel.from_pretrained(model)
    write_heatmap(m, img, query, output, alpha=alpha, scale=scale)
    click.echo(output)


@click.command("make-scenes")
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--n-train", type=int, default=2000, show_default=True)
@click.option("--n-test", type=int, default=500, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--size", type=int, default=64, show_default=True, help="Image side in pixels.")
@_errors
def make_scenes_cmd(out, n_train, n_test, seed, size):
    """Draw synthetic captioned scenes (shapes, colours, sizes, spatial relations) into OUT:
    train/ and test/ PNGs with train.jsonl and test.jsonl. Same seed, same scenes.
    """
    from stair_es.stair.scenes import make_scenes

    for split, path in make_scenes(out, n_train=n_train, n_test=n_test, seed=seed, size=size).items():
        click.echo(f"{split}: {path}")


COMMANDS = [train_cmd, eval_cmd, localize_cmd, make_scenes_cmd]
