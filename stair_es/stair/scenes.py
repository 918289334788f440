"""Synthetic captioned scenes drawn with Pillow, so the STAIR recipe can be trained on a CPU.

Each scene holds one or two shapes (circle, square, triangle, diamond) in one of several
colours and two sizes; two-shape scenes are described with a spatial relation ("a small red
circle left of a large blue square"). Output: ``<out>/{train,test}/*.png`` and
``<out>/{train,test}.jsonl`` with ``image`` (relative path), ``captions`` and ``labels`` (the
scene's shape and colour words, the ground truth of the interpretability metric); and
``<out>/{train,test}.manifest.jsonl``, the same images as a `stair-es ingest` manifest (id, path,
first caption, metadata: shapes, colors, objects).
Deterministic by seed. Knows nothing about models.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError

SHAPES = ("circle", "square", "triangle", "diamond")
COLORS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 220, 40),
    "purple": (150, 60, 200),
    "orange": (245, 140, 30),
    "white": (245, 245, 245),
}
SIZES = {"small": 0.11, "large": 0.21}  # radius as a fraction of the canvas side
RELATIONS = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
BACKGROUND = (60, 60, 60)


@dataclass(frozen=True)
class Shape:
    shape: str
    color: str
    size: str
    cx: float
    cy: float

    def phrase(self, with_size: bool = True) -> str:
        return f"a {self.size} {self.color} {self.shape}" if with_size else f"a {self.color} {self.shape}"


def _draw(draw, s: Shape, side: int) -> None:
    r = SIZES[s.size] * side
    x, y = s.cx * side, s.cy * side
    fill = COLORS[s.color]
    if s.shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=fill)
    elif s.shape == "square":
        q = r * 0.85
        draw.rectangle([x - q, y - q, x + q, y + q], fill=fill)
    elif s.shape == "triangle":
        draw.polygon([(x, y - r), (x - r, y + r * 0.8), (x + r, y + r * 0.8)], fill=fill)
    elif s.shape == "diamond":
        draw.polygon([(x, y - r), (x + r, y), (x, y + r), (x - r, y)], fill=fill)


def _scene(rng: random.Random) -> tuple[list[Shape], list[str]]:
    n = rng.choice((1, 2, 2))
    if n == 1:
        s = Shape(rng.choice(SHAPES), rng.choice(list(COLORS)), rng.choice(list(SIZES)), rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7))
        return [s], [s.phrase(), s.phrase(with_size=False)]
    rel = rng.choice(list(RELATIONS))
    a_shape, b_shape = rng.sample(SHAPES, 2) if rng.random() < 0.7 else (rng.choice(SHAPES),) * 2
    a_col, b_col = rng.sample(list(COLORS), 2)
    a_pos, b_pos = (0.27, 0.73) if rel in ("left of", "above") else (0.73, 0.27)
    jitter = lambda: rng.uniform(0.3, 0.7)
    if rel in ("left of", "right of"):
        a = Shape(a_shape, a_col, rng.choice(list(SIZES)), a_pos + rng.uniform(-0.04, 0.04), jitter())
        b = Shape(b_shape, b_col, rng.choice(list(SIZES)), b_pos + rng.uniform(-0.04, 0.04), jitter())
    else:
        a = Shape(a_shape, a_col, rng.choice(list(SIZES)), jitter(), a_pos + rng.uniform(-0.04, 0.04))
        b = Shape(b_shape, b_col, rng.choice(list(SIZES)), jitter(), b_pos + rng.uniform(-0.04, 0.04))
    captions = [
        f"{a.phrase()} {rel} {b.phrase()}",
        f"{b.phrase()} {RELATIONS[rel]} {a.phrase()}",
        f"{a.phrase(False)} and {b.phrase(False)}",
    ]
    return [a, b], captions


def render(shapes: list[Shape], side: int = 64):
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (side, side), BACKGROUND)
    d = ImageDraw.Draw(img)
    for s in shapes:
        _draw(d, s, side)
    return img


def make_scenes(out: str | Path, n_train: int = 2000, n_test: int = 500, seed: int = 0, size: int = 64) -> dict[str, Path]:
    """Write train and test splits; returns ``{"train": jsonl path, "test": jsonl path}``."""
    if n_train < 0 or n_test < 0:
        raise InvalidInputError("--n-train and --n-test must be >= 0")
    if size < 16:
        raise InvalidInputError(f"scene size must be at least 16 pixels, got {size}")
    out = Path(out)
    result = {}
    for split, n, split_seed in (("train", n_train, seed * 2 + 0), ("test", n_test, seed * 2 + 1)):
        rng = random.Random(split_seed)
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        lines, manifest = [], []
        for i in range(n):
            shapes, captions = _scene(rng)
            rel = f"{split}/{i:06d}.png"
            render(shapes, size).save(out / rel, format="PNG")
            labels = sorted({s.shape for s in shapes} | {s.color for s in shapes})
            meta = {"shapes": sorted({s.shape for s in shapes}), "colors": sorted({s.color for s in shapes}), "objects": len(shapes)}
            lines.append(json.dumps({"image": rel, "captions": captions, "labels": labels}))
            manifest.append(json.dumps({"id": f"{split}-{i:06d}", "path": rel, "caption": captions[0], "metadata": meta}))
        path = out / f"{split}.jsonl"
        path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
        (out / f"{split}.manifest.jsonl").write_text("\n".join(manifest) + ("\n" if manifest else ""), encoding="utf-8")
        result[split] = path
    return result
