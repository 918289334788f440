"""``index check``: verify an embedded index folder file by file, like Lucene's CheckIndex, and
repair what can be repaired (drop damaged segments, or roll back to the previous commit)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Mapping

from ..errors import DamagedIndexError, IndexNotFoundError
from ..errors import StairError as StairErrorBase
from .manifest import (LOCK, MANIFEST, PREV_MANIFEST, files_of, manifest_checksum, missing_manifest_error,
                       read_tombstones, read_valid_manifest, take_writer_lock, validate_manifest, writer_version)
from .segment import Segment
from .storage import atomic_write_json, read_arrays, read_footer, verify_file


def check_index(path: str | Path, *, repair: bool = False) -> dict[str, Any]:
    """Verify an index folder file by file, like Lucene's CheckIndex; optionally repair it.

    Checks the manifest (JSON, checksum, consistency), then every segment (footer checksum,
    header, pointer and count invariants, identity and document count against the manifest)
    and tombstone file (size, checksum, count). Returns a report::

        {"path", "ok", "manifest": None | error, "segments": [{"name", "docs", "deleted",
         "checksummed", "error"}], "orphans": [...], "repaired": bool, "lost_docs": int,
         "lost_ids": [...]}

    With ``repair=True`` and a readable manifest, damaged segments are dropped from a new
    commit (under the writer lock): the documents they held are lost and listed (ids when
    the file still names them). A damaged or missing manifest is repaired by rolling back to
    the previous commit (``manifest.prev.json``) when every file it names is whole.
    """
    path = Path(path)
    report: dict[str, Any] = {"path": str(path), "ok": True, "manifest": None, "segments": [], "orphans": [],
                              "repaired": False, "lost_docs": 0, "lost_ids": []}
    try:
        if not (path / MANIFEST).is_file():
            raise missing_manifest_error(path) or IndexNotFoundError(f"no stair_es index at {path}")
        m = validate_manifest(json.loads((path / MANIFEST).read_bytes()), path)
    except IndexNotFoundError:
        raise
    except (StairErrorBase, OSError, ValueError, UnicodeDecodeError) as e:
        prev = read_valid_manifest(path / PREV_MANIFEST, path)
        report.update(ok=False, manifest=str(e) if isinstance(e, StairErrorBase) else f"{path / MANIFEST}: {e}",
                      previous_generation=prev.get("generation") if prev else None)
        if repair and prev is not None:
            # the previous commit, if every file it names is whole, becomes the current one
            bad = [row for row in _check_segments(path, prev)[0] if row["error"]]
            if bad:
                report["segments"] = bad
                return report
            lock = take_writer_lock(path, "repair it when that ends")
            try:
                if (path / MANIFEST).is_dir():
                    (path / MANIFEST).rmdir()
                elif (path / MANIFEST).is_symlink() or (path / MANIFEST).exists():
                    (path / MANIFEST).unlink()
                atomic_write_json(path / MANIFEST, prev)
            finally:
                lock.release()
            report.update(repaired=True, rolled_back_to=prev.get("generation"))
        return report
    rows, damaged_entries = _check_segments(path, m)
    report.update(segments=rows, ok=not damaged_entries)
    referenced = {MANIFEST, PREV_MANIFEST, LOCK} | files_of(m) | files_of(read_valid_manifest(path / PREV_MANIFEST, path) or {})
    with contextlib.suppress(OSError):
        report["orphans"] = sorted(p.name for p in path.iterdir() if p.name not in referenced and p.name.startswith("seg-"))
    if repair and damaged_entries:
        lock = take_writer_lock(path, "repair it when that ends")
        try:
            for e in damaged_entries:
                report["lost_docs"] += int(e["docs"]) - int(e.get("deleted", 0))
                with contextlib.suppress(Exception):  # the ids of a damaged file may be unreadable: report the count only
                    arrays, meta = read_arrays(path / e["file"])
                    seg = Segment(path / e["file"], arrays, meta)
                    report["lost_ids"] += [seg.doc_id(d) for d in range(seg.n_docs)]
            new = {**m, "segments": [e for e in m["segments"] if e not in damaged_entries],
                   "generation": int(m["generation"]) + 1, "writer": writer_version()}
            new["checksum"] = manifest_checksum(new)
            atomic_write_json(path / MANIFEST, new)
            report["repaired"] = True
        finally:
            lock.release()
    return report


def _check_segments(path: Path, m: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[Mapping[str, Any]]]:
    """Per manifest entry: verify the segment file and its tombstones. Returns (rows, damaged entries)."""
    rows, damaged = [], []
    for e in m["segments"]:
        row = {"name": e["name"], "docs": e["docs"], "deleted": e.get("deleted", 0), "checksummed": False, "error": None}
        try:
            seg_path = path / e["file"]
            row["checksummed"] = read_footer(seg_path, seg_path.stat().st_size).kind != "none"
            verify_file(seg_path)
            arrays, meta = read_arrays(seg_path)
            seg = Segment(seg_path, arrays, meta)
            seg.check_structure()
            if seg.name != e["name"] or seg.n_docs != e["docs"]:
                raise DamagedIndexError(f"{e['file']} holds {seg.name} with {seg.n_docs} documents; the manifest expects "
                                        f"{e['name']} with {e['docs']}")
            if e.get("del_file"):
                read_tombstones(path, e, seg.n_docs)
        except (StairErrorBase, OSError, ValueError) as err:
            row["error"] = str(err) if isinstance(err, StairErrorBase) else f"{e['file']}: {err}"
            damaged.append(e)
        rows.append(row)
    return rows, damaged
