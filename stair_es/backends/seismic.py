"""OpenSearch 3.3+ ``sparse_vector`` fields with the SEISMIC method: query parameters and quantisation.

Query side (``neural_sparse`` on a ``sparse_vector`` field), per the OpenSearch neural sparse
ANN documentation: ``method_parameters`` = ``k`` (hits the ANN search returns per shard and
clause), ``top_n`` (query tokens kept, strongest first), ``heap_factor`` (recall vs speed; higher
is better recall) and ``filter`` (applied by the SEISMIC search itself: an exact search over the
filtered documents when they are at most ``k``, otherwise the ANN search with the filter).

stair_es always sends ``k``: ``top_k`` without a filter, and ``top_k * filter_overfetch``
(default 4) with one, the filter also inside ``method_parameters``, so that a filtered search
still fills its ``top_k`` when the filter removes ANN candidates. ``top_n`` and ``heap_factor``
are sent only when given (the engine's defaults: 10 and 1.0).

Storage side: a segment of at least ``approximate_threshold`` documents (1,000,000 in stair_es's
mapping) is searched by SEISMIC over byte-quantised weights: a document weight ``w`` is stored as
``round(min(w, c_ingest) * 255 / c_ingest)`` (``quantization_ceiling_ingest``, default 3.0) and a
query weight as ``round(min(q, c_search) * 255 / c_search)`` (``quantization_ceiling_search``,
default 16). Weights above the ceilings are clipped. Smaller segments are searched exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import InvalidInputError

#: ``approximate_threshold`` in stair_es's ``os_sparse_vector.json`` mapping.
APPROXIMATE_THRESHOLD = 1_000_000
CEILING_INGEST = 3.0
CEILING_SEARCH = 16.0
DEFAULT_OVERFETCH = 4


@dataclass(frozen=True)
class SeismicParams:
    k: int | None = None
    top_n: int | None = None
    heap_factor: float | None = None
    filter_overfetch: int = DEFAULT_OVERFETCH

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | "SeismicParams" | None) -> "SeismicParams":
        """From ``{"k": .., "top_n": .., "heap_factor": .., "filter_overfetch": ..}``, checked."""
        if options is None:
            return cls()
        if isinstance(options, SeismicParams):
            return options.checked()
        unknown = set(options) - {"k", "top_n", "heap_factor", "filter_overfetch"}
        if unknown:
            raise InvalidInputError(f"unknown seismic parameter(s) {', '.join(sorted(unknown))}: use k, top_n, heap_factor, "
                                    "filter_overfetch")
        return cls(**dict(options)).checked()

    def checked(self) -> "SeismicParams":
        def whole(name: str, v: Any, lo: int, hi: int) -> None:
            if v is None:
                return
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise InvalidInputError(f"seismic {name} must be a whole number from {lo} to {hi}, got {v!r}")

        whole("k", self.k, 1, 10_000)
        whole("top_n", self.top_n, 1, 10_000)
        whole("filter_overfetch", self.filter_overfetch, 1, 100)
        h = self.heap_factor
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h)
                              or not 0 < h <= 1000):
            raise InvalidInputError(f"seismic heap_factor must be a number above 0 (at most 1000; 1.0 is the engine's "
                                    f"default, higher gives better recall), got {h!r}")
        return self

    def method_parameters(self, top_k: int, filter_dsl: Mapping[str, Any] | None) -> dict[str, Any]:
        k = self.k if self.k is not None else (top_k * self.filter_overfetch if filter_dsl else top_k)
        out: dict[str, Any] = {"k": int(max(k, top_k))}
        if self.top_n is not None:
            out["top_n"] = int(self.top_n)
        if self.heap_factor is not None:
            out["heap_factor"] = float(self.heap_factor)
        if filter_dsl:
            out["filter"] = dict(filter_dsl)
        return out


def quantise(w: np.ndarray | float, ceiling: float) -> np.ndarray:
    """The weight SEISMIC scores with: clipped to ``[0, ceiling]``, rounded to 1/255 of it."""
    q = np.floor(np.clip(np.asarray(w, np.float64), 0.0, ceiling) * 255.0 / ceiling + 0.5)  # Java Math.round
    return q * ceiling / 255.0


def explain_notes(clauses, doc_vectors: Mapping[str, Any], doc_count: int, params: SeismicParams | None = None) -> list[str]:
    """What SEISMIC does to one document's score: the byte-quantised sum it is ranked by on an
    approximate segment, the weights clipped by the ceilings, and whether any segment can be approximate."""
    exact = 0.0
    quant = 0.0
    clipped_doc = clipped_query = 0
    for c in clauses:
        dv = doc_vectors.get(c.field)
        if dv is None:
            continue
        for _, qw, dw, _ in c.vector.contributions(dv):
            exact += float(c.weight) * qw * dw
            quant += float(c.weight) * float(quantise(qw, CEILING_SEARCH)) * float(quantise(dw, CEILING_INGEST))
            clipped_doc += dw > CEILING_INGEST
            clipped_query += qw > CEILING_SEARCH
    where = ("every segment of this index is below approximate_threshold "
             f"({APPROXIMATE_THRESHOLD:,} documents; the index has {doc_count:,}), so it was scored exactly"
             if doc_count < APPROXIMATE_THRESHOLD else
             f"segments of at least {APPROXIMATE_THRESHOLD:,} documents are searched approximately")
    p = (params or SeismicParams())
    notes = [f"OpenSearch SEISMIC: {where}; on an approximate segment this document scores {quant:.4f} instead of "
             f"{exact:.4f}: document weights are stored as bytes, min(w, {CEILING_INGEST:g}) in steps of "
             f"{CEILING_INGEST:g}/255, query weights min(q, {CEILING_SEARCH:g}) in steps of {CEILING_SEARCH:g}/255"
             f" (method_parameters: k={p.k or 'top_k'}, top_n={p.top_n or 'engine default 10'}, "
             f"heap_factor={p.heap_factor or 'engine default 1.0'})"]
    if clipped_doc or clipped_query:
        notes.append(f"{clipped_doc} document weight(s) above {CEILING_INGEST:g} and {clipped_query} query weight(s) above "
                     f"{CEILING_SEARCH:g} are clipped on approximate segments (quantization_ceiling_ingest/search)")
    return notes


MAX_K = 10_000
