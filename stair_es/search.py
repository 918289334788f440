"""Turning a user's query (text or token map) into a :class:`SearchRequest`.

This module owns query encoding: which encoder an index's queries use (the one recorded
at ingest unless overridden), and the per-index IDF handed to text encoders that weight a
query's own tokens (STAIR's text-encoder-free mode). It must not know backend internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .backends.base import SearchBackend
from .encoders.base import Encoder, get_encoder
from .errors import InvalidInputError
from .query import Filter, SearchRequest, SparseClause
from .schema import IndexSchema
from .sparse import SparseVector


def idf(doc_freqs: np.ndarray, n_docs: int) -> np.ndarray:
    """BM25-style IDF, ``log(1 + (N - df + 0.5) / (df + 0.5))``: positive, rarer tokens weigh more."""
    df = doc_freqs.astype(np.float64)
    return np.log1p((max(n_docs, 0) - df + 0.5) / (df + 0.5)).astype(np.float32)


def query_encoder(schema: IndexSchema, name: str | None = None, **options: Any) -> Encoder:
    """The encoder for queries on an index: ``name`` if given, else the one recorded at ingest."""
    if name:
        return get_encoder(name, **options)
    config = dict(schema.encoder or {})
    recorded = config.pop("name", None)
    if not recorded or recorded == "precomputed":
        raise InvalidInputError(
            "this index holds precomputed vectors and records no encoder: pass --encoder (e.g. bow) to encode "
            "query text, or give the query as a token map with --tokens")
    config.update(options)
    return get_encoder(recorded, **config)


def encode_query_text(encoder: Encoder, text: str, backend: SearchBackend | None = None, index: str | None = None,
                      field: str = "image", notes: list[str] | None = None,
                      grounding: list[dict[str, Any]] | None = None,
                      freqs_out: dict[str, Any] | None = None) -> SparseVector:
    """Encode a query for ``index`` (:func:`encode_query_texts` for one text); ``grounding``
    receives one dict per query word saying what it became."""
    encoded = encode_query_texts(encoder, [text], backend, index, field, notes, freqs_out)[0]
    if grounding is not None:
        grounding.extend(step.to_dict() for step in encoded.grounding)
    return encoded.vector


def encode_query_texts(encoder: Encoder, texts: Sequence[str], backend: SearchBackend | None = None,
                       index: str | None = None, field: str = "image", notes: list[str] | None = None,
                       freqs_out: dict[str, Any] | None = None) -> list[Any]:
    """Encode queries for ``index`` in one call of the encoder: one
    :class:`~stair_es.encoders.grounding.EncodedQuery` (vector, grounding steps) per text.
    Encoders that weight by IDF get the index's; encoders that ground query words on the index's
    tokens (``encoder.uses_index_stats``: the text encoders of ``stair_es.encoders.text``) get its
    document frequencies as an :class:`~stair_es.encoders.grounding.IndexStats`. When the backend
    cannot report document frequencies, the queries are encoded without IDF and without
    grounding, and ``notes`` says so (once). ``freqs_out["doc_freqs"]`` receives the (document
    frequencies, documents) read, for whoever needs them next (re-ranking)."""
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError("the query text is empty")
    weights = stats = None
    wants_stats = encoder.uses_index_stats
    if backend is not None and index is not None and (encoder.uses_idf or wants_stats):
        try:
            df, n = backend.doc_freqs(index, field)
        except NotImplementedError:
            if notes is not None:
                missing = " and ".join(x for x, on in (("without IDF", encoder.uses_idf),
                                                        ("without grounding its words on the index's", wants_stats)) if on)
                notes.append(f"the {encoder.name} query encoder uses the index's document frequencies, but this backend "
                             f"cannot report them: the query was encoded {missing}")
        else:
            if freqs_out is not None:
                freqs_out["doc_freqs"] = (df, n)
            weights = idf(df, n) if encoder.uses_idf else None
            if wants_stats:
                from .encoders.grounding import IndexStats

                stats = IndexStats(df, n, field)
    return encoder.encode_queries(list(texts), idf=weights, index_stats=stats)  # (no steps without grounding)


def build_request(vectors: Mapping[str, tuple[SparseVector, float]], *, filter: Filter | None = None, top_k: int = 10,
                  drop_tokens: tuple[str, ...] = (), query_top_k: int | None = None,
                  query_min_weight: float | None = None) -> SearchRequest:
    """One clause per field: ``{"image": (vector, 1.0), "caption": (vector, 0.5)}``."""
    clauses = [SparseClause(f, v, w) for f, (v, w) in vectors.items() if w > 0 and v.nnz]
    return SearchRequest(clauses, filter, top_k, drop_tokens, query_top_k, query_min_weight)


#: Encoders whose recorded config carries versions checked at query time (``QuerySpec.force``).
VERSIONED_ENCODERS = ("default", "imagenet", "grounded", "clip-vocab", "vdr")


@dataclass
class QuerySpec:
    """Everything a user states about one search, carried from the CLI (or an application) to
    :func:`make_request`, which turns it into a :class:`SearchRequest` for any backend.

    Exactly one of ``text``, ``tokens`` (a token map, or its JSON text) and ``image`` (a path,
    bytes or PIL image: query by example) is the query. ``wheres`` are ``--where`` conditions,
    ``requires``/``excludes`` words of the token whitelist/blacklist on ``token_field``,
    ``expr`` a boolean token expression, ``query_excludes`` words removed from the query.
    ``encoder``/``encoder_options`` override the index's recorded encoder; ``force`` queries an
    index built with another encoder version.
    """

    text: str | None = None
    tokens: Mapping[str, float] | str | None = None
    image: Any = None
    wheres: Sequence[str] = ()
    requires: Sequence[str] = ()
    require_all: bool = False
    excludes: Sequence[str] = ()
    query_excludes: Sequence[str] = ()
    expr: str | None = None
    token_field: str = "image"
    caption_weight: float = 0.5
    image_weight: float = 1.0
    top_k: int = 10
    query_top_k: int | None = None
    min_weight: float | None = None
    encoder: str | None = None
    encoder_options: Mapping[str, Any] = field(default_factory=dict)
    force: bool = False
    #: add each query token's N best image-token neighbours by PPMI (``stair_es.neighbours.expand_vector``)
    expand: int = 0
    expand_weight: float = 0.5
    expand_min_count: int = 2
    #: an encoder already built for this index (``query_encoder``), reused across many queries
    #: (``stair-es rank-eval``); when given, ``encoder``/``encoder_options``/``force`` are not consulted
    encoder_instance: Encoder | None = None


def make_request(backend: SearchBackend, index: str, spec: QuerySpec) -> tuple[SearchRequest, SparseVector]:
    """(the prepared request, the query vector) for ``spec`` on ``index``."""
    import json

    from .query import Not, Or, combine, parse_token_expression, parse_where, word_filter, words_to_token_ids

    schema = backend.index_info(index).schema
    given = [x for x in (spec.text, spec.tokens, spec.image) if x is not None and x != ""]
    if len(given) > 1:
        raise InvalidInputError("give one query: a text, a token map (--tokens) or an example image (--image)")
    notes: list[str] = []
    grounding: list[dict[str, Any]] = []
    freqs: dict[str, Any] = {}

    def encoder() -> Encoder:
        if spec.encoder_instance is not None:
            return spec.encoder_instance
        options = dict(spec.encoder_options)
        if spec.force and not spec.encoder and (schema.encoder or {}).get("name") in VERSIONED_ENCODERS:
            options["allow_version_mismatch"] = True
        return query_encoder(schema, spec.encoder, **options)

    if spec.image is not None:
        from .images import load_image

        enc = encoder()
        if "image" not in enc.modalities:
            raise InvalidInputError(f"the {enc.name!r} encoder does not encode images; query by image needs the index's image encoder")
        qvec = enc.encode_images([load_image(spec.image, min_side=getattr(enc, "image_min_side", None))])[0]
        if not qvec.nnz:
            raise InvalidInputError(f"the image {spec.image} gives no tokens to search with")
    elif spec.tokens is not None:
        tm = spec.tokens
        if isinstance(tm, str):
            try:
                tm = json.loads(tm)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"--tokens is not valid JSON: {e.msg}") from None
        qvec = SparseVector.from_token_map(tm)
    else:
        if not spec.text:
            raise InvalidInputError("give a query text, a token map with --tokens, or an example image with --image")
        qvec = encode_query_text(encoder(), spec.text, backend, index, field="image", notes=notes, grounding=grounding,
                                 freqs_out=freqs)
    filters: list[Filter | None] = [parse_where(w) for w in spec.wheres]
    if spec.requires:
        wl = [word_filter(w, spec.token_field) for w in spec.requires]
        filters.append(combine(wl) if spec.require_all else (wl[0] if len(wl) == 1 else Or(wl)))
    if spec.excludes:
        filters.extend(Not(word_filter(w, spec.token_field)) for w in spec.excludes)
    if spec.expr:
        filters.append(parse_token_expression(spec.expr, spec.token_field))
    vectors = {}
    expansion: dict = {}
    if spec.image_weight > 0 and "image" in schema.sparse_fields:
        image_qvec = qvec
        if spec.expand:  # expansion tokens are image tokens: they join the image clause only
            from .neighbours import expand_vector, index_counts

            counts = index_counts(backend, index, notes=notes)
            image_qvec, expansion = expand_vector(qvec, counts, spec.expand, weight=spec.expand_weight,
                                                  min_count=spec.expand_min_count, notes=notes)
        vectors["image"] = (image_qvec, spec.image_weight)
    if spec.caption_weight > 0 and "caption" in schema.sparse_fields:
        vectors["caption"] = (qvec, spec.caption_weight)
    request = build_request(vectors, filter=combine(filters), top_k=spec.top_k,
                            drop_tokens=tuple(words_to_token_ids(spec.query_excludes)),
                            query_top_k=spec.query_top_k, query_min_weight=spec.min_weight)
    request.notes.extend(notes)
    request.expansion = {t: e.to_dict() for t, e in expansion.items()}
    request.grounding = grounding
    request.doc_freqs = freqs.get("doc_freqs")
    return request.prepared(schema), qvec
