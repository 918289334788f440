"""Safe image loading: one place that turns a path, bytes or PIL image into an RGB picture.

Ingest calls :func:`load_image` for every document image. Every failure becomes an
:class:`~stair_es.errors.ImageError` whose message says what is wrong with *this* file
(empty, not an image, truncated, too many pixels, unreadable...), so an ingest report can
list it and go on with the rest.

What it guarantees for a successful load:

* the result is an ``RGB`` :class:`PIL.Image.Image`, fully decoded (no lazy file handle);
* pixel-count limits are checked from the header *before* decoding (decompression bombs);
* truncated files are errors, never half-grey pictures;
* EXIF orientation is applied, animated images give their first frame, transparency is
  composited on white, CMYK / 16-bit / 1-bit / palette images are converted properly;
* huge images are downscaled early (JPEG draft mode decodes at 1/2, 1/4 or 1/8 scale), so
  the longer side is at most ``target_max_side``.

This module knows nothing about encoders or indices.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import io
import os
import re
import threading
import warnings
from pathlib import Path
from typing import Iterator

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from .errors import ImageError

__all__ = ["IMAGE_EXTENSIONS", "load_image", "iter_image_files", "to_rgb"]

#: File extensions treated as images when scanning folders (lower case, with the dot).
IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".dib", ".tif", ".tiff",
                                     ".webp", ".ppm", ".pgm", ".pbm", ".pnm", ".tga", ".ico", ".jp2", ".j2k", ".avif",
                                     ".heic")

DEFAULT_MAX_PIXELS = 64_000_000
DEFAULT_TARGET_MAX_SIDE = 1024

# ImageFile.LOAD_TRUNCATED_IMAGES is process-global; if an application turned it on, we force
# it off around our own decode and put back its choice.
_TRUNCATED_LOCK = threading.Lock()
_WARNINGS_LOCK = threading.Lock()


def _describe(source: object) -> str:
    return f"<{len(source)} bytes>" if isinstance(source, (bytes, bytearray, memoryview)) else str(source)


def load_image(source: str | os.PathLike | bytes | Image.Image, *, max_pixels: int | None = DEFAULT_MAX_PIXELS,
               target_max_side: int | None = DEFAULT_TARGET_MAX_SIDE, min_side: int | None = None) -> Image.Image:
    """Load ``source`` (a path, raw file bytes, or a PIL image) as a decoded RGB image.

    ``max_pixels``: refuse images with more pixels than this (checked from the header,
    before decoding); ``None`` disables the check. ``target_max_side``: downscale so the
    longer side is at most this many pixels (aspect ratio kept); ``None`` keeps full size.
    ``min_side`` (what an encoder needs, e.g. 256): instead of ``target_max_side``, decode
    and keep only as many pixels as give a shorter side of at least ``min_side`` -- JPEGs
    at the smallest DCT scale (1/2 to 1/8) that still does, other images reduced by an
    integer factor -- so the encoder's own resize is the only interpolation.
    Raises :class:`ImageError` with the reason on any failure.
    """
    if isinstance(source, Image.Image):
        return _finish(source, _describe(source), max_pixels, target_max_side, opened_here=False, min_side=min_side)

    name = _describe(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise ImageError(f"{name}: empty file (0 bytes)")
        fp: io.IOBase = io.BytesIO(data)
    elif isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            if path.is_dir():
                raise ImageError(f"{path}: is a folder, not an image file")
            size = path.stat().st_size
            if size == 0:
                raise ImageError(f"{path}: empty file (0 bytes)")
            fp = open(path, "rb")
        except FileNotFoundError:
            raise ImageError(f"{path}: no such file") from None
        except PermissionError:
            raise ImageError(f"{path}: cannot read the file (permission denied)") from None
        except OSError as e:
            raise ImageError(f"{path}: cannot read the file ({e.strerror or e})") from None
    else:
        raise ImageError(f"cannot load an image from a {type(source).__name__}; pass a path, bytes or a PIL image")

    try:
        img = _open(fp, name, max_pixels)
        return _finish(img, name, max_pixels, target_max_side, opened_here=True, min_side=min_side)
    finally:
        fp.close()


def _open(fp, name: str, max_pixels: int | None) -> Image.Image:
    try:
        # catch_warnings swaps process-global state: serialise it (opening reads only the header).
        with _WARNINGS_LOCK, warnings.catch_warnings():
            # Our own max_pixels check below replaces Pillow's warning; Pillow's hard error
            # (more than twice its global limit) is converted to ImageError.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(fp)
    except Image.DecompressionBombError as e:
        raise ImageError(_bomb_message(name, e, max_pixels)) from None
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image (cannot identify format)") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:
        raise ImageError(f"{name}: damaged or unsupported image file ({e})") from None


def _bomb_message(name: str, err: Exception, max_pixels: int | None) -> str:
    # Pillow refuses more than 2 * Image.MAX_IMAGE_PIXELS while reading the header,
    # before our own check can run; report its count against the limit in force.
    m = re.search(r"\((\d+) pixels\)", str(err))
    pillow_limit = 2 * (Image.MAX_IMAGE_PIXELS or 0)
    limit = min(x for x in (max_pixels, pillow_limit) if x) if (max_pixels or pillow_limit) else 0
    size = f"{int(m.group(1)):,} pixels" if m else "too many pixels"
    return (
        f"{name}: image has {size}, more than the limit of {limit:,} "
        "(possible decompression bomb; refused before decoding)"
    )


def _finish(img: Image.Image, name: str, max_pixels: int | None, target_max_side: int | None, *, opened_here: bool,
            min_side: int | None = None) -> Image.Image:
    w, h = img.size
    if w <= 0 or h <= 0:
        raise ImageError(f"{name}: image has no pixels ({w}x{h})")
    if max_pixels is not None and w * h > max_pixels:
        raise ImageError(f"{name}: image is {w}x{h} = {w * h:,} pixels, more than the limit of {max_pixels:,} "
                         "(possible decompression bomb; raise max_pixels if the file is trusted)")
    try:
        if getattr(img, "is_animated", False):
            img.seek(0)  # first frame of GIF / APNG / WebP animations
        if min_side and img.format == "JPEG" and img.mode in ("RGB", "L", "CMYK", "YCbCr"):
            scale = min_side / min(w, h)
            if scale < 0.5:
                img.draft(img.mode if img.mode != "YCbCr" else "RGB",
                          (max(1, int(w * scale + 0.999)), max(1, int(h * scale + 0.999))))
        elif target_max_side and img.format == "JPEG" and img.mode in ("RGB", "L", "CMYK", "YCbCr"):
            scale = target_max_side / max(w, h)
            if scale < 1:
                # draft() picks the largest 1/2^k reduction still at least this size.
                img.draft(img.mode if img.mode != "YCbCr" else "RGB",
                          (max(1, int(w * scale)), max(1, int(h * scale))))
        if not ImageFile.LOAD_TRUNCATED_IMAGES:
            img.load()  # the usual case: no lock, so a thread pool decodes in parallel
        else:
            with _TRUNCATED_LOCK:
                previous = ImageFile.LOAD_TRUNCATED_IMAGES
                ImageFile.LOAD_TRUNCATED_IMAGES = False
                try:
                    img.load()
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = previous
    except Image.DecompressionBombError as e:
        raise ImageError(_bomb_message(name, e, max_pixels)) from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError) as e:
        msg = str(e)
        if "truncated" in msg or "broken data stream" in msg or isinstance(e, EOFError):
            raise ImageError(f"{name}: truncated or damaged image data ({msg or 'unexpected end of file'})") from None
        raise ImageError(f"{name}: cannot decode image ({msg})") from None

    with contextlib.suppress(Exception):  # a broken EXIF block must not lose an otherwise good picture
        img = ImageOps.exif_transpose(img) or img
    rgb = to_rgb(img, name)
    if min_side:
        factor = min(rgb.size) // (2 * min_side)
        if factor >= 2:  # a huge non-JPEG: a cheap integer box reduction, still >= 2x what is needed
            rgb = rgb.reduce(factor)
    elif target_max_side and max(rgb.size) > target_max_side:
        rgb.thumbnail((target_max_side, target_max_side), Image.Resampling.BICUBIC)
    if rgb is img and not opened_here:
        rgb = rgb.copy()  # never hand back the caller's own object
    return rgb


def to_rgb(img: Image.Image, name: str = "image") -> Image.Image:
    """Convert any Pillow mode to RGB: alpha on white, 16-bit scaled, palette expanded."""
    mode = img.mode
    if mode == "RGB":
        return img
    try:
        if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
            arr = np.asarray(img, dtype=np.float64)
            if mode.startswith("I;16"):
                arr = arr / 257.0
            elif mode == "F" and arr.size and np.nanmax(arr) <= 1.0:
                arr = arr * 255.0
            elif arr.size and np.nanmax(arr) > 255:
                arr = arr * (255.0 / 65535.0) if np.nanmax(arr) <= 65535 else arr * (255.0 / np.nanmax(arr))
            arr = np.nan_to_num(np.clip(arr, 0, 255)).round().astype(np.uint8)
            return Image.fromarray(arr, "L").convert("RGB")
        has_alpha = mode in ("RGBA", "LA", "PA", "La", "RGBa") or (
            mode in ("P", "L", "RGB") and "transparency" in img.info
        )
        if has_alpha:
            rgba = img.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(background, rgba).convert("RGB")
        return img.convert("RGB")
    except (ValueError, OSError) as e:
        raise ImageError(f"{name}: unsupported colour mode {mode!r} ({e})") from None


def iter_image_files(source: str | os.PathLike, *, recursive: bool = True) -> Iterator[Path]:
    """Image files under a folder, matching a glob pattern, or a single file, sorted by path.

    Folders are scanned for :data:`IMAGE_EXTENSIONS` (case-insensitive); hidden files and
    folders (names starting with ``.``) are skipped. A glob (``photos/**/*.jpg``) is used
    as given. Raises :class:`ImageError` when nothing of that name exists.
    """
    text = os.fspath(source)
    path = Path(text)
    if path.is_file():
        yield path
        return
    if path.is_dir():
        found: list[Path] = []
        walker = os.walk(path) if recursive else [(str(path), [], os.listdir(path))]
        for root, dirs, files in walker:
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in files:
                if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                    p = Path(root) / f
                    if p.is_file():
                        found.append(p)
        yield from sorted(found)
        return
    if any(c in text for c in "*?["):
        yield from sorted(Path(p) for p in _glob.glob(text, recursive=True) if os.path.isfile(p))
        return
    raise ImageError(f"{text}: no such file or folder")
