"""The model store on disk: where entries live, reading and checking them, installing one atomically.

Owns the store's layout (``<org>--<name>/<revision>/`` with ``stair-es-model.json``), the
per-id install lock, temporary folders and the atomic rename that installs an entry, file
hashing, ``models list``/``verify``/``rm``, and :func:`model_record` (what an index records
about its model). Must not know how models are downloaded or bundled, nor what they compute.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator
from urllib.parse import quote

from .. import __version__
from ..errors import InvalidInputError, ModelError

from .catalog import CATALOG, CatalogEntry

log = logging.getLogger(__name__)

ENTRY_FILE = "stair-es-model.json"
MANIFEST_FILE = "MANIFEST.json"
ENTRY_FORMAT = "stair-es-model"
BUNDLE_FORMAT = "stair-es-model-bundle"
FORMAT_VERSION = 1

#: Files a model folder is identified by (weights, configs, tokenizer and vocabulary files).
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".txt", ".model", ".npy", ".npz", ".yaml", ".yml")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
NOT_WEIGHTS = ("tf_model", "flax_model", "rust_model", "model.onnx", "openvino", "coreml")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
CHUNK = 1 << 20


# --- where things live -------------------------------------------------------------------------
def data_home() -> Path:
    home = os.environ.get("STAIR_ES_HOME")
    return Path(home).expanduser() if home else Path.home() / ".local" / "share" / "stair-es"


def store_dir() -> Path:
    """``$STAIR_ES_MODEL_STORE`` or ``<data home>/_models/store``."""
    env = os.environ.get("STAIR_ES_MODEL_STORE")
    return Path(env).expanduser() if env else data_home() / "_models" / "store"


def offline() -> bool:
    """Whether the user asked for no network (``HF_HUB_OFFLINE`` or ``STAIR_ES_OFFLINE``)."""
    return any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
               for var in ("STAIR_ES_OFFLINE", "HF_HUB_OFFLINE"))


def check_id(model_id: str) -> str:
    model_id = model_id.strip()
    if not _ID.match(model_id) or ".." in model_id or "--" in model_id:
        raise InvalidInputError(f"{model_id!r} is not a model id: give ORG/NAME as on the Hugging Face hub "
                                "(see `stair-es models list`) or a local folder")
    return model_id


def check_revision(revision: str) -> str:
    revision = revision.strip()
    if not _REVISION.match(revision) or ".." in revision:
        raise InvalidInputError(f"{revision!r} is not a revision: give a branch, tag or commit hash")
    return revision


def split_model(model: str) -> tuple[str, str | None]:
    """``"ORG/NAME@REV"`` -> ``("ORG/NAME", "REV")``; no ``@`` -> revision None."""
    model_id, at, revision = model.partition("@")
    return check_id(model_id), (check_revision(revision) if at else None)


def slug(model_id: str) -> str:
    """A model id as a folder name (hub ids are case-insensitive)."""
    return model_id.lower().replace("/", "--")


def id_dir(model_id: str) -> Path:
    return store_dir() / slug(model_id)


# --- reading entries ---------------------------------------------------------------------------
@dataclass
class StoreEntry:
    """One installed model (a folder of the store and its ``stair-es-model.json``)."""

    folder: Path
    meta: dict[str, Any]

    @property
    def id(self) -> str:
        return self.meta["id"]

    @property
    def revision(self) -> str:
        return self.meta["revision"]

    @property
    def kind(self) -> str | None:
        return self.meta.get("kind")

    @property
    def size(self) -> int:
        return int(sum(f["size"] for f in self.meta["files"].values()))


def read_entry_meta(folder: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((folder / ENTRY_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and meta.get("format") == ENTRY_FORMAT and isinstance(meta.get("id"), str)
            and isinstance(meta.get("revision"), str) and isinstance(meta.get("files"), dict)
            and isinstance(meta.get("sha256"), str)):
        return None
    return meta


def entries(model_id: str | None = None) -> list[StoreEntry]:
    """Installed entries (of one id, or all), newest install first. Temporary folders never count."""
    root = store_dir()
    if model_id is not None:
        id_dirs = [id_dir(model_id)]
    else:
        try:
            id_dirs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return []
    found = []
    for folder_of_id in id_dirs:
        try:
            rev_dirs = [p for p in folder_of_id.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            continue
        for folder in rev_dirs:
            meta = read_entry_meta(folder)
            if meta is not None and (model_id is None or meta["id"].lower() == model_id.lower()):
                found.append(StoreEntry(folder, meta))
    found.sort(key=lambda e: str(e.meta.get("installed", {}).get("at", "")), reverse=True)
    return found


def find_entry(model_id: str, revision: str | None = None) -> StoreEntry | None:
    """The installed entry of ``model_id`` at ``revision`` (a commit, a prefix of one of at least
    7 characters, or the branch/tag it was pulled as); without a revision, the newest install."""
    for entry in entries(model_id):
        if revision is None:
            return entry
        commit = entry.revision
        if revision in (commit, entry.meta.get("requested_revision")):
            return entry
        if len(revision) >= 7 and HEX40.match(commit) and commit.startswith(revision):
            return entry
    return None


def check_present(entry: StoreEntry) -> None:
    """Cheap check before use: every recorded file is there with its recorded size."""
    for rel, info in entry.meta["files"].items():
        path = entry.folder / rel
        try:
            size = path.stat().st_size
        except OSError:
            size = -1
        if size != info["size"]:
            raise ModelError(f"model {entry.id} in the store is damaged ({rel} is missing or has another size); "
                             f"run `stair-es models rm {entry.id}` and pull or import it again")


def model_record(folder: Path) -> dict[str, Any]:
    """What an index config records about the model in ``folder``.

    A store entry: ``{"id", "revision", "sha256"}`` (``sha256`` identifies every file of the
    entry, see :func:`files_digest`). Any other folder: ``{"id": <the folder as given>,
    "weights": <first 16 hex of runtime.weights_digest(the model files)>}``.
    """
    folder = Path(folder)
    meta = read_entry_meta(folder)
    if meta is not None:
        return {"id": meta["id"], "revision": meta["revision"], "sha256": meta["sha256"]}
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.runtime import weights_digest

    files = model_files(folder)
    if not files:
        raise ModelError(f"{folder} holds no model files ({', '.join(MODEL_FILE_SUFFIXES)}); give the model's folder")
    return {"id": str(folder), "weights": weights_digest(files)[:16]}


def model_files(folder: Path) -> list[Path]:
    """The files that identify a plain model folder (top level, by suffix)."""
    try:
        return sorted(p for p in Path(folder).iterdir() if p.is_file() and p.suffix.lower() in MODEL_FILE_SUFFIXES)
    except OSError:
        raise ModelError(f"model folder not found or unreadable: {folder}") from None


def files_digest(files: dict[str, dict[str, Any]]) -> str:
    """One sha256 over ``{relative path: {"sha256"...}}`` (order-independent; the same formula
    as ``runtime.weights_digest`` for top-level files)."""
    parts = sorted(f"{rel}:{info['sha256']}" for rel, info in files.items())
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def carry_hint(model_id: str, revision: str | None = None) -> str:
    """How to carry ``model_id`` (at ``revision`` when one was asked for) into this machine."""
    pull_rev, export_id = (f" --revision {revision}", f"{model_id}@{revision}") if revision else ("", model_id)
    return (f"on a machine with internet run `stair-es models pull {model_id}{pull_rev}` and "
            f"`stair-es models export {export_id} DIR`, then `stair-es models import DIR` here")


# --- hashing and copying -------------------------------------------------------------------------
Progress = Callable[[int], None]


def hash_file(path: Path, progress: Progress | None = None) -> str:
    with open(path, "rb") as f:
        return copy_stream(f, None, progress)


def copy_hashing(src: Path, dst: Path, progress: Progress | None = None) -> str:
    """Copy ``src`` to ``dst`` and return the sha256 of what was written."""
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        digest = copy_stream(fi, fo, progress)
        fo.flush()
        os.fsync(fo.fileno())
    return digest


def copy_stream(fi: BinaryIO, fo: BinaryIO | None, progress: Progress | None = None) -> str:
    """Copy the open file ``fi`` into ``fo`` (None: only read it) in chunks; the sha256 of what was copied."""
    h = hashlib.sha256()
    for chunk in iter(lambda: fi.read(CHUNK), b""):
        h.update(chunk)
        if fo is not None:
            fo.write(chunk)
        if progress:
            progress(len(chunk))
    return h.hexdigest()


def now_utc() -> str:
    """UTC, to the microsecond (entries installed within one second still sort newest first)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def walk_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, path) of every file under ``folder`` (symlinks followed), sorted;
    hidden folders (``.cache`` of the hub client, ``.git``) are skipped."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(folder).as_posix(), path


class InstallLock:
    """The per-id install lock (tells the user when it has to wait for another process)."""

    def __init__(self, model_id: str):
        # lazy: only installing into the store takes the lock
        from filelock import FileLock

        locks = store_dir() / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        self.model_id = model_id
        self.lock = FileLock(str(locks / f"{slug(model_id)}.lock"))

    def __enter__(self) -> "InstallLock":
        # lazy: only installing into the store takes the lock
        from filelock import Timeout

        try:
            self.lock.acquire(timeout=1)
        except Timeout:
            log.warning("waiting for another stair-es process installing %s", self.model_id)
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def tmp_dir(model_id: str, what: str) -> Path:
    root = store_dir()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f".tmp-{what}-{slug(model_id)}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def clear_stale(model_id: str) -> None:
    """Remove temporary folders an interrupted pull, replacement or removal of ``model_id`` (call
    under its lock) or an interrupted import (by a process no longer running) left behind."""
    root = store_dir()
    for stale in [*root.glob(f".tmp-pull-{slug(model_id)}-*"), *id_dir(model_id).glob(".old-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in root.glob(".tmp-import-*"):
        match = re.match(r"^\.tmp-import-.*-(\d+)-[0-9a-f]{8}$", stale.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def commit_entry(staged: Path, meta: dict[str, Any]) -> StoreEntry:
    """Write ``stair-es-model.json`` into the staged folder and rename it into place (under the lock).
    An entry already installed at that revision with the same files is kept."""
    target = id_dir(meta["id"]) / quote(meta["revision"], safe="")  # a revision such as "v1/rc" as one folder
    (staged / ENTRY_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", "utf-8")
    existing = read_entry_meta(target)
    if existing is not None and existing["sha256"] == meta["sha256"]:
        shutil.rmtree(staged, ignore_errors=True)
        return StoreEntry(target, existing)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a damaged or different entry at this revision: replace it whole
        old = target.with_name(f".old-{target.name}-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        os.rename(staged, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staged, target)
    return StoreEntry(target, meta)


def os_errors(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The operating system refusing a write (disk full, permissions) -> one-line ModelError."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except OSError as e:
                where = f" ({e.filename})" if e.filename else ""
                raise ModelError(f"{what} failed: {e.strerror or e}{where}; check the free space and permissions "
                                 "(nothing half-done is used)") from None

        return wrapper

    return deco


def entry_meta(model_id: str, revision: str, requested: str, kind: str | None, files: dict[str, dict[str, Any]],
                installed: dict[str, Any], pulled: dict[str, Any] | None = None) -> dict[str, Any]:
    installed = {**installed, "stair_es": __version__}
    return {
        "format": ENTRY_FORMAT,
        "format_version": FORMAT_VERSION,
        "id": model_id,
        "revision": revision,
        "requested_revision": requested,
        "kind": kind,
        "files": files,
        "sha256": files_digest(files),
        "size": int(sum(f["size"] for f in files.values())),
        "pulled": pulled or installed,
        "installed": installed,
    }


def remove(model_id: str, revision: str | None = None) -> list[StoreEntry]:
    """Remove an id's entries (one revision, or all of them); returns what was removed."""
    model_id = check_id(model_id)
    gone = [e for e in entries(model_id) if revision is None or find_entry(model_id, revision) == e]
    if not gone:
        raise ModelError(f"model {model_id}{'@' + revision if revision else ''} is not in the store "
                         "(see `stair-es models list`)")
    with InstallLock(model_id):
        for entry in gone:
            trash = entry.folder.with_name(f".old-{entry.folder.name}-{uuid.uuid4().hex[:8]}")
            os.rename(entry.folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
    return gone


def byte_bar(total: int, desc: str, enabled: bool):
    """A progress bar over ``total`` bytes (nothing drawn when not enabled)."""
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.base import progress_bar

    return progress_bar(total, desc, enabled, unit="B", unit_scale=True, unit_divisor=1024)


# --- list and verify ---------------------------------------------------------------------------------
def listing() -> list[dict[str, Any]]:
    """The catalog and every installed entry (models not in the catalog too), as rows for ``models list``."""
    installed: dict[str, list[StoreEntry]] = {}
    for entry in entries():
        installed.setdefault(entry.id.lower(), []).append(entry)
    rows = [_row(known.id, known, installed.pop(known.id.lower(), [])) for known in CATALOG]
    rows += [_row(group[0].id, None, group) for group in installed.values()]
    return rows


def _row(model_id: str, known: CatalogEntry | None, found: list[StoreEntry]) -> dict[str, Any]:
    kinds = {e.kind for e in found if e.kind}
    return {
        "id": model_id,
        "kind": known.kind if known else (sorted(kinds)[0] if kinds else None),
        "title": known.title if known else "",
        "purpose": known.purpose if known else "(not in the catalog: pulled or imported by id)",
        "download_size": known.size if known else None,
        "licence": known.licence if known else None,
        "revision": known.revision if known else None,
        "url": known.url if known else f"https://huggingface.co/{model_id}",
        "in_store": bool(found),
        "installed": [{
            "revision": e.revision,
            "requested_revision": e.meta.get("requested_revision"),
            "size": e.size,
            "sha256": e.meta["sha256"],
            "how": e.meta.get("installed", {}).get("how"),
            "at": e.meta.get("installed", {}).get("at"),
            "folder": str(e.folder),
        } for e in found],
    }


def verify(model: str, *, progress: bool = False) -> StoreEntry:
    """Re-hash every file of an installed entry; :class:`ModelError` naming the first damaged file."""
    entry = installed_entry(model)
    verify_entry(entry, progress)
    return entry


def installed_entry(model: str) -> StoreEntry:
    model_id, revision = split_model(model)
    entry = find_entry(model_id, revision)
    if entry is None:
        raise ModelError(f"model {model} is not in the store; run `stair-es models pull {model_id}` "
                         "(or `stair-es models import DIR` with a bundle exported elsewhere)")
    return entry


def verify_entry(entry: StoreEntry, progress: bool) -> None:
    check_present(entry)
    with byte_bar(entry.size, f"checking {entry.id}", progress) as bar:
        for rel, info in sorted(entry.meta["files"].items()):
            if hash_file(entry.folder / rel, bar.update) != info["sha256"]:
                raise ModelError(f"{rel} of model {entry.id} in the store does not match its checksum; run "
                                 f"`stair-es models rm {entry.id}` and pull or import it again")
