"""``people``: person and face words from OpenCV's built-in detectors (an optional token source).

ImageNet has no class for a person, so a portrait is otherwise described by its clothes. This
source runs OpenCV's frontal-face Haar cascade (shipped inside ``opencv-python-headless``, no
download) on a grey copy of the picture at most 320 px wide, and emits:

* ``face`` and ``person`` (share 0.7 and 0.8) when at least one face is found;
* ``people`` (0.8) when two or more are found, ``group`` (0.5) from three;
* ``portrait`` when the largest face covers at least 4 % of the picture (share up to 0.8,
  growing with its size).

Weights follow the image encoder's scale, ``w = log(1 + 10 * share)``. It takes about
20-70 ms per image on one core, which is why the default encoder leaves it off: enable it
with ``sources=["imagenet", "colour", "people"]`` (``--encoder-option
sources=imagenet,colour,people``). Needs the ``people`` extra (``pip install
'stair-es[people]'``; OpenCV 4.x, whose Python bindings carry the cascade classifier).

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

PEOPLE_TOKENS: tuple[str, ...] = ("person", "face", "people", "group", "portrait")
SCALE = 10.0
_SIDE = 320
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

    def __init__(self, *, min_neighbors: int = 6, vocab: Vocabulary | None = None):
        if not opencv_available():
            raise MissingDependencyError("the people token source (face detection)", "people", "'opencv-python-headless<5'")
        import cv2

        self.min_neighbors = int(min_neighbors)
        self.vocab = vocab or default_vocabulary()
        self._path = os.path.join(cv2.data.haarcascades, _CASCADE)
        self._local = threading.local()  # a CascadeClassifier is not safe to share between threads

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": 1, "min_neighbors": self.min_neighbors}

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

        grey = image.convert("L")
        if max(grey.size) > _SIDE:
            grey = grey.copy()
            grey.thumbnail((_SIDE, _SIDE), Image.Resampling.BILINEAR)
        arr = np.asarray(grey, dtype=np.uint8)
        found = self._detector().detectMultiScale(arr, scaleFactor=1.1, minNeighbors=self.min_neighbors, minSize=(24, 24))
        return [tuple(int(v) for v in box) for box in found], arr.size

    def shares(self, image: Any) -> dict[str, float]:
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

    def encode(self, image: Any) -> SparseVector:
        return shares_vector(self.shares(image), self.vocab, SCALE)
