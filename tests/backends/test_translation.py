"""Pure translation: mappings and query DSL (no client, no server)."""

import json

import pytest

from stair_es.backends.elasticsearch import mapping, query_dsl
from stair_es.backends.cluster.translate import translate
from stair_es.errors import BackendError, InvalidInputError
from stair_es.query import HasTokens, Not, Range, SearchRequest, SparseClause, Term, Terms, parse_token_expression
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector

SCHEMA = IndexSchema(fields={"brand": "keyword", "price": "number", "taken": "date", "sale": "boolean"})


def req(tokens=None, **kw):
    v = SparseVector.from_token_map(tokens or {"dog": 2.0, "beach": 0.5, ".": 1.0})
    return SearchRequest([SparseClause("image", v, 1.5)], **kw)


def test_rank_feature_clauses_are_linear_with_boost_clause_weight_times_query_weight():
    q = query_dsl(req(), schema=SCHEMA)
    should = q["bool"]["should"]
    assert q["bool"]["minimum_should_match"] == 1
    by_field = {c["rank_feature"]["field"]: c["rank_feature"] for c in should}
    assert set(by_field) == {"image.dog", "image.beach", "image.%2E"}
    assert by_field["image.dog"]["boost"] == pytest.approx(3.0)
    assert all(c["linear"] == {} and "saturation" not in c for c in by_field.values())


def test_filters_go_to_filter_and_blacklists_to_must_not():
    flt = Term("brand", "acme") & Range("price", lte="20") & Range("taken", gte="2024-01-01") \
        & HasTokens(["dog", "cat"], mode="all") & Not(HasTokens(["cat"]))
    q = query_dsl(req(filter=flt), schema=SCHEMA)
    b = q["bool"]
    assert {"term": {"brand": "acme"}} in b["filter"]
    assert {"range": {"price": {"lte": 20.0}}} in b["filter"]
    assert {"range": {"taken": {"gte": 1704067200000}}} in b["filter"]
    assert {"bool": {"filter": [{"rank_feature": {"field": "image.dog"}}, {"rank_feature": {"field": "image.cat"}}]}} in b["filter"]
    assert b["must_not"] == [{"rank_feature": {"field": "image.cat"}}]


def test_boolean_token_expressions_nest():
    flt = parse_token_expression("dog AND (beach OR park) NOT cat")
    q = query_dsl(req(filter=flt), schema=SCHEMA)
    text = json.dumps(q)
    assert '"must_not": [{"rank_feature": {"field": "image.cat"}}]' in text
    assert '"should": [{"rank_feature": {"field": "image.beach"}}, {"rank_feature": {"field": "image.park"}}], "minimum_should_match": 1' in text


def test_terms_and_booleans():
    q = query_dsl(req(filter=Terms("brand", ["a", "b"]) & Term("sale", "true")), schema=SCHEMA)
    assert {"terms": {"brand": ["a", "b"]}} in q["bool"]["filter"]
    assert {"term": {"sale": True}} in q["bool"]["filter"]


def test_clause_limit_prunes_lowest_weights_and_says_so():
    tokens = {t: float(i + 1) for i, t in enumerate(["dog", "cat", "bird", "fish", "tree", "car"])}
    r = req(tokens, filter=HasTokens(["dog"])).prepared(SCHEMA)
    tr = translate(r, max_clauses=4)
    kept = {c["rank_feature"]["field"] for c in tr.query["bool"]["should"]}
    assert kept == {"image.car", "image.tree", "image.fish"}
    assert any("pruned from 6 to 3" in n for n in tr.notes)
    with pytest.raises(InvalidInputError, match="clause"):
        translate(req(filter=HasTokens(["dog", "cat"], mode="all")).prepared(SCHEMA), max_clauses=2)


def test_sparse_vector_and_neural_sparse_forms():
    r = req().prepared(SCHEMA)
    es = translate(r, engine="elasticsearch", field_type="sparse_vector").query["bool"]["should"]
    assert es == [{"sparse_vector": {"field": "image", "query_vector": {"beach": 0.5, "dog": 2.0, "%2E": 1.0}, "boost": 1.5}}]
    os_ = translate(r, engine="opensearch", field_type="sparse_vector").query["bool"]["should"][0]
    tokens = os_["neural_sparse"]["image"]["query_tokens"]
    assert all(k.isdigit() for k in tokens)
    os_rf = translate(r, engine="opensearch", field_type="rank_features", form="neural_sparse").query["bool"]["should"][0]
    assert os_rf["neural_sparse"]["image"]["query_tokens"]["dog"] == 2.0


def test_hybrid_text_adds_bm25_and_a_note():
    tr = translate(req().prepared(SCHEMA), text="a dog", text_weight=0.5)
    assert {"match": {"caption_text": {"query": "a dog", "boost": 0.5}}} in tr.query["bool"]["should"]
    assert any("BM25" in n for n in tr.notes)


def test_mapping_carries_schema_and_types():
    body = mapping("elasticsearch", "rank_features", SCHEMA)
    props = body["mappings"]["properties"]
    assert props["image"] == {"type": "rank_features"} and props["caption"] == {"type": "rank_features"}
    assert props["price"]["type"] == "double" and props["taken"]["type"] == "date" and props["sale"]["type"] == "boolean"
    assert props["caption_text"]["type"] == "text"
    assert IndexSchema.from_dict(body["mappings"]["_meta"]["stair_es"]["schema"]) == SCHEMA


def test_sparse_vector_mappings():
    es = mapping("elasticsearch", "sparse_vector", SCHEMA)
    assert es["mappings"]["properties"]["image"]["index_options"] == {"prune": False}
    old = mapping("elasticsearch", "sparse_vector", SCHEMA, version=(8, 15, 0))
    assert "index_options" not in old["mappings"]["properties"]["image"]
    pruned = mapping("elasticsearch", "sparse_vector", SCHEMA, prune=True)
    assert pruned["mappings"]["properties"]["image"]["index_options"]["prune"] is True
    os_ = mapping("opensearch", "sparse_vector", SCHEMA)
    assert os_["settings"]["index"]["sparse"] is True
    assert os_["mappings"]["properties"]["image"]["method"]["name"] == "seismic"
    dense = mapping("opensearch", "rank_features", SCHEMA, dense_dims=8)
    assert dense["mappings"]["properties"]["dense"]["dimension"] == 8 and dense["settings"]["index"]["knn"] is True
    with pytest.raises(InvalidInputError):
        mapping("opensearch", "rank_features", SCHEMA, prune=True)
    with pytest.raises(BackendError, match=r"Elasticsearch 8\.15\.0 has no index-time pruning .*; leave prune off"):
        mapping("elasticsearch", "sparse_vector", SCHEMA, prune=True, version=(8, 15, 0))
