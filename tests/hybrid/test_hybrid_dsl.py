"""The hybrid request JSON for Elasticsearch (retriever API) and OpenSearch (hybrid query +
search pipeline), and the mapping's BM25 field with stair_es's analyzer."""

from stair_es.backends.dsl import mapping, translate
from stair_es.hybrid import HybridOptions, hybrid_body
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector

SCHEMA = IndexSchema(fields={"kind": "keyword"})


def _sparse():
    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 2.0}))], filter=Term("kind", "photo"),
                        top_k=5).prepared(SCHEMA)
    return translate(req).query


SPARSE = {"bool": {"should": [{"rank_feature": {"field": "image.dog", "linear": {}, "boost": 2.0}}],
                   "minimum_should_match": 1, "filter": [{"term": {"kind": "photo"}}]}}
BM25 = {"bool": {"must": [{"match": {"bm25_text": {"query": "a dog"}}}], "filter": [{"term": {"kind": "photo"}}]}}


def test_sparse_side_is_the_plain_translation():
    assert _sparse() == SPARSE


def test_elasticsearch_rrf_retriever():
    body = hybrid_body("elasticsearch", _sparse(), "a dog", HybridOptions("rrf", 20).checked(5), 5)
    assert body == {"size": 5, "retriever": {"rrf": {
        "retrievers": [{"standard": {"query": SPARSE}}, {"standard": {"query": BM25}}],
        "rank_window_size": 100, "rank_constant": 20}}}


def test_elasticsearch_linear_retriever():
    body = hybrid_body("elasticsearch", _sparse(), "a dog", HybridOptions("linear", weights=(3, 1), window=50).checked(5), 5)
    assert body == {"size": 5, "retriever": {"linear": {
        "retrievers": [{"retriever": {"standard": {"query": SPARSE}}, "weight": 0.75, "normalizer": "minmax"},
                       {"retriever": {"standard": {"query": BM25}}, "weight": 0.25, "normalizer": "minmax"}],
        "rank_window_size": 50}}}


def test_opensearch_hybrid_query_with_score_ranker():
    body = hybrid_body("opensearch", _sparse(), "a dog", HybridOptions("rrf", 60).checked(5), 5)
    assert body == {"size": 100, "query": {"hybrid": {"queries": [SPARSE, BM25]}},
                    "search_pipeline": {"phase_results_processors": [
                        {"score-ranker-processor": {"combination": {"technique": "rrf", "rank_constant": 60}}}]}}


def test_opensearch_hybrid_query_with_normalization_processor():
    body = hybrid_body("opensearch", _sparse(), "a dog", HybridOptions("linear", weights=(1, 1)).checked(5), 5)
    assert body["search_pipeline"] == {"phase_results_processors": [{"normalization-processor": {
        "normalization": {"technique": "min_max"},
        "combination": {"technique": "arithmetic_mean", "parameters": {"weights": [0.5, 0.5]}}}}]}


def test_mapping_has_the_bm25_field_and_analyzer():
    for engine in ("elasticsearch", "opensearch"):
        body = mapping(engine, "rank_features", SCHEMA)
        assert body["mappings"]["properties"]["bm25_text"] == {"type": "text", "analyzer": "stair_es_text"}
        an = body["settings"]["analysis"]
        assert an["analyzer"]["stair_es_text"] == {"type": "custom", "tokenizer": "standard",
                                                    "filter": ["lowercase", "stop", "stair_es_stemmer"]}
        assert an["filter"]["stair_es_stemmer"] == {"type": "stemmer", "language": "porter2"}
