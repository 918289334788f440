"""Index mappings on Elasticsearch/OpenSearch and the stair_es metadata kept inside them.

Owns: the create-index body built from the JSON files in ``stair_es.mappings`` (pure: users can
take it into their own deployments), reading back what stair_es stored in a mapping's
``_meta`` (:class:`IndexMeta`), index-name rules and the choice of field type per cluster
version. Must not know about clients, queries or bulk requests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

from ...errors import BackendError, IncompatibleIndexError, IndexNotFoundError, InvalidInputError
from ...lexical import CLUSTER_ANALYZER, TEXT_FIELD
from ...schema import IndexSchema

ENGINES = ("elasticsearch", "opensearch")
FIELD_TYPES = ("rank_features", "sparse_vector")
META_KEY = "stair_es"
META_FORMAT = 1


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


def mapping(engine: str = "elasticsearch", field_type: str = "rank_features", schema: IndexSchema | None = None, *,
            prune: bool = False, dense_dims: int | None = None,
            version: tuple[int, ...] | None = None) -> dict[str, Any]:
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
            raise BackendError(f"Elasticsearch {'.'.join(map(str, version))} has no index-time pruning option (8.19 / 9.1+); "
                               "leave prune off (sparse_vector without pruning is exact) or upgrade the cluster")
        template = {k: v for k, v in template.items() if k != "index_options"}
    for name in schema.sparse_fields:
        props[name] = json.loads(json.dumps(template))
    props.update(metadata_properties(schema.fields))
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
    props[TEXT_FIELD] = {"type": "text", "analyzer": "stair_es_text"}
    body.setdefault("settings", {})["analysis"] = json.loads(json.dumps(CLUSTER_ANALYZER))
    m["_meta"][META_KEY]["schema"] = schema.to_dict()
    return body


def metadata_properties(fields: Mapping[str, str]) -> dict[str, Any]:
    """The mapping ``properties`` of metadata fields (name -> stair_es field type)."""
    types = _load_json("metadata_types.json")
    return {name: dict(types[ftype]) for name, ftype in fields.items()}


def _es_has_index_options(version: tuple[int, ...]) -> bool:
    major, minor = (tuple(version) + (0, 0))[:2]
    return (major == 8 and minor >= 19) or (major == 9 and minor >= 1) or major >= 10


# --- what stair_es keeps in a mapping ------------------------------------------------------
@dataclass
class IndexMeta:
    """A stair_es index on a cluster, as its mapping describes it."""

    schema: IndexSchema
    field_type: str
    keys: str  # "token" (feature names are encoded tokens) or "id" (token ids: OpenSearch SEISMIC)
    raw_meta: dict[str, Any]
    has_text: bool = False  # the mapping has the BM25 field (indices created before hybrid search do not)
    has_dense: bool = False  # the mapping has the dense vector field


def index_not_found(index: str, where: str) -> IndexNotFoundError:
    """The error for an index the cluster at ``where`` does not have, with the way to make it."""
    return IndexNotFoundError(f"index {index!r} does not exist on {where}; create it with `stair-es ingest {index} "
                              f"SOURCE` or `stair-es index create {index}` (same --backend and --url), or see "
                              "`stair-es index list`")


def index_meta(engine: str, index: str, res: Any, where: str) -> IndexMeta:
    """Read the :class:`IndexMeta` from a ``GET <index>/_mapping`` response (``where``: the cluster, for errors)."""
    if not isinstance(res, Mapping) or not res:
        raise index_not_found(index, where)
    # an alias resolves to the concrete index name: take the single entry
    mappings = next(iter(res.values())).get("mappings", {})
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
                "the mapping was changed outside stair_es -- reindex into a new index")
    keys = raw.get("keys", "id" if (engine == "opensearch" and ftype == "sparse_vector") else "token")
    dense_prop = props.get("dense") or {}
    if schema.dense is None and dense_prop.get("type") in ("dense_vector", "knn_vector"):
        # an index made with dense_dims before stair_es searched dense vectors: its mapping says the dimension
        dims = dense_prop.get("dims") or dense_prop.get("dimension")
        if dims:
            schema.dense = {"dims": int(dims), "similarity": "cosine", "dtype": "float32", "encoder": None}
    return IndexMeta(schema, ftype, keys, dict(raw), has_text=TEXT_FIELD in props, has_dense=bool(dense_prop))


def field_type_for(engine: str, wanted: str, version: tuple[int, ...] | None) -> str:
    """The sparse field type of a new index: ``wanted`` checked against the cluster's version."""
    if wanted == "auto":
        return "rank_features"  # exact, supports whitelists, on every version of both engines
    v = version or (0,)
    if wanted == "sparse_vector":
        if engine == "elasticsearch" and v < (8, 11):
            raise BackendError(f"Elasticsearch {'.'.join(map(str, v))} has no sparse_vector field (8.11+); use rank_features")
        if engine == "opensearch" and v < (3, 3):
            raise BackendError(f"OpenSearch {'.'.join(map(str, v))} has no sparse_vector field (3.3+); use rank_features")
    return wanted


def check_index_name(index: str) -> None:
    bad = set('\\/*?"<>| ,#:')
    if (not isinstance(index, str) or not index or index != index.lower() or index.startswith(("-", "_", "+"))
            or any(c in bad for c in index) or index in (".", "..") or len(index.encode()) > 255):
        raise InvalidInputError(f"invalid index name {index!r}: use lower-case letters, digits, '-' or '_' "
                                "(not starting with '-', '_' or '+'), at most 255 bytes")
