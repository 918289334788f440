"""Pure translation of stair_es queries and schemas into Elasticsearch/OpenSearch JSON.

Owns: the index mapping built from the JSON files in ``stair_es.mappings`` and the translation of
a :class:`~stair_es.query.SearchRequest` into query DSL. Nothing here needs a client or a
cluster, so users can take the output into their own deployments.

Scoring is the exact dot product: a ``rank_feature`` query with the ``linear`` function
scores ``boost * stored_weight``; a ``bool.should`` of one such clause per query token, with
``boost = clause weight * query weight``, sums to ``sum_c w_c * <q_c, d_c>`` -- the quantity
the encoders are trained for (the default ``saturation`` function is not a dot product).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from ..errors import (
    BackendError,
    InvalidInputError,
)
from ..query import And, Exists, Filter, HasTokens, Not, Or, Range, SearchRequest, SparseClause, Term, Terms
from ..schema import (
    IndexSchema,
)
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .codec import encode_token, feature_map

ENGINES = ("elasticsearch", "opensearch")
FIELD_TYPES = ("rank_features", "sparse_vector")
DEFAULT_MAX_CLAUSES = 1024
META_KEY = "stair_es"


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
    stair_es can reopen the index. ``bm25_text`` (caption + keyword metadata, analysed as in
    :mod:`stair_es.lexical`) is the BM25 side of hybrid search. A dense field (``schema.dense``, or
    ``dense_dims`` for a cosine one) adds the ``dense`` vector field that hybrid search's dense
    retriever queries (``dense_vector`` / ``knn_vector``).
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
    spec = schema.dense or ({"dims": int(dense_dims), "similarity": "cosine"} if dense_dims else None)
    if spec:
        dense = _load_json("es_dense_vector.json" if engine == "elasticsearch" else "os_dense_vector.json")
        dense["dims" if engine == "elasticsearch" else "dimension"] = int(spec["dims"])
        # cosine vectors are unit length (stair_es normalises them), so the dot product is the cosine;
        # dot_product vectors keep their length: the engines' unbounded inner product
        if engine == "elasticsearch":
            dense["similarity"] = "dot_product" if spec.get("similarity", "cosine") == "cosine" else "max_inner_product"
        else:
            dense["space_type"] = "innerproduct"
        props["dense"] = dense
        if engine == "opensearch":
            body.setdefault("settings", {}).setdefault("index", {})["knn"] = True
    # BM25 text for hybrid search (caption + keyword metadata), with stair_es's analyzer
    from ..lexical import CLUSTER_ANALYZER, TEXT_FIELD

    props[TEXT_FIELD] = {"type": "text", "analyzer": "stair_es_text"}
    body.setdefault("settings", {})["analysis"] = json.loads(json.dumps(CLUSTER_ANALYZER))
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
    seismic: Any = None,
) -> Translation:
    """Translate a prepared request; see :func:`query_dsl`. ``seismic`` (a
    :class:`~stair_es.backends.seismic.SeismicParams`) sets ``method_parameters`` of ``neural_sparse``
    queries on OpenSearch ``sparse_vector`` (SEISMIC) fields; they get the defaults without it."""
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
            ns = {"query_tokens": feature_map(c.vector, keys), "boost": float(c.weight)}
            if keys == "id":  # OpenSearch sparse_vector (SEISMIC): k, top_n, heap_factor and the filter
                from .seismic import SeismicParams

                flt = {k: v for k, v in (("filter", filters), ("must_not", must_not)) if v}
                ns["method_parameters"] = (seismic or SeismicParams()).method_parameters(
                    request.top_k, {"bool": flt} if flt else None)
            should.append({"neural_sparse": {c.field: ns}})
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
