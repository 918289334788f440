"""The ``objects`` source's detector at several input sizes: its CPU per picture, and how far its
detections agree with the model's own at 512 px (the size it was trained at).

    python -m benchmarks.encoders.objects_sizes                      # photos, sizes 192-320
    python -m benchmarks.encoders.objects_sizes --sets photos,samples --sizes 224,256 --thresholds 0.25,0.3
    python -m benchmarks.encoders.objects_sizes --sets photos,tuxpaint,openclipart --gate-only   # the drawing gate

``--gate-only`` prints instead which pictures the source takes for drawn (never run): by rules 1
(the share of flat pixels, :func:`~stair_es.encoders.clipart.drawing_score`) and by rules 2 (flat
outside a plain background too, :func:`~stair_es.encoders.clipart.foreground_flatness`), for the
set's pictures as they are and pasted onto a white canvas (``--on-white``: the picture's share
of the canvas width), the way catalog product photos are shot.

For every picture of the sets (the public evaluation sets, ``benchmarks/encoders/sets.py``) the
detector's per-class heatmap peaks are computed at each size and at 512 px. A class counts as
found at a size when its peak reaches the threshold; the reference is what 512 px finds at 0.3.
Precision and recall of each (size, threshold) against it say how much of the model's own
judgement survives the smaller input; ``person recall`` is the person class alone (what the
counting words need). CPU: one thread (``STAIR_ES_ORT_THREADS=1``), batches of 16 pictures,
median of ``--rounds``. Retrieval quality of a size is measured by ``benchmarks.encoders.run``
(docs/encoders.md, "Objects as a default source"). Needs the detector (``stair-es encoders export``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def peaks_at(size: int, images: list) -> tuple[np.ndarray, float]:
    """Every picture's class peaks at ``size`` px, and the detector's CPU ms per picture."""
    from stair_es.encoders.objects import ObjectsSource

    src = ObjectsSource(size=size)
    run = src.load()
    out, cpu = [], []
    for i in range(0, len(images), 16):
        x = np.stack([src.preprocess(im) for im in images[i:i + 16]])
        t = time.process_time()
        out.append(run(x)[0])
        cpu.append((time.process_time() - t) / len(x) * 1000)
    return np.concatenate(out), statistics.median(cpu)


def gate_table(name: str, images: list, on_white: list[float], max_flat: float = 0.45) -> None:
    from PIL import Image

    from stair_es.encoders.clipart import drawing_score, foreground_flatness

    def pasted(im, frac: float):
        canvas = Image.new("RGB", (int(im.width / frac), int(im.height / frac)), "white")
        canvas.paste(im, ((canvas.width - im.width) // 2, (canvas.height - im.height) // 2))
        return canvas

    for frac in [1.0, *on_white]:
        ims = images if frac == 1.0 else [pasted(im, frac) for im in images]
        flat = np.array([drawing_score(im) for im in ims]) >= max_flat
        fg = np.array([foreground_flatness(im) for im in ims]) >= max_flat
        where = "as they are" if frac == 1.0 else f"on white, {frac:g} of the width"
        print(f"{name:12s} {where:26s} drawn by rules 1: {flat.mean():.2f}   by rules 2: {(flat & fg).mean():.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="photos", help="comma-separated sets of benchmarks/encoders/sets.py")
    ap.add_argument("--sizes", default="192,224,256,320")
    ap.add_argument("--thresholds", default="0.25,0.3")
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--gate-only", action="store_true", help="print only which pictures count as drawn")
    ap.add_argument("--on-white", default="0.7,0.5", help="with --gate-only: canvas widths to paste pictures into")
    args = ap.parse_args()
    os.environ["STAIR_ES_ORT_THREADS"] = "1"
    from benchmarks.common import provenance_line
    from benchmarks.encoders.sets import load_query_set

    print(f"# {provenance_line()}; load avg {os.getloadavg()[0]:.2f}")
    for name in args.sets.split(","):
        images = [it.load().convert("RGB") for it in load_query_set(name, limit=args.limit).items]
        if args.gate_only:
            gate_table(name, images, [float(f) for f in args.on_white.split(",") if f])
            continue
        ref = peaks_at(512, images)[0] >= 0.3
        print(f"{name}: {len(images)} pictures, {int(ref.sum())} detections at 512 px and 0.3 (the reference)")
        print(f"{'size':>5} {'threshold':>9} {'found':>6} {'precision':>9} {'recall':>6} {'person recall':>13} {'CPU ms':>7}")
        for size in (int(s) for s in args.sizes.split(",")):
            peaks, cpu = peaks_at(size, images)
            for thr in (float(t) for t in args.thresholds.split(",")):
                found = peaks >= thr
                hit = found & ref
                print(f"{size:>5} {thr:>9} {int(found.sum()):>6} {hit.sum() / max(found.sum(), 1):>9.2f} "
                      f"{hit.sum() / max(ref.sum(), 1):>6.2f} {hit[:, 0].sum() / max(ref[:, 0].sum(), 1):>13.2f} {cpu:>7.1f}")


if __name__ == "__main__":
    main()
