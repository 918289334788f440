"""``scene``: what kind of place a photo shows, from cheap pixel statistics.

ImageNet has a few scene classes (seashore, alp, valley, lakeside) but none for sky, clouds,
grass, trees, snow or night, which are what people type about landscapes and outdoor
photos ("storm clouds over a field", "snowy forest", "city at night"). This source reads them
from a small copy of the picture (at most 64 x 64 pixels, area-averaged, in CIELAB), with
rules on position, colour, lightness and texture (the mean absolute difference of a pixel's
lightness from its right and lower neighbours):

* **sky**: smooth pixels (texture < 4 L* units) that are blue (Lab hue 190-300 degrees,
  chroma >= 6, L* >= 35), grey or white (chroma < 12, L* >= 35) or vivid and warm (an evening
  sky: hue < 100 or >= 330, chroma >= 25, L* >= 40), with only such pixels above them in their
  column (a sky is open to the top edge). It must end above the bottom edge (at most 30 % of
  the bottom row), so a flat studio background is not a sky, and it must be partly blue
  (>= 15 % of it), or warm over a darker land (below), or grey and bright (mean L* >= 60)
  across >= 90 % of the top row and >= 20 % of the picture (an overcast sky; a grey wall
  rarely fills the whole top). Tokens ``sky`` and ``outdoors``.
* **clouds**: grey or white pixels making up >= 25 % of that sky (``clouds``, ``cloud``;
  ``cloudy`` when they cover >= 60 % of it);
* **sunset**: warm pixels (hue < 100 or >= 330, chroma >= 25) are >= 30 % of a sky covering
  >= 12 % of the picture, and the picture below the sky is darker than the sky by more than
  10 L* (``sunset``, ``sunrise``, ``dusk``);
* **water**: blue or cyan pixels (hue 170-295, chroma >= 6, L* >= 20) in the lower half, not
  part of the sky, in a picture with a sky (without one, blue below is as often a blue thing)
  (``water``);
* **vegetation**: green pixels (hue 95-175, chroma >= 8, L* >= 12) with texture >= 4:
  ``grass`` for those in the bottom 40 %, ``tree``/``trees`` above it, ``vegetation`` and
  ``foliage`` for all of them, ``forest`` when they cover more than half the picture;
* **snow**: bright, nearly colourless, slightly textured pixels (L* >= 72, chroma < 10,
  texture >= 1) covering >= 30 % of the lower half of a picture that has a sky (``snow``,
  ``snowy``, ``winter``);
* **night**: a dark picture (mean L* < 25) with some bright light (99th percentile L* > 50)
  (``night``, ``dark``); ``dark`` alone for a dark picture without lights.

A cue's share is ``SCENE_SHARE`` (0.6) times how much of its reference area it covers
(capped at 1), and weights follow the other sources: ``w = log(1 + 10 * share)``. Pictures
that look drawn (flat-pixel share >= ``max_flat``, the clip-art source's drawing score) get
no scene words: drawings use flat fills and white backgrounds that the rules would misread.

About a millisecond per picture, numpy only. This module must not know about indices,
backends or other token sources.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .base import shares_vector
from .clipart import drawing_score
from .colour import _srgb_to_lab, small_copy  # one 64 px copy serves both sources

VERSION = "scene-v1"
SCENE_SHARE = 0.6
SCALE = 10.0
#: Tokens this source can produce (all whole BERT tokens).
SCENE_TOKENS: tuple[str, ...] = (
    "sky", "outdoors", "clouds", "cloud", "cloudy", "sunset", "sunrise", "dusk", "water", "grass", "tree", "trees",
    "vegetation", "foliage", "forest", "snow", "snowy", "winter", "night", "dark",
)
SMOOTH = 4.0
TEXTURED = 4.0


def scene_features(image: Any) -> dict[str, float]:
    """The measurements behind the cues (areas as fractions), for one PIL image."""
    rgb = np.asarray(small_copy(image), dtype=np.uint8)
    h, w = rgb.shape[:2]
    if h < 4 or w < 4:
        return {}
    lab = _srgb_to_lab(rgb.reshape(-1, 3)).reshape(h, w, 3)
    L, a, b = lab[..., 0], lab[..., 1], lab[..., 2]
    chroma = np.hypot(a, b)
    hue = np.degrees(np.arctan2(b, a)) % 360
    tex = np.zeros((h, w))
    dx = np.abs(np.diff(L, axis=1))
    dy = np.abs(np.diff(L, axis=0))
    tex[:, :-1] += dx
    tex[:, 1:] += dx
    tex[:-1, :] += dy
    tex[1:, :] += dy
    tex /= 2.0
    rows = (np.arange(h)[:, None] + 0.5) / h * np.ones((1, w))
    warm = (hue < 100) | (hue >= 330)
    grey = chroma < 12
    blue = (hue >= 190) & (hue < 300) & (chroma >= 6)
    smooth = tex < SMOOTH
    vivid_warm = warm & (chroma >= 25) & (L >= 40)  # an evening sky; beige walls are paler
    sky_like = smooth & (L >= 35) & (blue | grey | vivid_warm)
    # sky: sky-like pixels with nothing but sky-like pixels above them in their column
    sky = np.logical_and.accumulate(sky_like, axis=0)
    n = float(h * w)
    f: dict[str, float] = {"mean_l": float(L.mean()), "p99_l": float(np.percentile(L, 99))}
    area = float(sky.sum())
    f["sky"] = area / n if sky[-1].mean() <= 0.3 else 0.0  # a sky ends above the bottom edge
    if f["sky"] > 0:
        f["sky_top_row"] = float(sky[0].mean())
        f["sky_blue"] = float((sky & blue).sum()) / area
        f["sky_grey"] = float((sky & grey).sum()) / area
        f["sky_grey_l"] = float(L[sky & grey].mean()) if (sky & grey).any() else 0.0
        f["sky_warm"] = float((sky & vivid_warm).sum()) / area
        f["below_darker"] = float(L[sky].mean() - L[~sky].mean())
    lower = rows >= 0.5
    water = (hue >= 170) & (hue < 295) & (chroma >= 6) & (L >= 20)
    f["water"] = float((water & lower & ~sky).sum()) / float(lower.sum())
    green = (hue >= 95) & (hue < 175) & (chroma >= 8) & (L >= 12) & (tex >= TEXTURED)
    f["green"] = float(green.sum()) / n
    ground = rows >= 0.6
    f["grass"] = float((green & ground).sum()) / float(ground.sum())
    f["trees"] = float((green & ~ground).sum()) / float((~ground).sum())
    snowy = (L >= 72) & (chroma < 10) & (tex >= 1.0)
    f["snow"] = float((snowy & lower).sum()) / float(lower.sum())
    return f


def scene_shares(f: dict[str, float]) -> dict[str, float]:
    """Cue measurements -> token shares (see the module docstring)."""
    out: dict[str, float] = {}

    def put(tokens: tuple[str, ...], share: float, factors: tuple[float, ...] = ()) -> None:
        for i, t in enumerate(tokens):
            s = SCENE_SHARE * min(1.0, share) * (factors[i] if i < len(factors) else 1.0)
            if s > 0:
                out[t] = max(out.get(t, 0.0), s)

    if not f:
        return out
    sky = f.get("sky", 0.0)
    blue_sky = f.get("sky_blue", 0.0) >= 0.15
    # a sky with no blue at all is a bright overcast sky across the whole top, or a wall
    overcast = f.get("sky_top_row", 0.0) >= 0.9 and sky >= 0.2 and f.get("sky_grey_l", 0.0) >= 60
    evening = f.get("sky_warm", 0.0) >= 0.3 and f.get("below_darker", 0.0) > 10 and sky >= 0.12
    if not (blue_sky or overcast or evening):
        sky = 0.0
    if sky >= 0.08:
        put(("sky", "outdoors"), sky / 0.3, (1.0, 0.6))
        grey = f.get("sky_grey", 0.0)
        if grey >= 0.25:
            put(("clouds", "cloud"), grey * sky / 0.2)
            if grey >= 0.6:
                put(("cloudy",), grey * sky / 0.2, (0.8,))
        if f.get("sky_warm", 0.0) >= 0.3 and f.get("below_darker", 0.0) > 10:
            put(("sunset", "sunrise", "dusk"), f["sky_warm"] * sky / 0.2, (1.0, 0.8, 0.6))
    if sky >= 0.08 and f.get("water", 0.0) >= 0.15:  # blue below a sky; without one, a blue thing
        put(("water",), f["water"] / 0.4)
    if f.get("green", 0.0) >= 0.1:
        put(("vegetation", "foliage"), f["green"] / 0.4, (1.0, 0.7))
        if f.get("grass", 0.0) >= 0.3:
            put(("grass",), f["grass"] / 0.6)
        if f.get("trees", 0.0) >= 0.2:
            put(("tree", "trees"), f["trees"] / 0.5)
        if f["green"] >= 0.5 and f.get("trees", 0.0) >= 0.5:
            put(("forest",), f["green"], (0.8,))
    if f.get("snow", 0.0) >= 0.3 and sky >= 0.08:  # (white studio backgrounds have no sky: it reaches the bottom)
        put(("snow", "snowy", "winter"), f["snow"] / 0.6, (1.0, 0.8, 0.6))
    if f.get("mean_l", 100.0) < 25:
        if f.get("p99_l", 0.0) > 50:
            put(("night", "dark"), 1.0, (1.0, 0.7))
        else:
            put(("dark",), 1.0, (0.7,))
    return out


class SceneSource:
    """Image -> scene token weights (see the module docstring)."""

    name = "scene"
    tokens = SCENE_TOKENS
    version = VERSION

    def __init__(self, *, max_flat: float = 0.45, vocab: Vocabulary | None = None):
        self.max_flat = float(max_flat)
        self.vocab = vocab or default_vocabulary()

    def shares(self, image: Any, flat: float | None = None) -> dict[str, float]:
        """Scene token -> share for one PIL image; ``flat`` is its drawing score when known."""
        if (drawing_score(image) if flat is None else flat) >= self.max_flat:
            return {}
        return scene_shares(scene_features(image))

    def encode(self, image: Any, flat: float | None = None) -> SparseVector:
        return shares_vector(self.shares(image, flat), self.vocab, SCALE)
