"""Turning a client's image reference (relative path, base64, data URI, URL) into a PIL image.

Every reference is checked before anything is decoded: paths are confined to the image
roots (:mod:`.security`), base64 is capped in size, URLs are fetched only when the server
was started with ``--allow-image-urls`` (http/https only, one total deadline, a byte cap,
never to the server's own or internal networks unless ``--allow-private-urls``; :mod:`.fetch`).
Decoding goes through :func:`stair_es.images.load_image` (pixel caps, clear errors).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from ..errors import ImageError, InvalidInputError
from ..images import load_image
from .fetch import fetch_blocking, public_url
from .security import ImageRoots


@dataclass
class ImagePolicy:
    roots: ImageRoots
    allow_urls: bool = False
    allow_private_urls: bool = False  # URLs may reach internal addresses (see .fetch)
    max_image_bytes: int = 10 * 1024 * 1024
    url_timeout: float = 10.0


def decode_base64(data: str, max_bytes: int) -> bytes:
    if data.startswith("data:"):
        head, sep, data = data.partition(",")
        if not sep or ";base64" not in head:
            raise ImageError("a data: URI must be 'data:image/...;base64,<data>'")
    if len(data) > (max_bytes * 4) // 3 + 8:
        raise ImageError(f"the base64 image is larger than {max_bytes} bytes; send a smaller image")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image is not valid base64") from None
    if not raw:
        raise ImageError("the base64 image is empty")
    return raw


def fetch_url(url: str, policy: ImagePolicy) -> bytes:
    """The bytes at an image URL (total deadline ``policy.url_timeout``, redirects re-checked;
    see :mod:`.fetch`)."""
    if not policy.allow_urls:
        raise InvalidInputError("image URLs are refused by this server; send the image as base64, name a file under an "
                                "image root, or start the server with --allow-image-urls")
    return fetch_blocking(url, policy.max_image_bytes, policy.url_timeout, allow_private=policy.allow_private_urls)


def open_image(ref: dict[str, Any], policy: ImagePolicy, min_side: int | None = None):
    """``ref`` has exactly one of ``path``, ``base64``, ``url``; returns an RGB PIL image."""
    given = [k for k in ("path", "base64", "url") if ref.get(k)]
    if len(given) != 1:
        raise InvalidInputError("an image needs exactly one of 'path' (relative to an image root), 'base64' or 'url'")
    kind = given[0]
    if kind == "path":
        source: Any = policy.roots.resolve_client_path(ref["path"])
        if source.stat().st_size > policy.max_image_bytes:
            raise ImageError(f"image {ref['path']}: larger than the {policy.max_image_bytes}-byte cap")
        name = f"image {ref['path']}"  # the client's name, never the server's real path
    elif kind == "base64":
        source = decode_base64(ref["base64"], policy.max_image_bytes)
        name = "base64 image"
    else:
        # `stair-es serve` fetches URLs before the work reaches a worker (stair_es.serve.fetch) and
        # hands the bytes in as `fetched`; a library caller without them fetches here
        fetched = ref.get("fetched")
        source = fetched if isinstance(fetched, bytes) else fetch_url(ref["url"], policy)
        name = f"image URL {public_url(ref['url'])}"
    try:
        return load_image(source, min_side=min_side)
    except ImageError as e:
        msg = str(e)
        raise ImageError(f"{name}: {msg.split(': ', 1)[1] if ': ' in msg else msg}") from None
    except Exception as e:  # noqa: BLE001 - whatever Pillow throws on hostile bytes is a bad image, not a crash
        raise ImageError(f"{name}: cannot decode the image ({type(e).__name__})") from None


def text_or_image(item: str, kind: str, policy: ImagePolicy) -> tuple[str, Any]:
    """One input string of the ES/OS integration endpoints as ("text", str) or ("image", ref).

    ``kind`` is ``text``, ``image`` or ``auto``. As an image, a string is a data: URI, an
    http(s) URL (if allowed) or a path relative to an image root. ``auto`` takes as images:
    data: URIs, ``image:REF``, http(s) URLs, and single words ending in an image extension
    (``cats/chelsea.jpg``); everything else is text. Elasticsearch's ingest side uses ``auto``,
    so the probe it may send when an endpoint is created (a short text) still gets tokens.
    """
    from ..catalog import IMAGE_EXTENSIONS

    if not isinstance(item, str):
        raise InvalidInputError(f"each input must be a string, got {type(item).__name__}")
    if kind == "auto":
        lower = item.strip().lower()
        looks_like_image = (lower.startswith(("data:", "image:", "http://", "https://"))
                            or (lower and not any(c.isspace() for c in lower)
                                and any(lower.endswith(ext) for ext in IMAGE_EXTENSIONS)))
        kind = "image" if looks_like_image else "text"
    if kind == "text":
        return "text", item
    item = item.removeprefix("image:")
    if item.startswith("data:"):
        return "image", {"base64": item}
    if item.lower().startswith(("http://", "https://")):
        return "image", {"url": item}
    return "image", {"path": item}
