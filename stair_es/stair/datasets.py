"""Image-caption data sets that stream: COCO / Flickr30k (Karpathy splits), WebDataset-style
tar shards, and JSONL + image folder.

A *source* yields :class:`Pair` records (one image, its captions) in a fixed order and opens
an image only when asked, so nothing but the caption index is ever held in memory. A
:class:`PairStream` turns a source into training batches: shards shuffled per epoch, a
bounded shuffle buffer, one caption drawn per image, images decoded per batch. Its position
is two integers (epoch, pairs consumed); restoring it replays the same order without decoding,
so a resumed run sees exactly the batches it would have seen.

Nothing is dropped silently: missing or undecodable images are skipped, empty captions and
captions the English WordPiece vocabulary cannot read (mostly ``[UNK]``) are rejected, long
ones truncated; all are counted and listed (first 100) in a :class:`~.data.DataReport`.
Knows nothing about models beyond a vocabulary and an image size.
"""

from __future__ import annotations

import glob
import io
import json
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ImageError, InvalidInputError
from ..vocab import Vocabulary, default_vocabulary
from .data import DataReport, decode_image as decode, pad_tokens

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
KARPATHY_SPLITS = ("train", "restval", "val", "test")
_LIST_LIMIT = 100  # per-item reasons kept in a report; the counts are always complete


@dataclass
class Pair:
    """One image and its captions. ``open()`` returns a path or bytes for PIL."""

    key: str
    captions: list[str]
    open: Callable[[], Any]
    where: str
    labels: list[str] = field(default_factory=list)


class KarpathySource:
    """``dataset_coco.json`` / ``dataset_flickr30k.json`` (Karpathy & Fei-Fei's splits).

    ``images[]`` entries hold ``filename``, ``split`` (train/restval/val/test), ``sentences[].raw``
    and, for COCO, ``filepath`` (``train2014``/``val2014``) under ``image_root``. ``splits``
    picks entries ("train" usually means train + restval: 113,287 COCO images).
    """

    def __init__(self, json_path: str | Path, image_root: str | Path, splits: Sequence[str] = ("test",)):
        self.json_path, self.image_root = Path(json_path), Path(image_root)
        bad = [s for s in splits if s not in KARPATHY_SPLITS]
        if bad:
            raise InvalidInputError(f"unknown Karpathy split(s) {bad}; the splits are {', '.join(KARPATHY_SPLITS)}")
        if not self.json_path.is_file():
            raise InvalidInputError(f"Karpathy split file {self.json_path} does not exist (dataset_coco.json / dataset_flickr30k.json)")
        if not self.image_root.is_dir():
            raise InvalidInputError(f"image folder {self.image_root} does not exist")
        try:
            data = json.loads(self.json_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InvalidInputError(f"cannot read {self.json_path}: {e}") from e
        if not isinstance(data, dict) or not isinstance(data.get("images"), list):
            raise InvalidInputError(f"{self.json_path} is not in the Karpathy format (an object with an 'images' list)")
        self.dataset = str(data.get("dataset", ""))
        # captions only: a few tens of MB for COCO; the images stay on disk
        self.entries = [e for e in data["images"] if isinstance(e, dict) and e.get("split") in splits]
        self.name = f"{self.json_path.name}[{'+'.join(splits)}]"

    def __len__(self) -> int:
        return len(self.entries)

    def shards(self) -> list[Any]:
        return [None]

    def iter_shard(self, shard: Any, report: DataReport) -> Iterator[Pair]:
        for n, e in enumerate(self.entries):
            where = f"{self.json_path.name}:images[{n}]"
            fname = e.get("filename")
            if not isinstance(fname, str):
                report.n_records += 1
                _add(report.rejected, (where, "no 'filename'"))
                continue
            path = self.image_root / e.get("filepath", "") / fname
            caps = [s.get("raw", "") for s in e.get("sentences", []) if isinstance(s, dict)]
            key = str(e.get("cocoid", e.get("imgid", fname)))
            yield Pair(key, [c if isinstance(c, str) else "" for c in caps], lambda p=path: p, where)


class JsonlSource:
    """JSONL lines ``{"image": path, "caption": str}`` or ``{"image": ..., "captions": [...]}``,
    optional ``"labels"``; relative paths resolve against ``image_root`` (default: the file's folder)."""

    def __init__(self, path: str | Path, image_root: str | Path | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise InvalidInputError(f"data file {self.path} does not exist")
        self.image_root = Path(image_root) if image_root else self.path.parent
        self.name = self.path.name

    def shards(self) -> list[Any]:
        return [None]

    def iter_shard(self, shard: Any, report: DataReport) -> Iterator[Pair]:
        with open(self.path, encoding="utf-8") as f:  # line by line: never the whole file
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{self.path.name}:{n}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    report.n_records += 1
                    _add(report.rejected, (where, f"not valid JSON ({e.msg})"))
                    continue
                image = rec.get("image", rec.get("image_path", rec.get("path"))) if isinstance(rec, dict) else None
                caps = rec.get("captions", rec.get("caption")) if isinstance(rec, dict) else None
                caps = [caps] if isinstance(caps, str) else caps
                if not isinstance(image, str) or not image or not isinstance(caps, list):
                    report.n_records += 1
                    _add(report.rejected, (where, "needs an 'image' path and a 'caption' string or 'captions' list"))
                    continue
                path = self.image_root / image
                yield Pair(image, [c if isinstance(c, str) else "" for c in caps], lambda p=path: p, where, [str(x) for x in rec.get("labels") or []])


class TarShardSource:
    """WebDataset-style tar shards: members grouped by key (the name up to its first dot), an
    image (``key.jpg``/``.png``/...) plus ``key.txt`` (one caption per line) or ``key.json``
    (``caption`` / ``captions``). Read sequentially (``r|*``), so shards may be gzipped."""

    def __init__(self, shards: str | Path | Sequence[str | Path]):
        items = [shards] if isinstance(shards, (str, Path)) else list(shards)
        files: list[str] = []
        for it in items:
            it = str(it)
            if Path(it).is_dir():
                files.extend(sorted(glob.glob(str(Path(it) / "*.tar*"))))
            else:
                found = sorted(glob.glob(it))
                files.extend(found if found else [it])
        missing = [f for f in files if not Path(f).is_file()]
        if missing or not files:
            raise InvalidInputError(f"tar shards not found: {missing[:3] or items} (give files, a glob like 'shards/*.tar' or a folder)")
        self.files = files
        self.name = f"{len(files)} tar shard(s) ({Path(files[0]).name}...)"

    def shards(self) -> list[Any]:
        return list(self.files)

    def iter_shard(self, shard: Any, report: DataReport) -> Iterator[Pair]:
        name = Path(shard).name
        group: dict[str, bytes] = {}
        key = None
        try:
            with tarfile.open(shard, mode="r|*") as tar:
                for m in tar:
                    if not m.isfile():
                        continue
                    base = m.name.rsplit("/", 1)[-1]
                    k, _, ext = base.partition(".")
                    k = m.name[: len(m.name) - len(base)] + k
                    if key is not None and k != key:
                        yield from _tar_pair(key, group, name, report)
                        group = {}
                    key = k
                    f = tar.extractfile(m)
                    group[ext.lower()] = f.read() if f else b""
        except (tarfile.TarError, OSError, EOFError) as e:
            _add(report.rejected, (name, f"shard unreadable after {key!r}: {e}"))
        if key is not None:
            yield from _tar_pair(key, group, name, report)


def _tar_pair(key: str, group: dict[str, bytes], shard: str, report: DataReport) -> Iterator[Pair]:
    where = f"{shard}:{key}"
    img_ext = next((e for e in IMAGE_EXTS if e in group), None)
    caps: list[str] | None = None
    labels: list[str] = []
    if "json" in group:
        try:
            meta = json.loads(group["json"].decode("utf-8"))
            c = meta.get("captions", meta.get("caption")) if isinstance(meta, dict) else None
            caps = [c] if isinstance(c, str) else c if isinstance(c, list) else None
            labels = [str(x) for x in (meta.get("labels") or [])] if isinstance(meta, dict) else []
        except (UnicodeDecodeError, json.JSONDecodeError):
            caps = None
    if caps is None and ("txt" in group or "caption" in group):
        text = group.get("txt", group.get("caption", b"")).decode("utf-8", errors="replace")
        caps = [line for line in text.splitlines() if line.strip()] or [""]
    if img_ext is None or caps is None:
        report.n_records += 1
        _add(report.rejected, (where, f"needs an image ({'/'.join(IMAGE_EXTS)}) and a .txt or .json caption; has {sorted(group)}"))
        return
    data = group[img_ext]
    yield Pair(key, [c if isinstance(c, str) else "" for c in caps], lambda d=data: io.BytesIO(d), where, labels)


def _add(items: list, item: Any) -> None:
    if len(items) < _LIST_LIMIT:
        items.append(item)


def open_source(spec: str, *, image_root: str | None = None, splits: Sequence[str] = ("train", "restval")) -> Any:
    """A source from a path: ``*.json`` = Karpathy split file (needs ``image_root``), ``*.jsonl``,
    or tar shards (a ``.tar`` file, a glob, or a folder of shards)."""
    p = Path(spec)
    if p.suffix == ".json":
        if not image_root:
            raise InvalidInputError(f"{spec} is a Karpathy split file: give the image folder too (--images ROOT, the folder holding train2014/ and val2014/ for COCO)")
        return KarpathySource(p, image_root, splits)
    if p.suffix in (".jsonl", ".ndjson"):
        return JsonlSource(p, image_root)
    return TarShardSource(spec)


# --- decoding -----------------------------------------------------------------------------
class CaptionChecker:
    """Tokenizes captions and says why one is unusable (empty, unreadable by the vocabulary)."""

    def __init__(self, vocab: Vocabulary, max_length: int):
        self.vocab, self.max_length = vocab, max_length
        self.cls, self.sep, self.unk = vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.get("[UNK]")

    def __call__(self, caption: str, where: str, report: DataReport) -> list[int] | None:
        ids = self.vocab.encode(caption) if caption.strip() else []
        unk = sum(t == self.unk for t in ids)
        if not ids or unk * 2 > len(ids):
            why = (f"empty caption {caption!r}" if not ids else f"caption {caption[:40]!r} is mostly unknown to the "
                   f"English WordPiece vocabulary ({unk} of {len(ids)} tokens [UNK])")
            _add(report.rejected, (where, why))
            report.rejected_captions += 1
            return None
        if len(ids) > self.max_length - 2:
            ids = ids[: self.max_length - 2]
            report.truncated_captions += 1
        return [self.cls, *ids, self.sep]


# --- training stream ------------------------------------------------------------------------
class PairStream:
    """Endless, shuffled, resumable batches of (image, one caption) from a source.

    Order for epoch ``e``: shards permuted by ``rng(seed, e)``, pairs passed through a shuffle
    buffer of ``buffer`` pairs (lazy: images are not opened in the buffer), one caption per image
    drawn by ``rng(seed, e, n)``. ``state()`` / ``restore()`` carry (epoch, consumed).
    """

    def __init__(self, source: Any, *, image_size: int, max_length: int = 77, vocab: Vocabulary | None = None,
                 seed: int = 0, buffer: int = 1000):
        self.source = source
        self.image_size = image_size
        self.seed, self.buffer = seed, max(1, buffer)
        self.check = CaptionChecker(vocab or default_vocabulary(), max_length)
        self.report = DataReport(source=getattr(source, "name", str(source)))
        self.epoch, self.consumed = 0, 0
        self._it: Iterator[Pair] | None = None
        self.rank, self.world = 0, 1

    def shard(self, rank: int, world: int) -> None:
        """Read only this process's share: whole shards when there are at least ``world`` of them,
        else every ``world``-th pair (before shuffling)."""
        self.rank, self.world = rank, world
        self._it = None

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "consumed": self.consumed}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, target = int(state["epoch"]), int(state["consumed"])
        self._it = self._epoch_iter(self.epoch)
        self.consumed = 0
        for _ in range(target):  # replay without opening images
            next(self._it)
            self.consumed += 1

    def _epoch_iter(self, epoch: int) -> Iterator[Pair]:
        rng = np.random.default_rng([self.seed, epoch])
        shards = self.source.shards()
        order = rng.permutation(len(shards))
        by_shard = self.world > 1 and len(shards) >= self.world
        if by_shard:
            order = order[self.rank :: self.world]
        buf: list[Pair] = []
        scratch = DataReport(source="")
        n = -1
        for s in order:
            # records rejected while parsing count once, in the first epoch
            for pair in self.source.iter_shard(shards[s], self.report if epoch == 0 else scratch):
                n += 1
                if self.world > 1 and not by_shard and n % self.world != self.rank:
                    continue
                if len(buf) < self.buffer:
                    buf.append(pair)
                    continue
                j = int(rng.integers(len(buf)))
                buf[j], pair = pair, buf[j]
                yield pair
        rng.shuffle(buf)
        yield from buf

    def _next_pair(self) -> Pair:
        if self._it is None:
            self._it = self._epoch_iter(self.epoch)
        while True:
            try:
                pair = next(self._it)
                self.consumed += 1
                return pair
            except StopIteration:
                if self.consumed == 0:
                    raise InvalidInputError(f"{self.report.source} holds no image-caption pairs ({self.report.summary()})") from None
                self.epoch += 1
                self.consumed = 0
                self._it = self._epoch_iter(self.epoch)

    def next_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        """``{"pixels": uint8 (B, S, S, 3), "ids", "mask"}``: distinct images, usable captions only."""
        images, rows, keys = [], [], set()
        tries = 0
        while len(rows) < batch_size:
            tries += 1
            if tries > 50 * batch_size + 1000:
                raise InvalidInputError(f"{self.report.source}: could not fill a batch of {batch_size} usable pairs ({self.report.summary()})")
            pair = self._next_pair()
            first_epoch = self.epoch == 0
            if pair.key in keys:
                continue
            caps = list(pair.captions)
            rng = np.random.default_rng([self.seed, self.epoch, self.consumed])
            ids = None
            for c in (caps[i] for i in rng.permutation(len(caps))):
                ids = self.check(c, pair.where, self.report if first_epoch else DataReport(source=""))
                if ids is not None:
                    break
            if ids is None:
                continue
            try:
                arr = decode(pair.open(), self.image_size)
            except ImageError as e:
                if first_epoch:
                    _add(self.report.skipped_images, (pair.where, str(e)))
                    self.report.skipped_count += 1
                continue
            if first_epoch:
                self.report.n_pairs += 1
            keys.add(pair.key)
            images.append(arr)
            rows.append(ids)
        ids, mask = pad_tokens(rows)
        return {"pixels": np.stack(images), "ids": ids, "mask": mask}


# --- evaluation set (streamed) ----------------------------------------------------------------
def iter_eval_items(source: Any, image_size: int, check: CaptionChecker, report: DataReport, prompt: str = "") -> Iterator[tuple[np.ndarray, list[list[int]], Pair]]:
    """(decoded image, tokenized captions, pair) for every usable image of ``source``, in order."""
    for shard in source.shards():
        for pair in source.iter_shard(shard, report):
            report.n_records += 1
            caps = [ids for c in pair.captions if (ids := check(prompt + c if c.strip() else c, pair.where, report)) is not None]
            if not caps:
                continue
            try:
                arr = decode(pair.open(), image_size)
            except ImageError as e:
                _add(report.skipped_images, (pair.where, str(e)))
                report.skipped_count += 1
                continue
            report.n_images += 1
            report.n_pairs += len(caps)
            yield arr, caps, pair
