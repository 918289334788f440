"""Shared machinery of the Elasticsearch and OpenSearch backends.

Owns: connection settings (flags > environment > config file), the mapping built from
``stair_es.mappings``, the pure translation of :class:`~stair_es.query.SearchRequest` into
query DSL, resilient bulk ingestion (count/byte-bounded chunks through the client's
``streaming_bulk``, tenacity back-off that re-sends only the items that failed), and explain
with the engines' 9-bit stored weights.

The two engine modules only say how to build their client and which helpers/exceptions it
has (:class:`EngineAdapter`). Nothing here imports a client library at module import time.

Scoring is the exact dot product: a ``rank_feature`` query with the ``linear`` function
scores ``boost * stored_weight``; a ``bool.should`` of one such clause per query token, with
``boost = clause weight * query weight``, sums to ``sum_c w_c * <q_c, d_c>`` -- the quantity
the encoders are trained for (the default ``saturation`` function is not a dot product).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping
from urllib.parse import quote, urlsplit, urlunsplit

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
from ..query import And, Exists, Filter, HasTokens, Not, Or, Range, SearchRequest, SparseClause, Term, Terms
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
from ..sparse import SparseVector
from ..vocab import VOCAB_SIZE, Vocabulary, default_vocabulary
from .base import IndexInfo, ProgressCallback, SearchBackend
from .codec import encode_token, feature_map, stored_value, vector_from_features

log = logging.getLogger(__name__)

ENGINES = ("elasticsearch", "opensearch")
FIELD_TYPES = ("rank_features", "sparse_vector")
RETRY_STATUSES = frozenset({429, 502, 503, 504})
DEFAULT_URL = "http://localhost:9200"
DEFAULT_MAX_CLAUSES = 1024
META_KEY = "stair_es"
META_FORMAT = 1


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


# --- mappings ----------------------------------------------------------------------------
def _load_json(name: str) -> dict[str, Any]:
    return json.loads(resources.files("stair_es.mappings").joinpath(name).read_text(encoding="utf-8"))


def _mapping_file(engine: str, field_type: str, prune: bool) -> str:
    if engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if field_type not in FIELD_TYPES:
        raise InvalidInputError(f"unknown field type {field_type!r}; use one of {', '.join(FIELD_TYPES)} or auto")
    prefix = "es" if engine == "elasticsearch" else "os"
    if prune:
        if (engine, field_type) != ("elasticsearch", "sparse_vector"):
            raise InvalidInputError("index-time pruning is an option of the Elasticsearch sparse_vector field only")
        return "es_sparse_vector_pruned.json"
    return f"{prefix}_{field_type}.json"


def mapping(
    engine: str = "elasticsearch",
    field_type: str = "rank_features",
    schema: IndexSchema | None = None,
    *,
    prune: bool = False,
    dense_dims: int | None = None,
    version: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """The create-index body (``settings`` + ``mappings``) for ``schema``; pure, no client needed.

    Built from the JSON files in ``stair_es.mappings`` (``es_rank_features.json`` ...): every
    sparse field of the schema gets the template of ``image``; metadata fields get
    ``metadata_types.json``; the schema itself is kept in ``mappings._meta.stair_es`` so
    stair_es can reopen the index. ``dense_dims`` adds a ``dense`` vector field for hybrid search.
    ``version`` (the cluster's) drops ``index_options`` on Elasticsearch versions without it.
    """
    schema = schema or IndexSchema()
    body = _load_json(_mapping_file(engine, field_type, prune))
    m = body["mappings"]
    props = m["properties"]
    template = props["image"]
    for name in ("image", "caption"):
        props.pop(name, None)
    if engine == "elasticsearch" and field_type == "sparse_vector" and version is not None and not _es_has_index_options(version):
        if prune:
            raise BackendError(f"Elasticsearch {'.'.join(map(str, version))} has no index-time pruning option (8.19 / 9.1+)")
        template = {k: v for k, v in template.items() if k != "index_options"}
    for name in schema.sparse_fields:
        props[name] = json.loads(json.dumps(template))
    types = _load_json("metadata_types.json")
    for name, ftype in schema.fields.items():
        props[name] = dict(types[ftype])
    if dense_dims:
        dense = _load_json("es_dense_vector.json" if engine == "elasticsearch" else "os_dense_vector.json")
        dense["dims" if engine == "elasticsearch" else "dimension"] = int(dense_dims)
        props["dense"] = dense
        if engine == "opensearch":
            body.setdefault("settings", {}).setdefault("index", {})["knn"] = True
    m["_meta"][META_KEY]["schema"] = schema.to_dict()
    return body


def _es_has_index_options(version: tuple[int, ...]) -> bool:
    major, minor = (tuple(version) + (0, 0))[:2]
    return (major == 8 and minor >= 19) or (major == 9 and minor >= 1) or major >= 10


# --- query translation ---------------------------------------------------------------------
def default_query_form(engine: str, field_type: str) -> str:
    if field_type == "rank_features":
        return "rank_feature"
    return "sparse_vector" if engine == "elasticsearch" else "neural_sparse"


@dataclass
class Translation:
    query: dict[str, Any]
    notes: list[str]
    request: SearchRequest  # after clause-limit pruning: what the engine scores with


def translate(
    request: SearchRequest,
    *,
    engine: str = "elasticsearch",
    field_type: str = "rank_features",
    form: str | None = None,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    vocab: Vocabulary | None = None,
    text: str | None = None,
    text_weight: float = 1.0,
) -> Translation:
    """Translate a prepared request; see :func:`query_dsl`."""
    vocab = vocab or default_vocabulary()
    form = form or default_query_form(engine, field_type)
    if form not in ("rank_feature", "sparse_vector", "neural_sparse"):
        raise InvalidInputError(f"unknown query form {form!r}; use rank_feature, sparse_vector or neural_sparse")
    keys = "id" if (engine == "opensearch" and field_type == "sparse_vector") else "token"
    ctx = _FilterContext(engine, field_type, keys, vocab)
    notes: list[str] = []
    filters: list[dict[str, Any]] = []
    must_not: list[dict[str, Any]] = []
    if request.filter is not None:
        parts = request.filter.filters if isinstance(request.filter, And) else (request.filter,)
        for f in parts:
            if isinstance(f, Not):
                must_not.append(ctx.dsl(f.filter))
            else:
                filters.append(ctx.dsl(f))
    budget = max_clauses - ctx.clauses - (1 if text else 0)
    if budget < 1:
        raise InvalidInputError(
            f"the filter alone needs {ctx.clauses} clauses, over the cluster's limit of {max_clauses} "
            "(indices.query.bool.max_clause_count); use fewer tokens in --require/--exclude"
        )
    clauses = _fit_clauses(request.clauses, budget, notes, max_clauses)
    should: list[dict[str, Any]] = []
    for c in clauses:
        if form == "rank_feature":
            for i, w in zip(c.vector.ids, c.vector.weights):
                should.append({"rank_feature": {
                    "field": f"{c.field}.{encode_token(vocab.tokens[int(i)])}",
                    "linear": {},
                    "boost": float(c.weight) * float(w),
                }})
        elif form == "sparse_vector":
            should.append({"sparse_vector": {"field": c.field, "query_vector": feature_map(c.vector, keys), "boost": float(c.weight)}})
        else:
            should.append({"neural_sparse": {c.field: {"query_tokens": feature_map(c.vector, keys), "boost": float(c.weight)}}})
    if text:
        should.append({"match": {"caption_text": {"query": text, "boost": float(text_weight)}}})
        notes.append("hybrid: BM25 on caption_text is added to the sparse score; scores are no longer a pure dot product")
    bool_q: dict[str, Any] = {"should": should, "minimum_should_match": 1}
    if filters:
        bool_q["filter"] = filters
    if must_not:
        bool_q["must_not"] = must_not
    from dataclasses import replace

    return Translation({"bool": bool_q}, notes, replace(request, clauses=clauses))


def _fit_clauses(clauses: list[SparseClause], budget: int, notes: list[str], limit: int) -> list[SparseClause]:
    total = sum(c.vector.nnz for c in clauses)
    if total <= budget:
        return list(clauses)
    # keep the largest effective weights (clause weight * token weight) across all clauses
    eff = np.concatenate([c.vector.weights.astype(np.float64) * c.weight for c in clauses])
    owner = np.concatenate([np.full(c.vector.nnz, k) for k, c in enumerate(clauses)])
    pos = np.concatenate([np.arange(c.vector.nnz) for c in clauses])
    order = np.argsort(-eff, kind="stable")[:budget]
    out = []
    for k, c in enumerate(clauses):
        sel = np.sort(pos[order][owner[order] == k])
        if sel.size:
            out.append(SparseClause(c.field, SparseVector(c.vector.ids[sel], c.vector.weights[sel], c.vector.vocab), c.weight))
    notes.append(
        f"query pruned from {total} to {budget} tokens (lowest weights dropped) to fit the cluster's clause limit of {limit}"
    )
    return out


class _FilterContext:
    def __init__(self, engine: str, field_type: str, keys: str, vocab: Vocabulary):
        self.engine, self.field_type, self.keys, self.vocab = engine, field_type, keys, vocab
        self.clauses = 0

    def dsl(self, f: Filter) -> dict[str, Any]:
        if isinstance(f, Term):
            self.clauses += 1
            return {"term": {f.field: _value(f.value)}}
        if isinstance(f, Terms):
            self.clauses += 1
            return {"terms": {f.field: [_value(v) for v in f.values]}}
        if isinstance(f, Range):
            self.clauses += 1
            bounds = {k: _value(getattr(f, k)) for k in ("gt", "gte", "lt", "lte") if getattr(f, k) is not None}
            return {"range": {f.field: bounds}}
        if isinstance(f, Exists):
            self.clauses += 1
            return {"exists": {"field": f.field}}
        if isinstance(f, HasTokens):
            parts = [self.token_clause(f.field, t) for t in f.tokens]
            self.clauses += len(parts)
            if len(parts) == 1:
                return parts[0]
            if f.mode == "all":
                return {"bool": {"filter": parts}}
            return {"bool": {"should": parts, "minimum_should_match": 1}}
        if isinstance(f, And):
            return {"bool": {"filter": [self.dsl(x) for x in f.filters]}}
        if isinstance(f, Or):
            return {"bool": {"should": [self.dsl(x) for x in f.filters], "minimum_should_match": 1}}
        if isinstance(f, Not):
            return {"bool": {"must_not": [self.dsl(f.filter)]}}
        raise InvalidInputError(f"filter {type(f).__name__} cannot be translated for {self.engine}")

    def token_clause(self, fld: str, token: str) -> dict[str, Any]:
        """A clause matching documents whose ``fld`` has ``token``; used in filter context only.

        ``exists`` does not see inside ``rank_features`` on the real engines; a ``rank_feature``
        query matches exactly the documents holding the feature, and filter context drops its score.
        """
        i = self.vocab.id(token)
        if self.field_type == "rank_features":
            return {"rank_feature": {"field": f"{fld}.{encode_token(token)}"}}
        key = str(i) if self.keys == "id" else encode_token(token)
        if self.engine == "elasticsearch":
            return {"sparse_vector": {"field": fld, "query_vector": {key: 1.0}}}
        return {"neural_sparse": {fld: {"query_tokens": {key: 1.0}}}}


def _value(v: Any) -> Any:
    # dates are epoch-ms ints after resolve; the mapping's format accepts epoch_millis and ISO
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**53:
        return v  # keep floats as floats: a double field compares numerically either way
    return v


def query_dsl(
    request: SearchRequest,
    engine: str = "elasticsearch",
    field_type: str = "rank_features",
    *,
    schema: IndexSchema | None = None,
    form: str | None = None,
    max_clauses: int = DEFAULT_MAX_CLAUSES,
    text: str | None = None,
    text_weight: float = 1.0,
    vocab: Vocabulary | None = None,
) -> dict[str, Any]:
    """The query DSL fragment (the value of ``"query"``) for ``request``; pure, no client needed.

    Put it in your own ``_search`` body, or inside your own ``bool`` query. With ``schema``
    the request is prepared first (filter fields checked, values coerced, query pruned);
    without it the request is taken as already prepared. ``form`` defaults to
    ``rank_feature`` for rank_features fields (the exact dot product), ``sparse_vector`` for the
    Elasticsearch sparse_vector field, ``neural_sparse`` for the OpenSearch one. ``text`` adds
    BM25 on ``caption_text`` (hybrid; not a pure dot product any more).
    """
    if schema is not None:
        request = request.prepared(schema, vocab)
    return translate(request, engine=engine, field_type=field_type, form=form, max_clauses=max_clauses,
                     vocab=vocab, text=text, text_weight=text_weight).query


# --- engine adapters -------------------------------------------------------------------------
class EngineAdapter:
    """How one engine's client is built and called. Subclassed in elasticsearch.py / opensearch.py."""

    loggers: tuple[str, ...] = ()  # the client's loggers, quietened unless the user asked for debug output
    engine = "abstract"
    label = "abstract"
    extra = "abstract"

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


class _Retry(Exception):
    pass


class ClusterBackend(SearchBackend):
    """A :class:`SearchBackend` on an Elasticsearch or OpenSearch cluster."""

    adapter: EngineAdapter

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
        from tenacity import RetryError, Retrying, retry_if_exception, stop_after_attempt

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
        except RetryError as e:  # pragma: no cover - reraise=True makes this unreachable
            raise self._map_error(e.last_attempt.exception(), action, index) from None
        except Exception as e:  # noqa: BLE001
            raise self._map_error(e, action, index) from None

    def _wait(self) -> Any:
        """Exponential back-off from ``backoff`` seconds, capped at ``backoff_max``, plus up to ``backoff`` of jitter."""
        import inspect

        from tenacity import wait_exponential_jitter

        if "multiplier" in inspect.signature(wait_exponential_jitter.__init__).parameters:
            return wait_exponential_jitter(multiplier=self.backoff, max=self.backoff_max, jitter=self.backoff)
        return wait_exponential_jitter(initial=self.backoff, max=self.backoff_max, jitter=self.backoff)

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
        meta = _IndexMeta(schema, ftype, keys, dict(raw))
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
        body = mapping(self.adapter.engine, ftype, schema, prune=self.prune, dense_dims=self.dense_dims, version=self.version)
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
        if doc.source is not None:
            src["path"] = doc.source  # "path" is reserved in the schema; "source" may be user metadata
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
        src.pop("dense", None)
        return Document(hit["_id"], vectors, self._metadata_out(src, meta.schema), caption, source)

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
        tr = translate(req, engine=self.adapter.engine, field_type=meta.field_type, max_clauses=self.max_clauses, vocab=self.vocab)
        body = {"query": tr.query, "size": req.top_k, "track_total_hits": True,
                "_source": {"excludes": list(meta.schema.sparse_fields) + ["dense"]}}
        res = self._call("POST", self._path(index, "_search"), body, action=f"search {index!r}", index=index)
        hits = []
        for h in res.get("hits", {}).get("hits", []):
            src = h.get("_source") or {}
            hits.append(Hit(h["_id"], float(h.get("_score") or 0.0), self._metadata_out(src, meta.schema),
                            src.get("caption_text"), src.get("path")))
        total = res.get("hits", {}).get("total")
        total = total.get("value") if isinstance(total, Mapping) else total
        notes = list(req.notes) + tr.notes
        if meta.field_type == "sparse_vector" and self.adapter.engine == "opensearch":
            notes.append("OpenSearch seismic search is approximate on segments above its approximate_threshold")
        took = (time.perf_counter() - t0) * 1000  # end to end, as the user waits for it
        return SearchResult(hits, total, took, notes)

    def explain(self, index: str, doc_id: str, request: SearchRequest) -> Explanation:
        meta = self._meta(index)
        req = request.prepared(meta.schema, self.vocab)
        tr = translate(req, engine=self.adapter.engine, field_type=meta.field_type, max_clauses=self.max_clauses, vocab=self.vocab)
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
        if hits:
            score, matched = float(hits[0].get("_score") or 0.0), True
        else:
            score = float(sum(t.contribution for t in contributions))
            matched = False
            notes.append("the document does not match this query's filter (or shares no token with it); "
                         "the score shown is the sum of contributions")
        return Explanation(doc_id, score, contributions, matched, notes)

    def doc_freqs(self, index: str, field: str) -> tuple[np.ndarray, int]:
        """Exact document frequencies by scanning the field's stored feature maps (one pass, 1000 docs/page).

        Costs a full read of the index: fine for the CLI's IDF on small and medium indices.
        """
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        df = np.zeros(VOCAB_SIZE, dtype=np.int64)
        n = 0
        body = {"query": {"match_all": {}}, "size": 1000, "_source": [field], "sort": ["_doc"]}
        res = self._call("POST", self._path(index, "_search"), body, {"scroll": "2m"}, action=f"scan {index!r}", index=index)
        scroll_id = res.get("_scroll_id")
        try:
            while True:
                hits = res.get("hits", {}).get("hits", [])
                if not hits:
                    break
                for h in hits:
                    n += 1
                    feats = (h.get("_source") or {}).get(field)
                    if feats:
                        v = vector_from_features(feats, self.vocab, meta.keys)
                        df[v.ids] += 1
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
        return df, n


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
