"""clip-vocab image speed on ViT-B/32-sized random CLIP weights, beside Lite0, without the hour-long matrix.

    python benchmarks/clip_vocab_bench.py                                   # lite0 and clip-vocab
    python benchmarks/clip_vocab_bench.py --encoders clip-vocab --images 64 --runs 3 --json out.json

``benchmarks/pretrained_bench.py --rows clip`` measures the same encoder, but its warm-up
computes the whole vocabulary matrix (43,916 prompts through the text tower), which takes an
hour on two busy cores. This runner embeds only the first ``--clip-words`` words (default
2,048), times that to give the prompt rate and an extrapolated full-matrix time, and scores
images against a full-size matrix (the 2,048 rows tiled to 10,979), so the per-image cost is
the real one. The figures: the median images/s over ``--runs`` runs of ``encode_images`` on
``--images`` real photos (scikit-image's, cycled; preprocessing, ONNX Runtime, scoring, top-k)
and CPU ms per image (user + sys of this process), after a warm-up; export and matrix times
apart. The report carries the commit, the CPU and the load average.

Entries: ``lite0`` (the ``imagenet`` encoder: EfficientNet-Lite0, ONNX Runtime) and
``clip-vocab`` (CLIP ViT-B/32's architecture: vision 12 x 768, patch 32, 224 px; text 12 x 512;
512-d; random weights from ``benchmarks/clip_models.py``; ONNX Runtime).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import Timer, machine_info  # noqa: E402


def _photos(n: int) -> list[Any]:
    """``n`` real photos (scikit-image), cycled, as RGB PIL images."""
    from PIL import Image

    out = []
    try:
        import skimage.data as skd

        for name in ("astronaut", "chelsea", "coffee", "rocket", "horse", "camera"):
            try:
                out.append(Image.fromarray(getattr(skd, name)()).convert("RGB"))
            except Exception:  # some skimage photos need a download
                continue
    except ImportError:
        pass
    if not out:
        import numpy as np

        rng = np.random.default_rng(0)
        out = [Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8))]
    return [out[i % len(out)] for i in range(n)]


def bench_lite0(workdir: Path, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from stair_es.encoders.base import get_encoder

    enc = get_encoder("imagenet")
    enc.load()
    return enc, {"model": "EfficientNet-Lite0 (ImageNet-1k, offline weights)", "runtime": "onnx"}


def bench_clip_vocab(workdir: Path, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    import numpy as np

    from benchmarks.clip_models import make_clip
    from stair_es.encoders.base import get_encoder

    folder = workdir / "clip-b32"
    if not (folder / "model.safetensors").is_file():
        make_clip(folder, size="b32")
    enc = get_encoder("clip-vocab", model=str(folder), runtime="onnx")
    t = time.perf_counter()
    enc._tower("image"), enc._tower("text")
    export_s = time.perf_counter() - t
    words = max(1, min(int(args.clip_words), len(enc.word_list)))
    notes: dict[str, Any] = {"model": "CLIP ViT-B/32 architecture, random weights", "runtime": "onnx",
                             "export_s": round(export_s, 1), "vocabulary_words": len(enc.word_list)}
    if words < len(enc.word_list):
        full_rows = len(enc.word_list)
        enc.word_list = enc.word_list[:words]
        enc.word_ids = enc.word_ids[:words]
        t = time.perf_counter()
        matrix = enc._compute_matrix(workdir / f"clip-b32-matrix-{words}.npy", progress=False)
        secs = time.perf_counter() - t
        reps = -(-full_rows // words)
        enc._matrix = np.tile(matrix, (reps, 1))[:full_rows]  # full-size scoring cost per image
        enc.word_ids = np.resize(enc.word_ids, full_rows)
        notes.update(matrix_words=words, matrix_s=round(secs, 1), prompts_per_s=round(words * len(enc.templates) / secs, 1),
                     matrix_s_full_estimate=round(secs * full_rows / words, 0))
    else:
        t = time.perf_counter()
        enc.vocabulary_matrix(progress=True)
        notes.update(matrix_words=len(enc.word_list), matrix_s=round(time.perf_counter() - t, 1))
    return enc, notes


ENCODERS: dict[str, Callable[[Path, argparse.Namespace], tuple[Any, dict[str, Any]]]] = {
    "lite0": bench_lite0,
    "clip-vocab": bench_clip_vocab,
}


def run_one(name: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    t = time.perf_counter()
    enc, notes = ENCODERS[name](workdir, args)
    setup_s = time.perf_counter() - t
    images = _photos(args.images)
    enc.encode_images(images[: min(4, len(images))], batch_size=args.batch)  # warm-up (sessions, thread pools)
    rates, cpu_ms = [], []
    for _ in range(args.runs):
        with Timer() as t:
            vecs = enc.encode_images(images, batch_size=args.batch)
        rates.append(len(images) / t.wall_s)
        cpu_ms.append(1000 * t.cpu_s / len(images))
    return {"encoder": name, "images": len(images), "batch": args.batch, "runs": args.runs,
            "images_per_s": round(statistics.median(rates), 2), "images_per_s_all": [round(r, 2) for r in rates],
            "cpu_ms_per_image": round(statistics.median(cpu_ms), 1), "setup_s": round(setup_s, 1),
            "mean_nnz": round(sum(v.nnz for v in vecs) / len(vecs), 1), **notes}


def machine() -> dict[str, Any]:
    """benchmarks.common's provenance, with ONNX Runtime's version and thread setting."""
    info = machine_info(("stair-es", "numpy", "onnxruntime", "transformers", "torch"))
    info["ort_threads"] = os.environ.get("STAIR_ES_ORT_THREADS", "all")
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--encoders", default=",".join(ENCODERS), help=f"comma-separated, of: {', '.join(ENCODERS)}")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--clip-words", type=int, default=2048, help="words embedded for clip-vocab's matrix (see above)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the random checkpoint is made (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.encoders.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENCODERS]
    if unknown:
        ap.error(f"unknown encoder(s) {', '.join(unknown)}; available: {', '.join(ENCODERS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="stair-es-clip-vocab-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        print(f"[{name}] building and warming up ...", file=sys.stderr, flush=True)
        rows.append(run_one(name, workdir, args))
    result = {"machine": machine(), "results": rows}
    print(f"{'encoder':<12} {'images/s':>9} {'CPU ms/img':>11} {'setup s':>8}  notes")
    for r in rows:
        extra = {k: v for k, v in r.items() if k not in ("encoder", "images_per_s", "cpu_ms_per_image", "setup_s")}
        print(f"{r['encoder']:<12} {r['images_per_s']:>9.2f} {r['cpu_ms_per_image']:>11.1f} {r['setup_s']:>8.1f}  {json.dumps(extra)}")
    print(json.dumps(result["machine"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
