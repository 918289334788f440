"""Image encoding speed of the pretrained-model encoders beside the default EfficientNet-Lite0.

    python benchmarks/pretrained_bench.py --rows lite0,vdr      # 64 photos, 3 runs (default: every row)
    python benchmarks/pretrained_bench.py --rows vdr-text       # one text query at a time (5 queries x runs)
    python benchmarks/pretrained_bench.py --rows vdr,lite0 --images 32 --runs 5 --out report.json

The hub cannot be reached from the machines that build stair_es, so the pretrained rows run
**random weights of the released sizes** (speed does not depend on the weights' values): the
model is made once under ``--work`` (seeded, so the same bytes every time and the ONNX export
is cached by their sha256) and its towers exported before timing. Every row runs in ONNX
Runtime (``runtime="onnx"``); the time covers ``encode_images`` on photos already decoded
(resize/crop/normalise + the tower + the top-k), batch ``--batch``, after one warm-up batch.
The figure is the median over ``--runs`` runs of images per second (min and max beside it).
The report carries the git commit, the machine and its load average (a shared machine: the
figures move with what else runs).

A new encoder is one entry in :data:`ROWS` (images/s) or :data:`TEXT_ROWS` (ms per text
query): a name, what it is, and a function that returns the encoder given the work folder.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Timer, machine_info, percentiles, provenance_line  # noqa: E402
from benchmarks.encoder_bench import sample_photos  # noqa: E402


# --- random checkpoints of the released sizes ---------------------------------------------------
VDR_B32 = {  # vsearch/vdr-cross-modal's image tower (the reference defaults: ViT-B/32 at 224 px)
    "encoder_p": {"type": "vdr_crossmodal_image", "resolution": 224, "patch_size": 32, "width": 768, "layers": 12,
                  "heads": 12, "topk": 768},
    # the text tower does not take part in image encoding: a small one keeps the file at ~0.45 GB
    "encoder_q": {"type": "vdr_crossmodal_text", "max_len": 32, "topk": 768, "hidden_size": 64, "num_hidden_layers": 2,
                  "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 64},
}


VDR_TEXT_BASE = {  # vsearch/vdr-cross-modal's text tower (bert-base, max_len 128 as in the reference's config)
    "encoder_p": {"type": "vdr_crossmodal_image", "resolution": 64, "patch_size": 32, "width": 32, "layers": 1,
                  "heads": 2, "topk": 768},
    "encoder_q": {"type": "vdr_crossmodal_text", "max_len": 128, "topk": 768},
}


def make_vdr(folder: Path, config: dict[str, Any] = VDR_B32, seed: int = 0) -> Path:
    """A VDR cross-modal checkpoint folder (config.json + model.safetensors) with seeded random weights."""
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        if json.loads((folder / "config.json").read_text()) == {"architectures": ["Retriever"], **config}:
            return folder
    import torch
    from safetensors.torch import save_file

    from stair_es.encoders.vdr import VdrConfig, build_towers, restricted_ids

    cfg = VdrConfig.from_json(config, str(folder))
    image, text = build_towers(cfg, restricted_ids())
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for prefix, tower in (("encoder_p.", image), ("encoder_q.", text)):
        for name, tensor in tower.state_dict().items():
            value = torch.ones_like(tensor) if name.endswith(("ln_1.weight", "ln_2.weight", "ln_pre.weight", "ln_post.weight",
                                                              "LayerNorm.weight", "ln.weight")) else \
                0.02 * torch.randn(tensor.shape, generator=gen)
            state[prefix + name] = value.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["Retriever"], **config}, indent=2))
    return folder


# --- the rows -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    name: str
    what: str
    make: Callable[[Path], Any]  # work folder -> an encoder (loaded lazily is fine: it is warmed up)


def _lite0(work: Path):
    from stair_es.encoders.imagenet import ImageNetLabelEncoder

    return ImageNetLabelEncoder(runtime="onnx")


def _default(work: Path):
    from stair_es.encoders import get_encoder

    return get_encoder("default")


def _vdr(work: Path):
    from stair_es.encoders.vdr import VdrEncoder

    return VdrEncoder(str(make_vdr(work / "vdr-vit-b32-random")), runtime="onnx")


def _clip_vocab(family: str):
    def make(work: Path):
        from benchmarks.clip_models import make_clip, make_siglip
        from stair_es.encoders import get_encoder

        maker = make_clip if family == "clip" else make_siglip
        folder = work / f"{family}-b32-random"
        if not (folder / "config.json").is_file():
            maker(folder, size="b32")
        return get_encoder("clip-vocab", model=str(folder), runtime="onnx")

    return make


def _vdr_text(work: Path):
    from stair_es.encoders.vdr import VdrEncoder

    return VdrEncoder(str(make_vdr(work / "vdr-bert-base-random", VDR_TEXT_BASE)), runtime="onnx")


#: Rows timed on one text query at a time (the latency a search pays to encode its query).
TEXT_ROWS: tuple[Row, ...] = (
    Row("vdr-text", "vdr: VDR cross-modal text tower, bert-base over 128 positions, random weights of the released size",
        _vdr_text),
)

ROWS: tuple[Row, ...] = (
    Row("lite0", "imagenet encoder: EfficientNet-Lite0 ImageNet classes as words (the default encoder's base)", _lite0),
    Row("default", "default encoder: Lite0 + colours + clip-art head + OCR", _default),
    Row("vdr", "vdr: VDR cross-modal image tower, ViT-B/32 at 224 px, random weights of the released size", _vdr),
    Row("clip", "clip-vocab on a CLIP ViT-B/32 of random weights (benchmarks/clip_models.py, size b32)", _clip_vocab("clip")),
    Row("siglip", "clip-vocab on a SigLIP of random weights (benchmarks/clip_models.py, size b32)", _clip_vocab("siglip")),
)



def time_row(row: Row, work: Path, images: list, batch: int, runs: int) -> dict[str, Any]:
    started = time.perf_counter()
    enc = row.make(work)
    enc.encode_images(images[:batch], batch_size=batch)  # warm-up: loads, exports if needed
    setup = time.perf_counter() - started
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        vectors = enc.encode_images(images, batch_size=batch)
        rates.append(len(images) / (time.perf_counter() - t0))
    nnz = statistics.median(v.nnz for v in vectors)
    return {"row": row.name, "what": row.what, "images": len(images), "batch": batch, "runs": runs,
            "images_per_s_median": round(statistics.median(rates), 2), "images_per_s_min": round(min(rates), 2),
            "images_per_s_max": round(max(rates), 2), "median_tokens": nnz, "setup_s": round(setup, 1),
            "runtime": getattr(enc, "runtime_in_use", "onnx") if row.name != "default" else "onnx"}


QUERIES = ("a dog on a beach", "a red car parked on a street at night", "two children playing football in a park",
           "a bowl of soup", "an old man reading a newspaper on a bench")


def time_text_row(row: Row, work: Path, runs: int) -> dict[str, Any]:
    started = time.perf_counter()
    enc = row.make(work)
    enc.encode_texts(["warm up"])  # loads, exports if needed
    setup = time.perf_counter() - started
    ms = []
    for _ in range(runs):
        for q in QUERIES:
            with Timer() as t:
                enc.encode_texts([q])
            ms.append(t.wall_ms)
    return {"row": row.name, "what": row.what, "queries": len(ms),
            **{k: round(v, 1) for k, v in percentiles(ms, (50, 95)).items() if k != "n"},
            "min_ms": round(min(ms), 1), "max_ms": round(max(ms), 1), "setup_s": round(setup, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = [r.name for r in ROWS + TEXT_ROWS]
    p.add_argument("--rows", default=",".join(names), help=f"comma-separated, of: {', '.join(names)}")
    p.add_argument("--images", type=int, default=64, help="photos per run (sample photos cycled)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work", type=Path, default=None, help="where the random checkpoints are kept (default: model cache)")
    p.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = p.parse_args()
    from stair_es.encoders.runtime import model_cache_dir

    work = args.work or (model_cache_dir() / "bench")
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(wanted) - set(names)
    if unknown:
        p.error(f"unknown rows {sorted(unknown)}; known: {', '.join(names)}")
    photos = sample_photos()
    images = []
    for i in range(args.images):
        im = photos[i % len(photos)]
        scale = 640 / max(im.size)
        images.append(im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale)))))
    machine = machine_info()
    report = {"commit": machine["commit"], "machine": machine, "rows": [], "text_rows": []}
    print(f"# pretrained encoders  {provenance_line(machine)}")
    image_rows = [r for r in ROWS if r.name in wanted]
    if image_rows:
        print(f"{'row':<8} {'images/s (median)':>18} {'min':>7} {'max':>7} {'tokens':>7} {'setup s':>8}  what")
    for row in image_rows:
        result = time_row(row, work, images, args.batch, args.runs)
        report["rows"].append(result)
        print(f"{row.name:<8} {result['images_per_s_median']:>18} {result['images_per_s_min']:>7} "
              f"{result['images_per_s_max']:>7} {result['median_tokens']:>7} {result['setup_s']:>8}  {row.what}", flush=True)
    text_rows = [r for r in TEXT_ROWS if r.name in wanted]
    if text_rows:
        print(f"\n{'row':<8} {'p50 ms per query':>22} {'p95':>7} {'min':>7} {'max':>7} {'setup s':>8}  what")
    for row in text_rows:
        result = time_text_row(row, work, args.runs)
        report["text_rows"].append(result)
        print(f"{row.name:<8} {result['p50_ms']:>22} {result['p95_ms']:>7} {result['min_ms']:>7} {result['max_ms']:>7} "
              f"{result['setup_s']:>8}  "
              f"{row.what}", flush=True)
    report["machine"]["loadavg_end"] = list(os.getloadavg())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
