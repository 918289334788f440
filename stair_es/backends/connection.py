"""Connection settings for the Elasticsearch and OpenSearch backends.

Owns: resolving URLs, credentials, TLS and timeouts from flags > ``STAIR_ES_*`` environment
variables > a TOML/JSON config file, and redacting secrets from anything that may be printed
or logged. Must not know about queries, mappings or client libraries.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit


from ..errors import (
    InvalidInputError,
)

DEFAULT_URL = "http://localhost:9200"


# --- connection settings ---------------------------------------------------------------------
def redact_url(url: str) -> str:
    """``https://user:secret@host:9200/`` -> ``https://host:9200/`` (for messages and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


_SECRET_FIELDS = ("api_key", "password", "bearer_token")
_ENV = {
    "urls": "STAIR_ES_URL",
    "api_key": "STAIR_ES_API_KEY",
    "username": "STAIR_ES_USERNAME",
    "password": "STAIR_ES_PASSWORD",
    "bearer_token": "STAIR_ES_BEARER_TOKEN",
    "ca_certs": "STAIR_ES_CA_CERTS",
}
DEFAULT_CONFIG = Path("~/.config/stair-es/config.toml")


@dataclass(repr=False)
class ClusterConfig:
    """Where the cluster is and how to authenticate. ``repr`` and ``describe`` never show secrets."""

    urls: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    api_key: str | None = None
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_certs: str | None = None
    verify_certs: bool = True
    timeout: float = 30.0

    @classmethod
    def resolve(cls, engine: str, config_file: str | os.PathLike | None = None, **given: Any) -> "ClusterConfig":
        """Flags (``given``, ``None`` = not given) > ``STAIR_ES_*`` environment > config file > defaults."""
        values: dict[str, Any] = {}
        values.update(_read_config_file(engine, config_file))
        for key, env in _ENV.items():
            v = os.environ.get(env)
            if v:
                values[key] = v
        for key, v in given.items():
            if v is not None:
                values[key] = v
        urls = values.get("urls", values.get("url"))
        if urls is None:
            urls = [DEFAULT_URL]
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        urls = list(urls)
        if not urls:
            raise InvalidInputError("no cluster URL given: pass --url or set STAIR_ES_URL")
        for u in urls:
            p = urlsplit(u)
            if p.scheme not in ("http", "https") or not p.hostname:
                raise InvalidInputError(f"invalid cluster URL {redact_url(u)!r}: use http(s)://host:port")
        verify = values.get("verify_certs", True)
        if isinstance(verify, str):
            verify = verify.strip().lower() not in ("0", "false", "no", "off")
        try:
            timeout = float(values.get("timeout", 30.0))
        except (TypeError, ValueError):
            raise InvalidInputError(f"timeout must be a number of seconds, got {values.get('timeout')!r}") from None
        if not (timeout > 0 and math.isfinite(timeout)):
            raise InvalidInputError(f"timeout must be positive, got {timeout}")
        if values.get("password") and not values.get("username"):
            raise InvalidInputError("a password was given without a username (--username / STAIR_ES_USERNAME)")
        return cls(
            urls=urls,
            api_key=values.get("api_key"),
            username=values.get("username"),
            password=values.get("password"),
            bearer_token=values.get("bearer_token"),
            ca_certs=values.get("ca_certs"),
            verify_certs=bool(verify),
            timeout=timeout,
        )

    @property
    def display_urls(self) -> str:
        return ", ".join(redact_url(u) for u in self.urls)

    @property
    def auth_kind(self) -> str:
        if self.api_key:
            return "api key"
        if self.bearer_token:
            return "bearer token"
        if self.username:
            return f"user {self.username!r}"
        return "no authentication"

    def __repr__(self) -> str:
        shown = {k: ("***" if getattr(self, k) else None) for k in _SECRET_FIELDS}
        return (
            f"ClusterConfig(urls={self.display_urls!r}, auth={self.auth_kind!r}, api_key={shown['api_key']}, "
            f"password={shown['password']}, bearer_token={shown['bearer_token']}, ca_certs={self.ca_certs!r}, "
            f"verify_certs={self.verify_certs}, timeout={self.timeout})"
        )

    __str__ = __repr__


def _read_config_file(engine: str, path: str | os.PathLike | None) -> dict[str, Any]:
    """Top-level keys, overridden by an ``[elasticsearch]``/``[opensearch]`` table if present."""
    explicit = path is not None
    p = Path(path).expanduser() if explicit else DEFAULT_CONFIG.expanduser()
    if not p.exists():
        if explicit:
            raise InvalidInputError(f"config file {str(p)!r} does not exist")
        return {}
    try:
        text = p.read_text(encoding="utf-8")
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except (OSError, ValueError) as e:
        # the message of a parse error can quote the line, which may hold a secret: keep only its type
        raise InvalidInputError(f"cannot read config file {str(p)!r} ({type(e).__name__}); check its syntax") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"config file {str(p)!r} must hold a table/object of settings")
    out = {k: v for k, v in data.items() if not isinstance(v, dict)}
    out.update(data.get(engine, {}) if isinstance(data.get(engine), dict) else {})
    if "url" in out and "urls" not in out:
        out["urls"] = out.pop("url")
    return out
