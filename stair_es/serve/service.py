"""The work behind `stair-es serve`, without HTTP: encode, search, explain, thumbnails.

One :class:`Service` per server process holds the backend and every encoder it has built
(each model is loaded once, then shared by all requests), the image policy and the limits.
Query handling is the library's own (:func:`stair_es.search.make_request` with a
:class:`~stair_es.search.QuerySpec`); this module only encodes the query with a cached
encoder first so no request ever loads a model. It must not know FastAPI.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..backends.base import SearchBackend, get_backend
from ..backends.codec import feature_map
from ..encoders.base import Encoder, get_encoder
from ..errors import ImageError, InvalidInputError, StairError
from ..query import SearchRequest
from ..rerank import Planned, plan_many
from ..search import VERSIONED_ENCODERS, QuerySpec, encode_query_texts, make_request, query_encoder
from ..sparse import SparseVector
from ..vocab import default_vocabulary
from .clocks import thread_cpu_s
from .errors import ThumbnailUnavailable
from .inputs import ImagePolicy, open_image, text_or_image
from .security import ImageRoots

log = logging.getLogger(__name__)


def _env_number(name: str, default: float, kind: type = float) -> Any:
    """``$name`` as ``kind`` (int or float), or ``default`` when unset or blank."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return kind(value)
    except ValueError:
        what = "an integer; set a whole number" if kind is int else "a number; set a number"
        raise InvalidInputError(f"${name}={value!r} is not {what} or unset it") from None


def each_alone(items: Sequence[Any], batch: Callable[[list], Sequence[Any]], one: Callable[[Any], Any]) -> list[Any]:
    """``batch(items)``, one result per item; when it fails, ``one(item)`` for each item alone, so
    only the item that causes an error gets it (in its place) and the others go through."""
    try:
        return list(batch(list(items)))
    except Exception:  # noqa: BLE001 - find which item failed, and let the others through
        out: list[Any] = []
        for item in items:
            try:
                out.append(one(item))
            except Exception as e:  # noqa: BLE001 - handed back in that item's place
                out.append(e)
        return out


@dataclass
class ServeConfig:
    """Everything `stair-es serve` is started with (the API key is held, never logged)."""

    backend: str = "embedded"
    backend_options: dict[str, Any] = field(default_factory=dict)
    encoder: str = "default"  # for /v1/encode and the Elasticsearch/OpenSearch endpoints
    encoder_options: dict[str, Any] = field(default_factory=dict)
    # text searches' best hits re-ranked by meaning (stair_es.rerank): auto | semantic | off;
    # None: $STAIR_ES_RERANK, else auto (as `stair-es search`); a request's "rerank" overrides it
    rerank: str | None = None
    image_roots: Sequence[str] = ()
    allow_image_urls: bool = False
    allow_private_urls: bool = False  # image URLs may reach loopback/private/link-local/... addresses (trusted networks)
    api_key: str | None = field(default=None, repr=False)
    workers: int = 2  # encode/search calls running at once
    max_queue: int = 64  # requests waiting for a worker before the server answers 429 (stair_es.serve.admission)
    max_queue_ms: float | None = None  # 429 when the requests ahead would take longer than this to drain (None/0: off)
    # a request that has waited this long in the queue when its turn comes is answered 429 instead of run
    # (--queue-timeout-ms): after a stall the backlog is told to come back, not served late. "auto" (the
    # default): 20 ms, or 4 mean service times of its kind (search / the pool's work) when longer
    # (stair_es.serve.admission); a number of ms: fixed; None/0: off
    queue_timeout_ms: float | str | None = "auto"
    request_timeout: float | None = 30.0  # seconds to an answer; 504 beyond, queued work dropped (None/0: no limit)
    max_in_flight: int | None = None  # HTTP requests in the app at once (any route), 429 beyond; None: workers + max_queue + 64
    max_url_fetches: int = 4  # image URL fetches at once (their own threads, never the workers)
    url_timeout: float = 10.0  # seconds for one image URL fetch in total: connect, redirects, every byte
    header_timeout: float = 10.0  # seconds a client may take to send a request's headers (connection closed beyond)
    worker_nice: int = 5  # nice steps of the worker threads below the event loop's thread (Linux; 0: equal)
    # the event loop's thread's own nice value (Linux; 0: the process's; negative: ahead of the machine's
    # other processes, which needs root or CAP_SYS_NICE): $STAIR_ES_SERVE_LOOP_NICE
    loop_nice: int = field(default_factory=lambda: _env_number("STAIR_ES_SERVE_LOOP_NICE", 0, int))
    # the event loop's thread in the real-time class (SCHED_FIFO 1; Linux; root or CAP_SYS_NICE), so it runs at
    # once when it wakes instead of after the next scheduler tick: $STAIR_ES_SERVE_LOOP_REALTIME=1
    loop_realtime: bool = field(default_factory=lambda: bool(_env_number("STAIR_ES_SERVE_LOOP_REALTIME", 0, int)))
    max_body_bytes: int = 16 * 1024 * 1024
    max_image_bytes: int = 10 * 1024 * 1024
    max_inputs: int = 64  # inputs per encode call
    max_text_chars: int = 4096
    max_top_k: int = 1000  # hits per search
    # bounded work per request, checked before any work starts (see LIMITS and docs/serve.md)
    max_filters: int = 64  # `where` conditions per search
    max_clause_tokens: int = 1024  # `require` + `exclude` + `exclude_query` tokens per search
    max_query_tokens: int = 2048  # tokens in a query token map
    max_explain_hits: int = 100  # hits explained by one `explain: true` search
    body_timeout: float = 15.0  # seconds a client may take to send its request body
    default_index: str | None = None
    public_docs: bool = False  # with an API key: /docs, /redoc, /openapi.json open to all (--public-docs)
    bind_host: str = "127.0.0.1"  # with localhost, 127.0.0.1 and [::1], the Host names answered
    allowed_hosts: Sequence[str] = ()  # more Host names (--allowed-host); "*": any
    load_encoder_at_start: bool = True
    # /v1/search through one FIFO queue, prepared in batches, searched on `workers` threads
    # (stair_es.serve.batching); "auto" = on for the embedded engine only, the one measured
    batching: str = "auto"
    max_batch: int = 16  # searches prepared together (their query texts encoded in one call)
    batch_window_ms: float = 0.0  # how long the first search of a batch waits for others (0: take what waits)
    debug_stats: bool = False  # GET /debug/stats: where the recent requests' time went (stair_es.serve.stats)

    def batches_searches(self, in_process: bool) -> bool:
        """Whether /v1/search goes through the batching queue, for a backend that searches
        ``in_process`` (:attr:`SearchBackend.in_process`) or not."""
        if self.batching not in ("auto", "on", "off"):
            raise InvalidInputError(f"batching {self.batching!r}: use auto, on or off")
        return self.batching == "on" or (self.batching == "auto" and in_process)

    def in_flight_limit(self) -> int:
        """HTTP requests the app holds at once, on any route (429 beyond)."""
        return self.max_in_flight or self.workers + self.max_queue + 64

    def describe(self) -> dict[str, Any]:
        """For logs and /readyz: no key, no backend credentials."""
        return {"backend": self.backend, "encoder": self.encoder, "image_roots": [str(r) for r in self.image_roots],
                "allow_image_urls": self.allow_image_urls, "allow_private_urls": self.allow_private_urls, "workers": self.workers, "api_key": bool(self.api_key),
                "max_queue": self.max_queue, "max_queue_ms": self.max_queue_ms, "queue_timeout_ms": self.queue_timeout_ms, "request_timeout": self.request_timeout,
                "max_body_bytes": self.max_body_bytes, "max_inputs": self.max_inputs, "batching": self.batching,
                "max_batch": self.max_batch, "batch_window_ms": self.batch_window_ms, "rerank": self.rerank}


#: An absolute POSIX path of two or more components (not inside a URL).
_ABS_PATH = re.compile(r"(?<![\w.:/~])(/(?:[^\s'\"/]+/)+[^\s'\",;)]*)")

#: The per-request limits: (config field, CLI option, what it bounds). docs/serve.md has the same table.
LIMITS: list[tuple[str, str, str]] = [
    ("max_filters", "--max-filters", "`where` conditions per search or explain"),
    ("max_clause_tokens", "--max-clause-tokens", "`require` + `exclude` + `exclude_query` tokens per search or explain"),
    ("max_query_tokens", "--max-query-tokens", "tokens in a query token map (`tokens`)"),
    ("max_top_k", "--max-top-k", "hits per search (`top_k`)"),
    ("max_explain_hits", "--max-explain-hits", "hits of one `explain: true` search"),
    ("max_text_chars", "--max-text-chars", "characters of a text (query, encode input, `expr`)"),
    ("max_inputs", "--max-inputs", "inputs per encode call (also the Elasticsearch/OpenSearch endpoints)"),
]


class LimitExceededError(InvalidInputError):
    """A request asks for more work than the server's per-request limits allow."""


@dataclass
class PreparedSearch:
    """One search body made ready for the backend (query encoded, filters parsed)."""

    index: str
    request: SearchRequest
    qvec: SparseVector
    notes: list[str]
    explain: bool = False
    #: the widened request and the re-ranking of its hits by meaning (stair_es.rerank), or None
    planned: Planned | None = None

    @property
    def search_request(self) -> SearchRequest:
        """What the backend searches: ``request``, widened when its hits are re-ranked (explain
        keeps ``request``: the hit's own tokens against the query's)."""
        return self.planned.request if self.planned is not None else self.request

    def finish(self, backend: SearchBackend, result):
        return self.planned.finish(backend, self.index, result) if self.planned is not None else result


#: On a backend without commit generations (a cluster), how long the server uses an index's
#: schema and document frequencies before asking again: there they are a scan of the whole
#: index, which every text query needs (IDF, words grounded on the index's).
UNVERSIONED_TTL_S = 60.0


class _CommitCache:
    """The backend as query preparation sees it. On backends that report a commit generation
    (the embedded engine), ``index_info`` and ``doc_freqs`` are remembered until the index
    changes, so a search neither re-lists the index folder for its schema nor recounts the
    document frequencies of a whole index for IDF. Other backends (a cluster, where counting
    them is a scan of the index) are asked again after :data:`UNVERSIONED_TTL_S` seconds."""

    def __init__(self, backend: SearchBackend):
        self._backend = backend
        self._generation = backend.generation  # None for a backend without commit generations
        self._info: dict[str, tuple[int, Any]] = {}
        self._df: dict[tuple[str, str], tuple[int, Any]] = {}
        self._pinned = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @contextmanager
    def pinned(self):
        """Within: each index's generation is read once (one batch of searches sees one commit)."""
        self._pinned.gens = {}
        try:
            yield
        finally:
            self._pinned.gens = None

    def _remembered(self, memo: dict, key: Any, index: str, compute):
        gens = getattr(self._pinned, "gens", None)
        gen = gens.get(index) if gens is not None else None
        if gen is None:
            gen = self._generation(index)  # a stat() of the manifest
            if gen is None:  # no commits to follow: remembered for a while (negative: never a generation)
                gen = -1 - int(time.monotonic() // UNVERSIONED_TTL_S)
            if gens is not None:
                gens[index] = gen
        hit = memo.get(key)
        if hit is not None and hit[0] == gen:
            return hit[1]
        value = compute()
        memo[key] = (gen, value)  # if a commit landed meanwhile, the next call sees a newer generation
        return value

    def index_info(self, index: str):
        return self._remembered(self._info, index, index, lambda: self._backend.index_info(index))

    def doc_freqs(self, index: str, field: str):
        return self._remembered(self._df, (index, field), index, lambda: self._backend.doc_freqs(index, field))


class Service:
    def __init__(self, config: ServeConfig, backend: SearchBackend | None = None):
        self.config = config
        self.backend = backend if backend is not None else get_backend(config.backend, **config.backend_options)
        self._commits = _CommitCache(self.backend)
        self.policy = ImagePolicy(ImageRoots(config.image_roots), allow_urls=config.allow_image_urls,
                                  allow_private_urls=config.allow_private_urls,
                                  max_image_bytes=config.max_image_bytes)
        self._lock = threading.Lock()
        self._encoders: dict[str, Encoder] = {}
        self._thumbnail = functools.lru_cache(maxsize=512)(self._jpeg)  # the last 512 thumbnails made

    # --- models (each built once) --------------------------------------------------------------
    def _cached(self, key: str, build) -> Encoder:
        enc = self._encoders.get(key)
        if enc is None:
            with self._lock:
                enc = self._encoders.get(key)
                if enc is None:
                    enc = build()
                    self._encoders[key] = enc
        return enc

    def encoder(self) -> Encoder:
        """The configured encoder of /v1/encode and the cluster endpoints."""
        key = "encode:" + json.dumps([self.config.encoder, self.config.encoder_options], sort_keys=True, default=str)
        enc = self._cached(key, lambda: get_encoder(self.config.encoder, **self.config.encoder_options))
        # an index recorded with the same config queries with this very instance (no second copy of the model)
        self._encoders.setdefault(self._config_key(enc.config()), enc)
        return enc

    @staticmethod
    def _config_key(config: Mapping[str, Any] | None) -> str:
        return "config:" + json.dumps(config, sort_keys=True, default=str)

    def query_encoder(self, index: str, force: bool = False) -> Encoder:
        """The encoder an index's queries use (the one recorded at ingest), built once per config."""
        schema = self._commits.index_info(index).schema
        options: dict[str, Any] = {}
        if force and (schema.encoder or {}).get("name") in VERSIONED_ENCODERS:
            options["allow_version_mismatch"] = True
        key = self._config_key({**(schema.encoder or {}), **options})
        return self._cached(key, lambda: query_encoder(schema, None, **options))

    def warm_up(self) -> None:
        """Build the encoder and run it once on a text and a small image: encoders that load their
        towers (ONNX sessions, weights) on first use then do it now, not in the first request."""
        enc = self.encoder()
        if "text" in enc.modalities:
            enc.encode_texts(["warm up"])
        if "image" in enc.modalities:
            from PIL import Image

            enc.encode_images([Image.new("RGB", (64, 64), (128, 128, 128))])

    def warm_indices(self) -> None:
        """Open every index and run one text query on it: its query encoder loads and the
        engine's kernels are ready before the first client asks. An index that cannot take a
        text query (precomputed vectors, a missing model) is logged and left for later."""
        for info in self.indices():
            if "error" in info:
                log.warning("index %s: %s", info["name"], info["error"])
                continue
            try:
                self.search({"index": info["name"], "text": "warm up", "top_k": 1})
                if self.backend.in_process:  # document frequencies are cheap here, not on a cluster
                    # a query that matches documents, so the engine's kernels load too (a query
                    # matching nothing returns before them)
                    field_ = info["sparse_fields"][0]
                    df, _ = self.backend.doc_freqs(info["name"], field_)
                    common = [int(i) for i in df.argsort()[-8:] if df[i] > 0]
                    if common:
                        tokens = {default_vocabulary().tokens[i]: 1.0 for i in common}
                        self.search({"index": info["name"], "tokens": tokens, "top_k": 1, "token_field": field_})
            except StairError as e:
                log.info("index %s not warmed up: %s", info["name"], e)
            except Exception as e:  # noqa: BLE001 - a warm-up failure must not stop the server; requests will say why
                log.warning("index %s not warmed up: %s: %s", info["name"], type(e).__name__, e)

    def loaded_models(self) -> list[str]:
        """One name per loaded encoder instance."""
        return sorted(e.name for e in {id(e): e for e in self._encoders.values()}.values())

    # --- encode ----------------------------------------------------------------------------------
    def encode(self, items: Sequence[Mapping[str, Any]], top_k: int | None = None) -> list[dict[str, Any]]:
        """``items``: ``{"text": ...}`` or ``{"image": {"path"|"base64"|"url": ...}}``; one result each, in order.

        Texts are encoded in one batch and images in one batch (the encoder's batching)."""
        pairs = [("text", it["text"]) if it.get("text") is not None else ("image", it.get("image")) for it in items]
        vectors = self.encode_vectors(pairs)
        return [{"kind": kind, "nnz": v.nnz, "tokens": v.to_token_map(top_k)} for (kind, _), v in zip(pairs, vectors)]

    def encode_vectors(self, items: Sequence[tuple[str, Any]]) -> list[SparseVector]:
        if len(items) > self.config.max_inputs:
            raise InvalidInputError(f"{len(items)} inputs in one request; send at most {self.config.max_inputs} "
                                    "(split the batch)")
        if not items:
            raise InvalidInputError("no inputs: send at least one text or image")
        enc = self.encoder()
        texts: list[tuple[int, str]] = []
        images: list[tuple[int, Any]] = []
        for i, (kind, value) in enumerate(items):
            if kind == "text":
                if not isinstance(value, str) or not value.strip():
                    raise InvalidInputError(f"input {i}: the text is empty")
                if len(value) > self.config.max_text_chars:
                    raise InvalidInputError(f"input {i}: text of {len(value)} characters; the limit is "
                                            f"{self.config.max_text_chars}")
                texts.append((i, value))
            else:
                if "image" not in enc.modalities:
                    raise InvalidInputError(f"input {i}: the {enc.name!r} encoder does not encode images")
                if not isinstance(value, Mapping):
                    raise InvalidInputError(f"input {i}: an image is an object with 'path', 'base64' or 'url'")
                try:
                    images.append((i, open_image(dict(value), self.policy, getattr(enc, "image_min_side", None))))
                except InvalidInputError as e:  # ImageError, PathNotAllowedError...: name the input
                    raise type(e)(f"input {i}: {e}") from None
        out: list[SparseVector | None] = [None] * len(items)
        if texts:
            if "text" not in enc.modalities:
                raise InvalidInputError(f"the {enc.name!r} encoder does not encode texts")
            for (i, _), v in zip(texts, enc.encode_texts([t for _, t in texts])):
                out[i] = v
        if images:
            for (i, _), v in zip(images, enc.encode_images([im for _, im in images])):
                out[i] = v
        return out  # type: ignore[return-value]

    # --- Elasticsearch / OpenSearch inference shapes -------------------------------------------
    def cluster_inputs(self, inputs: Any, kind: str) -> list[tuple[str, Any]]:
        """The inputs of an Elasticsearch/OpenSearch call as ("text", str) / ("image", ref) pairs
        (checked and capped; nothing is read or fetched yet)."""
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list):
            raise InvalidInputError("'input' must be a string or a list of strings")
        self.check_count("max_inputs", len(inputs), "input: inputs")
        if kind not in ("text", "image", "auto"):
            raise InvalidInputError(f"kind {kind!r}: use text, image or auto")
        return [text_or_image(s, kind, self.policy) for s in inputs]

    def es_sparse_embedding(self, inputs: Any, kind: str = "text", items: list[tuple[str, Any]] | None = None
                            ) -> dict[str, Any]:
        """The response the Elasticsearch `custom` service reads with
        ``token_path $.result.sparse_embeddings[*].embedding[*].token`` and
        ``weight_path $.result.sparse_embeddings[*].embedding[*].weight`` (lists, not maps:
        its json_parser does not read maps). Tokens are the backends' feature names."""
        vectors = self.encode_vectors(items if items is not None else self.cluster_inputs(inputs, kind))
        return {"result": {"sparse_embeddings": [
            {"index": i, "embedding": [{"token": t, "weight": w} for t, w in feature_map(v, "token").items()]}
            for i, v in enumerate(vectors)]}}

    def os_sparse_encoding(self, inputs: Any, kind: str = "text", keys: str = "token",
                           items: list[tuple[str, Any]] | None = None) -> list[dict[str, float]]:
        """One ``{token: weight}`` map per input (``keys="id"``: token ids, for seismic ``sparse_vector``):
        the top-level JSON array that ml-commons hands to ``sparse_encoding`` as ``response``."""
        if keys not in ("token", "id"):
            raise InvalidInputError(f"keys {keys!r}: use token or id")
        pairs = items if items is not None else self.cluster_inputs(inputs, kind)
        return [feature_map(v, keys) for v in self.encode_vectors(pairs)]

    # --- search / explain ------------------------------------------------------------------------
    def check_count(self, field_: str, n: int, what: str) -> None:
        limit = getattr(self.config, field_)
        if n > limit:
            option = next(o for f, o, _ in LIMITS if f == field_)
            raise LimitExceededError(f"{what}: {n}; the limit is {limit} per request ({option}); send fewer")

    def check_limits(self, body: Mapping[str, Any]) -> None:
        """Refuses a search/explain body that asks for more than the per-request limits, before
        any work is done (only lengths are read)."""
        def count(v: Any) -> int:
            return len(v) if isinstance(v, (list, tuple, dict, str)) else 0

        self.check_count("max_filters", count(body.get("where")), "where: filters")
        self.check_count("max_clause_tokens", sum(count(body.get(k)) for k in ("require", "exclude", "exclude_query")),
                   "require + exclude + exclude_query: tokens")
        self.check_count("max_query_tokens", count(body.get("tokens")), "tokens: entries in the token map")
        top_k = body.get("top_k", 10)
        if isinstance(top_k, int):
            self.check_count("max_top_k", top_k, "top_k")
            if body.get("explain"):
                self.check_count("max_explain_hits", top_k, "explain: hits to explain (top_k)")
        self.check_count("max_text_chars", count(body.get("expr")), "expr: characters")

    def _query(self, body: Mapping[str, Any]) -> tuple[str, str, Any, bool]:
        """Checks a search body: (index, kind "text" | "tokens" | "image", the query, force)."""
        self.check_limits(body)
        index = body.get("index") or self.config.default_index
        if not index:
            raise InvalidInputError("no index: give 'index' (see GET /v1/indices)")
        top_k = int(body.get("top_k", 10))
        if not 1 <= top_k <= self.config.max_top_k:
            raise InvalidInputError(f"top_k {top_k}: use 1..{self.config.max_top_k}")
        text, tokens, image = body.get("text"), body.get("tokens"), body.get("image")
        given = [x for x in (text, tokens) if x not in (None, "")] + ([image] if image is not None else [])
        if len(given) != 1:
            raise InvalidInputError("give one query: 'text', 'tokens' (a token map) or 'image' (path, base64 or url)")
        force = bool(body.get("force", False))
        if text is not None and text != "":
            if not isinstance(text, str) or not text.strip():
                raise InvalidInputError("the query text is empty")
            if len(text) > self.config.max_text_chars:
                raise InvalidInputError(f"the query text has {len(text)} characters; the limit is {self.config.max_text_chars}")
            return index, "text", text, force
        if image is not None:
            return index, "image", image, force
        return index, "tokens", tokens, force

    def _spec_of(self, body: Mapping[str, Any], tokens: Mapping[str, float]) -> QuerySpec:
        return QuerySpec(
            tokens=tokens, wheres=tuple(body.get("where") or ()), requires=tuple(body.get("require") or ()),
            require_all=bool(body.get("require_all", False)), excludes=tuple(body.get("exclude") or ()),
            query_excludes=tuple(body.get("exclude_query") or ()), expr=body.get("expr") or None,
            token_field=body.get("token_field") or "image", caption_weight=float(body.get("caption_weight", 0.5)),
            image_weight=float(body.get("image_weight", 1.0)), top_k=int(body.get("top_k", 10)),
            query_top_k=body.get("query_top_k"), min_weight=body.get("min_weight"), force=bool(body.get("force", False)))

    def prepare_searches(self, bodies: Sequence[Mapping[str, Any]]) -> list[PreparedSearch | Exception]:
        """Each body as a prepared request, or the error that body alone caused (in order).

        Query texts for the same index are encoded in one call of its query encoder (a model
        encodes a batch faster than its texts one by one); IDF weights and index schemas come
        from :class:`_CommitCache`, so no request recounts document frequencies."""
        with self._commits.pinned():
            return self._prepare(bodies)

    def _prepare(self, bodies: Sequence[Mapping[str, Any]]) -> list[PreparedSearch | Exception]:
        out: list[PreparedSearch | Exception | None] = [None] * len(bodies)
        checked: list[tuple[int, str, str, Any, bool, list[str], Encoder | None]] = []
        for i, body in enumerate(bodies):
            try:
                index, kind, query, force = self._query(body)
                enc = self.query_encoder(index, force) if kind != "tokens" else None
                checked.append((i, index, kind, query, force, [], enc))
            except Exception as e:  # noqa: BLE001 - this body's error, handed back to its request
                out[i] = e
        tokens: dict[int, Mapping[str, float]] = {}
        texts: dict[tuple[str, int], list[tuple[int, str, list[str]]]] = {}
        for i, index, kind, query, _, notes, enc in checked:
            if kind == "tokens":
                tokens[i] = query
            elif kind == "text":
                texts.setdefault((index, id(enc)), []).append((i, query, notes))
            else:
                try:
                    tokens[i] = self._image_query(enc, query)
                except Exception as e:  # noqa: BLE001
                    out[i] = e
        encoders = {(index, id(enc)): enc for _, index, kind, _, _, _, enc in checked if kind == "text"}
        grounding: dict[int, list[dict[str, Any]]] = {}
        freqs: dict[int, Any] = {}  # the document frequencies a text was encoded with, for its re-ranking

        def encode(enc: Encoder, index: str, part: list[tuple[int, str, list[str]]]) -> list:
            notes: list[str] = []
            read: dict[str, Any] = {}
            encoded = encode_query_texts(enc, [t for _, t, _ in part], self._commits, index, notes=notes, freqs_out=read)
            for (i, _, n), q in zip(part, encoded):
                tokens[i] = q.vector.to_token_map()
                grounding[i] = [step.to_dict() for step in q.grounding]
                freqs[i] = read.get("doc_freqs")
                n.extend(notes)
            return part

        for (index, key), group in texts.items():
            # one call of the encoder per index: words grounded on the index's, IDF, as `stair-es search`;
            # when it fails (e.g. one text with nothing to search here), each text alone
            enc = encoders[(index, key)]
            for (i, _, _), done in zip(group, each_alone(group, lambda part: encode(enc, index, part),
                                                         lambda one: encode(enc, index, [one])[0])):
                if isinstance(done, Exception):
                    out[i] = done
        ready: list[tuple[int, str, SearchRequest, str | None, Any]] = []
        for i, index, kind, query, _, notes, _ in checked:
            if out[i] is not None:
                continue
            try:
                request, qvec = make_request(self._commits, index, self._spec_of(bodies[i], tokens[i]))
                request.grounding, request.doc_freqs = grounding.get(i, []), freqs.get(i)
                out[i] = PreparedSearch(index, request, qvec, notes, bool(bodies[i].get("explain")))
                ready.append((i, index, request, query if kind == "text" else None,
                              bodies[i].get("rerank") or self.config.rerank))
            except Exception as e:  # noqa: BLE001
                out[i] = e
        self._plan_reranking(out, ready)
        return out  # type: ignore[return-value]

    def _plan_reranking(self, out: list, ready: list[tuple[int, str, SearchRequest, str | None, Any]]) -> None:
        """Text queries' best hits re-ranked by meaning, as `stair-es search --rerank`; a request
        whose re-ranking fails gets that error alone."""
        plans = each_alone([r[1:] for r in ready], lambda rs: plan_many(self._commits, rs),
                           lambda r: plan_many(self._commits, [r])[0])
        for (i, *_), planned in zip(ready, plans):
            if isinstance(planned, Exception):
                out[i] = planned
            else:
                out[i].planned = planned

    def _image_query(self, enc: Encoder, image: Any) -> dict[str, float]:
        if "image" not in enc.modalities:
            raise InvalidInputError(f"the {enc.name!r} encoder does not encode images; query by image needs the "
                                    "index's image encoder")
        img = open_image(dict(image), self.policy, getattr(enc, "image_min_side", None))
        vec = enc.encode_images([img])[0]
        if not vec.nnz:
            raise InvalidInputError("the image gives no tokens to search with")
        return vec.to_token_map()

    def search_many(self, bodies: Sequence[Mapping[str, Any]], *, threads: int | None = None) -> list[dict[str, Any] | Exception]:
        """The answers of several searches, each a result dict or the error of that search alone.

        Requests on the same index go to the backend in one ``search_batch`` call (the embedded
        engine runs them on ``threads`` threads without the GIL); a batch that fails is retried
        one by one, so a bad request never fails the others."""
        prepared = self.prepare_searches(bodies)
        out: list[dict[str, Any] | Exception] = [p for p in prepared]  # type: ignore[misc]
        by_index: dict[str, list[int]] = {}
        for i, p in enumerate(prepared):
            if isinstance(p, PreparedSearch):
                by_index.setdefault(p.index, []).append(i)
        for index, idxs in by_index.items():
            reqs = [prepared[i].search_request for i in idxs]  # type: ignore[union-attr]
            results = each_alone(reqs, lambda rs: self.backend.search_batch(index, rs, threads=threads),
                                 lambda r: self.backend.search(index, r))
            for i, res in zip(idxs, results):
                if isinstance(res, Exception):
                    out[i] = res
                    continue
                try:
                    out[i] = self._answer(prepared[i], prepared[i].finish(self.backend, res))  # type: ignore[union-attr]
                except Exception as e:  # noqa: BLE001
                    out[i] = e
        return out

    def run_search_json(self, p: PreparedSearch, dumps) -> tuple[bytes, tuple[float, float, float, float]]:
        """The answer of one prepared search as JSON (``dumps``), made on the calling thread, and
        where its time went (seconds): the backend's search (wall, this thread's CPU) and the
        answer's dicts and JSON (wall, CPU). Wall minus CPU is time the thread waited, for the
        GIL or for a core."""
        t0, c0 = time.perf_counter(), thread_cpu_s()  # not time.thread_time(): see .clocks
        result = p.finish(self.backend, self.backend.search(p.index, p.search_request))
        t1, c1 = time.perf_counter(), thread_cpu_s()
        payload = dumps(self._answer(p, result))
        t2, c2 = time.perf_counter(), thread_cpu_s()
        return payload, (t1 - t0, c1 - c0, t2 - t1, c2 - c1)

    # --- what leaves the server: no absolute server paths ------------------------------------------
    @functools.cached_property
    def _server_paths(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        home = getattr(self.backend, "home", None) or self.config.backend_options.get("home")
        for given, label in [(home, "<index home>")] + [(r, "<image root>") for r in self.config.image_roots]:
            if not given:
                continue
            for form in {str(Path(given)), str(Path(given).expanduser().resolve())}:
                if form not in ("/", "."):
                    found.append((form.rstrip("/"), label))
        return sorted(set(found), key=lambda x: -len(x[0]))  # longest first

    def scrub(self, message: str) -> str:
        """``message`` with the server's paths replaced: index home and image roots by a label,
        any other absolute path by its last component."""
        for path, label in self._server_paths:
            message = message.replace(path, label)
        return _ABS_PATH.sub(lambda m: m.group(1).rsplit("/", 1)[-1] or m.group(1), message)

    def public_source(self, source: Any) -> Any:
        """A hit's ``source`` as clients see it: a file path relative to its image root, or its
        file name when outside every root; URLs and other values as they are."""
        if not isinstance(source, str) or not source.startswith("/"):
            return source
        for root in self.policy.roots.roots:
            try:
                return str(Path(source).relative_to(root))
            except ValueError:
                pass
            try:
                return str(Path(source).resolve().relative_to(root))
            except (ValueError, OSError, RuntimeError):
                pass
        return Path(source).name

    def _answer(self, p: PreparedSearch, result) -> dict[str, Any]:
        data = result.to_dict()
        for h in data["hits"]:
            if "source" in h:
                h["source"] = self.public_source(h["source"])
        data["notes"] = p.notes + data["notes"]
        data["index"] = p.index
        data["query_tokens"] = p.qvec.to_token_map(50)
        data["grounding"] = p.request.grounding
        if p.explain:
            for h in data["hits"]:
                h["explanation"] = self.backend.explain(p.index, h["id"], p.request).to_dict()
        return data

    def search(self, body: Mapping[str, Any]) -> dict[str, Any]:
        res = self.search_many([body])[0]
        if isinstance(res, Exception):
            raise res
        return res

    def explain(self, body: Mapping[str, Any]) -> dict[str, Any]:
        doc_id = body.get("id")
        if not isinstance(doc_id, str) or not doc_id:
            raise InvalidInputError("give the document 'id' to explain")
        p = self.prepare_searches([{**body, "rerank": "off"}])[0]  # (explain scores the sparse request)
        if isinstance(p, Exception):
            raise p
        data = self.backend.explain(p.index, doc_id, p.request).to_dict()
        return {**data, "notes": p.notes + data["notes"]}

    # --- indices, thumbnails, health -------------------------------------------------------------
    def indices(self) -> list[dict[str, Any]]:
        out = []
        for name in self.backend.list_indices():
            try:
                info = self.backend.index_info(name)
            except StairError as e:  # a damaged index is listed with its error, not hidden
                out.append({"name": name, "error": self.scrub(str(e))})
                continue
            out.append({"name": name, "doc_count": info.doc_count, "fields": info.schema.fields,
                        "sparse_fields": list(info.schema.sparse_fields),
                        "encoder": (info.schema.encoder or {}).get("name")})
        return out

    def _image_file(self, index: str, doc_id: str) -> Path:
        """The file of a document's source image, if it lies under an image root."""
        doc = self.backend.get(index, doc_id)
        real = self.policy.roots.contains(doc.source) if doc.source and self.policy.roots else None
        if real is None:
            raise ThumbnailUnavailable(f"document {doc_id!r} has no image under this server's image roots")
        return real

    def thumbnail(self, index: str, doc_id: str, size: int = 256) -> bytes:
        """A JPEG of a document's source image, if that file lies under an image root."""
        return self._thumbnail(index, doc_id, max(32, min(int(size), 1024)))

    def _jpeg(self, index: str, doc_id: str, size: int) -> bytes:
        real = self._image_file(index, doc_id)
        from ..images import load_image

        try:
            img = load_image(real, target_max_side=size)
        except ImageError:
            raise ImageError(f"the image of document {doc_id!r} cannot be decoded") from None
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=82)
        return buf.getvalue()

    def heatmap(self, index: str, doc_id: str, query: str, size: int = 256, alpha: float = 0.5) -> bytes:
        """A PNG of a document's image with the STAIR localisation of ``query`` laid over it
        (section 7.2 of the paper): only for indices built with the ``stair`` encoder."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("give the query text ('q') whose tokens to localise")
        if len(query) > self.config.max_text_chars:
            raise InvalidInputError(f"the query text has {len(query)} characters; the limit is {self.config.max_text_chars}")
        enc = self.query_encoder(index)
        model = getattr(enc, "model", None)
        if enc.name != "stair" or not hasattr(model, "patch_activations"):
            raise InvalidInputError(f"the heatmap needs an index built with the stair encoder (a STAIR model); "
                                    f"index {index!r} uses {enc.name!r}")
        if getattr(model, "head", "stair") != "stair":
            raise InvalidInputError(f"the heatmap needs a model with the stair head; index {index!r} uses a {model.head!r} model")
        real = self._image_file(index, doc_id)
        from ..images import load_image
        from ..stair.localize import localize, overlay

        size = max(32, min(int(size), 1024))
        img = load_image(real, target_max_side=size)
        out = overlay(img, localize(model, img, query), alpha)
        buf = io.BytesIO()
        out.save(buf, "PNG")
        return buf.getvalue()

    def ready(self) -> dict[str, Any]:
        """Raises if the backend cannot list its indices or the encoder cannot be built."""
        self.backend.list_indices()
        self.encoder()
        d = self.config.describe()
        d["image_roots"] = len(d["image_roots"])  # how many, never where
        return {"status": "ready", "models": self.loaded_models(), **d}

    def close(self) -> None:
        self.backend.close()

