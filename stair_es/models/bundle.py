"""Carrying a model to a machine with no internet: ``export`` writes a bundle (a folder or a
tarball with ``MANIFEST.json``), ``import`` checks every file of one before installing it.

Must not know how models are downloaded or what they compute.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import tarfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from .. import __version__
from ..errors import InvalidInputError, MissingDependencyError, ModelError
from .store import (BUNDLE_FORMAT, ENTRY_FILE, FORMAT_VERSION, MANIFEST_FILE, InstallLock, StoreEntry, byte_bar,
                    check_id, check_revision, clear_stale, commit_entry, copy_hashing, copy_stream, files_digest,
                    hash_file, installed_entry, now_utc, os_errors, read_entry_meta, tmp_dir, verify_entry)

log = logging.getLogger(__name__)

# --- export -------------------------------------------------------------------------------------------
_TAR_SUFFIXES = {".tar": "w", ".tar.gz": "w:gz", ".tgz": "w:gz"}


def encoder_artifacts(entry: StoreEntry) -> list[Path]:
    """The derived files the entry's encoder needs at run time without torch (in the model cache)."""
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.base import get_encoder
    from ..encoders.runtime import model_cache_dir

    if not entry.kind:
        return []
    try:
        encoder = get_encoder(entry.kind, model=str(entry.folder))
        paths = [Path(p) for p in encoder.artifacts()]  # type: ignore[attr-defined]
    except (ModelError, MissingDependencyError):
        raise
    except Exception as e:
        # lazy: the encoders bring onnxruntime and image code; only this path needs them
        from ..encoders.runtime import first_line

        raise ModelError(f"the {entry.kind} encoder cannot prepare {entry.id} for export ({first_line(e)}); "
                         "pass --weights-only to carry the weights alone (the other machine then derives "
                         "its files with torch)") from None
    cache = model_cache_dir().resolve()
    for path in paths:
        real = path.resolve()
        if not real.is_file() or cache not in real.parents:
            raise ModelError(f"the {entry.kind} encoder listed {path}, which is not a file in the model cache {cache}")
    return paths


@os_errors("exporting the model")
def export(model: str, dest: Path | str, *, tar: bool = False, weights_only: bool = False,
           progress: bool = False) -> dict[str, Any]:
    """Write a self-contained bundle of an installed model: a folder, or a tarball when ``tar``
    (``dest`` + ``.tar``) or ``dest`` ends in ``.tar``/``.tar.gz``/``.tgz``. Returns the
    manifest (plus ``path`` and ``size``)."""
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.runtime import model_cache_dir

    entry = installed_entry(model)
    dest = Path(dest).expanduser()
    mode = next((m for suffix, m in _TAR_SUFFIXES.items() if dest.name.lower().endswith(suffix)), None)
    if tar and mode is None:  # plain tar: weights barely compress (gzip saved 7% of 100 MB of fp32 in ~10x the time)
        dest, mode = dest.with_name(dest.name + ".tar"), "w"
    if dest.exists() and not (dest.is_dir() and mode is None and not any(dest.iterdir())):
        raise InvalidInputError(f"{dest} already exists; give a new path (or an empty folder) for the bundle")
    if not dest.parent.is_dir():
        raise InvalidInputError(f"folder {dest.parent} does not exist; create it first")
    verify_entry(entry, progress)
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
        "created": now_utc(),
        "stair_es": __version__,
        "weights_only": bool(weights_only or not artifacts),
        "files": files,
    }
    top = dest.name[: -len(next(s for s in _TAR_SUFFIXES if dest.name.lower().endswith(s)))] if mode else dest.name
    tmp = dest.with_name(f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with byte_bar(total, f"exporting {entry.id}", progress) as bar:
            if mode is None:
                for rel, src in members:
                    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                    files[rel] = {"sha256": copy_hashing(src, tmp / rel, bar.update), "size": src.stat().st_size}
                (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")
                if dest.is_dir():
                    dest.rmdir()
                os.rename(tmp, dest)
            else:
                for rel, src in members:  # hash first: the manifest goes at the front of the tarball
                    files[rel] = {"sha256": hash_file(src, bar.update), "size": src.stat().st_size}
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
    with byte_bar(total, "checking bundle", progress) as bar:
        for rel, info in sorted(manifest["files"].items()):
            src = root / rel
            if src.is_symlink() or not src.is_file():
                raise ModelError(f"{source} lacks {rel} (listed in {MANIFEST_FILE}) or it is not a plain file; "
                                 "nothing was installed: copy or export the bundle again")
            (staged / rel).parent.mkdir(parents=True, exist_ok=True)
            if copy_hashing(src, staged / rel, bar.update) != info["sha256"]:
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
        with byte_bar(total, "checking bundle", progress) as bar:
            for full, rel in sorted(listed.items()):
                if names[full].size != manifest["files"][rel]["size"]:
                    raise _checksum_error(source, rel)
                dst = staged / rel
                dst.parent.mkdir(parents=True, exist_ok=True)
                try:
                    f = tar.extractfile(names[full])
                    assert f is not None
                    with f, open(dst, "wb") as out:
                        digest = copy_stream(f, out, bar.update)
                except (tarfile.TarError, OSError, EOFError, AssertionError):
                    raise _checksum_error(source, rel) from None
                if digest != manifest["files"][rel]["sha256"]:
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


@os_errors("importing the bundle")
def import_bundle(source: Path | str, *, progress: bool = False) -> StoreEntry:
    """Install a bundle (folder or tarball) written by :func:`export`: every file is checked
    against ``MANIFEST.json`` in a staging folder first; then the ``cache/`` files go into the
    model cache and the entry into the store (renamed into place last)."""
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.runtime import model_cache_dir

    source = Path(source).expanduser()
    if not source.exists():
        raise InvalidInputError(f"{source} does not exist; give the folder or tarball `stair-es models export` wrote")
    clear_stale("bundle")
    staged = tmp_dir("bundle", "import")
    try:
        manifest = _stage_folder(source, staged, progress) if source.is_dir() else _stage_tar(source, staged, progress)
        model_dir = staged / "model"
        meta = read_entry_meta(model_dir)
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
        if manifest.get("stair_es") != __version__ and any(r.startswith("cache/") for r in manifest["files"]):
            log.warning("%s was exported by stair_es %s and this is %s: if the encoder's export format changed "
                        "in between, it makes its derived files again on first use (needs torch)",
                        source.name, manifest.get("stair_es"), __version__)
        meta = {**meta, "installed": {"how": "import", "from": source.name, "at": now_utc(), "stair_es": __version__}}
        with InstallLock(meta["id"]):
            return commit_entry(model_dir, meta)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
