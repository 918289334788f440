"""What ``encode-catalog`` encodes: a SOURCE read as catalog items, and images read from where
they are (a local path, an http(s) URL, or an object store URI).

SOURCE is one of
* what ``stair-es ingest`` reads (a folder, a quoted glob, a JSONL manifest): the same reader,
  so ids, captions and metadata are exactly those ``ingest`` would give;
* a Parquet or CSV list (local, or ``s3://`` / ``gs://`` through pyarrow and fsspec) with a
  ``path`` or ``url`` column and optional ``id``, ``caption`` and ``metadata`` (a JSON object
  as text, or a struct) columns. Relative paths are relative to the list's folder; ``id``
  defaults to the path or URL.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

from ..catalog import CatalogEntry, CatalogItem, clean_caption, dedupe, json_object_line, read_catalog
from ..errors import ImageError, InvalidInputError
from ..schema import ItemResult
from .shards import is_remote, open_fs, pyarrow_modules

URL_TIMEOUT_S = 30.0
LIST_SUFFIXES = (".parquet", ".pq", ".csv")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


def read_source(source: str) -> Iterator[CatalogItem]:
    """Catalog items of ``source`` in a stable order (re-runs cut the same shards)."""
    text = str(source)
    if text.lower().endswith(LIST_SUFFIXES):
        return read_list(text)
    if text.lower().endswith(JSONL_SUFFIXES) and (is_remote(text) or jsonl_has_urls(text)):
        return read_jsonl_list(text)
    if is_remote(text):
        raise InvalidInputError(f"{text}: a remote SOURCE must be a Parquet, CSV or JSONL list of paths/URLs "
                                "(.parquet, .csv or .jsonl)")
    return read_catalog(text)


def jsonl_has_urls(path: str) -> bool:
    """Whether a local JSONL manifest names an image by URL (``url``, or a ``path`` such as
    ``s3://...``): then it is read as a list of locations (:func:`read_jsonl_list`); otherwise by
    ``ingest``'s own reader, so ids, captions and metadata are exactly those ``ingest`` gives."""
    try:
        with open(Path(path).expanduser(), encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if '"url"' in line or "://" in line:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if isinstance(rec, dict) and (isinstance(rec.get("url"), str)
                                                  or (isinstance(rec.get("path"), str) and is_remote(rec["path"]))):
                        return True
    except OSError:
        return False  # ingest's reader says what is wrong with the file
    return False


def read_jsonl_list(location: str) -> Iterator[CatalogItem]:
    """A JSONL list of images by location (local paths, http(s)://, s3://, gs://), local or in an
    object store: per line ``path`` or ``url``, optional ``id``, ``caption``, ``metadata`` (as in
    a Parquet/CSV list). A bad line is that line's failure, with the reason."""
    fs, path = open_fs(location)
    if not fs.get_file_info(path).is_file:
        raise InvalidInputError(f"{location}: no such file")
    name = location.rsplit("/", 1)[-1]
    base = location.rsplit("/", 1)[0] if is_remote(location) else str(Path(path).parent)
    with fs.open_input_stream(path) as fh:  # a list of locations is small next to its images
        lines = fh.read().decode("utf-8", errors="replace").splitlines()

    def rows() -> Iterator[CatalogItem]:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            origin, rec = f"{name}:{n}", None
            try:
                rec = json_object_line(line, "a line")
                unknown = set(rec) - {"id", "path", "url", "caption", "metadata"}
                if unknown & {"vectors", "dense"}:
                    raise InvalidInputError("precomputed 'vectors'/'dense' come from a manifest of local paths "
                                            "(this list names images by URL); ingest them with `stair-es ingest`")
                if unknown:
                    raise InvalidInputError(f"unknown keys {sorted(unknown)}; allowed: id, path, url, caption, metadata")
                where = "path" if rec.get("path") is not None else "url"
                yield _list_entry(rec, where, base, origin)
            except InvalidInputError as e:
                yield ItemResult(rec.get("id") if isinstance(rec, dict) and isinstance(rec.get("id"), str) else None,
                                 False, str(e), source=origin)

    return dedupe(rows())


def read_list(location: str) -> Iterator[CatalogItem]:
    """Rows of a Parquet/CSV list as catalog items (duplicates and bad rows reported per row)."""
    pa, pq, _ = pyarrow_modules()
    fs, path = open_fs(location)
    if not fs.get_file_info(path).is_file:
        raise InvalidInputError(f"{location}: no such file")
    name = location.rsplit("/", 1)[-1]
    if path.lower().endswith(".csv"):
        import pyarrow.csv as pacsv

        with fs.open_input_stream(path) as fh:
            table = pacsv.read_csv(fh, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    else:
        table = pq.read_table(path, filesystem=fs)
    cols = set(table.column_names)
    where = "path" if "path" in cols else "url" if "url" in cols else None
    if where is None:
        raise InvalidInputError(f"{location}: a list needs a 'path' or 'url' column; it has {sorted(cols)}")
    base = location.rsplit("/", 1)[0] if is_remote(location) else str(Path(path).parent)

    def rows() -> Iterator[CatalogItem]:
        for n, rec in enumerate(table.to_pylist(), 1):  # a list of paths is small next to its images
            origin = f"{name}:{n}"
            try:
                yield _list_entry(rec, where, base, origin)
            except InvalidInputError as e:
                yield ItemResult(None, False, str(e), source=origin)

    return dedupe(rows())


def _list_entry(rec: dict[str, Any], where: str, base: str, origin: str) -> CatalogEntry:
    loc = rec.get(where)
    if not isinstance(loc, str) or not loc.strip():
        raise InvalidInputError(f"'{where}' must be a non-empty string, got {loc!r}")
    loc = loc.strip()
    doc_id = rec.get("id") if rec.get("id") is not None else loc
    if not isinstance(doc_id, str):
        doc_id = str(doc_id)
    if not doc_id.strip():
        raise InvalidInputError("'id' must be a non-empty string")
    meta = rec.get("metadata")
    if isinstance(meta, str):
        try:
            meta = json.loads(meta) if meta.strip() else {}
        except json.JSONDecodeError as e:
            raise InvalidInputError(f"'metadata' is not JSON ({e.msg} at column {e.colno})") from None
    meta = meta or {}
    if not isinstance(meta, dict):
        raise InvalidInputError(f"'metadata' must be a JSON object, got {type(meta).__name__}")
    caption, warning = clean_caption(rec.get("caption"), origin)
    if not is_remote(loc) and not Path(loc).is_absolute():
        loc = f"{base}/{loc}"
    # Local files stay Paths (then the document's source reads as `ingest` writes it); URLs stay text.
    return CatalogEntry(doc_id, loc if is_remote(loc) else Path(loc), caption, meta, None, origin, warning)  # type: ignore[arg-type]


def location_loader(min_side: int | None) -> Callable[[Any], Any]:
    """``load(location)`` -> decoded RGB image, for a local path or a URL; raises ImageError with the reason."""
    from ..images import load_image

    load = partial(load_image, min_side=min_side) if min_side else load_image

    def run(location: Any) -> Any:
        if isinstance(location, str) and is_remote(location):
            data = fetch_bytes(location)
            try:
                return load(data)
            except ImageError as e:
                raise ImageError(str(e).replace(f"<{len(data)} bytes>", location, 1)) from None
        return load(location)

    return run


def fetch_bytes(location: str) -> bytes:
    if location.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(location, timeout=URL_TIMEOUT_S) as resp:  # noqa: S310 - the user's URL
                return resp.read()
        except urllib.error.HTTPError as e:
            raise ImageError(f"{location}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise ImageError(f"{location}: cannot fetch ({getattr(e, 'reason', None) or e})") from None
    try:
        fs, path = open_fs(location)
        with fs.open_input_stream(path) as fh:
            return fh.read()
    except InvalidInputError:
        raise
    except Exception as e:  # noqa: BLE001 - any store error is this item's failure
        raise ImageError(f"{location}: cannot read ({e})") from None
