"""The work behind `stair-es serve`, without HTTP: encode, search, explain, thumbnails.

One :class:`Service` per server process holds the backend and every encoder it has built
(each model is loaded once, then shared by all requests), the image policy and the limits.
Query handling is the library's own (:func:`stair_es.search.make_request` with a
:class:`~stair_es.search.QuerySpec`); this module only encodes the query with a cached
encoder first so no request ever loads a model. It must not know FastAPI.
"""

from __future__ import annotations

import io
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ..backends.base import SearchBackend, get_backend
from ..backends.codec import feature_map
from ..encoders.base import Encoder, get_encoder
from ..errors import ImageError, InvalidInputError, StairError
from ..search import VERSIONED_ENCODERS, QuerySpec, encode_query_text, make_request, query_encoder
from ..sparse import SparseVector
from ..vocab import default_vocabulary
from .inputs import ImagePolicy, open_image, text_or_image
from .security import ImageRoots

log = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """Everything `stair-es serve` is started with (the API key is held, never logged)."""

    backend: str = "embedded"
    backend_options: dict[str, Any] = field(default_factory=dict)
    encoder: str = "default"  # for /v1/encode and the Elasticsearch/OpenSearch endpoints
    encoder_options: dict[str, Any] = field(default_factory=dict)
    image_roots: Sequence[str] = ()
    allow_image_urls: bool = False
    api_key: str | None = field(default=None, repr=False)
    workers: int = 2  # encode/search calls running at once
    max_queue: int = 64  # requests waiting for a worker before the server answers 503
    max_body_bytes: int = 16 * 1024 * 1024
    max_image_bytes: int = 10 * 1024 * 1024
    max_inputs: int = 64  # inputs per encode call
    max_text_chars: int = 4096
    max_top_k: int = 1000
    body_timeout: float = 15.0  # seconds a client may take to send its request body
    default_index: str | None = None
    load_encoder_at_start: bool = True

    def describe(self) -> dict[str, Any]:
        """For logs and /readyz: no key, no backend credentials."""
        return {"backend": self.backend, "encoder": self.encoder, "image_roots": [str(r) for r in self.image_roots],
                "allow_image_urls": self.allow_image_urls, "workers": self.workers, "api_key": bool(self.api_key),
                "max_body_bytes": self.max_body_bytes, "max_inputs": self.max_inputs}


class Service:
    def __init__(self, config: ServeConfig, backend: SearchBackend | None = None):
        self.config = config
        self.backend = backend if backend is not None else get_backend(config.backend, **config.backend_options)
        self.policy = ImagePolicy(ImageRoots(config.image_roots), allow_urls=config.allow_image_urls,
                                  max_image_bytes=config.max_image_bytes)
        self._lock = threading.Lock()
        self._encoders: dict[str, Encoder] = {}
        self._thumbs: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._thumb_lock = threading.Lock()

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
        schema = self.backend.index_info(index).schema
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
                if self.backend.name == "embedded":  # document frequencies are cheap here, not on a cluster
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
    def _cluster_inputs(self, inputs: Any, kind: str) -> list[tuple[str, Any]]:
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list):
            raise InvalidInputError("'input' must be a string or a list of strings")
        if kind not in ("text", "image", "auto"):
            raise InvalidInputError(f"kind {kind!r}: use text, image or auto")
        return [text_or_image(s, kind, self.policy) for s in inputs]

    def es_sparse_embedding(self, inputs: Any, kind: str = "text") -> dict[str, Any]:
        """The response the Elasticsearch `custom` service reads with
        ``token_path $.result.sparse_embeddings[*].embedding[*].token`` and
        ``weight_path $.result.sparse_embeddings[*].embedding[*].weight`` (lists, not maps:
        its json_parser does not read maps). Tokens are the backends' feature names."""
        vectors = self.encode_vectors(self._cluster_inputs(inputs, kind))
        return {"result": {"sparse_embeddings": [
            {"index": i, "embedding": [{"token": t, "weight": w} for t, w in feature_map(v, "token").items()]}
            for i, v in enumerate(vectors)]}}

    def os_sparse_encoding(self, inputs: Any, kind: str = "text", keys: str = "token") -> list[dict[str, float]]:
        """One ``{token: weight}`` map per input (``keys="id"``: token ids, for seismic ``sparse_vector``):
        the top-level JSON array that ml-commons hands to ``sparse_encoding`` as ``response``."""
        if keys not in ("token", "id"):
            raise InvalidInputError(f"keys {keys!r}: use token or id")
        return [feature_map(v, keys) for v in self.encode_vectors(self._cluster_inputs(inputs, kind))]

    # --- search / explain ------------------------------------------------------------------------
    def _spec(self, body: Mapping[str, Any]) -> tuple[str, QuerySpec, list[str]]:
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
        notes: list[str] = []
        force = bool(body.get("force", False))
        if text is not None and text != "":
            if len(text) > self.config.max_text_chars:
                raise InvalidInputError(f"the query text has {len(text)} characters; the limit is {self.config.max_text_chars}")
            enc = self.query_encoder(index, force)
            tokens = encode_query_text(enc, text, self.backend, index, field="image", notes=notes).to_token_map()
        elif image is not None:
            enc = self.query_encoder(index, force)
            if "image" not in enc.modalities:
                raise InvalidInputError(f"the {enc.name!r} encoder does not encode images; query by image needs the "
                                        "index's image encoder")
            img = open_image(dict(image), self.policy, getattr(enc, "image_min_side", None))
            vec = enc.encode_images([img])[0]
            if not vec.nnz:
                raise InvalidInputError("the image gives no tokens to search with")
            tokens = vec.to_token_map()
        spec = QuerySpec(
            tokens=tokens, wheres=tuple(body.get("where") or ()), requires=tuple(body.get("require") or ()),
            require_all=bool(body.get("require_all", False)), excludes=tuple(body.get("exclude") or ()),
            query_excludes=tuple(body.get("exclude_query") or ()), expr=body.get("expr") or None,
            token_field=body.get("token_field") or "image", caption_weight=float(body.get("caption_weight", 0.5)),
            image_weight=float(body.get("image_weight", 1.0)), top_k=top_k, query_top_k=body.get("query_top_k"),
            min_weight=body.get("min_weight"), force=force)
        return index, spec, notes

    def search(self, body: Mapping[str, Any]) -> dict[str, Any]:
        index, spec, notes = self._spec(body)
        request, qvec = make_request(self.backend, index, spec)
        result = self.backend.search(index, request)
        data = result.to_dict()
        data["notes"] = notes + data["notes"]
        data["index"] = index
        data["query_tokens"] = qvec.to_token_map(50)
        if body.get("explain"):
            for h in data["hits"]:
                h["explanation"] = self.backend.explain(index, h["id"], request).to_dict()
        return data

    def explain(self, body: Mapping[str, Any]) -> dict[str, Any]:
        doc_id = body.get("id")
        if not isinstance(doc_id, str) or not doc_id:
            raise InvalidInputError("give the document 'id' to explain")
        index, spec, notes = self._spec(body)
        request, _ = make_request(self.backend, index, spec)
        data = self.backend.explain(index, doc_id, request).to_dict()
        data["notes"] = notes + data["notes"]
        return data

    # --- indices, thumbnails, health -------------------------------------------------------------
    def indices(self) -> list[dict[str, Any]]:
        out = []
        for name in self.backend.list_indices():
            try:
                info = self.backend.index_info(name)
            except StairError as e:  # a damaged index is listed with its error, not hidden
                out.append({"name": name, "error": str(e)})
                continue
            out.append({"name": name, "doc_count": info.doc_count, "fields": info.schema.fields,
                        "sparse_fields": list(info.schema.sparse_fields),
                        "encoder": (info.schema.encoder or {}).get("name")})
        return out

    def thumbnail(self, index: str, doc_id: str, size: int = 256) -> bytes:
        """A JPEG of a document's source image, if that file lies under an image root."""
        size = max(32, min(int(size), 1024))
        key = (index, doc_id, size)
        with self._thumb_lock:
            if key in self._thumbs:
                self._thumbs.move_to_end(key)
                return self._thumbs[key]
        doc = self.backend.get(index, doc_id)
        real = self.policy.roots.contains(doc.source) if doc.source and self.policy.roots else None
        if real is None:
            raise ThumbnailUnavailable(f"document {doc_id!r} has no image under this server's image roots")
        from ..images import load_image

        try:
            img = load_image(real, target_max_side=size)
        except ImageError:
            raise ImageError(f"the image of document {doc_id!r} cannot be decoded") from None
        img.thumbnail((size, size))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=82)
        data = buf.getvalue()
        with self._thumb_lock:
            self._thumbs[key] = data
            while len(self._thumbs) > 512:
                self._thumbs.popitem(last=False)
        return data

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
        doc = self.backend.get(index, doc_id)
        real = self.policy.roots.contains(doc.source) if doc.source and self.policy.roots else None
        if real is None:
            raise ThumbnailUnavailable(f"document {doc_id!r} has no image under this server's image roots")
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
        return {"status": "ready", "models": self.loaded_models(), **self.config.describe()}

    def close(self) -> None:
        self.backend.close()


class ThumbnailUnavailable(StairError):
    exit_code = 4
