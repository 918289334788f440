"""Public evaluation sets for the encoders, fetched at evaluation time and never vendored.

Each set is a list of :class:`Item` -- an image and the text a user would search it by,
written by the image's authors, not by us:

* ``samples``: the sample photo catalog (scikit-image, scikit-learn, matplotlib photos;
  ``stair_es.samples``), queried by its captions;
* ``tuxpaint``: Debian ``tuxpaint-stamps-default`` clip-art stamps (PNG), queried by the
  English line of their ``.txt`` description (GPL: installed at evaluation time only);
* ``openclipart``: Debian ``openclipart-svg`` public-domain drawings, rasterised with
  cairosvg, queried by their ``dc:title``.

Debian sets are installed with ``apt-get install`` when missing (root needed); a set that
cannot be had raises :class:`SetUnavailable` with the reason, and the runner skips it.
Large sets are sampled with a fixed seed, so every run sees the same items.
"""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

TUXPAINT = Path("/usr/share/tuxpaint/stamps")
OPENCLIPART = Path("/usr/share/openclipart/svg")


class SetUnavailable(RuntimeError):
    """The set's data cannot be had on this machine (the message says why)."""


@dataclass
class Item:
    id: str
    query: str
    load: Callable[[], Image.Image]


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


SETS: dict[str, Callable[..., list[Item]]] = {
    "samples": samples_set,
    "tuxpaint": tuxpaint_set,
    "openclipart": openclipart_set,
}
