"""Talking to one Elasticsearch or OpenSearch cluster: requests, retries, errors and bulk sends.

Owns: the :class:`EngineAdapter` seam through which the two engine modules say how to build and
call their client, :class:`Transport` (one client, connected once; each request with back-off
on 429/502/503/504 and connection errors; client errors mapped to typed errors naming the URL,
never credentials) and resilient bulk sending (count/byte-bounded chunks through the client's
``streaming_bulk``, only the items that failed re-sent). Must not know about schemas, queries or
documents. Nothing here imports a client library at module import time.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Any, Callable, Iterable, Iterator, Mapping

from ...errors import BackendError, ConnectionFailedError, MissingDependencyError, StairError
from .config import BulkPolicy, ClusterConfig
from .mapping import index_not_found

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class EngineAdapter:
    """How one engine's client is built and called. Subclassed in elasticsearch.py / opensearch.py."""

    loggers: tuple[str, ...] = ()  # the client's loggers, quietened unless the user asked for debug output
    engine = "abstract"
    label = "abstract"
    package = ""  # the client library, imported when an adapter is made (the extra is named as the engine)
    install = ""  # what `pip install` brings it

    def __init__(self) -> None:
        if not self.package:
            return
        try:
            # lazy: optional client (extra elasticsearch / opensearch), imported when the backend is used
            self.lib = importlib.import_module(self.package)
        except ImportError:
            raise MissingDependencyError(f"the {self.label} backend", self.engine, self.install) from None

    def make_client(self, cfg: ClusterConfig) -> Any:
        raise NotImplementedError

    def request(self, client: Any, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def streaming_bulk(self) -> Callable[..., Iterator[tuple[bool, dict]]]:
        return importlib.import_module(f"{self.package}.helpers").streaming_bulk

    def classify(self, exc: BaseException) -> tuple[str, int | None, str]:
        """(kind, HTTP status, reason); kind: connection | timeout | tls | product | api | other."""
        raise NotImplementedError

    def check_info(self, info: Mapping[str, Any]) -> None:
        """Raise BackendError when GET / says this is the other engine."""


def error_body_reason(body: Any) -> tuple[str | None, str]:
    if isinstance(body, Mapping):
        err = body.get("error")
        if isinstance(err, Mapping):
            cause = err.get("caused_by") if isinstance(err.get("caused_by"), Mapping) else None
            reason = str(err.get("reason") or "")
            if cause and cause.get("reason") and cause.get("reason") not in reason:
                reason = f"{reason} (caused by: {cause.get('reason')})"
            return err.get("type"), reason
        if isinstance(err, str):
            return None, err
    if isinstance(body, (str, bytes)):
        return None, (body.decode(errors="replace") if isinstance(body, bytes) else body)[:300]
    return None, ""


class _Retry(Exception):
    pass


class Transport:
    """One cluster's client, created on first use; every call goes through :meth:`call` or :meth:`bulk`."""

    def __init__(self, adapter: EngineAdapter, config: ClusterConfig, policy: BulkPolicy):
        self.adapter, self.config, self.policy = adapter, config, policy
        self._client: Any = None
        self.version: tuple[int, ...] | None = None
        self.stats = {"bulk_requests": 0, "retried_items": 0, "retry_rounds": 0}

    @property
    def client(self) -> Any:
        if self._client is None:
            self.connect()
        return self._client

    def connect(self) -> None:
        """Build the client and read GET / (product and version) once; errors name the URL."""
        _quiet_client_loggers(self.adapter.loggers)
        client = self.adapter.make_client(self.config)
        try:
            info = self.adapter.request(client, "GET", "/")
        except Exception as e:  # noqa: BLE001 - mapped to typed errors
            with contextlib.suppress(Exception):
                client.close()
            raise self.map_error(e, "connect") from None
        self.adapter.check_info(info)
        ver = str((info.get("version") or {}).get("number", "0"))
        self.version = tuple(int(x) for x in ver.split("-")[0].split(".")[:3] if x.isdigit()) or (0,)
        self._client = client
        log.debug("connected to %s %s at %s", self.adapter.label, ver, self.config.display_urls)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def map_error(self, e: BaseException, action: str, index: str | None = None) -> StairError:
        if isinstance(e, StairError):
            return e
        kind, status, reason = self.adapter.classify(e)
        where = self.config.display_urls
        label = self.adapter.label
        if kind == "tls":
            return BackendError(
                f"TLS error talking to {label} at {where}: {reason}. Check --ca-certs (STAIR_ES_CA_CERTS) or, "
                "for a test cluster only, --insecure")
        if kind in ("connection", "timeout"):
            what = "timed out" if kind == "timeout" else "could not connect"
            return ConnectionFailedError(f"{label} at {where} {what} ({action}): {reason or type(e).__name__}. "
                                         "Is the cluster running and the URL right (--url / STAIR_ES_URL)?")
        if kind == "product":
            other = "opensearch" if self.adapter.engine == "elasticsearch" else "elasticsearch"
            return BackendError(f"{where} is not {label} ({reason}); if it is {other}, use --backend {other}")
        if status == 401:
            return BackendError(f"{label} at {where} refused the credentials ({self.config.auth_kind}); "
                                "check --api-key/--username/--password (or STAIR_ES_* variables)")
        if status == 403:
            return BackendError(f"{label} at {where}: {self.config.auth_kind} is not allowed to {action}: {reason}")
        if status == 404 and index is not None:
            return index_not_found(index, where)
        if status == 400 and "compatib" in reason.lower():
            return BackendError(
                f"{label} at {where} refused the client's API version ({reason}); install the client matching "
                "the server's major version, e.g. pip install 'elasticsearch>=8.15,<9' for an 8.x cluster")
        return BackendError(f"{label} at {where} failed to {action}: {f'HTTP {status}: ' if status else ''}{reason}")

    def call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
             *, action: str, index: str | None = None, retry: bool = True) -> Any:
        """One request with back-off on 429/502/503/504 and connection errors unless ``retry=False``;
        the raw response, or a typed error saying what failed (``action``) where."""
        # lazy: loaded with the first cluster request, not with the package
        from tenacity import Retrying, retry_if_exception, stop_after_attempt

        def transient(e: BaseException) -> bool:
            if isinstance(e, StairError):
                return False
            kind, status, _ = self.adapter.classify(e)
            return kind in ("connection", "timeout") or status in RETRY_STATUSES

        client = self.client
        attempts = self.policy.max_retries + 1 if retry else 1
        try:
            for attempt in Retrying(stop=stop_after_attempt(attempts), reraise=True,
                                    wait=self.policy.wait(), retry=retry_if_exception(transient)):
                with attempt:
                    return self.adapter.request(client, method, path, body, params)
        except Exception as e:  # noqa: BLE001
            raise self.map_error(e, action, index) from None

    def bulk(self, actions: dict[int, dict[str, Any]], *, refresh_wait: bool = False
             ) -> dict[int, tuple[bool, str | None]]:
        """Send ``actions`` (position -> bulk action); returns position -> (ok, error).
        ``refresh_wait``: each bulk request waits for a refresh (``refresh=wait_for``).

        Items answered 429/502/503/504, or lost to a connection error, are re-sent alone after an
        exponential, jittered back-off; other item errors are permanent and reported as they are.
        A 413 (request too large) halves the chunk and re-sends. After ``policy.max_retries`` rounds what
        is still pending is reported failed with the last error: nothing is dropped silently.
        """
        # lazy: loaded with the first cluster request, not with the package
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt

        pending = dict(actions)
        out: dict[int, tuple[bool, str | None]] = {}
        last_error: dict[int, str] = {}
        limits = {"docs": self.policy.chunk_docs, "bytes": self.policy.chunk_bytes}
        bulk = self.adapter.streaming_bulk()
        client = self.client

        def send(order: list[int]) -> list[int]:
            """One pass over ``order``; returns the items refused with 413 in a chunk of several."""
            done = 0
            sent_docs = limits["docs"]
            too_large: list[int] = []
            self.stats["bulk_requests"] += 1
            try:
                extra = {"refresh": "wait_for"} if refresh_wait else {}
                stream = bulk(client, (pending[k] for k in order), chunk_size=limits["docs"],
                              max_chunk_bytes=limits["bytes"], raise_on_error=False, raise_on_exception=False,
                              max_retries=0, yield_ok=True, **extra)
                for ok, info in stream:
                    k = order[done]
                    done += 1
                    item = next(iter(info.values())) if isinstance(info, Mapping) and info else {}
                    if ok:
                        out[k] = (True, None)
                        pending.pop(k)
                        continue
                    status = item.get("status")
                    status = status if isinstance(status, int) else None
                    err = _item_error(item)
                    exc = item.get("exception")
                    if status == 413 and sent_docs > 1:
                        too_large.append(k)
                        last_error[k] = err
                    elif status in RETRY_STATUSES or (status is None and exc is not None):
                        last_error[k] = err
                    else:
                        if status == 413:
                            err += " (this document alone is over the cluster's http.max_content_length)"
                        out[k] = (False, err)
                        pending.pop(k)
            except Exception as e:  # noqa: BLE001 - a connection error aborts the stream mid-way
                kind, status, reason = self.adapter.classify(e)
                if not (kind in ("connection", "timeout") or status in RETRY_STATUSES):
                    raise self.map_error(e, "send a bulk request") from None
                for k in order[done:]:
                    if k in pending:
                        last_error[k] = f"{kind} error: {reason or type(e).__name__}"
            return too_large

        def one_round() -> None:
            keys = sorted(pending)
            while keys:
                keys = send(keys)
                if keys:  # 413: halve the chunks and re-send those items at once (not an overload)
                    limits["docs"] = max(1, limits["docs"] // 2)
                    limits["bytes"] = max(1024, limits["bytes"] // 2)
            if pending:
                self.stats["retried_items"] += len(pending)
                self.stats["retry_rounds"] += 1
                log.info("bulk: %d item(s) to retry (e.g. %s)", len(pending), next(iter(last_error.values()), "?"))
                raise _Retry()

        with contextlib.suppress(_Retry, RetryError):
            for attempt in Retrying(stop=stop_after_attempt(self.policy.max_retries + 1), wait=self.policy.wait(),
                                    retry=retry_if_exception_type(_Retry), reraise=True):
                with attempt:
                    one_round()
        for k in pending:
            out[k] = (False, f"gave up after {self.policy.max_retries + 1} attempts: {last_error.get(k, 'unknown error')}")
        return out


def _quiet_client_loggers(names: Iterable[str]) -> None:
    """The clients log every failed attempt at WARNING, with a traceback; stair_es reports the outcome itself.

    Left alone when the user configured these loggers or asked for debug output (``-vv``).
    """
    if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
        return
    for name in names:
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.ERROR)


def _item_error(item: Mapping[str, Any]) -> str:
    status = item.get("status")
    err = item.get("error")
    if isinstance(err, Mapping):
        typ, reason = error_body_reason({"error": err})
        text = f"{typ}: {reason}" if typ else reason
    else:
        text = "unknown error" if err is None else str(err)
    return f"HTTP {status}: {text}" if isinstance(status, int) else text
