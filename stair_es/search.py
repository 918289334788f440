"""Turning a user's query (text or token map) into a :class:`SearchRequest`.

This module owns query encoding: which encoder an index's queries use (the one recorded
at ingest unless overridden), and the per-index IDF handed to text encoders that weight a
query's own tokens (STAIR's text-encoder-free mode). It must not know backend internals.
"""

from __future__ import annotations

from typing import Any, Mapping

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
            "query text, or give the query as a token map with --tokens"
        )
    config.update(options)
    return get_encoder(recorded, **config)


def encode_query_text(
    encoder: Encoder, text: str, backend: SearchBackend | None = None, index: str | None = None, field: str = "image",
    notes: list[str] | None = None,
) -> SparseVector:
    """Encode a query; encoders that weight by IDF get the index's. When the backend cannot
    report document frequencies, the query is encoded without IDF and ``notes`` says so."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInputError("the query text is empty")
    weights = None
    if backend is not None and index is not None and encoder.uses_idf:
        try:
            df, n = backend.doc_freqs(index, field)
            weights = idf(df, n)
        except NotImplementedError:
            weights = None
            if notes is not None:
                notes.append(f"the {encoder.name} query encoder weights tokens by IDF, but this backend cannot report "
                             "document frequencies: the query was encoded without IDF")
    return encoder.encode_texts([text], idf=weights)[0]


def build_request(
    vectors: Mapping[str, tuple[SparseVector, float]],
    *,
    filter: Filter | None = None,
    top_k: int = 10,
    drop_tokens: tuple[str, ...] = (),
    query_top_k: int | None = None,
    query_min_weight: float | None = None,
) -> SearchRequest:
    """One clause per field: ``{"image": (vector, 1.0), "caption": (vector, 0.5)}``."""
    clauses = [SparseClause(f, v, w) for f, (v, w) in vectors.items() if w > 0 and v.nnz]
    return SearchRequest(clauses, filter, top_k, drop_tokens, query_top_k, query_min_weight)
