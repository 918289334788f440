"""Shared machinery of the Elasticsearch and OpenSearch backends.

Owns: resilient bulk ingestion (count/byte-bounded chunks through the client's
``streaming_bulk``, tenacity back-off that re-sends only the items that failed), search and
explain with the engines' 9-bit stored weights, and the :class:`EngineAdapter` seam through
which the two engine modules say how to build their client. Connection settings live in
:mod:`.connection`, mappings and query translation in :mod:`.dsl`.
Nothing here imports a client library at module import time.
"""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import quote

import numpy as np

from ..errors import (
    BackendError,
    ConnectionFailedError,
    DocumentNotFoundError,
    IncompatibleIndexError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidInputError,
    StairError,
)
from ..query import SearchRequest
from ..schema import (
    Document,
    Explanation,
    Hit,
    IndexSchema,
    IngestReport,
    ItemResult,
    SearchResult,
    TokenContribution,
    format_date,
)
from ..vocab import VOCAB_SIZE, Vocabulary, default_vocabulary
from .base import IndexInfo, ProgressCallback, SearchBackend
from .cluster_hybrid import ClusterHybrid
from .codec import feature_map, stored_value, vector_from_features
from .connection import ClusterConfig
from .dsl import DEFAULT_MAX_CLAUSES, FIELD_TYPES, META_KEY, _load_json, mapping, translate

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 502, 503, 504})
META_FORMAT = 1


# --- engine adapters -------------------------------------------------------------------------
class EngineAdapter:
    """How one engine's client is built and called. Subclassed in elasticsearch.py / opensearch.py."""

    loggers: tuple[str, ...] = ()  # the client's loggers, quietened unless the user asked for debug output
    engine = "abstract"
    label = "abstract"

    def make_client(self, cfg: ClusterConfig) -> Any:
        raise NotImplementedError

    def request(self, client: Any, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def streaming_bulk(self) -> Callable[..., Iterator[tuple[bool, dict]]]:
        raise NotImplementedError

    def classify(self, exc: BaseException) -> tuple[str, int | None, str]:
        """(kind, HTTP status, reason); kind: connection | timeout | tls | product | api | other."""
        raise NotImplementedError

    def check_info(self, info: Mapping[str, Any]) -> None:
        """Raise BackendError when GET / says this is the other engine."""


def _error_body_reason(body: Any) -> tuple[str | None, str]:
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


# --- the backend -----------------------------------------------------------------------------
@dataclass
class _IndexMeta:
    schema: IndexSchema
    field_type: str
    keys: str
    raw_meta: dict[str, Any]
    has_text: bool = False  # the mapping has the BM25 field (indices created before hybrid search do not)
    has_dense: bool = False  # the mapping has the dense vector field


class _Retry(Exception):
    pass


class ClusterBackend(ClusterHybrid, SearchBackend):
    """A :class:`SearchBackend` on an Elasticsearch or OpenSearch cluster."""

    adapter: EngineAdapter
    seismic: Any = None  # OpenSearch: the SEISMIC query parameters (stair_es.backends.seismic.SeismicParams)

    def __init__(
        self,
        urls: list[str] | str | None = None,
        api_key: str | None = None,
        username: str | None = None,
        password: str | None = None,
        bearer_token: str | None = None,
        ca_certs: str | None = None,
        verify_certs: bool | None = None,
        timeout: float | None = None,
        config_file: str | os.PathLike | None = None,
        field_type: str | None = None,
        refresh: bool | str | None = None,
        max_clauses: int | None = None,
        chunk_docs: int | None = None,
        chunk_bytes: int | None = None,
        max_retries: int | None = None,
        *,
        url: str | None = None,
        prune: bool = False,
        dense_dims: int | None = None,
        backoff: float = 0.5,
        backoff_max: float = 30.0,
        vocab: Vocabulary | None = None,
    ):
        self.config = ClusterConfig.resolve(
            self.adapter.engine, config_file, urls=urls if urls is not None else url, api_key=api_key,
            username=username, password=password, bearer_token=bearer_token, ca_certs=ca_certs,
            verify_certs=verify_certs, timeout=timeout,
        )
        self.field_type = field_type or "auto"
        if self.field_type not in ("auto",) + FIELD_TYPES:
            raise InvalidInputError(f"field type must be auto, rank_features or sparse_vector, got {self.field_type!r}")
        self.refresh = True if refresh is None else refresh
        if self.refresh not in (True, False, "wait_for"):
            raise InvalidInputError(f"refresh must be true, false or wait_for, got {refresh!r}")
        self.max_clauses = int(max_clauses or DEFAULT_MAX_CLAUSES)
        self.chunk_docs = int(chunk_docs or 500)
        self.chunk_bytes = int(chunk_bytes or 10 * 1024 * 1024)
        self.max_retries = 5 if max_retries is None else int(max_retries)
        if self.max_clauses < 1 or self.chunk_docs < 1 or self.chunk_bytes < 1024 or self.max_retries < 0:
            raise InvalidInputError("max_clauses and chunk_docs must be >= 1, chunk_bytes >= 1024, max_retries >= 0")
        self.prune = prune
        self.dense_dims = dense_dims
        self.backoff = float(backoff)
        self.backoff_max = float(backoff_max)
        self.vocab = vocab or default_vocabulary()
        self._client: Any = None
        self.version: tuple[int, ...] | None = None
        self.distribution: str | None = None
        self._meta_cache: dict[str, _IndexMeta] = {}
        self.stats = {"bulk_requests": 0, "retried_items": 0, "retry_rounds": 0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r}, field_type={self.field_type!r})"

    # --- connection --------------------------------------------------------------------
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
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
            raise self._map_error(e, "connect") from None
        self.adapter.check_info(info)
        ver = str((info.get("version") or {}).get("number", "0"))
        self.version = tuple(int(x) for x in ver.split("-")[0].split(".")[:3] if x.isdigit()) or (0,)
        self.distribution = (info.get("version") or {}).get("distribution") or self.adapter.engine
        self._client = client
        log.debug("connected to %s %s at %s", self.adapter.label, ver, self.config.display_urls)

    def close(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001
                pass
            self._client = None

    def _map_error(self, e: BaseException, action: str, index: str | None = None) -> StairError:
        if isinstance(e, StairError):
            return e
        kind, status, reason = self.adapter.classify(e)
        where = self.config.display_urls
        label = self.adapter.label
        if kind == "tls":
            return BackendError(
                f"TLS error talking to {label} at {where}: {reason}. Check --ca-certs (STAIR_ES_CA_CERTS) or, "
                "for a test cluster only, --insecure"
            )
        if kind in ("connection", "timeout"):
            what = "timed out" if kind == "timeout" else "could not connect"
            return ConnectionFailedError(
                f"{label} at {where} {what} ({action}): {reason or type(e).__name__}. "
                "Is the cluster running and the URL right (--url / STAIR_ES_URL)?"
            )
        if kind == "product":
            other = "opensearch" if self.adapter.engine == "elasticsearch" else "elasticsearch"
            return BackendError(f"{where} is not {label} ({reason}); if it is {other}, use --backend {other}")
        if status == 401:
            return BackendError(
                f"{label} at {where} refused the credentials ({self.config.auth_kind}); "
                "check --api-key/--username/--password (or STAIR_ES_* variables)"
            )
        if status == 403:
            return BackendError(f"{label} at {where}: {self.config.auth_kind} is not allowed to {action}: {reason}")
        if status == 404 and index is not None:
            return IndexNotFoundError(f"index {index!r} does not exist on {where}")
        if status == 400 and "compatib" in reason.lower():
            return BackendError(
                f"{label} at {where} refused the client's API version ({reason}); install the client matching "
                "the server's major version, e.g. pip install 'elasticsearch>=8.15,<9' for an 8.x cluster"
            )
        return BackendError(f"{label} at {where} failed to {action}: {f'HTTP {status}: ' if status else ''}{reason}")

    def _call(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
              *, action: str, index: str | None = None, retry: bool = True) -> Any:
        """One request with back-off on 429/502/503/504 and connection errors (reads and admin calls)."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt

        def transient(e: BaseException) -> bool:
            if isinstance(e, StairError):
                return False
            kind, status, _ = self.adapter.classify(e)
            return kind in ("connection", "timeout") or status in RETRY_STATUSES

        client = self.client
        attempts = self.max_retries + 1 if retry else 1
        try:
            for attempt in Retrying(stop=stop_after_attempt(attempts), reraise=True,
                                    wait=self._wait(),
                                    retry=retry_if_exception(transient)):
                with attempt:
                    return self.adapter.request(client, method, path, body, params)
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, action, index) from None

    def _wait(self) -> Callable[[Any], float]:
        """Exponential back-off from ``backoff`` seconds plus up to ``backoff`` of jitter, capped at
        ``backoff_max`` (a plain function of tenacity's retry state: the same on every tenacity version)."""
        base, cap = self.backoff, self.backoff_max

        def wait(retry_state: Any) -> float:
            n = max(int(getattr(retry_state, "attempt_number", 1)), 1)
            return min(base * 2.0 ** min(n - 1, 60) + random.uniform(0.0, base), cap)

        return wait

    def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
                *, action: str = "request", index: str | None = None, retry: bool = True) -> Any:
        """One request through this backend's client (its auth, TLS, back-off unless ``retry=False``,
        and errors mapped to typed ones naming the URL, never credentials); the raw response."""
        return self._call(method, path, body, params, action=action, index=index, retry=retry)

    # --- index metadata ----------------------------------------------------------------
    def _path(self, index: str, *rest: str) -> str:
        return "/" + "/".join([quote(index, safe="")] + [quote(r, safe="_") for r in rest])

    def _meta(self, index: str, *, fresh: bool = False) -> _IndexMeta:
        if not fresh and index in self._meta_cache:
            return self._meta_cache[index]
        res = self._call("GET", self._path(index, "_mapping"), action=f"read the mapping of {index!r}", index=index)
        if not isinstance(res, Mapping) or not res:
            raise IndexNotFoundError(f"index {index!r} does not exist on {self.config.display_urls}")
        # an alias resolves to the concrete index name: take the single entry
        entry = next(iter(res.values()))
        mappings = entry.get("mappings", {})
        raw = (mappings.get("_meta") or {}).get(META_KEY)
        if not isinstance(raw, Mapping) or "schema" not in raw:
            raise IncompatibleIndexError(
                f"index {index!r} exists but was not created by stair_es (no _meta.{META_KEY} in its mapping); "
                "create a new index, or add stair_es fields with the mapping from stair_es.backends.elasticsearch.mapping()"
            )
        if raw.get("format", 1) > META_FORMAT:
            raise IncompatibleIndexError(f"index {index!r} was written by a newer stair_es (format {raw.get('format')})")
        schema = IndexSchema.from_dict(raw["schema"])
        props = mappings.get("properties", {})
        ftype = raw.get("field_type") or props.get(schema.sparse_fields[0], {}).get("type", "rank_features")
        for name in schema.sparse_fields:
            actual = props.get(name, {}).get("type")
            if actual != ftype:
                raise IncompatibleIndexError(
                    f"index {index!r}: sparse field {name!r} is mapped as {actual!r}, expected {ftype!r}; "
                    "the mapping was changed outside stair_es -- reindex into a new index"
                )
        keys = raw.get("keys", "id" if (self.adapter.engine == "opensearch" and ftype == "sparse_vector") else "token")
        dense_prop = props.get("dense") or {}
        if schema.dense is None and dense_prop.get("type") in ("dense_vector", "knn_vector"):
            # an index made with dense_dims before stair_es searched dense vectors: its mapping says the dimension
            dims = dense_prop.get("dims") or dense_prop.get("dimension")
            if dims:
                schema.dense = {"dims": int(dims), "similarity": "cosine", "dtype": "float32", "encoder": None}
        meta = _IndexMeta(schema, ftype, keys, dict(raw), has_text="bm25_text" in props, has_dense=bool(dense_prop))
        self._meta_cache[index] = meta
        return meta

    def _pick_field_type(self) -> str:
        ft = self.field_type
        if ft == "auto":
            return "rank_features"  # exact, supports whitelists, on every version of both engines
        v = self.version or (0,)
        if ft == "sparse_vector":
            if self.adapter.engine == "elasticsearch" and v < (8, 11):
                raise BackendError(f"Elasticsearch {'.'.join(map(str, v))} has no sparse_vector field (8.11+); use rank_features")
            if self.adapter.engine == "opensearch" and v < (3, 3):
                raise BackendError(f"OpenSearch {'.'.join(map(str, v))} has no sparse_vector field (3.3+); use rank_features")
        return ft

    # --- SearchBackend -----------------------------------------------------------------
    def create_index(self, index: str, schema: IndexSchema, *, exist_ok: bool = False) -> None:
        _check_index_name(index)
        self.client  # connect: the version decides the field type and mapping options
        ftype = self._pick_field_type()
        if schema.dense is None and self.dense_dims:
            from dataclasses import replace

            from ..dense import DenseSpec

            schema = replace(schema, dense=DenseSpec(int(self.dense_dims), "cosine", "float32").to_dict())
        body = mapping(self.adapter.engine, ftype, schema, prune=self.prune, version=self.version)
        try:
            self.adapter.request(self.client, "PUT", self._path(index), body)
        except Exception as e:  # noqa: BLE001
            kind, status, reason = self.adapter.classify(e)
            if status == 400 and "already_exists" in reason + str(getattr(e, "error", "")) + repr(e):
                if not exist_ok:
                    raise IndexExistsError(f"index {index!r} already exists on {self.config.display_urls}") from None
                meta = self._meta(index, fresh=True)
                if tuple(meta.schema.sparse_fields) != tuple(schema.sparse_fields):
                    raise IncompatibleIndexError(
                        f"index {index!r} exists with sparse fields {list(meta.schema.sparse_fields)}, "
                        f"not {list(schema.sparse_fields)}"
                    ) from None
                for name, ftype_ in schema.fields.items():
                    have = meta.schema.fields.get(name)
                    if have is not None and have != ftype_:
                        raise IncompatibleIndexError(
                            f"index {index!r} exists with field {name!r} of type {have}, not {ftype_}"
                        ) from None
                return
            raise self._map_error(e, f"create index {index!r}") from None
        self._meta_cache.pop(index, None)

    def list_indices(self) -> list[str]:
        res = self._call("GET", "/_mapping", action="list indices")
        out = []
        for name, entry in (res or {}).items():
            meta = ((entry or {}).get("mappings") or {}).get("_meta") or {}
            if isinstance(meta.get(META_KEY), Mapping) and not name.startswith("."):
                out.append(name)
        return sorted(out)

    def index_info(self, index: str) -> IndexInfo:
        meta = self._meta(index, fresh=True)
        count = self._call("GET", self._path(index, "_count"), action=f"count {index!r}", index=index)
        size = None
        try:
            stats = self._call("GET", self._path(index, "_stats", "store"), action="read index stats", index=index, retry=False)
            size = int(stats["_all"]["primaries"]["store"]["size_in_bytes"])
        except (StairError, KeyError, TypeError, ValueError):
            pass
        extra = {"engine": self.adapter.engine, "field_type": meta.field_type,
                 "cluster_version": ".".join(map(str, self.version or ())), "url": self.config.display_urls}
        return IndexInfo(index, meta.schema, int(count.get("count", 0)), size, extra)

    def delete_index(self, index: str) -> None:
        self._call("DELETE", self._path(index), action=f"delete index {index!r}", index=index)
        self._meta_cache.pop(index, None)

    # --- ingestion ---------------------------------------------------------------------
    def _source(self, doc: Document, meta: _IndexMeta, schema: IndexSchema, new_fields: dict[str, str]) -> dict[str, Any]:
        if not isinstance(doc, Document):
            raise InvalidInputError(f"expected a Document, got {type(doc).__name__}")
        src: dict[str, Any] = {}
        for name, vec in doc.vectors.items():
            schema.check_sparse_field(name)
            if vec.vocab is not self.vocab and vec.vocab.digest != self.vocab.digest:
                raise InvalidInputError(f"field {name!r}: the vector uses another vocabulary than the index")
            if vec.nnz:
                src[name] = feature_map(vec, meta.keys)
        if not src:
            raise InvalidInputError("the document has no non-zero token weight in any sparse field")
        values, new = schema.normalize_metadata(doc.metadata)
        for k, t in new.items():
            schema.fields[k] = t
            new_fields[k] = t
        for k, v in values.items():
            src[k] = list(v) if isinstance(v, tuple) else v
        if doc.caption is not None:
            src["caption_text"] = doc.caption
        if meta.has_text:
            from ..lexical import TEXT_FIELD, document_text

            src[TEXT_FIELD] = document_text(doc.caption, values)
        if doc.source is not None:
            src["path"] = doc.source  # "path" is reserved in the schema; "source" may be user metadata
        if getattr(doc, "dense", None) is not None:
            from ..dense import DENSE_FIELD, DenseSpec, prepare

            spec = DenseSpec.from_dict(schema.dense)
            if spec is None or not meta.has_dense:
                raise InvalidInputError(f"{doc.id!r} has a dense vector but the index has no dense field: "
                                        "create the index with --dense-dims N (or ingest without dense vectors)")
            src[DENSE_FIELD] = [float(x) for x in prepare(doc.dense, spec, f"the dense vector of {doc.id!r}")]
        return src

    def ingest(self, index: str, docs: Iterable[Document], *, on_batch: ProgressCallback | None = None) -> IngestReport:
        meta = self._meta(index, fresh=True)
        report = IngestReport()
        batch: list[Document] = []
        for doc in docs:
            batch.append(doc)
            if len(batch) >= self.chunk_docs:
                self._ingest_batch(index, meta, batch, report, on_batch)
                batch = []
        if batch:
            self._ingest_batch(index, meta, batch, report, on_batch)
        if self.refresh is True and report.succeeded:
            self._call("POST", self._path(index, "_refresh"), action=f"refresh {index!r}", index=index)
        return report

    def _ingest_batch(self, index: str, meta: _IndexMeta, batch: list[Document], report: IngestReport,
                      on_batch: ProgressCallback | None) -> None:
        schema = meta.schema
        results: list[ItemResult | None] = [None] * len(batch)
        actions: dict[int, dict[str, Any]] = {}
        new_fields: dict[str, str] = {}
        for k, doc in enumerate(batch):
            did = getattr(doc, "id", None)
            try:
                before = dict(schema.fields)
                try:
                    src = self._source(doc, meta, schema, new_fields)
                except Exception:
                    # a rejected document must not leave its inferred fields behind
                    for name in set(schema.fields) - set(before):
                        schema.fields.pop(name, None)
                        new_fields.pop(name, None)
                    raise
                actions[k] = {"_op_type": "index", "_index": index, "_id": did, "_source": src}
            except StairError as e:
                results[k] = ItemResult(did, False, str(e), getattr(doc, "source", None))
        if new_fields:
            self._add_fields(index, meta, new_fields)
        outcome = self._bulk(actions) if actions else {}
        for k, (ok, err) in outcome.items():
            results[k] = ItemResult(batch[k].id, ok, err, batch[k].source)
        items = [r for r in results if r is not None]
        report.extend(items)
        if on_batch is not None:
            on_batch(items)

    def _add_fields(self, index: str, meta: _IndexMeta, new_fields: dict[str, str]) -> None:
        types = _load_json("metadata_types.json")
        raw = dict(meta.raw_meta)
        raw["schema"] = meta.schema.to_dict()
        body = {"properties": {k: dict(types[t]) for k, t in new_fields.items()}, "_meta": {META_KEY: raw}}
        self._call("PUT", self._path(index, "_mapping"), body, action=f"add fields {sorted(new_fields)} to {index!r}", index=index)
        meta.raw_meta = raw

    def _bulk(self, actions: dict[int, dict[str, Any]]) -> dict[int, tuple[bool, str | None]]:
        """Send ``actions`` (position -> bulk action); returns position -> (ok, error).

        Items answered 429/502/503/504, or lost to a connection error, are re-sent alone after an
        exponential, jittered back-off; other item errors are permanent and reported as they are.
        A 413 (request too large) halves the chunk and re-sends. After ``max_retries`` rounds what
        is still pending is reported failed with the last error: nothing is dropped silently.
        """
        from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt

        pending = dict(actions)
        out: dict[int, tuple[bool, str | None]] = {}
        last_error: dict[int, str] = {}
        limits = {"docs": self.chunk_docs, "bytes": self.chunk_bytes}
        bulk = self.adapter.streaming_bulk()
        client = self.client

        def send(order: list[int]) -> list[int]:
            """One pass over ``order``; returns the items refused with 413 in a chunk of several."""
            done = 0
            sent_docs = limits["docs"]
            too_large: list[int] = []
            self.stats["bulk_requests"] += 1
            try:
                extra = {"refresh": "wait_for"} if self.refresh == "wait_for" else {}
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
                    raise self._map_error(e, "send a bulk request") from None
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

        try:
            for attempt in Retrying(stop=stop_after_attempt(self.max_retries + 1),
                                    wait=self._wait(),
                                    retry=retry_if_exception_type(_Retry), reraise=True):
                with attempt:
                    one_round()
        except (_Retry, RetryError):
            pass
        for k in pending:
            out[k] = (False, f"gave up after {self.max_retries + 1} attempts: {last_error.get(k, 'unknown error')}")
        return out

    def delete_documents(self, index: str, ids: Iterable[str]) -> IngestReport:
        self._meta(index)
        id_list = list(ids)
        actions = {k: {"_op_type": "delete", "_index": index, "_id": i} for k, i in enumerate(id_list)}
        outcome = self._bulk(actions) if actions else {}
        report = IngestReport()
        for k, i in enumerate(id_list):
            ok, err = outcome[k]
            if not ok and err and ("not_found" in err or "404" in err):
                err = f"document {i!r} not found"
            report.add(ItemResult(i, ok, err, action="delete"))
        if self.refresh is True and report.succeeded:
            self._call("POST", self._path(index, "_refresh"), action=f"refresh {index!r}", index=index)
        return report

    # --- reading -----------------------------------------------------------------------
    def _doc_from_hit(self, hit: Mapping[str, Any], meta: _IndexMeta) -> Document:
        src = dict(hit.get("_source") or {})
        vectors = {}
        for name in meta.schema.sparse_fields:
            feats = src.pop(name, None)
            if feats:
                vectors[name] = vector_from_features(feats, self.vocab, meta.keys)
        caption = src.pop("caption_text", None)
        source = src.pop("path", None)
        dense = src.pop("dense", None)
        return Document(hit["_id"], vectors, self._metadata_out(src, meta.schema), caption, source, dense)

    @staticmethod
    def _metadata_out(src: Mapping[str, Any], schema: IndexSchema) -> dict[str, Any]:
        out = {}
        for k, v in src.items():
            if k not in schema.fields:
                continue
            if schema.fields[k] == "date" and v is not None:
                v = format_date(int(v)) if isinstance(v, (int, float)) else v
            out[k] = v
        return out

    def get(self, index: str, doc_id: str) -> Document:
        meta = self._meta(index)
        try:
            res = self.adapter.request(self.client, "GET", self._path(index, "_doc", doc_id))
        except Exception as e:  # noqa: BLE001
            kind, status, reason = self.adapter.classify(e)
            if status == 404 and "index_not_found" not in reason and "no such index" not in reason:
                raise DocumentNotFoundError(f"document {doc_id!r} not found in index {index!r}") from None
            raise self._map_error(e, f"get document {doc_id!r}", index) from None
        if not res.get("found", True):
            raise DocumentNotFoundError(f"document {doc_id!r} not found in index {index!r}")
        return self._doc_from_hit(res, meta)

    def existing_ids(self, index: str, ids: Iterable[str]) -> set[str]:
        self._meta(index)
        id_list = list(dict.fromkeys(ids))
        found: set[str] = set()
        for start in range(0, len(id_list), 1000):
            chunk = id_list[start : start + 1000]
            res = self._call("POST", self._path(index, "_mget"), {"ids": chunk}, {"_source": "false"},
                             action=f"look up ids in {index!r}", index=index)
            found.update(d["_id"] for d in res.get("docs", []) if d.get("found"))
        return found

    def search(self, index: str, request: SearchRequest) -> SearchResult:
        t0 = time.perf_counter()
        meta = self._meta(index)
        req = request.prepared(meta.schema, self.vocab)
        tr = translate(req, engine=self.adapter.engine, field_type=meta.field_type, max_clauses=self.max_clauses, vocab=self.vocab,
                       seismic=self.seismic)
        body = {"query": tr.query, "size": req.top_k, "track_total_hits": True,
                "_source": {"excludes": list(meta.schema.sparse_fields) + ["dense"]}}
        res = self._call("POST", self._path(index, "_search"), body, action=f"search {index!r}", index=index)
        res, refill_notes = self._after_search(index, req, meta, body, res)
        hits = []
        for h in res.get("hits", {}).get("hits", []):
            src = h.get("_source") or {}
            hits.append(Hit(h["_id"], float(h.get("_score") or 0.0), self._metadata_out(src, meta.schema),
                            src.get("caption_text"), src.get("path")))
        total = res.get("hits", {}).get("total")
        total = total.get("value") if isinstance(total, Mapping) else total
        notes = list(req.notes) + tr.notes + refill_notes
        if meta.field_type == "sparse_vector" and self.adapter.engine == "opensearch":
            notes.append("OpenSearch seismic search is approximate on segments above its approximate_threshold")
        took = (time.perf_counter() - t0) * 1000  # end to end, as the user waits for it
        return SearchResult(hits, total, took, notes)

    def _after_search(self, index: str, req: SearchRequest, meta: _IndexMeta, body: dict[str, Any],
                      res: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
        """A hook on a search's response (OpenSearch repeats a filtered SEISMIC search): (response, notes)."""
        return res, []

    def explain(self, index: str, doc_id: str, request: SearchRequest) -> Explanation:
        meta = self._meta(index)
        req = request.prepared(meta.schema, self.vocab)
        tr = translate(req, engine=self.adapter.engine, field_type=meta.field_type, max_clauses=self.max_clauses, vocab=self.vocab,
                       seismic=self.seismic)
        doc = self.get(index, doc_id)
        contributions = []
        for c in tr.request.clauses:
            dv = doc.vectors.get(c.field)
            if dv is None:
                continue
            for tok, qw, dw, _ in c.vector.contributions(dv):
                stored = float(stored_value(dw))
                q = float(c.weight) * qw
                contributions.append(TokenContribution(c.field, tok, q, stored, q * stored))
        contributions.sort(key=lambda t: -t.contribution)
        # the engine's own score for this document under the same query (and whether the filter matched)
        body = {"query": {"bool": {"must": [tr.query], "filter": [{"ids": {"values": [doc_id]}}]}}, "size": 1, "_source": False}
        res = self._call("POST", self._path(index, "_search"), body, action=f"explain in {index!r}", index=index)
        hits = res.get("hits", {}).get("hits", [])
        notes = list(req.notes) + tr.notes
        notes.append(
            f"document weights are shown as {self.adapter.label} stores them: float32 truncated to 9 significant "
            "bits (relative error < 0.4%); the score is sum(query weight * stored weight)"
        )
        if meta.field_type == "sparse_vector" and self.adapter.engine == "opensearch":
            from .seismic import explain_notes

            notes.extend(explain_notes(tr.request.clauses, doc.vectors, self.index_info(index).doc_count,
                                       self.seismic))
        if hits:
            score, matched = float(hits[0].get("_score") or 0.0), True
        else:
            score = float(sum(t.contribution for t in contributions))
            matched = False
            notes.append("the document does not match this query's filter (or shares no token with it); "
                         "the score shown is the sum of contributions")
        return Explanation(doc_id, score, contributions, matched, notes)

    def _scroll(self, index: str, sources: list[str]) -> Iterator[list[dict[str, Any]]]:
        """Every document of ``index`` with the given ``_source`` fields, one page (1000 hits) at a
        time, through the scroll API; the scroll context is cleared however the caller stops."""
        body = {"query": {"match_all": {}}, "size": 1000, "_source": sources, "sort": ["_doc"]}
        res = self._call("POST", self._path(index, "_search"), body, {"scroll": "2m"}, action=f"scan {index!r}", index=index)
        scroll_id = res.get("_scroll_id")
        try:
            while True:
                hits = res.get("hits", {}).get("hits", [])
                if not hits:
                    break
                yield hits
                if not scroll_id:
                    break
                res = self._call("POST", "/_search/scroll", {"scroll": "2m", "scroll_id": scroll_id}, action="scan (scroll)")
                scroll_id = res.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                try:
                    self._call("DELETE", "/_search/scroll", {"scroll_id": [scroll_id]}, action="clear scroll", retry=False)
                except StairError:
                    pass

    def doc_freqs(self, index: str, field: str) -> tuple[np.ndarray, int]:
        """Exact document frequencies by scanning the field's stored feature maps (one pass, 1000 docs/page).

        Costs a full read of the index: fine for the CLI's IDF on small and medium indices.
        """
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        df = np.zeros(VOCAB_SIZE, dtype=np.int64)
        n = 0
        for hits in self._scroll(index, [field]):
            for h in hits:
                n += 1
                feats = (h.get("_source") or {}).get(field)
                if feats:
                    df[vector_from_features(feats, self.vocab, meta.keys).ids] += 1
        return df, n

    def scan(self, index: str, field: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[str | None]]]:
        """Every document, 1000 per page (scroll), as ``(indptr, token ids of field, captions)`` per page.

        Costs a full read of the index (used for neighbour statistics, ``stair_es.neighbours``)."""
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        for hits in self._scroll(index, [field, "caption_text"]):
            rows, captions = [], []
            for h in hits:
                src = h.get("_source") or {}
                feats = src.get(field)
                rows.append(vector_from_features(feats, self.vocab, meta.keys).ids if feats else np.zeros(0, np.int32))
                captions.append(src.get("caption_text"))
            ptr = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([r.size for r in rows], out=ptr[1:])
            yield ptr, np.concatenate(rows).astype(np.int32), captions


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
        typ, reason = _error_body_reason({"error": err})
        text = f"{typ}: {reason}" if typ else reason
    elif err is not None:
        text = str(err)
    else:
        text = "unknown error"
    return f"HTTP {status}: {text}" if isinstance(status, int) else text


def _check_index_name(index: str) -> None:
    bad = set('\\/*?"<>| ,#:')
    if (not isinstance(index, str) or not index or index != index.lower() or index.startswith(("-", "_", "+"))
            or any(c in bad for c in index) or index in (".", "..") or len(index.encode()) > 255):
        raise InvalidInputError(
            f"invalid index name {index!r}: use lower-case letters, digits, '-' or '_' "
            "(not starting with '-', '_' or '+'), at most 255 bytes"
        )
