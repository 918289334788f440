"""Image-caption training data: JSONL or CSV of image path + caption(s).

JSONL lines: ``{"image": "path.png", "caption": "..."}`` or ``{"image": ..., "captions": [...]}``,
optionally ``"labels": [...]`` (ground-truth words for the interpretability metric). CSV: a
header with ``image`` and ``caption`` columns; an image may appear on several rows. Relative
image paths resolve against the data file's folder.

Nothing is dropped silently: images that fail to decode are skipped and listed, empty captions
are rejected with a reason, captions longer than the model's maximum length are truncated and
counted, all in a :class:`DataReport`. Knows nothing about models beyond a vocabulary.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ImageError, InvalidInputError
from ..vocab import Vocabulary, default_vocabulary

log = logging.getLogger(__name__)


@dataclass
class DataReport:
    source: str
    n_records: int = 0
    n_images: int = 0
    n_pairs: int = 0
    skipped_images: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    truncated_captions: int = 0
    # streamed sources keep at most 100 reasons per list; these are the full counts
    skipped_count: int = 0
    rejected_captions: int = 0

    def summary(self) -> str:
        rejected = f"{len(self.rejected)} records rejected"
        if self.rejected_captions:
            rejected += f" ({self.rejected_captions} captions empty or unreadable)"
        return (
            f"{self.source}: {self.n_pairs} pairs over {self.n_images} images; "
            f"{max(self.skipped_count, len(self.skipped_images))} images skipped (missing or undecodable), {rejected}, "
            f"{self.truncated_captions} captions truncated"
        )

    def to_dict(self) -> dict:
        return {
            "source": self.source,
            "records": self.n_records,
            "images": self.n_images,
            "pairs": self.n_pairs,
            "skipped_images": [{"image": p, "reason": r} for p, r in self.skipped_images],
            "rejected": [{"where": w, "reason": r} for w, r in self.rejected],
            "truncated_captions": self.truncated_captions,
            "skipped_count": max(self.skipped_count, len(self.skipped_images)),
            "rejected_captions": self.rejected_captions,
        }


@dataclass
class CaptionData:
    """Decoded images (uint8, N x S x S x 3) and (image index, token ids, caption) pairs."""

    images: np.ndarray
    image_paths: list[str]
    pair_image: np.ndarray  # int64 (P,)
    pair_tokens: list[list[int]]  # [CLS] ... [SEP], already truncated
    captions: list[str]
    labels: list[list[str]]  # per image, may be empty
    report: DataReport

    def __len__(self) -> int:
        return len(self.captions)

    def first_caption_per_image(self) -> np.ndarray:
        """Index of the first pair of each image (the evaluation's one query per image)."""
        first = np.full(len(self.images), -1, dtype=np.int64)
        images, pairs = np.unique(np.asarray(self.pair_image, np.int64), return_index=True)
        first[images] = pairs
        return first


def read_records(path: str | Path, report: DataReport) -> list[tuple[str, list[str], list[str], str]]:
    """(image path, captions, labels, where) per record; bad records go to ``report.rejected``."""
    path = Path(path)
    if not path.exists():
        raise InvalidInputError(f"training data file {path} does not exist")
    base = path.parent
    out: list[tuple[str, list[str], list[str], str]] = []
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInputError(f"cannot read training data {path}: {e}") from e
    if suffix in (".jsonl", ".json", ".ndjson"):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path.name}:{n}"
            report.n_records += 1
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                report.rejected.append((where, f"not valid JSON ({e.msg})"))
                continue
            if not isinstance(rec, dict):
                report.rejected.append((where, "a line must be a JSON object"))
                continue
            image = rec.get("image", rec.get("image_path", rec.get("path")))
            caps = rec.get("captions", rec.get("caption"))
            if isinstance(caps, str):
                caps = [caps]
            if not isinstance(image, str) or not image:
                report.rejected.append((where, "no 'image' path"))
                continue
            if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                report.rejected.append((where, "no 'caption' string or 'captions' list"))
                continue
            labels = rec.get("labels") or []
            out.append((str(base / image), caps, [str(x) for x in labels], where))
    elif suffix in (".csv", ".tsv"):
        reader = csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
        if not reader.fieldnames or "image" not in reader.fieldnames or "caption" not in reader.fieldnames:
            raise InvalidInputError(f"{path} needs a header with 'image' and 'caption' columns; got {reader.fieldnames}")
        for n, row in enumerate(reader, 2):
            report.n_records += 1
            where = f"{path.name}:{n}"
            if not row.get("image"):
                report.rejected.append((where, "empty 'image' column"))
                continue
            out.append((str(base / row["image"]), [row.get("caption") or ""], [], where))
    else:
        raise InvalidInputError(f"training data must be .jsonl or .csv, got {path.name}")
    return out


def decode_image(src: Any, size: int, name: str | None = None) -> np.ndarray:
    """``src`` (a path or a file object) as uint8 RGB (size, size, 3); an :class:`ImageError`
    naming the image as ``name`` (messages without a name are reasons listed beside its place)."""
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(src) as im:
            im = im.convert("RGB")
            if im.size != (size, size):
                im = im.resize((size, size), Image.BILINEAR)
            return np.asarray(im, dtype=np.uint8)
    except FileNotFoundError:
        raise ImageError(f"image {name} does not exist" if name else "image file does not exist") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise ImageError(f"image {name} cannot be decoded: {e}" if name else f"cannot be decoded: {e}") from e


def load_caption_data(path: str | Path, *, image_size: int, max_length: int = 77,
                      vocab: Vocabulary | None = None) -> CaptionData:
    """Read, decode and tokenize a whole data file into memory (the CPU-scale recipe)."""
    vocab = vocab or default_vocabulary()
    report = DataReport(source=str(path))
    records = read_records(path, report)
    cls_id, sep_id = vocab.id("[CLS]"), vocab.id("[SEP]")
    index: dict[str, int] = {}
    images: list[np.ndarray] = []
    paths: list[str] = []
    labels: list[list[str]] = []
    bad: set[str] = set()
    pair_image: list[int] = []
    pair_tokens: list[list[int]] = []
    captions: list[str] = []
    for image, caps, lab, where in records:
        if image in bad:
            continue
        good_caps = []
        for c in caps:
            ids = vocab.encode(c) if c.strip() else []
            if not ids:
                report.rejected.append((where, f"empty caption {c!r} (nothing to tokenize)"))
                continue
            if len(ids) > max_length - 2:
                ids = ids[: max_length - 2]
                report.truncated_captions += 1
            good_caps.append((c, [cls_id, *ids, sep_id]))
        if not good_caps:
            continue
        if image not in index:
            try:
                arr = decode_image(image, image_size, image)
            except ImageError as e:
                bad.add(image)
                report.skipped_images.append((image, str(e)))
                continue
            index[image] = len(images)
            images.append(arr)
            paths.append(image)
            labels.append(lab)
        for c, ids in good_caps:
            pair_image.append(index[image])
            pair_tokens.append(ids)
            captions.append(c)
    report.n_images, report.n_pairs = len(images), len(captions)
    if report.skipped_images:
        log.warning("%s: skipped %d images that failed to decode (first: %s)", path, len(report.skipped_images), report.skipped_images[0][1])
    if report.truncated_captions:
        log.warning("%s: truncated %d captions to %d tokens", path, report.truncated_captions, max_length)
    if report.rejected:
        log.warning("%s: rejected %d records (first: %s: %s)", path, len(report.rejected), *report.rejected[0])
    if not captions:
        raise InvalidInputError(f"{path} holds no usable image-caption pairs ({report.summary()})")
    arr = np.stack(images) if images else np.zeros((0, image_size, image_size, 3), np.uint8)
    return CaptionData(arr, paths, np.asarray(pair_image, np.int64), pair_tokens, captions, labels, report)


def pad_tokens(rows: list[list[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token rows padded to the longest (``[CLS] [SEP]`` wide when there are none): (ids, mask)."""
    width = max((len(r) for r in rows), default=2)
    ids = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    return ids, mask
