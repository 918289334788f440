"""Pure translation of stair_es queries into Elasticsearch/OpenSearch query DSL.

Owns: the translation of a :class:`~stair_es.query.SearchRequest` (sparse clauses, filters,
the cluster's clause limit) into query DSL, and the ``method_parameters`` of ``neural_sparse``
on OpenSearch SEISMIC fields (:class:`SeismicParams`). Nothing here needs a client or a
cluster, so users can take the output into their own deployments.

Scoring is the exact dot product: a ``rank_feature`` query with the ``linear`` function
scores ``boost * stored_weight``; a ``bool.should`` of one such clause per query token, with
``boost = clause weight * query weight``, sums to ``sum_c w_c * <q_c, d_c>`` -- the quantity
the encoders are trained for (the default ``saturation`` function is not a dot product).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ...errors import InvalidInputError
from ...query import And, Exists, Filter, HasTokens, Not, Or, Range, SearchRequest, SparseClause, Term, Terms
from ...schema import IndexSchema
from ...sparse import SparseVector
from ...vocab import Vocabulary, default_vocabulary
from ..codec import encode_token, feature_map

DEFAULT_MAX_CLAUSES = 1024
DEFAULT_OVERFETCH = 4


# --- query translation ---------------------------------------------------------------------
@dataclass(frozen=True)
class SeismicParams:
    """The ``method_parameters`` of ``neural_sparse`` on an OpenSearch SEISMIC field (OpenSearch's
    neural sparse ANN documentation).

    ``k``: hits the ANN search returns per shard and clause, always sent: ``top_k``, times
    ``filter_overfetch`` (default 4) with a filter, which also goes inside ``method_parameters``
    (SEISMIC applies it itself: an exact search over the filtered documents when they are at most
    ``k``, otherwise the ANN search with the filter), so a filtered search still fills its
    ``top_k``. ``top_n`` (query tokens kept, strongest first) and ``heap_factor`` (recall vs speed;
    higher is better recall) are sent only when given (the engine's defaults: 10 and 1.0).
    """

    k: int | None = None
    top_n: int | None = None
    heap_factor: float | None = None
    filter_overfetch: int = DEFAULT_OVERFETCH

    @classmethod
    def from_options(cls, options: "Mapping[str, Any] | SeismicParams | None") -> "SeismicParams":
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


def default_query_form(engine: str, field_type: str) -> str:
    if field_type == "rank_features":
        return "rank_feature"
    return "sparse_vector" if engine == "elasticsearch" else "neural_sparse"


@dataclass
class Translation:
    query: dict[str, Any]
    notes: list[str]
    request: SearchRequest  # after clause-limit pruning: what the engine scores with


def translate(request: SearchRequest, *, engine: str = "elasticsearch", field_type: str = "rank_features",
              form: str | None = None, max_clauses: int = DEFAULT_MAX_CLAUSES, vocab: Vocabulary | None = None,
              text: str | None = None, text_weight: float = 1.0, seismic: "SeismicParams | None" = None) -> Translation:
    """Translate a prepared request; see :func:`query_dsl`. ``seismic`` sets ``method_parameters``
    of ``neural_sparse`` queries on OpenSearch ``sparse_vector`` (SEISMIC) fields; they get the
    defaults without it."""
    vocab = vocab or default_vocabulary()
    form = form or default_query_form(engine, field_type)
    if form not in ("rank_feature", "sparse_vector", "neural_sparse"):
        raise InvalidInputError(f"unknown query form {form!r}; use rank_feature, sparse_vector or neural_sparse")
    keys = "id" if (engine == "opensearch" and field_type == "sparse_vector") else "token"
    ctx = _FilterContext(engine, field_type, keys, vocab)
    notes: list[str] = []
    given = request.filter
    parts = () if given is None else given.filters if isinstance(given, And) else (given,)
    filters = [ctx.dsl(f) for f in parts if not isinstance(f, Not)]
    must_not = [ctx.dsl(f.filter) for f in parts if isinstance(f, Not)]
    flt = {k: v for k, v in (("filter", filters), ("must_not", must_not)) if v}
    budget = max_clauses - ctx.clauses - (1 if text else 0)
    if budget < 1:
        raise InvalidInputError(
            f"the filter alone needs {ctx.clauses} clauses, over the cluster's limit of {max_clauses} "
            "(indices.query.bool.max_clause_count); use fewer tokens in --require/--exclude")
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
            ns = {"query_tokens": feature_map(c.vector, keys), "boost": float(c.weight)}
            if keys == "id":  # OpenSearch sparse_vector (SEISMIC): k, top_n, heap_factor and the filter
                ns["method_parameters"] = (seismic or SeismicParams()).method_parameters(
                    request.top_k, {"bool": flt} if flt else None)
            should.append({"neural_sparse": {c.field: ns}})
    if text:
        should.append({"match": {"caption_text": {"query": text, "boost": float(text_weight)}}})
        notes.append("hybrid: BM25 on caption_text is added to the sparse score; scores are no longer a pure dot product")
    return Translation({"bool": {"should": should, "minimum_should_match": 1, **flt}}, notes,
                       replace(request, clauses=clauses))


def filter_of(query: Mapping[str, Any]) -> dict[str, Any]:
    """The ``filter`` / ``must_not`` of a translated query's ``bool`` (what every retriever and count shares)."""
    b = query.get("bool", {})
    return {k: b[k] for k in ("filter", "must_not") if b.get(k)}


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
        if isinstance(f, (Term, Terms, Range, Exists)):
            self.clauses += 1
        if isinstance(f, Term):
            return {"term": {f.field: _value(f.value)}}
        if isinstance(f, Terms):
            return {"terms": {f.field: [_value(v) for v in f.values]}}
        if isinstance(f, Range):
            bounds = {k: _value(getattr(f, k)) for k in ("gt", "gte", "lt", "lte") if getattr(f, k) is not None}
            return {"range": {f.field: bounds}}
        if isinstance(f, Exists):
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
    return list(v) if isinstance(v, tuple) else v


def query_dsl(request: SearchRequest, engine: str = "elasticsearch", field_type: str = "rank_features", *,
              schema: IndexSchema | None = None, form: str | None = None, max_clauses: int = DEFAULT_MAX_CLAUSES,
              text: str | None = None, text_weight: float = 1.0, vocab: Vocabulary | None = None) -> dict[str, Any]:
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
