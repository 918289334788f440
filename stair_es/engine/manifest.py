"""The commit record of an embedded index: the manifest files, the writer lock and the tombstones.

``manifest.json`` is the commit point (format version, generation, schema, segments with their
tombstone files, next segment number and insertion number, a CRC-32 of its canonical JSON);
``manifest.prev.json`` is the commit before it, kept with its files for ``index check --repair``;
``write.lock`` is held by the one writer. This module reads, validates and names them; it knows
nothing of postings or search (:mod:`.index` commits, :mod:`.check` verifies).
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import DamagedIndexError, IndexLockedError
from ..errors import StairError as StairErrorBase
from .storage import crc32_of

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


@functools.lru_cache(maxsize=256)
def manifest_file(index_dir: Path) -> str:
    """The manifest's path as a string: a reader stats it at every search, and joining a
    ``Path`` each time cost twice the ``stat`` itself (~5 us of a 0.5 ms search, 2026-11-27)."""
    return os.fspath(index_dir / MANIFEST)

#: The previous commit, kept (with every file it references) so `index check --repair` can roll back to it.
PREV_MANIFEST = "manifest.prev.json"
LOCK = "write.lock"
SEG_NAME = re.compile(r"^seg-(\d{6,})$")


def manifest_checksum(m: Mapping[str, Any]) -> int:
    """CRC-32 of a manifest's canonical JSON without its ``checksum`` entry."""
    body = {k: v for k, v in m.items() if k != "checksum"}
    return crc32_of(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def validate_manifest(m: Any, path: Path) -> dict[str, Any]:
    """The manifest if it is whole and consistent; else :class:`DamagedIndexError` saying what is wrong.

    A damaged commit record must stop every reader and writer: a writer trusting a manifest whose
    ``next_segment`` names a live segment, or that lists one twice, would overwrite or duplicate
    documents; a path leaving the folder would read or delete files that are not the index's.
    """
    where = f"the manifest of the index at {path}"
    hint = "; nothing was changed. Run `stair-es index check` on it, or restore the folder from a backup"

    def bad(what: str) -> DamagedIndexError:
        return DamagedIndexError(f"{where} is damaged ({what}){hint}")

    if not isinstance(m, dict):
        raise bad(f"a JSON {type(m).__name__} instead of an object")
    if "checksum" in m and m["checksum"] != manifest_checksum(m):
        raise bad("checksum mismatch: the file was altered after it was written")
    for key, kind in (("generation", int), ("next_segment", int), ("segments", list), ("schema", dict)):
        if not isinstance(m.get(key), kind) or isinstance(m.get(key), bool):
            raise bad(f"{key!r} is missing or not a{'n' if kind is int else ''} {kind.__name__}")
    names = set()
    for e in m["segments"]:
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            raise bad("a segment entry is not an object with a name")
        match = SEG_NAME.match(e["name"])
        if not match or e.get("file") != f"{e['name']}.seg":
            raise bad(f"segment entry {e.get('name')!r} -> {e.get('file')!r} is not a segment file of this folder")
        if e["name"] in names:
            raise bad(f"segment {e['name']} is listed twice")
        if int(match.group(1)) >= m["next_segment"]:
            raise bad(f"next_segment {m['next_segment']} would overwrite the live segment {e['name']}")
        docs, deleted = e.get("docs"), e.get("deleted", 0)
        if not isinstance(docs, int) or docs < 0 or not isinstance(deleted, int) or not 0 <= deleted <= docs:
            raise bad(f"segment {e['name']} has invalid document counts")
        del_file = e.get("del_file")
        if del_file is not None and (not isinstance(del_file, str) or not re.fullmatch(re.escape(e["name"]) + r"\.del\.\d+", del_file)):
            raise bad(f"segment {e['name']} names the tombstone file {del_file!r}")
        names.add(e["name"])
    return m


def take_writer_lock(path: Path, when_busy: str):
    """The one writer's lock on an index folder (held, not waited for), or a clear error."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise IndexLockedError(f"the index at {path} is locked by another writer (process); {when_busy}") from None
    except OSError as e:
        raise DamagedIndexError(
            f"cannot take the writer lock {path / LOCK} ({e.strerror or e}): it must be a file the writer can "
            "create and lock; remove what is there if no stair-es process is writing, and check permissions") from None
    return lock


def files_of(m: Mapping[str, Any]) -> set[str]:
    """The segment and tombstone files a manifest references."""
    entries = m.get("segments", []) if isinstance(m, Mapping) else []
    return {f for e in entries for f in (e["file"], e.get("del_file")) if f}


def read_valid_manifest(file: Path, folder: Path) -> dict[str, Any] | None:
    """A manifest file's content if it reads and validates, else None (never raises)."""
    try:
        return validate_manifest(json.loads(file.read_bytes()), folder)
    except (OSError, ValueError, UnicodeDecodeError, StairErrorBase):
        return None


def missing_manifest_error(path: Path) -> DamagedIndexError | None:
    """A folder with segment files but no readable manifest is a damaged index, never an empty one."""
    try:
        segs = sorted(p.name for p in path.iterdir() if p.name.startswith("seg-"))
    except OSError:
        return None
    if not segs:
        return None
    return DamagedIndexError(
        f"the index folder {path} holds {len(segs)} segment file(s) ({', '.join(segs[:3])}{'...' if len(segs) > 3 else ''}) "
        f"but no readable {MANIFEST}: its commit record is lost, so it is neither opened nor overwritten. "
        + ("`stair-es index check NAME --repair` rolls back to the previous commit (manifest.prev.json), "
           if (path / PREV_MANIFEST).is_file() else "")
        + "or restore manifest.json from a backup, or move the folder away and re-ingest"
    )


def read_tombstones(folder: Path, e: Mapping[str, Any], n_docs: int) -> tuple[np.ndarray, int]:
    """(deleted flag per document, count) of a manifest entry's tombstone file, checked against the entry."""
    path = folder / e["del_file"]
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as err:
        raise DamagedIndexError(f"cannot read the tombstone file {path} ({err.strerror or err})") from None
    if len(raw) != (n_docs + 7) // 8:
        raise DamagedIndexError(f"tombstone file {path} has {len(raw)} bytes, expected {(n_docs + 7) // 8}; the index is damaged")
    if "del_crc32" in e and crc32_of(raw) != e["del_crc32"]:
        raise DamagedIndexError(f"tombstone file {path} fails its checksum; the index is damaged: "
                                "run `stair-es index check`")
    deleted = np.unpackbits(np.frombuffer(raw, np.uint8), count=n_docs).astype(bool)
    n_del = int(deleted.sum())
    if n_del != e["deleted"]:
        raise DamagedIndexError(f"tombstone file {path} marks {n_del} deleted documents, the manifest {e['deleted']}; "
                                "the index is damaged")
    return deleted, n_del


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files in an index folder, read while a writer may be working in it:
    a temporary file renamed or removed between the listing and its stat is simply not counted."""
    total = 0
    for p in folder.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
    return total


def writer_version() -> str:
    from .. import __version__  # (importlib.metadata would cost every ingest ~70 ms of start-up)

    return f"stair_es {__version__}"
