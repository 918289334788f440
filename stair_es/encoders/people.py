"""``people``: person and face words from OpenCV's built-in detectors (an optional token source).

ImageNet has no class for a person, so a portrait is otherwise described by its clothes. This
source runs OpenCV's frontal-face Haar cascade (shipped inside ``opencv-python-headless``, no
download) on a grey copy of the picture at most 160 px on its long side (``scaleFactor`` 1.1,
``minNeighbors`` 4; the cascade's 24 px window then finds faces of about a sixth of the
picture's height and larger), and emits:

* ``face`` and ``person`` (share 0.7 and 0.8) when at least one face is found;
* ``people`` (0.8) when two or more are found, ``group`` (0.5) from three;
* ``portrait`` when the largest face covers at least 4 % of the picture (share up to 0.8,
  growing with its size).

Pictures that look drawn (flat-pixel share >= ``max_flat``, the clip-art source's drawing
score, which the default encoder computes once per picture) get no words: the cascade takes
cartoon eyes and mouths for faces. Weights follow the image encoder's scale,
``w = log(1 + 10 * share)``. Version ``people-v2`` (recorded in the index config); v1 ran the
cascade at 320 px (``minNeighbors`` 6) on every picture, 4x the work for the same photos P@1.

It takes about 8 ms of CPU per camera photo (the cascade alone, one thread), still about a
fifth of the rest of the image side, which is why the default encoder leaves it off (figures:
docs/encoders.md, "People"): enable it with ``sources=["imagenet", "colour", "clipart", "ocr",
"people"]`` (``--encoder-option sources=imagenet,colour,clipart,ocr,people``). Needs the
``people`` extra (``pip install 'stair-es[people]'``; OpenCV 4.x, whose Python bindings carry
the cascade classifier).

This module must not know about indices, backends or other token sources.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ..errors import MissingDependencyError
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .base import shares_vector
from .clipart import drawing_score

#: recorded in an index's config: v2 = the cascade at 160 px (scaleFactor 1.1, minNeighbors 4)
#: with no faces on pictures that look drawn; v1 (unrecorded) ran it at 320 px on every picture
VERSION = "people-v2"
PEOPLE_TOKENS: tuple[str, ...] = ("person", "face", "people", "group", "portrait")
SCALE = 10.0
_SIDE = 160
_CASCADE = "haarcascade_frontalface_default.xml"


def opencv_available() -> bool:
    try:
        import cv2
    except ImportError:
        return False
    return hasattr(cv2, "CascadeClassifier") and hasattr(cv2, "data")


class PeopleSource:
    """Image -> person/face token weights (see the module docstring)."""

    name = "people"
    tokens = PEOPLE_TOKENS
    version = VERSION

    def __init__(self, *, min_neighbors: int = 4, side: int = _SIDE, scale_factor: float = 1.1, min_size: int = 24,
                 cascade: str = _CASCADE, max_flat: float = 0.45, vocab: Vocabulary | None = None):
        if not opencv_available():
            raise MissingDependencyError("the people token source (face detection)", "people", "'opencv-python-headless<5'")
        import cv2

        self.min_neighbors = int(min_neighbors)
        self.max_flat = float(max_flat)
        self.side = int(side)
        self.scale_factor = float(scale_factor)
        self.min_size = int(min_size)
        self.vocab = vocab or default_vocabulary()
        self.cascade = cascade
        self._path = os.path.join(cv2.data.haarcascades, cascade)
        self._local = threading.local()  # a CascadeClassifier is not safe to share between threads

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "side": self.side, "scale_factor": self.scale_factor,
                "min_neighbors": self.min_neighbors, "min_size": self.min_size, "cascade": self.cascade}

    def _detector(self):
        det = getattr(self._local, "det", None)
        if det is None:
            import cv2

            det = cv2.CascadeClassifier(self._path)
            if det.empty():
                raise MissingDependencyError("the people token source (OpenCV's face cascade is missing)", "people",
                                             "'opencv-python-headless<5'")
            self._local.det = det
        return det

    def faces(self, image: Any) -> tuple[list[tuple[int, int, int, int]], int]:
        """(face boxes ``(x, y, w, h)``, pixel count) of the downscaled grey picture they were found in."""
        from PIL import Image

        small = image
        if max(small.size) > self.side:  # shrink before the grey conversion: far fewer pixels to convert
            small = small.copy()
            small.thumbnail((self.side, self.side), Image.Resampling.BILINEAR)
        arr = np.asarray(small.convert("L"), dtype=np.uint8)
        found = self._detector().detectMultiScale(arr, scaleFactor=self.scale_factor, minNeighbors=self.min_neighbors,
                                                  minSize=(self.min_size, self.min_size))
        return [tuple(int(v) for v in box) for box in found], arr.size

    def shares(self, image: Any, flat: float | None = None) -> dict[str, float]:
        """Person token -> share for one PIL image; ``flat`` is its drawing score when known.
        Pictures that look drawn get none: the cascade finds faces in cartoon eyes and mouths."""
        if (drawing_score(image) if flat is None else flat) >= self.max_flat:
            return {}
        boxes, area = self.faces(image)
        if not boxes:
            return {}
        out = {"person": 0.8, "face": 0.7}
        if len(boxes) >= 2:
            out["people"] = 0.8
        if len(boxes) >= 3:
            out["group"] = 0.5
        largest = max(w * h for _, _, w, h in boxes) / max(area, 1)
        if largest >= 0.04:
            out["portrait"] = min(0.8, 0.4 + 2.0 * largest)
        return out

    def encode(self, image: Any, flat: float | None = None) -> SparseVector:
        return shares_vector(self.shares(image, flat), self.vocab, SCALE)
