"""Settings of the Elasticsearch and OpenSearch backends: :class:`ClusterConfig` and :class:`BulkPolicy`.

Owns: resolving URLs, credentials, TLS and timeouts from flags > ``STAIR_ES_*`` environment
variables > a TOML/JSON config file, the index options given as flags (field type, refresh,
clause limit, pruning, dense dimension), the bulk/retry policy, and redacting secrets from
anything that may be printed or logged. Must not know about queries or client libraries.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

from ...errors import InvalidInputError
from .mapping import FIELD_TYPES
from .translate import DEFAULT_MAX_CLAUSES

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
    """Where the cluster is, how to authenticate, and how stair_es lays out its indices there.
    ``repr`` never shows secrets."""

    urls: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    api_key: str | None = None
    username: str | None = None
    password: str | None = None
    bearer_token: str | None = None
    ca_certs: str | None = None
    verify_certs: bool = True
    timeout: float = 30.0
    # index options (flags only; not read from the environment or the config file)
    field_type: str = "auto"  # auto (= rank_features), rank_features or sparse_vector
    refresh: bool | str = True  # True: refresh once after an ingest; False; "wait_for" on every bulk request
    max_clauses: int = DEFAULT_MAX_CLAUSES  # the cluster's indices.query.bool.max_clause_count
    prune: bool = False  # Elasticsearch sparse_vector index-time pruning
    dense_dims: int | None = None  # a cosine dense field for indices whose schema has none

    def __post_init__(self) -> None:
        if self.field_type not in ("auto",) + FIELD_TYPES:
            raise InvalidInputError(f"field type must be auto, rank_features or sparse_vector, got {self.field_type!r}")
        if self.refresh not in (True, False, "wait_for"):
            raise InvalidInputError(f"refresh must be true, false or wait_for, got {self.refresh!r}")
        self.max_clauses = _number("max_clauses", self.max_clauses, int)
        if self.max_clauses < 1:
            raise InvalidInputError(f"max_clauses must be >= 1, got {self.max_clauses}")

    @classmethod
    def resolve(cls, engine: str, config_file: str | os.PathLike | None = None, **given: Any) -> "ClusterConfig":
        """Flags (``given``, ``None`` = not given) > ``STAIR_ES_*`` environment > config file > defaults."""
        values = {k: v for k, v in _read_config_file(engine, config_file).items() if k not in _INDEX_OPTIONS}
        values.update({key: os.environ[env] for key, env in _ENV.items() if os.environ.get(env)})
        values.update({key: v for key, v in given.items() if v is not None})
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
        # api_key, username, password, bearer_token, ca_certs
        credentials = {k: values.get(k) for k in _ENV if k != "urls"}
        return cls(urls=urls, verify_certs=bool(verify), timeout=timeout, **credentials,
                   **{k: values[k] for k in _INDEX_OPTIONS if k in values})

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
            f"verify_certs={self.verify_certs}, timeout={self.timeout}, field_type={self.field_type!r})"
        )

    __str__ = __repr__


_INDEX_OPTIONS = ("field_type", "refresh", "max_clauses", "prune", "dense_dims")


@dataclass(frozen=True)
class BulkPolicy:
    """How bulk requests are cut and how failed requests and items are retried.

    Chunks hold at most ``chunk_docs`` documents and ``chunk_bytes`` bytes; a request or item
    answered 429/502/503/504 (or lost to a connection error) is re-sent after an exponential
    back-off from ``backoff`` seconds plus up to ``backoff`` of jitter, capped at ``backoff_max``,
    at most ``max_retries`` times. Reads and admin calls use the same retries and back-off.
    """

    chunk_docs: int = 500
    chunk_bytes: int = 10 * 1024 * 1024
    max_retries: int = 5
    backoff: float = 0.5
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.chunk_docs < 1 or self.chunk_bytes < 1024 or self.max_retries < 0:
            raise InvalidInputError("chunk_docs must be >= 1, chunk_bytes >= 1024, max_retries >= 0")
        if not (self.backoff >= 0 and self.backoff_max >= 0):
            raise InvalidInputError("backoff and backoff_max must be >= 0 seconds")

    def wait(self) -> Callable[[Any], float]:
        """The back-off as a plain function of tenacity's retry state (the same on every tenacity version)."""
        base, cap = float(self.backoff), float(self.backoff_max)

        def wait(retry_state: Any) -> float:
            n = max(int(getattr(retry_state, "attempt_number", 1)), 1)
            return min(base * 2.0 ** min(n - 1, 60) + random.uniform(0.0, base), cap)

        return wait


def settings_from_options(engine: str, options: Mapping[str, Any]) -> tuple[ClusterConfig, BulkPolicy]:
    """The flat keyword options of ``get_backend("elasticsearch", ...)`` as a resolved
    :class:`ClusterConfig` and a :class:`BulkPolicy` (``None`` = not given: the default)."""
    opts = {k: v for k, v in options.items() if v is not None}
    if "url" in opts:
        opts.setdefault("urls", opts.pop("url"))
    bulk_keys = {f.name for f in fields(BulkPolicy)}
    known = bulk_keys | {f.name for f in fields(ClusterConfig)} | {"config_file"}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise InvalidInputError(f"unknown {engine} backend option(s) {', '.join(unknown)}: use {', '.join(sorted(known))}")
    bulk = BulkPolicy(**{k: _number(k, opts.pop(k), int if k != "backoff" and k != "backoff_max" else float)
                         for k in sorted(bulk_keys & set(opts))})
    return ClusterConfig.resolve(engine, opts.pop("config_file", None), **opts), bulk


def _number(name: str, value: Any, kind: type) -> Any:
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a number, got {value!r}") from None


def _toml(path: Path):
    """The TOML reader: the standard library's from Python 3.11, the ``tomli`` backport (a
    dependency of stair-es on Python 3.10) before it."""
    # lazy: only a TOML config file needs it
    try:
        import tomllib
    except ModuleNotFoundError:
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise InvalidInputError(f"config file {str(path)!r} is TOML, which this Python reads with the tomli "
                                    "package: pip install tomli, or write the settings as a .json file") from None
    return tomllib


def _read_config_file(engine: str, path: str | os.PathLike | None) -> dict[str, Any]:
    """Top-level keys, overridden by an ``[elasticsearch]``/``[opensearch]`` table if present."""
    explicit = path is not None
    p = Path(path).expanduser() if explicit else DEFAULT_CONFIG.expanduser()
    if not p.exists():
        if explicit:
            raise InvalidInputError(f"config file {str(p)!r} does not exist; give the path of a TOML or JSON file "
                                    f"of connection settings, or leave --config out to use {DEFAULT_CONFIG} when it exists")
        return {}
    parser = json if p.suffix.lower() == ".json" else _toml(p)
    try:
        data = parser.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        # the message of a parse error can quote the line, which may hold a secret: keep only its
        # type and where it is
        where = re.search(r"line \d+,? column \d+", str(e)) if isinstance(e, ValueError) else None
        at = f" at {where.group(0).replace(',', '')}" if where else ""
        raise InvalidInputError(f"cannot read config file {str(p)!r} ({type(e).__name__}{at}); check its syntax") from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"config file {str(p)!r} must hold a table/object of settings")
    out = {k: v for k, v in data.items() if not isinstance(v, dict)}
    out.update(data.get(engine, {}) if isinstance(data.get(engine), dict) else {})
    if "url" in out and "urls" not in out:
        out["urls"] = out.pop("url")
    return out
