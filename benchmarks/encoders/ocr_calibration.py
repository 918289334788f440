"""How well the ``ocr`` token source reads, on data that is *not* an evaluation set.

    python -m benchmarks.encoders.ocr_calibration [--drawings 150] [--side 256] [--rec-width 96] [--out FILE]

The source's thresholds (``min_confidence``, ``glyph_confidence``) and its drawing gate are
chosen here, never on Tux Paint (the out-of-domain evaluation set) or on the Openclipart
drawings the evaluation samples:

* **positives**: letters a-z / A-Z and digits 0-9 drawn with Pillow in DejaVu Sans, Sans Bold
  and Serif (filled in black or a colour, and outlined), plus common sign words, on white;
* **negatives**: Openclipart drawings the evaluation never samples (the held-out ids of
  ``scripts/build_clipart_head.py`` are skipped) -- some of these really contain text, so
  their "false reads" are an upper bound -- and the photos the int8 tower is calibrated on.

For every picture it records the raw reads (all confidences), then prints, per threshold,
the share of glyphs read right and the share of negatives given at least one token.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FONTS = Path("/usr/share/fonts/truetype/dejavu")
SIGN_WORDS = ["STOP", "EXIT", "OPEN", "SALE", "HOTEL", "TAXI", "coffee", "pizza", "POLICE", "school", "milk", "BUS"]


def synthetic() -> list[tuple[str, object]]:
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(1)
    out = []
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + list("0123456789")
    fonts = [f for f in ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf") if (FONTS / f).exists()]
    for text in chars + SIGN_WORDS:
        font_name = rng.choice(fonts)
        size = rng.choice([60, 90, 120])
        font = ImageFont.truetype(str(FONTS / font_name), size)
        style = rng.choice(["black", "colour", "outline"])
        l, t, r, b = font.getbbox(text)
        pad = rng.choice([4, 12, 30])
        im = Image.new("RGB", (r - l + 2 * pad, b - t + 2 * pad), "white")
        d = ImageDraw.Draw(im)
        fill = {"black": (0, 0, 0), "colour": tuple(rng.randrange(0, 180) for _ in range(3)), "outline": (255, 255, 255)}[style]
        d.text((pad - l, pad - t), text, font=font, fill=fill,
               stroke_width=3 if style == "outline" else 0, stroke_fill=(0, 0, 0))
        out.append((text, im))
    return out


def negatives(n_drawings: int) -> list[tuple[str, object]]:
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "benchmarks" / "encoders"))
    from build_clipart_head import held_out_ids  # type: ignore[import-not-found]
    from sets import openclipart_set  # type: ignore[import-not-found]

    held = held_out_ids()
    pool = [it for it in openclipart_set(limit=None) if it.id not in held]
    pool = random.Random(7).sample(pool, min(n_drawings, len(pool))) if n_drawings else []
    out = [(f"openclipart:{it.id}", it.load()) for it in pool]
    from stair_es.encoders.imagenet import calibration_images

    out += [(f"photo:{i}", im) for i, im in enumerate(calibration_images()[::6])]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drawings", type=int, default=150)
    ap.add_argument("--side", type=int, default=256, help="the detector's picture size (the source's default: 256)")
    ap.add_argument("--rec-width", type=int, default=0, help="the recogniser's minimum width (default: the source's)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    import stair_es.encoders.ocr as ocr
    from stair_es.encoders.clipart import drawing_score
    from stair_es.encoders.ocr import OcrSource

    if args.rec_width:
        ocr.REC_MIN_WIDTH = args.rec_width
    # one thread: CPU ms per picture comparable between settings
    src = OcrSource(images="all", side=args.side, min_confidence=0.0, char_confidence=0.0, threads=1)
    src.read(synthetic()[0][1])  # engine start-up out of the timing
    rows = []
    t0 = time.perf_counter()
    for kind, items in (("glyph", synthetic()), ("negative", negatives(args.drawings))):
        for label, im in items:
            t = time.perf_counter()
            c = time.process_time()
            reads = src.read(im)
            rows.append({"kind": kind, "label": label, "flat": round(drawing_score(im), 3), "reads": reads,
                         "cpu_ms": round(1000 * (time.process_time() - c), 1), "ms": round(1000 * (time.perf_counter() - t), 1)})
    glyphs = [r for r in rows if r["kind"] == "glyph"]
    negs = [r for r in rows if r["kind"] == "negative"]
    print(f"# {len(rows)} pictures read in {time.perf_counter() - t0:.0f} s; side {args.side}, recogniser width "
          f">= {ocr.REC_MIN_WIDTH}; CPU ms per picture (mean): glyphs {statistics.mean(r['cpu_ms'] for r in glyphs):.0f}, "
          f"negatives {statistics.mean(r['cpu_ms'] for r in negs):.0f}")
    print(f"{'threshold':>9} {'glyphs read right':>18} {'negatives with a read':>22} {'drawn negatives':>16}")
    for th in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        right = sum(any(t.strip().lower() == r["label"].lower() and s >= th for t, s in r["reads"]) for r in glyphs)
        fp = [r for r in negs if any(s >= th for _, s in r["reads"])]
        fp_drawn = [r for r in fp if r["flat"] >= 0.3]
        print(f"{th:>9.2f} {right / len(glyphs):>18.3f} {len(fp) / len(negs):>22.3f} {len(fp_drawn):>16d}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
