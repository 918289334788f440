"""What `stair-es serve` refuses: unauthenticated callers, paths outside the image roots,
binds beyond loopback without a key.

This module owns the API key (read once, compared in constant time, never logged) and the
confinement of image paths to configured roots. It must not know FastAPI or any encoder.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
from pathlib import Path
from typing import Sequence

from ..errors import InvalidInputError, StairError

#: Environment variable holding the API key when no --api-key-file is given.
API_KEY_ENV = "STAIR_ES_SERVE_API_KEY"


class AuthError(StairError):
    """No API key, or a wrong one, on a server that requires one."""

    exit_code = 2


class PathNotAllowedError(InvalidInputError):
    """An image path that is absolute, climbs out with '..', or resolves outside every root."""


def load_api_key(key_file: str | os.PathLike | None = None, *, env: str = API_KEY_ENV) -> str | None:
    """The API key from ``key_file`` (first line, stripped) or ``$STAIR_ES_SERVE_API_KEY``; None if neither."""
    if key_file is not None:
        try:
            text = Path(key_file).read_text("utf-8")
        except OSError as e:
            raise InvalidInputError(f"--api-key-file {key_file}: cannot read it ({e.strerror or e})") from None
        key = text.strip().splitlines()[0].strip() if text.strip() else ""
        if not key:
            raise InvalidInputError(f"--api-key-file {key_file} is empty; write the key on its first line")
    else:
        key = os.environ.get(env, "").strip()
        if not key:
            return None
    if len(key) < 16:
        raise InvalidInputError("the API key is shorter than 16 characters; use a long random key "
                                "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
    return key


def is_loopback(host: str) -> bool:
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """A bind beyond loopback (e.g. 0.0.0.0) is refused unless an API key is configured."""
    if not is_loopback(host) and not api_key:
        raise InvalidInputError(
            f"--host {host} exposes the server beyond this machine; give an API key with --api-key-file FILE "
            f"or ${API_KEY_ENV} (clients then send 'Authorization: Bearer KEY'), or bind 127.0.0.1"
        )


def key_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison (the time taken does not reveal how much of the key matched)."""
    if given is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), given.encode("utf-8", "surrogateescape"))


def key_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    """``Authorization: Bearer KEY`` or ``X-API-Key: KEY``."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    return x_api_key.strip() if x_api_key else None


class ImageRoots:
    """Folders whose images clients may name by relative path (and whose files thumbnails show).

    A client path must be relative, contain no '..' component, and resolve (following every
    symlink) to a file inside the root: a symlink that points elsewhere is refused.
    """

    def __init__(self, roots: Sequence[str | os.PathLike]):
        self.roots: list[Path] = []
        for r in roots:
            p = Path(r).expanduser()
            if not p.is_dir():
                raise InvalidInputError(f"--image-root {r}: not a folder; give folders holding the images clients may name")
            self.roots.append(p.resolve())

    def __bool__(self) -> bool:
        return bool(self.roots)

    def resolve_client_path(self, given: str) -> Path:
        """The real file a client's relative path names, or PathNotAllowedError / InvalidInputError."""
        if not self.roots:
            raise PathNotAllowedError("this server has no image roots: image paths are refused; start it with "
                                      "--image-root FOLDER, or send the image as base64")
        if not isinstance(given, str) or not given or "\x00" in given:
            raise PathNotAllowedError("the image path is empty or holds a NUL character")
        p = Path(given)
        if p.is_absolute() or given.startswith(("/", "\\")) or (len(given) > 1 and given[1] == ":"):
            raise PathNotAllowedError(f"image path {given!r} is absolute; give it relative to an image root")
        if ".." in p.parts or ".." in given.replace("\\", "/").split("/"):
            raise PathNotAllowedError(f"image path {given!r} climbs out with '..'; give it relative to an image root")
        for root in self.roots:
            candidate = root / p
            try:
                real = candidate.resolve(strict=True)
            except (OSError, RuntimeError):
                continue
            if not real.is_relative_to(root):
                raise PathNotAllowedError(f"image path {given!r} resolves outside the image root (a symlink?); refused")
            if not real.is_file():
                raise InvalidInputError(f"image path {given!r} is not a file")
            return real
        raise InvalidInputError(f"image path {given!r}: no such file under the image roots")

    def contains(self, path: str | os.PathLike) -> Path | None:
        """The real path of a stored document source if it lies inside a root, else None."""
        try:
            p = Path(path)
            real = (p if p.is_absolute() else (self.roots[0] / p if self.roots else p)).resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            return None
        return real if real.is_file() and any(real.is_relative_to(r) for r in self.roots) else None


# --- Host header allow-list (DNS rebinding) and browser security headers ------------------------
def host_names(bind_host: str, extra: Sequence[str] = ()) -> frozenset[str] | None:
    """The Host names the server answers to: the bind address, ``localhost``, ``127.0.0.1``,
    ``[::1]`` and ``extra`` (``--allowed-host``), any port; None when ``extra`` holds ``*`` (any)."""
    names = {"localhost", "127.0.0.1", "[::1]", _bare(bind_host)}
    for h in extra:
        if h.strip() == "*":
            return None
        names.add(_bare(h))
    return frozenset(n for n in names if n)


def _bare(host: str) -> str:
    """``Host`` value without its port, lower-case, IPv6 in brackets."""
    h = host.strip().lower().rstrip(".")
    if h.startswith("["):
        end = h.find("]")
        return h[:end + 1] if end > 0 else h
    if h.count(":") > 1:  # a bare IPv6 address (as given to --host)
        return f"[{h}]"
    name, sep, port = h.rpartition(":")
    return name if sep and port.isdigit() else h


def host_allowed(host_header: str | None, allowed: frozenset[str] | None) -> bool:
    if allowed is None or host_header is None:  # no Host at all: not a browser (they always send one)
        return True
    return _bare(host_header) in allowed


_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)(?![^>]*type=['\"]application/json)[^>]*>(.*?)</script>", re.S | re.I)


def content_security_policy(html: bytes) -> str:
    """Only this origin: scripts from files here plus the page's own inline scripts (by hash:
    the offline Swagger UI starts with one), no framing, no plugins, forms only to here."""
    hashes = " ".join("'sha256-" + base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode() + "'"
                      for m in _INLINE_SCRIPT.finditer(html))
    return ("default-src 'self'; script-src 'self'" + (f" {hashes}" if hashes else "") +
            "; style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


#: Sent with every HTML answer (with the Content-Security-Policy above).
HTML_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


def html_headers(html: bytes) -> dict[str, str]:
    """The security headers of an HTML answer ``html``: its Content-Security-Policy and :data:`HTML_HEADERS`."""
    return {"Content-Security-Policy": content_security_policy(html), **HTML_HEADERS}
