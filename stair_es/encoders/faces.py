"""Faces in photos of people: a man or a woman, smiling or not (part of the ``objects`` source).

The COCO detector of the ``objects`` source says ``person`` and counts people, but queries
about photos of people say which ("a smiling woman", "three men", "a man and a woman"), and
ImageNet's classes say nothing about them either. Since source rules 3, on a photo where the
detector found a person, the ``objects`` source also reads the faces, with three small models
published in the same MIT-licensed npm package as its detector (``@vladmandic/human`` 3.3.6,
no further download):

* **BlazeFace** (``blazeface.json``, MediaPipe's full-range face detector, made for 256 x 256
  pictures and run at :data:`DETECTOR_SIZE` = 192: every face of the public photos that it found
  at 256 it found at 192, for 0.56x the work; 504 anchors instead of 896): the picture, padded to
  a square, gives face boxes and scores. Faces scoring at least
  :data:`MIN_SCORE` (0.75) are kept, at most :data:`MAX_FACES`, overlapping ones (IoU > 0.3)
  merged into the best one;
* **FaceRes** (``faceres.json``, HSE's MobileNet face descriptor with a gender head): each
  face, cropped square at :data:`CROP` times its box from the picture as the encoder got it
  (not the detector's small copy) and resized to 160 x 160 (the model was trained at 224; at
  160 it named 15 of the 21 faces of the public photos right and 2 wrong, against 16 and 2 at
  224, for half the CPU), gives the probability that it is a man's;
* **the emotion classifier** (``emotion.json``, Oarriaga's mini-Xception, 64 x 64 grey) gives
  the probability that the face is happy (smiling).

Words and shares (``w = log(1 + 10 * share)`` like every source), for a face of score ``s``:

* ``man`` (or ``woman``) when the gender head is sure enough: share ``s * c`` where ``c`` grows
  from 0 at a confidence ``|2p - 1|`` of :data:`GENDER_FLOOR` (0.3) to 1 at certainty;
  ``male`` / ``female`` at half that;
* ``smiling`` (``smile`` at 0.8 of it, ``happy`` at 0.5) when the happy probability ``h`` is at
  least 0.5: share ``s * h``;
* ``face``: share ``0.8 * s * min(1, area / 10 %)`` of the picture (a close-up is a face);
* ``men`` / ``women`` when two or more faces are men / women (0.9), and ``couple`` (0.7) when
  the picture's only two faces are a man's and a woman's.

A picture whose largest side is small (the face crop comes from the picture as it is) still
gets the words: the gender head is less sure on small faces, which lowers ``c``. Pictures
without a person peak never run these models, so the cost falls on photos of people: about
4 ms of CPU for the face detector and 8 ms per face kept (ONNX Runtime, one thread).

This module must not know about indices, backends or other token sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

#: the three models' files in ``package/models`` of the npm package, and their sha256
FACE_FILES: dict[str, str] = {
    "blazeface.json": "cd7bbfc078270572beb39f9e5ae67aadbd50b5e67cff37e6d4f6b3ea39312e5f",
    "blazeface.bin": "dc9a97fdc50bc43216554bdd69aa3e7b9361a519ee7bdd996a2f69a98a6f9b72",
    "faceres.json": "5b83d49c0385d2e68a05122441b94226313677cae9fcc40b9587ad50079eb4df",
    "faceres.bin": "2c7d2d62b76c97528b736527aa09d310ea71743c9e3e79fb6c62d4b2d73af79b",
    "emotion.json": "56f7e557eb0c863a8b9ab04ac7ccba756e93bf2c27dce135ef0e8712b80b7ad2",
    "emotion.bin": "927ac8224f356ab1e68c2bcfbfa07b0c8567047d1bcf817388ba6e38214c4987",
}
DETECTOR_SIZE = 192
FACE_SIZE = 160
GREY_SIZE = 64
MIN_SCORE = 0.75
MAX_FACES = 6
CROP = 1.2
NMS_IOU = 0.3
GENDER_FLOOR = 0.3
HAPPY = 3  # the emotion classifier's classes: angry, disgust, fear, happy, sad, surprise, neutral
#: every word this module can give (all whole BERT tokens)
FACE_TOKENS: tuple[str, ...] = ("man", "woman", "male", "female", "men", "women", "couple", "smiling", "smile",
                                "happy", "face")
_GREY = np.array([0.2989, 0.5870, 0.1140], np.float32)  # the emotion model's grey (ITU-R 601 luma)


class Face(NamedTuple):
    score: float  # the detector's
    area: float  # share of the picture the face box covers
    male: float  # probability that it is a man's face
    happy: float  # probability that it smiles


def anchors(size: int = DETECTOR_SIZE) -> np.ndarray:
    """BlazeFace's anchor centres in input pixels: 2 per cell of its stride-16 feature map, then 6
    per cell of its stride-32 one, row by row (the order of its outputs)."""
    out = []
    for stride, per_cell in ((16, 2), (32, 6)):
        cells = -(-size // stride)
        for y in range(cells):
            for x in range(cells):
                out += [(stride * (x + 0.5), stride * (y + 0.5))] * per_cell
    return np.asarray(out, np.float32)


def detector_module(model_json: Path) -> Any:
    """BlazeFace as a torch module: square pictures (N, 3, DETECTOR_SIZE, DETECTOR_SIZE), 0-255 ->
    (scores (N, anchors), boxes (N, anchors, 4) as x0, y0, x1, y1 in fractions of the square)."""
    import torch

    from .tfjs_graph import graph_module

    graph = graph_module(model_json, ["Identity", "Identity_2", "Identity_1", "Identity_3"])
    centres = torch.from_numpy(anchors())

    class FaceDetector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph = graph
            self.register_buffer("centres", centres)

        def forward(self, images: Any) -> Any:
            logits_16, boxes_16, logits_32, boxes_32 = self.graph(images / 127.5 - 1.0)
            logits = torch.cat([logits_16, logits_32], dim=1)[..., 0]
            raw = torch.cat([boxes_16, boxes_32], dim=1)
            centre = raw[..., 0:2] + self.centres
            half = raw[..., 2:4] / 2
            return torch.sigmoid(logits), torch.cat([centre - half, centre + half], dim=-1) / DETECTOR_SIZE

    return FaceDetector().eval()


def attributes_module(faceres_json: Path, emotion_json: Path) -> Any:
    """FaceRes's gender head and the emotion classifier as one torch module: (faces (N, 3, 160,
    160), 0-255; the same faces grey (N, 1, 64, 64) in [-1, 1]) -> (P(man) (N,), P(happy) (N,))."""
    import torch

    from .tfjs_graph import graph_module

    faceres = graph_module(faceres_json, ["gender_pred/Sigmoid"])
    emotion = graph_module(emotion_json, ["Identity"])

    class FaceAttributes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.faceres = faceres
            self.emotion = emotion

        def forward(self, faces: Any, grey: Any) -> Any:
            return self.faceres(faces)[0][:, 0], self.emotion(grey)[0][:, HAPPY]

    return FaceAttributes().eval()


def tower_specs(folder: Path) -> list[Any]:
    """The face detector and the face attributes as :class:`~stair_es.encoders.runtime.TowerSpec`
    (exported to ONNX once, like every tower), from the model files in ``folder``."""
    from .runtime import TowerSpec

    files = {name: folder / name for name in FACE_FILES}

    def pixels(*shape: int, low: float = 0.0, high: float = 255.0) -> np.ndarray:
        return (np.random.default_rng(0).random((2, *shape)) * (high - low) + low).astype(np.float32)

    def batch(*names: str) -> dict[str, dict[int, str]]:
        return {name: {0: "batch"} for name in names}

    return [
        TowerSpec(kind="face-detector", weight_files=[files["blazeface.json"], files["blazeface.bin"]],
                  build=lambda: detector_module(files["blazeface.json"]),
                  sample=lambda: {"images": pixels(3, DETECTOR_SIZE, DETECTOR_SIZE)},
                  input_names=["images"], output_names=["scores", "boxes"],
                  dynamic_axes=batch("images", "scores", "boxes"), extra_key=f"size{DETECTOR_SIZE}", parallel=True),
        TowerSpec(kind="face-attributes", weight_files=[files[n] for n in sorted(files) if not n.startswith("blaze")],
                  build=lambda: attributes_module(files["faceres.json"], files["emotion.json"]),
                  sample=lambda: {"faces": pixels(3, FACE_SIZE, FACE_SIZE),
                                  "grey": pixels(1, GREY_SIZE, GREY_SIZE, low=-1, high=1)},
                  input_names=["faces", "grey"], output_names=["male", "happy"],
                  dynamic_axes=batch("faces", "grey", "male", "happy"), extra_key=f"size{FACE_SIZE}", parallel=True),
    ]


def _square(image: Any) -> np.ndarray:
    """The picture padded with black to a square (right or bottom), at the detector's size, CHW."""
    from PIL import Image

    w, h = image.size
    scale = DETECTOR_SIZE / max(w, h)
    square = Image.new("RGB", (DETECTOR_SIZE, DETECTOR_SIZE))
    square.paste(image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR), (0, 0))
    return np.asarray(square, np.float32).transpose(2, 0, 1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    lo = np.maximum(box[:2], others[:, :2])
    hi = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    return inter / (area + np.prod(others[:, 2:] - others[:, :2], axis=1) - inter + 1e-12)


def kept_boxes(scores: np.ndarray, boxes: np.ndarray) -> list[int]:
    """Indices of the faces kept: score >= MIN_SCORE, best first, none overlapping a better one."""
    keep: list[int] = []
    for i in np.argsort(-scores, kind="stable"):
        if scores[i] < MIN_SCORE or len(keep) == MAX_FACES:
            break
        if not keep or (_iou(boxes[i], boxes[keep]) <= NMS_IOU).all():
            keep.append(int(i))
    return keep


def _crops(image: Any, box: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One face (box in fractions of the padded square) as FaceRes's and the emotion model's inputs."""
    from PIL import Image

    side = max(image.size)
    x0, y0, x1, y1 = (box * side).tolist()
    half = max(x1 - x0, y1 - y0) * CROP / 2
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    crop = image.crop((round(cx - half), round(cy - half), round(cx + half), round(cy + half)))
    face = crop.resize((FACE_SIZE, FACE_SIZE), Image.Resampling.BILINEAR)
    small = np.asarray(face.resize((GREY_SIZE, GREY_SIZE), Image.Resampling.BILINEAR), np.float32) / 255.0
    grey = (small @ _GREY - 0.5) * 2.0
    return np.asarray(face, np.float32).transpose(2, 0, 1), grey[None]


def read_faces(images: Sequence[Any], detect: Any, describe: Any) -> list[list[Face]]:
    """The faces of each picture (PIL images), with ``detect`` running the detector tower
    (squares -> scores, boxes) and ``describe`` the attributes tower (faces, grey -> P(man), P(happy))."""
    if not images:
        return []
    images = [im if im.mode == "RGB" else im.convert("RGB") for im in images]
    scores, boxes = detect(np.stack([_square(im) for im in images]))
    found: list[list[tuple[float, float, np.ndarray]]] = []
    faces, greys = [], []
    for im, s, b in zip(images, scores, boxes):
        side = max(im.size)
        mine = []
        for i in kept_boxes(s, b):
            w, h = (b[i, 2:] - b[i, :2]) * side
            mine.append((float(s[i]), float(min(1.0, w * h / (im.size[0] * im.size[1])))))
            face, grey = _crops(im, b[i])
            faces.append(face)
            greys.append(grey)
        found.append(mine)
    if not faces:
        return [[] for _ in images]
    male, happy = describe(np.stack(faces), np.stack(greys).astype(np.float32))
    out, k = [], 0
    for mine in found:
        out.append([Face(score, area, float(male[k + j]), float(happy[k + j])) for j, (score, area) in enumerate(mine)])
        k += len(mine)
    return out


def face_shares(faces: Sequence[Face]) -> dict[str, float]:
    """Token -> share for one picture's faces (the rules in the module docstring)."""
    out: dict[str, float] = {}

    def put(token: str, share: float) -> None:
        if share > 0:
            out[token] = max(out.get(token, 0.0), share)

    men = women = 0
    for f in faces:
        sure = abs(2 * f.male - 1)
        gender = f.score * float(np.clip((sure - GENDER_FLOOR) / (1 - GENDER_FLOOR), 0, 1))
        if gender > 0:
            word, kind = ("man", "male") if f.male > 0.5 else ("woman", "female")
            put(word, gender)
            put(kind, 0.5 * gender)
            men += f.male > 0.5
            women += f.male <= 0.5
        if f.happy >= 0.5:
            put("smiling", f.score * f.happy)
            put("smile", 0.8 * f.score * f.happy)
            put("happy", 0.5 * f.score * f.happy)
        put("face", 0.8 * f.score * min(1.0, f.area / 0.1))
    if men >= 2:
        put("men", 0.9)
    if women >= 2:
        put("women", 0.9)
    if len(faces) == 2 and men == 1 and women == 1:
        put("couple", 0.7)
    return out
