"""Reading image catalogs: a folder, a glob pattern, or a JSONL manifest.

Each source yields, in order, either a :class:`CatalogEntry` (something to ingest) or an
:class:`~stair_es.schema.ItemResult` describing an input that cannot be used and why
(malformed line, duplicate id, a file that is not an image...). Nothing is dropped silently.

Manifest lines are JSON objects::

    {"id": "sku-1", "path": "img/1.jpg", "caption": "a red shoe", "metadata": {"brand": "acme"}}
    {"id": "sku-2", "vectors": {"image": {"shoe": 1.3, "red": 0.8}}, "metadata": {...}}
    {"id": "sku-3", "path": "img/3.jpg", "dense": [0.12, -0.5, ...]}

``path`` is relative to the manifest's folder; ``id`` defaults to ``path``; ``vectors``
holds already-encoded token maps per sparse field (then no image is needed); ``dense`` an
already-computed dense vector for an index with a dense field (see :mod:`stair_es.dense`).
In a folder, ``name.txt`` and ``name.json`` beside ``name.jpg`` give its caption and metadata.
"""

from __future__ import annotations

import glob as _glob
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Union

from .errors import InvalidInputError
from .schema import MAX_CAPTION_CHARS, ItemResult

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".jfif"})
SIDECAR_EXTENSIONS = frozenset({".txt", ".json"})


@dataclass
class CatalogEntry:
    id: str
    path: Path | None  # image file, or None when vectors are given
    caption: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    vectors: dict[str, dict[str, float]] | None = None  # precomputed token maps per field
    origin: str = ""  # "manifest.jsonl:12" or the file path, for reports
    warning: str | None = None
    dense: list[float] | None = None  # a precomputed dense vector (checked when the document is built)


CatalogItem = Union[CatalogEntry, ItemResult]


def clean_caption(caption: Any, origin: str) -> tuple[str | None, str | None]:
    """Return (caption or None, warning or None). Raises on a non-string caption."""
    if caption is None:
        return None, None
    if not isinstance(caption, str):
        raise InvalidInputError(f"caption must be a string, got {type(caption).__name__}")
    caption = " ".join(caption.split())
    if not caption:
        return None, None
    if len(caption) > MAX_CAPTION_CHARS:
        return caption[:MAX_CAPTION_CHARS], f"caption truncated from {len(caption)} to {MAX_CAPTION_CHARS} characters"
    return caption, None


def read_catalog(source: str | Path) -> Iterator[CatalogItem]:
    """Dispatch on the source: ``*.jsonl`` file, directory, or glob pattern."""
    text = str(source)
    p = Path(text).expanduser()
    if p.is_file() and p.suffix.lower() in (".jsonl", ".ndjson"):
        yield from read_manifest(p)
    elif p.is_dir():
        yield from read_folder(p)
    elif _glob.has_magic(text):
        yield from read_glob(text)
    elif p.exists():
        raise InvalidInputError(
            f"{text}: a catalog is a folder, a glob pattern (quote it) or a JSONL manifest ending in .jsonl")
    else:
        raise InvalidInputError(f"{text}: no such file or folder")


def count_catalog(source: str | Path) -> int | None:
    """How many items ``read_catalog(source)`` will yield (for a progress bar); None if unknown.

    Cheap next to ingesting: lines are counted without parsing, files without opening them.
    """
    text = str(source)
    p = Path(text).expanduser()
    try:
        if p.is_file():
            with p.open("rb") as fh:
                return sum(1 for line in fh if line.strip())
        if p.is_dir():
            return sum(1 for f in p.rglob("*") if f.is_file() and not _is_sidecar(f))
        if _glob.has_magic(text):
            return sum(1 for f in _glob.iglob(text, recursive=True) if Path(f).is_file() and not _is_sidecar(Path(f)))
    except OSError:
        return None
    return None


def dedupe(items: Iterator[CatalogItem]) -> Iterator[CatalogItem]:
    """``items`` with every repeat of an id replaced by a failed ItemResult naming the first."""
    seen: dict[str, str] = {}
    for item in items:
        if isinstance(item, CatalogEntry):
            first = seen.get(item.id)
            if first is not None:
                yield ItemResult(item.id, False, f"duplicate id {item.id!r} (first seen at {first}); this entry was not ingested",
                                 source=item.origin)
                continue
            seen[item.id] = item.origin
        yield item


def read_manifest(path: Path) -> Iterator[CatalogItem]:
    base = path.parent
    def lines() -> Iterator[CatalogItem]:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            for n, raw in enumerate(fh, 1):
                origin = f"{path.name}:{n}"
                if not raw.strip():
                    continue
                try:
                    yield _manifest_entry(raw, base, origin)
                except InvalidInputError as e:
                    yield ItemResult(None, False, str(e), source=origin)
    return dedupe(lines())


def json_object_line(raw: str, what: str = "a manifest line") -> dict:
    """One JSONL line as a dict, or InvalidInputError saying why not (the same words for every
    line-per-item file stair_es reads: manifests, lists of locations)."""
    try:
        rec = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidInputError(f"not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(rec, dict):
        raise InvalidInputError(f"{what} must be a JSON object, got {type(rec).__name__}")
    return rec


def _manifest_entry(raw: str, base: Path, origin: str) -> CatalogEntry:
    rec = json_object_line(raw)
    unknown = set(rec) - {"id", "path", "caption", "metadata", "vectors", "dense"}
    if unknown:
        raise InvalidInputError(f"unknown keys {sorted(unknown)}; allowed: id, path, caption, metadata, vectors, dense")
    dense = rec.get("dense")
    if dense is not None and not isinstance(dense, list):
        raise InvalidInputError(f"'dense' must be a list of numbers, got {type(dense).__name__}")
    path_v, vectors = rec.get("path"), rec.get("vectors")
    if path_v is None and vectors is None:
        raise InvalidInputError("needs a 'path' to an image or precomputed 'vectors'")
    if path_v is not None and not isinstance(path_v, str):
        raise InvalidInputError(f"'path' must be a string, got {type(path_v).__name__}")
    if vectors is not None and (not isinstance(vectors, dict) or not all(isinstance(v, dict) for v in vectors.values())):
        raise InvalidInputError("'vectors' must map a field name to a {token: weight} object")
    doc_id = rec.get("id", path_v)
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise InvalidInputError(f"'id' must be a non-empty string, got {doc_id!r}")
    meta = rec.get("metadata") or {}
    if not isinstance(meta, dict):
        raise InvalidInputError(f"'metadata' must be a JSON object, got {type(meta).__name__}")
    caption, warning = clean_caption(rec.get("caption"), origin)
    img = None if path_v is None else base / Path(path_v).expanduser()  # (an absolute path stays as it is)
    return CatalogEntry(doc_id, img, caption, meta, vectors, origin, warning, dense)


def _file_entry(file: Path, root: Path) -> CatalogItem:
    rel = file.relative_to(root).as_posix() if file.is_relative_to(root) else file.as_posix()
    origin = str(file)
    if file.suffix.lower() not in IMAGE_EXTENSIONS:
        return ItemResult(rel, True, None, source=origin, action="skip",
                          warning=f"skipped: {file.suffix or 'no extension'} is not an image extension")
    caption = warning = None
    meta: dict[str, Any] = {}
    txt, js = file.with_suffix(".txt"), file.with_suffix(".json")
    side = txt
    try:
        if txt.is_file():
            caption, warning = clean_caption(txt.read_text(encoding="utf-8", errors="replace"), origin)
        side = js
        if js.is_file():
            meta = json.loads(js.read_text(encoding="utf-8"))
            if not isinstance(meta, dict):
                raise InvalidInputError(f"it holds a JSON {type(meta).__name__}, not an object")
    except (OSError, json.JSONDecodeError, InvalidInputError) as e:
        return ItemResult(rel, False, f"sidecar file {side.name} unusable ({e}): fix or remove it", source=origin)
    return CatalogEntry(rel, file, caption, meta, None, origin, warning)


def _is_sidecar(file: Path) -> bool:
    return file.suffix.lower() in SIDECAR_EXTENSIONS and any(
        file.with_suffix(ext).exists() or file.with_suffix(ext.upper()).exists() for ext in IMAGE_EXTENSIONS)


def read_folder(folder: Path) -> Iterator[CatalogItem]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return dedupe(_file_entry(f, folder) for f in files if not _is_sidecar(f))


def read_glob(pattern: str) -> Iterator[CatalogItem]:
    root = Path(pattern)
    while _glob.has_magic(str(root)):
        root = root.parent
    files = sorted(Path(p) for p in _glob.glob(pattern, recursive=True) if Path(p).is_file())
    if not files:
        raise InvalidInputError(f"no files match {pattern!r}")
    return dedupe(_file_entry(f, root) for f in files if not _is_sidecar(f))
