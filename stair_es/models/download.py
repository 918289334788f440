"""Getting a model's files: a local folder as given, an installed store entry, or a download
from the Hugging Face hub (``huggingface_hub.snapshot_download`` into its cache, which resumes
partial files) installed into the store once.

Owns :func:`resolve_model` and :func:`model_config` (the contract the encoders call) and
:func:`pull`. Must not know what a model computes.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from ..errors import InvalidInputError, ModelError, optional_import
from .catalog import DEFAULT_PATTERNS, catalog_entry
from .store import (HEX40, HEX64, NOT_WEIGHTS, WEIGHT_SUFFIXES, InstallLock, Progress, StoreEntry, byte_bar, carry_hint,
                    check_id, check_present, check_revision, clear_stale, commit_entry, copy_hashing, entries, entry_meta,
                    find_entry, hash_file, now_utc, offline, os_errors, split_model, tmp_dir, walk_files)

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
    check_present(entry)
    return entry.folder


def model_config(model: str, *, kind: str, expected: str) -> tuple[Path, dict[str, Any]]:
    """(the local folder of ``model`` (:func:`resolve_model`), its ``config.json`` as a dict);
    a ModelError naming the folder when the config cannot be read or is not a JSON object
    (``expected`` says what the encoder takes, e.g. "a CLIP or SigLIP checkpoint folder")."""
    folder = Path(resolve_model(model, kind=kind))
    try:
        config = json.loads((folder / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as e:
        # lazy: the encoders bring onnxruntime and image code; only this path needs them
        from ..encoders.runtime import first_line

        raise ModelError(f"model {model!r}: cannot read config.json in {folder} ({first_line(e)}); give {expected}") from None
    if not isinstance(config, dict):
        raise ModelError(f"model {model!r}: config.json in {folder} is not a JSON object; give {expected}")
    return folder, config


def _link_or_copy(src: Path, dst: Path, progress: Progress | None = None) -> str:
    """Hard-link ``src`` at ``dst`` (same file system) or copy it; return its sha256."""
    try:
        os.link(src, dst)
    except OSError:
        return copy_hashing(src, dst, progress)
    return hash_file(dst, progress)


# --- pull ---------------------------------------------------------------------------------------------
def _snapshot(model_id: str, revision: str, patterns: Iterable[str], *, local_only: bool, asked: str | None) -> Path:
    """``huggingface_hub.snapshot_download`` into the Hugging Face cache (which resumes partial files);
    ``asked``: the revision the user named, if any (for the error)."""
    hub = optional_import("huggingface_hub", f"pulling {model_id!r} from the Hugging Face hub", "encoders",
                          "huggingface-hub")
    try:
        return Path(hub.snapshot_download(model_id, revision=revision, allow_patterns=list(patterns),
                                      local_files_only=local_only))
    except Exception as e:  # the hub client raises many types
        raise ModelError(_download_failure(model_id, e, local_only, asked)) from None


def _prefer_safetensors(model_id: str, revision: str, patterns: list[str]) -> list[str]:
    """Leave out pickled ``.bin`` weights when the repository also has safetensors (many hub
    repositories carry both: the same weights twice). Best effort: when the listing fails, the
    download that follows reports the problem.

    The listing is one ``model_info`` request: ``list_repo_files`` pages through the tree with the
    client's retries, which on a machine without network cost about 20 s and a dozen warnings
    before the one-line answer of :func:`_download_failure`."""
    try:
        # lazy: optional, needed only to download from the hub
        from huggingface_hub import model_info

        files = [s.rfilename for s in (model_info(model_id, revision=revision).siblings or [])]
    except Exception:  # noqa: BLE001 - no listing: download with the patterns as they are
        return patterns
    if any(f.endswith(".safetensors") for f in files):
        return [p for p in patterns if not p.endswith(".bin")]
    return patterns


def _download_failure(model_id: str, e: BaseException, local_only: bool, revision: str | None = None) -> str:
    name = type(e).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return (f"the hub has no model {model_id!r} this machine may read (check the id, or for a gated model "
                "log in with `hf auth login`)")
    if name == "RevisionNotFoundError":
        return f"the hub has no such revision of {model_id!r}; check --revision"
    why = "offline (HF_HUB_OFFLINE/STAIR_ES_OFFLINE is set)" if local_only else "the hub cannot be reached"
    what = f"{model_id} at revision {revision}" if revision else model_id
    held = [entry.revision[:12] for entry in entries(model_id)]
    # a model in the store at another revision than the one asked for (an index built elsewhere)
    other = f" (the store has it at {', '.join(held)} only: `stair-es models list`)" if revision and held else ""
    return f"cannot get model {what}{other}: {why}; {carry_hint(model_id, revision)}"


@os_errors("pulling the model")
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
    snapshot = _snapshot(model_id, requested, patterns, local_only=local_only, asked=revision)
    commit = snapshot.name if HEX40.match(snapshot.name) else requested
    with InstallLock(model_id):
        existing = find_entry(model_id, commit)  # already there, or another process finished meanwhile
        if existing is not None:
            return existing
        clear_stale(model_id)
        staged = tmp_dir(model_id, "pull")
        try:
            files = _stage_snapshot(snapshot, staged, model_id, progress, patterns)
            source = "huggingface-cache" if local_only else "huggingface-hub"
            meta = entry_meta(model_id, commit, requested, kind, files, {"how": "pull", "from": source, "at": now_utc()})
            return commit_entry(staged, meta)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise


def _stage_snapshot(snapshot: Path, staged: Path, model_id: str, progress: bool,
                    patterns: Iterable[str] = DEFAULT_PATTERNS) -> dict[str, dict[str, Any]]:
    # a snapshot folder of the hub cache may also hold files an earlier download with other
    # patterns fetched: take only what this pull asked for
    patterns = list(patterns)
    listing = [(rel, p) for rel, p in walk_files(snapshot)
               if any(fnmatch.fnmatch(rel, pat) for pat in patterns) and not any(rel.startswith(x) for x in NOT_WEIGHTS)]
    if not listing:
        raise ModelError(f"the snapshot of {model_id} holds no files; check the id and --revision")
    if not any(rel.endswith(WEIGHT_SUFFIXES) for rel, _ in listing):
        # the hub client links each file into a snapshot once it is complete, so an interrupted
        # download leaves a snapshot without (all) its weights: never install that
        raise ModelError(f"the downloaded snapshot of {model_id} has no weight files (an interrupted download?); "
                         f"run `stair-es models pull {model_id}` with internet to complete it")
    files: dict[str, dict[str, Any]] = {}
    with byte_bar(sum(p.stat().st_size for _, p in listing), f"storing {model_id}", progress) as bar:
        for rel, src in listing:
            real = Path(os.path.realpath(src))
            dst = staged / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            digest = _link_or_copy(real, dst, bar.update)
            # the hub names large (LFS) files' blobs by their sha256: a mismatch is a damaged download
            if HEX64.match(real.name) and real.name != digest:
                raise ModelError(f"{rel} of {model_id} in the Hugging Face cache does not match its checksum; "
                                 f"delete it from the cache (`hf cache delete`) and pull again")
            files[rel] = {"sha256": digest, "size": dst.stat().st_size}
    return files
