"""``colour``: colour names from pixels, a token source the ImageNet classifier cannot give.

Users search catalogs by colour ("a red dress", "black and white photo"), and no ImageNet
class says what colour a picture is. This source names the colours that cover a picture:

1. the image is reduced to at most 64 x 64 pixels (area averaging) and converted to CIELAB,
   a space where distances and hue angles follow perception;
2. each pixel gets one of the eleven basic colour terms (Berlin and Kay): pixels with
   chroma below 12 are achromatic (``black`` below L* 25, ``white`` above 82, ``grey``
   between -- emitted as both ``grey`` and ``gray``); the others are named by hue angle and
   lightness: ``red``, ``orange`` (``brown`` when dark), ``yellow``, ``green``, ``blue``,
   ``purple``, ``pink`` (light reds and purples);
3. the share of a colour is the fraction of pixels it covers, times :data:`COLOUR_SHARE`
   (0.6), so even a single-colour picture weighs a little less than a sure object class;
   colours covering less than ``min_area`` (6 %) are dropped;
4. a picture with (almost) no chromatic pixel and a real range of lightness is black and
   white: ``black`` and ``white`` each get at least a 0.5 share.

Weights follow the image encoder's scale: ``w = log(1 + 10 * share)`` (0.26 at 6 % area,
1.95 for a one-colour picture). Deterministic, about a millisecond per image, numpy only.

This module must not know about indices, backends or other token sources.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .base import shares_vector

#: Tokens this source can produce (all whole BERT tokens).
COLOUR_TOKENS: tuple[str, ...] = ("black", "white", "grey", "gray", "red", "orange", "brown", "yellow", "green", "blue",
                                  "purple", "pink")
COLOUR_SHARE = 0.6
MONOCHROME_SHARE = 0.5
SCALE = 10.0
_SIDE = 64


def small_copy(image: Any, side: int = _SIDE) -> Any:
    """An area-averaged RGB copy of a PIL image at most ``side`` px: by default the 64 px one the
    colour and the scene source read (the default encoder makes it once for both; a picture
    already that small is used as it is)."""
    from PIL import Image

    img = image if image.mode == "RGB" else image.convert("RGB")
    if max(img.size) > side:
        img = img.copy()
        img.thumbnail((side, side), Image.Resampling.BOX)
    return img


def _srgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """``(n, 3)`` sRGB in 0..255 -> CIELAB (D65)."""
    c = rgb.astype(np.float64) / 255.0
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    m = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]])
    xyz = lin @ m.T / np.array([0.95047, 1.0, 1.08883])
    eps, kappa = 216 / 24389, 24389 / 27
    f = np.where(xyz > eps, np.cbrt(xyz), (kappa * xyz + 16) / 116)
    L = 116 * f[:, 1] - 16
    a = 500 * (f[:, 0] - f[:, 1])
    b = 200 * (f[:, 1] - f[:, 2])
    return np.stack([L, a, b], axis=1)


def colour_names(lab: np.ndarray) -> np.ndarray:
    """The basic colour term index (into :data:`_NAMES`) of each CIELAB row."""
    L, a, b = lab[:, 0], lab[:, 1], lab[:, 2]
    chroma = np.hypot(a, b)
    hue = np.degrees(np.arctan2(b, a)) % 360
    out = np.full(L.shape, _NAMES.index("grey"), np.int8)
    chromatic = chroma >= 12
    out[~chromatic & (L < 25)] = _NAMES.index("black")
    out[~chromatic & (L > 82)] = _NAMES.index("white")

    def put(mask: np.ndarray, name: str) -> None:
        out[chromatic & mask] = _NAMES.index(name)

    put((hue >= 20) & (hue < 50), "red")
    put((hue >= 50) & (hue < 92), "orange")
    put((hue >= 40) & (hue < 105) & (L < 48), "brown")
    put((hue >= 92) & (hue < 115) & (L >= 48), "yellow")
    put((hue >= 115) & (hue < 190) | (hue >= 92) & (hue < 115) & (L < 48), "green")
    put((hue >= 190) & (hue < 310), "blue")
    put((hue >= 310) & (hue < 345), "purple")
    put(((hue >= 345) | (hue < 20)), "red")
    put(((hue >= 310) | (hue < 40)) & (L >= 68), "pink")
    out[chromatic & (L < 12)] = _NAMES.index("black")  # very dark colours read as black
    return out


_NAMES = ("black", "white", "grey", "red", "orange", "brown", "yellow", "green", "blue", "purple", "pink")


class ColourSource:
    """Image -> colour-name token weights (see the module docstring)."""

    name = "colour"
    tokens = COLOUR_TOKENS

    def __init__(self, *, min_area: float = 0.06, vocab: Vocabulary | None = None):
        self.min_area = float(min_area)
        self.vocab = vocab or default_vocabulary()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": 1, "min_area": self.min_area}

    def shares(self, image: Any) -> dict[str, float]:
        """Colour term -> share for one PIL image."""
        rgb = np.asarray(small_copy(image), dtype=np.uint8).reshape(-1, 3)
        if rgb.size == 0:
            return {}
        lab = _srgb_to_lab(rgb)
        names = colour_names(lab)
        counts = np.bincount(names, minlength=len(_NAMES)) / names.size
        out = {_NAMES[i]: float(c) * COLOUR_SHARE for i, c in enumerate(counts) if c >= self.min_area}
        chromatic = counts[[_NAMES.index(n) for n in _NAMES if n not in ("black", "white", "grey")]].sum()
        spread = np.percentile(lab[:, 0], 90) - np.percentile(lab[:, 0], 10)
        if chromatic < 0.02 and spread > 20:  # a black-and-white picture, not a flat grey card
            for n in ("black", "white"):
                out[n] = max(out.get(n, 0.0), MONOCHROME_SHARE)
        if "grey" in out:
            out["gray"] = out["grey"]
        return out

    def encode(self, image: Any) -> SparseVector:
        return shares_vector(self.shares(image), self.vocab, SCALE)
