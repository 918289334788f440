"""The hybrid request JSON for Elasticsearch (retriever API) and OpenSearch (hybrid query +
search pipeline), and the mapping's BM25 field with stair_es's analyzer."""

from stair_es.backends.cluster.mapping import mapping
from stair_es.backends.cluster.translate import translate
from stair_es.backends.cluster.hybrid import hybrid_body
from stair_es.hybrid import HybridOptions
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


# --- the dense retriever ------------------------------------------------------------------------
VEC = [0.6, 0.8]
FILTER = {"bool": {"filter": [{"term": {"kind": "photo"}}]}}
THREE = ("sparse", "bm25", "dense")


def test_elasticsearch_rrf_with_a_knn_retriever_sharing_the_filter():
    body = hybrid_body("elasticsearch", _sparse(), "a dog", HybridOptions("rrf", 60, window=50, retrievers=THREE).checked(5), 5,
                       vector=VEC)
    assert body == {"size": 5, "retriever": {"rrf": {
        "retrievers": [{"standard": {"query": SPARSE}}, {"standard": {"query": BM25}},
                       {"knn": {"field": "dense", "query_vector": VEC, "k": 50, "num_candidates": 100, "filter": FILTER}}],
        "rank_window_size": 50, "rank_constant": 60}}}


def test_elasticsearch_linear_with_a_knn_retriever_and_three_weights():
    opts = HybridOptions("linear", weights=(1, 1, 2), retrievers=("sparse", "bm25", "dense")).checked(5)
    subs = hybrid_body("elasticsearch", _sparse(), "a dog", opts, 5, vector=VEC)["retriever"]["linear"]["retrievers"]
    assert [s["weight"] for s in subs] == [0.25, 0.25, 0.5]
    assert subs[2] == {"retriever": {"knn": {"field": "dense", "query_vector": VEC, "k": 100, "num_candidates": 200,
                                             "filter": FILTER}}, "weight": 0.5, "normalizer": "minmax"}


def test_opensearch_hybrid_with_a_knn_query_and_its_filter_inside():
    opts = HybridOptions("rrf", 60, window=40, retrievers=("dense", "sparse")).checked(5)
    body = hybrid_body("opensearch", _sparse(), None, opts, 5, vector=VEC)
    assert body["query"] == {"hybrid": {"queries": [{"knn": {"dense": {"vector": VEC, "k": 40, "filter": FILTER}}}, SPARSE]}}
    assert body["size"] == 40


def test_a_knn_without_a_filter_has_none():
    from stair_es.backends.cluster.hybrid import es_knn, os_knn

    plain = {"bool": {"should": [], "minimum_should_match": 1}}
    assert "filter" not in es_knn(VEC, plain, 10)
    assert "filter" not in os_knn(VEC, plain, 10)["knn"]["dense"]


def test_mapping_dense_field_follows_the_schema():
    from stair_es.dense import DenseSpec

    schema = IndexSchema(dense=DenseSpec(64).to_dict())
    es = mapping("elasticsearch", "rank_features", schema)
    assert es["mappings"]["properties"]["dense"] == {"type": "dense_vector", "dims": 64, "index": True, "similarity": "dot_product",
                                                  "index_options": {"type": "hnsw"}}
    assert es["mappings"]["_meta"]["stair_es"]["schema"]["dense"]["dims"] == 64
    os_ = mapping("opensearch", "rank_features", IndexSchema(dense=DenseSpec(8, "dot_product").to_dict()))
    assert os_["mappings"]["properties"]["dense"]["dimension"] == 8
    assert os_["mappings"]["properties"]["dense"]["space_type"] == "innerproduct"
    assert os_["settings"]["index"]["knn"] is True
    es_dot = mapping("elasticsearch", "rank_features", IndexSchema(dense=DenseSpec(8, "dot_product").to_dict()))
    assert es_dot["mappings"]["properties"]["dense"]["similarity"] == "max_inner_product"
    assert "dense" not in mapping("elasticsearch", "rank_features", SCHEMA)["mappings"]["properties"]
