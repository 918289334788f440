"""The stair-es model store: pretrained models fetched once and carried into air-gapped machines.

A search engineer with internet runs ``stair-es models pull ID``; an encoder given
``model=ID`` then finds the files with :func:`resolve_model`, and an index records
:func:`model_record` so that a query encoded with another model is refused. A cluster with
no internet gets the model carried in: ``models export ID DIR`` on a machine that has it,
``models import DIR`` on the machine that needs it.

The store
---------
``$STAIR_ES_MODEL_STORE`` or ``<data home>/_models/store`` (data home: ``$STAIR_ES_HOME`` or
``~/.local/share/stair-es``). One folder per model id and revision,
``<org>--<name>/<revision>/``, holding the snapshot's files and ``stair-es-model.json``: the
id, the revision (the hub commit when known), the requested revision, the encoder kind, every
file with its sha256 and size, and when and how the entry got there.

An entry is never used half-written: a pull or an import fills a temporary folder inside the
store (``.tmp-*``), checks every file, writes ``stair-es-model.json`` last and renames the
folder into place (one atomic rename). A per-id lock (``filelock``) keeps two processes from
installing the same model at once; an interrupted pull leaves only a ``.tmp-*`` folder, which
lookups never read and the next pull of that id removes. The files themselves are downloaded
by ``huggingface_hub.snapshot_download`` into the Hugging Face cache, which resumes partial
downloads, then hard-linked (copied across file systems) into the store.

Bundles
-------
``export`` writes a folder (or a ``.tar``/``.tar.gz``) with ``MANIFEST.json`` (sha256 and size
of every file), ``model/`` (the store entry) and ``cache/`` (what the model's encoder derives
from it and needs at run time without torch: ONNX towers, a vocabulary matrix, tokenizer
files, as listed by the encoder's ``artifacts()``; they live in
:func:`stair_es.encoders.runtime.model_cache_dir`, keyed by the weights' sha256). ``import``
unpacks into a temporary folder, checks every file against the manifest *before* installing
anything (links, absolute paths and ``..`` in a tarball are refused), then moves ``cache/``
into the model cache and the entry into the store.

This module knows where models live and how they travel; it must not know what any model
computes (the encoders do).
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import quote

from .errors import InvalidInputError, MissingDependencyError, ModelError

log = logging.getLogger(__name__)

ENTRY_FILE = "stair-es-model.json"
MANIFEST_FILE = "MANIFEST.json"
ENTRY_FORMAT = "stair-es-model"
BUNDLE_FORMAT = "stair-es-model-bundle"
FORMAT_VERSION = 1

#: Files a model folder is identified by (weights, configs, tokenizer and vocabulary files).
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".json", ".txt", ".model", ".npy", ".npz", ".yaml", ".yml")
#: What a pull downloads from a repository the catalog does not describe (no TF, Flax, ONNX or
#: Rust copies of the weights: the encoders load PyTorch/safetensors weights).
DEFAULT_PATTERNS = ("*.json", "*.txt", "*.model", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.npy", "*.npz",
                    "*.yaml", "*.yml", "*.md")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_NOT_WEIGHTS = ("tf_model", "flax_model", "rust_model", "model.onnx", "openvino", "coreml")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


# --- the catalog ----------------------------------------------------------------------------
@dataclass(frozen=True)
class CatalogEntry:
    """A model stair_es knows how to use.

    ``revision`` is the revision a pull asks for unless ``--revision`` says otherwise. These
    machines cannot reach the hub to read commit hashes, so it is ``"main"``; the commit a
    pull actually got is recorded in the store entry (and in every index built with it).
    """

    id: str
    kind: str
    title: str
    purpose: str
    size: str
    licence: str
    revision: str = "main"
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    url: str = ""


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        id="vsearch/vdr-cross-modal",
        kind="vdr",
        title="VDR cross-modal (Zhou et al., ICLR 2024)",
        purpose="photos: image and text towers trained to give weights over the BERT vocabulary; the strongest "
                "route to photo search without training",
        size="~0.9 GB",
        licence="MIT (VDR repository; check the model card)",
        patterns=("*.json", "*.txt", "*.safetensors", "*.bin"),
        url="https://huggingface.co/vsearch/vdr-cross-modal",
    ),
    CatalogEntry(
        id="openai/clip-vit-base-patch32",
        kind="clip-vocab",
        title="CLIP ViT-B/32 (OpenAI)",
        purpose="photos, zero-shot: CLIP scores each image against a fixed vocabulary of words; fast (ViT-B/32)",
        size="~0.6 GB",
        licence="MIT (model card: research use)",
        patterns=("*.json", "*.txt", "*.safetensors", "*.bin"),
        url="https://huggingface.co/openai/clip-vit-base-patch32",
    ),
    CatalogEntry(
        id="google/siglip-base-patch16-224",
        kind="clip-vocab",
        title="SigLIP base patch16 224 (Google)",
        purpose="photos, zero-shot: like CLIP with a sigmoid loss; usually better zero-shot words than CLIP B/32, "
                "slower per image",
        size="~0.8 GB",
        licence="Apache-2.0",
        patterns=("*.json", "*.txt", "*.model", "*.safetensors", "*.bin"),
        url="https://huggingface.co/google/siglip-base-patch16-224",
    ),
)


def catalog_entry(model_id: str) -> CatalogEntry | None:
    for entry in CATALOG:
        if entry.id.lower() == model_id.lower():
            return entry
    return None


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
    for var in ("STAIR_ES_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return True
    return False


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


def _slug(model_id: str) -> str:
    """A model id as a folder name (hub ids are case-insensitive)."""
    return model_id.lower().replace("/", "--")


def _id_dir(model_id: str) -> Path:
    return store_dir() / _slug(model_id)


def _rev_dir_name(revision: str) -> str:
    return quote(revision, safe="")


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

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "revision": self.revision, "sha256": self.meta["sha256"]}


def _read_entry_meta(folder: Path) -> dict[str, Any] | None:
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
        id_dirs = [_id_dir(model_id)]
    else:
        try:
            id_dirs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return []
    found = []
    for id_dir in id_dirs:
        try:
            rev_dirs = [p for p in id_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            continue
        for folder in rev_dirs:
            meta = _read_entry_meta(folder)
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
        if len(revision) >= 7 and _HEX40.match(commit) and commit.startswith(revision):
            return entry
    return None


def _check_present(entry: StoreEntry) -> None:
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


# --- the contract the encoders call -------------------------------------------------------
def resolve_model(model: str, *, kind: str | None = None) -> Path:
    """The local folder of ``model``: a folder as given; an id (``ORG/NAME`` or ``ORG/NAME@REV``)
    from the store; otherwise, unless offline, pulled into the store first.

    Offline (``HF_HUB_OFFLINE=1``, ``STAIR_ES_OFFLINE=1``) or with the hub unreachable, a model
    already in the Hugging Face cache is still taken from there; anything else raises a
    :class:`ModelError` saying how to carry the model in.
    """
    if not isinstance(model, (str, os.PathLike)) or not str(model).strip():
        raise InvalidInputError("model must be a hub id (see `stair-es models list`) or a local folder")
    text = str(model).strip()
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists() or text.startswith((".", "/", "~")) or os.sep + os.sep in text or text.count("/") > 1:
        raise ModelError(f"model folder not found: {text} (give a folder with the model's files, or a hub id; "
                         "see `stair-es models list`)")
    model_id, revision = split_model(text)
    entry = find_entry(model_id, revision)
    if entry is None:
        entry = pull(model_id, revision=revision, kind=kind, local_only=offline())
    _check_present(entry)
    return entry.folder


def model_config(model: str, *, kind: str, expected: str) -> tuple[Path, dict[str, Any]]:
    """(the local folder of ``model`` (:func:`resolve_model`), its ``config.json`` as a dict);
    a ModelError naming the folder when the config cannot be read or is not a JSON object
    (``expected`` says what the encoder takes, e.g. "a CLIP or SigLIP checkpoint folder")."""
    folder = Path(resolve_model(model, kind=kind))
    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as e:
        from .encoders.runtime import first_line

        raise ModelError(f"model {model!r}: cannot read config.json in {folder} ({first_line(e)}); give {expected}") from None
    if not isinstance(config, dict):
        raise ModelError(f"model {model!r}: config.json in {folder} is not a JSON object; give {expected}")
    return folder, config


def model_record(folder: Path) -> dict[str, Any]:
    """What an index config records about the model in ``folder``.

    A store entry: ``{"id", "revision", "sha256"}`` (``sha256`` identifies every file of the
    entry, see :func:`files_digest`). Any other folder: ``{"id": <the folder as given>,
    "weights": <first 16 hex of runtime.weights_digest(the model files)>}``.
    """
    folder = Path(folder)
    meta = _read_entry_meta(folder)
    if meta is not None:
        return {"id": meta["id"], "revision": meta["revision"], "sha256": meta["sha256"]}
    from .encoders.runtime import weights_digest

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


def carry_hint(model_id: str) -> str:
    return (f"on a machine with internet run `stair-es models pull {model_id}` and "
            f"`stair-es models export {model_id} DIR`, then `stair-es models import DIR` here")


# --- hashing and copying -------------------------------------------------------------------------
Progress = Callable[[int], None]


def _hash_file(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def _copy_hashing(src: Path, dst: Path, progress: Progress | None = None) -> str:
    """Copy ``src`` to ``dst`` and return the sha256 of what was written."""
    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        for chunk in iter(lambda: fi.read(_CHUNK), b""):
            h.update(chunk)
            fo.write(chunk)
            if progress:
                progress(len(chunk))
        fo.flush()
        os.fsync(fo.fileno())
    return h.hexdigest()


def _link_or_copy(src: Path, dst: Path, progress: Progress | None = None) -> str:
    """Hard-link ``src`` at ``dst`` (same file system) or copy it; return its sha256."""
    try:
        os.link(src, dst)
    except OSError:
        return _copy_hashing(src, dst, progress)
    return _hash_file(dst, progress)


def _now() -> str:
    """UTC, to the microsecond (entries installed within one second still sort newest first)."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


def _walk_files(folder: Path) -> Iterator[tuple[str, Path]]:
    """(posix relative path, path) of every file under ``folder`` (symlinks followed), sorted;
    hidden folders (``.cache`` of the hub client, ``.git``) are skipped."""
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            yield path.relative_to(folder).as_posix(), path


class _Lock:
    """The per-id install lock (tells the user when it has to wait for another process)."""

    def __init__(self, model_id: str):
        from filelock import FileLock

        locks = store_dir() / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        self.model_id = model_id
        self.lock = FileLock(str(locks / f"{_slug(model_id)}.lock"))

    def __enter__(self) -> "_Lock":
        from filelock import Timeout

        try:
            self.lock.acquire(timeout=1)
        except Timeout:
            log.warning("waiting for another stair-es process installing %s", self.model_id)
            self.lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _tmp_dir(model_id: str, what: str) -> Path:
    root = store_dir()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f".tmp-{what}-{_slug(model_id)}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    return folder


def _clear_stale(model_id: str) -> None:
    """Remove temporary folders an interrupted pull, replacement or removal of ``model_id`` (call
    under its lock) or an interrupted import (by a process no longer running) left behind."""
    root = store_dir()
    for stale in [*root.glob(f".tmp-pull-{_slug(model_id)}-*"), *_id_dir(model_id).glob(".old-*")]:
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


def _commit_entry(staged: Path, meta: dict[str, Any]) -> StoreEntry:
    """Write ``stair-es-model.json`` into the staged folder and rename it into place (under the lock).
    An entry already installed at that revision with the same files is kept."""
    target = _id_dir(meta["id"]) / _rev_dir_name(meta["revision"])
    (staged / ENTRY_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", "utf-8")
    existing = _read_entry_meta(target)
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


def _os_errors(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The operating system refusing a write (disk full, permissions) -> one-line ModelError."""
    import functools

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


# --- pull ---------------------------------------------------------------------------------------------
def _snapshot(model_id: str, revision: str, patterns: Iterable[str], *, local_only: bool) -> Path:
    """``huggingface_hub.snapshot_download`` into the Hugging Face cache (which resumes partial files)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MissingDependencyError(f"pulling {model_id!r} from the Hugging Face hub", "encoders",
                                     "huggingface-hub") from None
    try:
        return Path(snapshot_download(model_id, revision=revision, allow_patterns=list(patterns),
                                      local_files_only=local_only))
    except Exception as e:  # the hub client raises many types
        raise ModelError(_download_failure(model_id, e, local_only)) from None


def _prefer_safetensors(model_id: str, revision: str, patterns: list[str]) -> list[str]:
    """Leave out pickled ``.bin`` weights when the repository also has safetensors (many hub
    repositories carry both: the same weights twice). Best effort: when the listing fails, the
    download that follows reports the problem."""
    try:
        from huggingface_hub import list_repo_files

        files = list_repo_files(model_id, revision=revision)
    except Exception:  # noqa: BLE001 - no listing: download with the patterns as they are
        return patterns
    if any(f.endswith(".safetensors") for f in files):
        return [p for p in patterns if not p.endswith(".bin")]
    return patterns


def _download_failure(model_id: str, e: BaseException, local_only: bool) -> str:
    name = type(e).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return (f"the hub has no model {model_id!r} this machine may read (check the id, or for a gated model "
                "log in with `hf auth login`)")
    if name == "RevisionNotFoundError":
        return f"the hub has no such revision of {model_id!r}; check --revision"
    why = "offline (HF_HUB_OFFLINE/STAIR_ES_OFFLINE is set)" if local_only else "the hub cannot be reached"
    return f"cannot get model {model_id}: {why}; {carry_hint(model_id)}"


@_os_errors("pulling the model")
def pull(model_id: str, *, revision: str | None = None, kind: str | None = None, local_only: bool = False,
         refresh: bool = False, progress: bool = False) -> StoreEntry:
    """Download ``model_id`` once into the store (or return the entry already there).

    ``local_only``: take the files only from the Hugging Face cache (offline). ``refresh``: ask
    the hub what ``revision`` (a branch such as ``main``) points at now, and install that
    commit if the store does not have it yet.
    """
    model_id = check_id(model_id)
    known = catalog_entry(model_id)
    if known is not None:
        model_id = known.id
    requested = check_revision(revision) if revision else (known.revision if known else "main")
    kind = kind or (known.kind if known else None)
    existing = None if refresh else find_entry(model_id, revision)
    if existing is not None:
        return existing
    patterns = list(known.patterns if known else DEFAULT_PATTERNS)
    if not local_only:
        patterns = _prefer_safetensors(model_id, requested, patterns)
    snapshot = _snapshot(model_id, requested, patterns, local_only=local_only)
    commit = snapshot.name if _HEX40.match(snapshot.name) else requested
    with _Lock(model_id):
        existing = find_entry(model_id, commit)  # already there, or another process finished meanwhile
        if existing is not None:
            return existing
        _clear_stale(model_id)
        staged = _tmp_dir(model_id, "pull")
        try:
            files = _stage_snapshot(snapshot, staged, model_id, progress, patterns)
            source = "huggingface-cache" if local_only else "huggingface-hub"
            meta = _entry_meta(model_id, commit, requested, kind, files, {"how": "pull", "from": source, "at": _now()})
            return _commit_entry(staged, meta)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise


def _stage_snapshot(snapshot: Path, staged: Path, model_id: str, progress: bool,
                    patterns: Iterable[str] = DEFAULT_PATTERNS) -> dict[str, dict[str, Any]]:
    # a snapshot folder of the hub cache may also hold files an earlier download with other
    # patterns fetched: take only what this pull asked for
    patterns = list(patterns)
    listing = [(rel, p) for rel, p in _walk_files(snapshot)
               if any(fnmatch.fnmatch(rel, pat) for pat in patterns) and not any(rel.startswith(x) for x in _NOT_WEIGHTS)]
    if not listing:
        raise ModelError(f"the snapshot of {model_id} holds no files; check the id and --revision")
    if not any(rel.endswith(_WEIGHT_SUFFIXES) for rel, _ in listing):
        # the hub client links each file into a snapshot once it is complete, so an interrupted
        # download leaves a snapshot without (all) its weights: never install that
        raise ModelError(f"the downloaded snapshot of {model_id} has no weight files (an interrupted download?); "
                         f"run `stair-es models pull {model_id}` with internet to complete it")
    files: dict[str, dict[str, Any]] = {}
    with _bar(sum(p.stat().st_size for _, p in listing), f"storing {model_id}", progress) as bar:
        for rel, src in listing:
            real = Path(os.path.realpath(src))
            dst = staged / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            digest = _link_or_copy(real, dst, bar.update)
            # the hub names large (LFS) files' blobs by their sha256: a mismatch is a damaged download
            if _HEX64.match(real.name) and real.name != digest:
                raise ModelError(f"{rel} of {model_id} in the Hugging Face cache does not match its checksum; "
                                 f"delete it from the cache (`hf cache delete`) and pull again")
            files[rel] = {"sha256": digest, "size": dst.stat().st_size}
    return files


def _entry_meta(model_id: str, revision: str, requested: str, kind: str | None, files: dict[str, dict[str, Any]],
                installed: dict[str, Any], pulled: dict[str, Any] | None = None) -> dict[str, Any]:
    from . import __version__

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
    with _Lock(model_id):
        for entry in gone:
            trash = entry.folder.with_name(f".old-{entry.folder.name}-{uuid.uuid4().hex[:8]}")
            os.rename(entry.folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
    return gone


def _bar(total: int, desc: str, enabled: bool):
    """A progress bar over ``total`` bytes (nothing drawn when not enabled)."""
    from .encoders.base import progress_bar

    return progress_bar(total, desc, enabled, unit="B", unit_scale=True, unit_divisor=1024)


# --- list and verify ---------------------------------------------------------------------------------
def listing() -> list[dict[str, Any]]:
    """The catalog and every installed entry (models not in the catalog too), as rows for ``models list``."""
    installed: dict[str, list[StoreEntry]] = {}
    for entry in entries():
        installed.setdefault(entry.id.lower(), []).append(entry)
    rows = []
    for known in CATALOG:
        rows.append(_row(known.id, known, installed.pop(known.id.lower(), [])))
    for group in installed.values():
        rows.append(_row(group[0].id, None, group))
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
    entry = _installed(model)
    _verify_entry(entry, progress)
    return entry


def _installed(model: str) -> StoreEntry:
    model_id, revision = split_model(model)
    entry = find_entry(model_id, revision)
    if entry is None:
        raise ModelError(f"model {model} is not in the store; run `stair-es models pull {model_id}` "
                         "(or `stair-es models import DIR` with a bundle exported elsewhere)")
    return entry


def _verify_entry(entry: StoreEntry, progress: bool) -> None:
    _check_present(entry)
    with _bar(entry.size, f"checking {entry.id}", progress) as bar:
        for rel, info in sorted(entry.meta["files"].items()):
            if _hash_file(entry.folder / rel, bar.update) != info["sha256"]:
                raise ModelError(f"{rel} of model {entry.id} in the store does not match its checksum; run "
                                 f"`stair-es models rm {entry.id}` and pull or import it again")


# --- export -------------------------------------------------------------------------------------------
_TAR_SUFFIXES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz"}


def _tar_mode(path: Path) -> str | None:
    name = path.name.lower()
    for suffix, mode in _TAR_SUFFIXES.items():
        if name.endswith(suffix):
            return mode
    return None


def encoder_artifacts(entry: StoreEntry) -> list[Path]:
    """The derived files the entry's encoder needs at run time without torch (in the model cache)."""
    from .encoders.base import get_encoder
    from .encoders.runtime import model_cache_dir

    if not entry.kind:
        return []
    try:
        encoder = get_encoder(entry.kind, model=str(entry.folder))
        paths = [Path(p) for p in encoder.artifacts()]  # type: ignore[attr-defined]
    except (ModelError, MissingDependencyError):
        raise
    except Exception as e:
        from .encoders.runtime import first_line

        raise ModelError(f"the {entry.kind} encoder cannot prepare {entry.id} for export ({first_line(e)}); "
                         "pass --weights-only to carry the weights alone (the other machine then derives "
                         "its files with torch)") from None
    cache = model_cache_dir().resolve()
    for path in paths:
        real = path.resolve()
        if not real.is_file() or cache not in real.parents:
            raise ModelError(f"the {entry.kind} encoder listed {path}, which is not a file in the model cache {cache}")
    return paths


@_os_errors("exporting the model")
def export(model: str, dest: Path | str, *, tar: bool = False, weights_only: bool = False,
           progress: bool = False) -> dict[str, Any]:
    """Write a self-contained bundle of an installed model: a folder, or a tarball when ``tar``
    (``dest`` + ``.tar``) or ``dest`` ends in ``.tar``/``.tar.gz``/``.tgz``. Returns the
    manifest (plus ``path`` and ``size``)."""
    from . import __version__
    from .encoders.runtime import model_cache_dir

    entry = _installed(model)
    dest = Path(dest).expanduser()
    mode = _tar_mode(dest)
    if tar and mode is None:  # plain tar: weights barely compress (gzip saved 7% of 100 MB of fp32 in ~10x the time)
        dest, mode = dest.with_name(dest.name + ".tar"), "w"
    if dest.exists() and not (dest.is_dir() and mode is None and not any(dest.iterdir())):
        raise InvalidInputError(f"{dest} already exists; give a new path (or an empty folder) for the bundle")
    if not dest.parent.is_dir():
        raise InvalidInputError(f"folder {dest.parent} does not exist; create it first")
    _verify_entry(entry, progress)
    artifacts = [] if weights_only else encoder_artifacts(entry)
    cache = model_cache_dir().resolve()
    members: list[tuple[str, Path]] = [(f"model/{rel}", entry.folder / rel) for rel in sorted(entry.meta["files"])]
    members.append((f"model/{ENTRY_FILE}", entry.folder / ENTRY_FILE))
    members += [(f"cache/{p.resolve().relative_to(cache).as_posix()}", p) for p in artifacts]
    for rel, _ in members:
        if _bundle_path(rel) != rel:
            raise ModelError(f"the {entry.kind} encoder listed a file that cannot travel in a bundle: {rel}")
    files: dict[str, dict[str, Any]] = {}
    total = sum(p.stat().st_size for _, p in members)
    manifest = {
        "format": BUNDLE_FORMAT,
        "format_version": FORMAT_VERSION,
        "id": entry.id,
        "revision": entry.revision,
        "kind": entry.kind,
        "sha256": entry.meta["sha256"],
        "created": _now(),
        "stair_es": __version__,
        "weights_only": bool(weights_only or not artifacts),
        "files": files,
    }
    top = dest.name[: -len(next(s for s in _TAR_SUFFIXES if dest.name.lower().endswith(s)))] if mode else dest.name
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with _bar(total, f"exporting {entry.id}", progress) as bar:
            if mode is None:
                for rel, src in members:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    files[rel] = {"sha256": _copy_hashing(src, tmp / rel, bar.update), "size": src.stat().st_size}
                (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
                if dest.is_dir():
                    dest.rmdir()
                os.rename(tmp, dest)
            else:
                for rel, src in members:  # hash first: the manifest goes at the front of the tarball
                    files[rel] = {"sha256": _hash_file(src, bar.update), "size": src.stat().st_size}
                data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
                with tarfile.open(tmp, mode, **({"compresslevel": 1} if mode == "w:gz" else {})) as out:
                    info = tarfile.TarInfo(f"{top}/{MANIFEST_FILE}")
                    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
                    out.addfile(info, io.BytesIO(data))
                    for rel, src in members:
                        out.add(str(src), arcname=f"{top}/{rel}", recursive=False, filter=_plain_member)
                os.replace(tmp, dest)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    return {**manifest, "path": str(dest), "size": total}


def _plain_member(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644
    return info


# --- import -------------------------------------------------------------------------------------------
def _bundle_path(rel: str) -> str | None:
    """``rel`` as a safe relative POSIX path under ``model/`` or ``cache/``, or None."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or any(part in ("", ".", "..") for part in p.parts) or p.parts[0] not in ("model", "cache"):
        return None
    if len(p.parts) < 2:
        return None
    # derived files go into the model cache, which also holds the store and the weights-digest
    # book: a bundle may add cache files, never write into those
    if p.parts[0] == "cache" and (p.parts[1] in ("store", "weights-digests.json") or any(x.startswith(".") for x in p.parts)):
        return None
    return p.as_posix()


def _read_manifest(data: bytes, source: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except ValueError:
        raise ModelError(f"{source}: {MANIFEST_FILE} is not valid JSON; export the model again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT or not isinstance(manifest.get("files"), dict):
        raise ModelError(f"{source} is not a stair-es model bundle (no {MANIFEST_FILE} of format {BUNDLE_FORMAT})")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise ModelError(f"{source} was exported by a newer stair_es (bundle format {manifest.get('format_version')}); "
                         "upgrade stair-es here")
    check_id(str(manifest.get("id", "")))
    check_revision(str(manifest.get("revision", "")))
    for rel, info in manifest["files"].items():
        if _bundle_path(rel) != rel:
            raise ModelError(f"{source}: MANIFEST.json lists an unsafe path {rel!r}; refusing the bundle")
        if not (isinstance(info, dict) and isinstance(info.get("sha256"), str) and isinstance(info.get("size"), int)):
            raise ModelError(f"{source}: MANIFEST.json has no checksum for {rel}; export the model again")
    if f"model/{ENTRY_FILE}" not in manifest["files"]:
        raise ModelError(f"{source}: the bundle has no model/{ENTRY_FILE}; export the model again")
    return manifest


def _checksum_error(source: Path, rel: str) -> ModelError:
    return ModelError(f"{rel} in {source} does not match its checksum in {MANIFEST_FILE} (damaged in transit?); "
                      "nothing was installed: copy or export the bundle again")


def _stage_folder(source: Path, staged: Path, progress: bool) -> dict[str, Any]:
    root = source
    if not (root / MANIFEST_FILE).is_file():
        subs = [p for p in source.iterdir() if p.is_dir() and (p / MANIFEST_FILE).is_file()]
        if len(subs) != 1:
            raise ModelError(f"{source} is not a stair-es model bundle (no {MANIFEST_FILE}); give the folder "
                             "or tarball `stair-es models export` wrote")
        root = subs[0]
    manifest = _read_manifest((root / MANIFEST_FILE).read_bytes(), source)
    total = sum(int(i["size"]) for i in manifest["files"].values())
    with _bar(total, "checking bundle", progress) as bar:
        for rel, info in sorted(manifest["files"].items()):
            src = root / rel
            if src.is_symlink() or not src.is_file():
                raise ModelError(f"{source} lacks {rel} (listed in {MANIFEST_FILE}) or it is not a plain file; "
                                 "nothing was installed: copy or export the bundle again")
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            if _copy_hashing(src, staged / rel, bar.update) != info["sha256"]:
                raise _checksum_error(source, rel)
    return manifest


def _stage_tar(source: Path, staged: Path, progress: bool) -> dict[str, Any]:
    try:
        tar = tarfile.open(source, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise ModelError(f"{source} is not a readable tarball ({e}); copy or export the bundle again") from None
    with tar:
        try:
            members = tar.getmembers()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ModelError(f"{source} is damaged ({e}); nothing was installed: copy or export the bundle again") from None
        for m in members:  # refuse anything that could write outside the staging folder
            name = m.name
            if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or ".." in PurePosixPath(name).parts or "\\" in name:
                raise ModelError(f"{source} holds an unsafe path {name!r}; refusing the bundle (nothing was installed)")
            if not (m.isfile() or m.isdir()):
                raise ModelError(f"{source} holds a link or special file {name!r}; refusing the bundle "
                                 "(nothing was installed)")
        names = {PurePosixPath(m.name).as_posix(): m for m in members if m.isfile()}
        manifests = [n for n in names if PurePosixPath(n).name == MANIFEST_FILE and len(PurePosixPath(n).parts) <= 2]
        if len(manifests) != 1:
            raise ModelError(f"{source} is not a stair-es model bundle (no single {MANIFEST_FILE}); give the tarball "
                             "`stair-es models export --tar` wrote")
        prefix = str(PurePosixPath(manifests[0]).parent)
        prefix = "" if prefix == "." else prefix + "/"
        manifest = _read_manifest(_read_member(tar, names[manifests[0]], source), source)
        listed = {prefix + rel: rel for rel in manifest["files"]}
        for name in names:
            if name not in listed and name != manifests[0]:
                raise ModelError(f"{source} holds {name!r}, which {MANIFEST_FILE} does not list; refusing the bundle")
        missing = sorted(rel for full, rel in listed.items() if full not in names)
        if missing:
            raise ModelError(f"{source} lacks {missing[0]} (listed in {MANIFEST_FILE}); nothing was installed: "
                             "copy or export the bundle again")
        total = sum(int(i["size"]) for i in manifest["files"].values())
        with _bar(total, "checking bundle", progress) as bar:
            for full, rel in sorted(listed.items()):
                if names[full].size != manifest["files"][rel]["size"]:
                    raise _checksum_error(source, rel)
                dst = staged / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                h = hashlib.sha256()
                try:
                    f = tar.extractfile(names[full])
                    assert f is not None
                    with f, open(dst, "wb") as out:
                        for chunk in iter(lambda: f.read(_CHUNK), b""):
                            h.update(chunk)
                            out.write(chunk)
                            bar.update(len(chunk))
                except (tarfile.TarError, OSError, EOFError, AssertionError):
                    raise _checksum_error(source, rel) from None
                if h.hexdigest() != manifest["files"][rel]["sha256"]:
                    raise _checksum_error(source, rel)
    return manifest


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo, source: Path) -> bytes:
    try:
        f = tar.extractfile(member)
        assert f is not None
        with f:
            return f.read()
    except (tarfile.TarError, OSError, EOFError, AssertionError):
        raise ModelError(f"{source} is damaged ({member.name} cannot be read); copy or export the bundle again") from None


@_os_errors("importing the bundle")
def import_bundle(source: Path | str, *, progress: bool = False) -> StoreEntry:
    """Install a bundle (folder or tarball) written by :func:`export`: every file is checked
    against ``MANIFEST.json`` in a staging folder first; then the ``cache/`` files go into the
    model cache and the entry into the store (renamed into place last)."""
    from .encoders.runtime import model_cache_dir

    source = Path(source).expanduser()
    if not source.exists():
        raise InvalidInputError(f"{source} does not exist; give the folder or tarball `stair-es models export` wrote")
    _clear_stale("bundle")
    staged = _tmp_dir("bundle", "import")
    try:
        manifest = _stage_folder(source, staged, progress) if source.is_dir() else _stage_tar(source, staged, progress)
        model_dir = staged / "model"
        meta = _read_entry_meta(model_dir)
        if meta is None or meta["id"] != manifest["id"] or meta["revision"] != manifest["revision"]:
            raise ModelError(f"{source}: model/{ENTRY_FILE} does not describe {manifest['id']}; export the model again")
        check_id(meta["id"])
        for rel, info in meta["files"].items():
            if _bundle_path(f"model/{rel}") != f"model/{rel}" or manifest["files"].get(f"model/{rel}", {}).get("sha256") != info.get("sha256"):
                raise ModelError(f"{source}: model/{rel} is missing from the bundle or differs from the model's own "
                                 "record; export the model again")
        if files_digest(meta["files"]) != meta["sha256"]:
            raise ModelError(f"{source}: the model's record is inconsistent; export the model again")
        # every check passed: install the derived files (content-keyed), then the entry
        cache = model_cache_dir()
        for rel in sorted(r for r in manifest["files"] if r.startswith("cache/")):
            target = cache / rel[len("cache/"):]
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
            shutil.move(str(staged / rel), str(tmp))
            os.replace(tmp, target)
        if manifest.get("stair_es") != _version() and any(r.startswith("cache/") for r in manifest["files"]):
            log.warning("%s was exported by stair_es %s and this is %s: if the encoder's export format changed "
                        "in between, it makes its derived files again on first use (needs torch)",
                        source.name, manifest.get("stair_es"), _version())
        meta = dict(meta)
        meta["installed"] = {"how": "import", "from": source.name, "at": _now(), "stair_es": _version()}
        with _Lock(meta["id"]):
            return _commit_entry(model_dir, meta)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _version() -> str:
    from . import __version__

    return __version__
