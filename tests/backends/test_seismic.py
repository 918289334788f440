"""OpenSearch SEISMIC (sparse_vector): method_parameters passed through and checked, filtered
queries still return top_k (the filter goes into method_parameters with k = top_k x 4), and
explain reports the byte quantisation SEISMIC scores with."""

import numpy as np
import pytest

from .fake_cluster import FakeCluster
from stair_es.backends.base import get_backend
from stair_es.backends.cluster.translate import translate
from stair_es.backends.opensearch import SeismicParams, quantise
from stair_es.errors import InvalidInputError
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

SCHEMA = IndexSchema(fields={"colour": "keyword"})


def _req(flt=None, k=5):
    return SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 2.0, "cat": 0.5}))], filter=flt,
                         top_k=k).prepared(SCHEMA)


def _ns(tr):
    (clause,) = tr.query["bool"]["should"]
    return clause["neural_sparse"]["image"]


def test_method_parameters_are_passed_through():
    ns = _ns(translate(_req(), engine="opensearch", field_type="sparse_vector",
                       seismic=SeismicParams(k=50, top_n=8, heap_factor=1.5)))
    assert ns["method_parameters"] == {"k": 50, "top_n": 8, "heap_factor": 1.5}
    assert _ns(translate(_req(), engine="opensearch", field_type="sparse_vector"))["method_parameters"] == {"k": 5}


def test_a_filter_goes_into_method_parameters_with_overfetch():
    ns = _ns(translate(_req(Term("colour", "red")), engine="opensearch", field_type="sparse_vector"))
    assert ns["method_parameters"] == {"k": 20, "filter": {"bool": {"filter": [{"term": {"colour": "red"}}]}}}
    ns = _ns(translate(_req(Term("colour", "red")), engine="opensearch", field_type="sparse_vector",
                       seismic=SeismicParams(filter_overfetch=10)))
    assert ns["method_parameters"]["k"] == 50


def test_rank_features_queries_get_no_method_parameters():
    tr = translate(_req(), engine="opensearch", field_type="rank_features", form="neural_sparse")
    assert "method_parameters" not in _ns(tr)


@pytest.mark.parametrize("opts, msg", [
    ({"k": 0}, "k must be"), ({"top_n": -1}, "top_n must be"), ({"heap_factor": 0}, "heap_factor"),
    ({"heap_factor": float("inf")}, "heap_factor"), ({"filter_overfetch": 0}, "filter_overfetch"),
    ({"k": 2.5}, "k must be"), ({"cut": 3}, "unknown seismic parameter"),
])
def test_out_of_range_parameters_are_refused(opts, msg):
    with pytest.raises(InvalidInputError, match=msg):
        SeismicParams.from_options(opts)


def test_quantisation_matches_opensearch():
    # round(min(w, 3) * 255 / 3) * 3 / 255, Java rounding (half up), clipped at the ceiling
    assert quantise(1.0, 3.0) == pytest.approx(85 * 3 / 255)
    assert quantise(5.0, 3.0) == pytest.approx(3.0)
    assert quantise(0.001, 3.0) == 0.0
    assert quantise(np.array([3 / 510]), 3.0)[0] == pytest.approx(3 / 255)  # exactly half a step rounds up


def _corpus(anti_correlated: bool):
    docs = []
    for i in range(60):
        # anti-correlated: the 30 strongest dog documents are all blue, so an approximate top-k
        # (filtered afterwards) holds no red one until k reaches the red documents
        colour = ("blue" if i < 30 else "red") if anti_correlated else ("red" if i % 3 == 0 else "blue")
        docs.append(Document(f"d{i:02d}", {"image": SparseVector.from_token_map({"dog": 3.0 - i * 0.04})},
                             {"colour": colour}, f"dog {i}"))
    return docs


@pytest.mark.parametrize("anti_correlated", [False, True])
def test_filtered_seismic_search_returns_top_k(anti_correlated):
    """The fake models OpenSearch's documented SEISMIC filtering (P <= k: exact over the filtered
    documents; else the approximate top k, then the filter). k = top_k x 4 fills top_k when the
    filter is not against the ranking; when it is, stair_es repeats with a larger k up to P."""
    with FakeCluster("opensearch", version="3.3.0") as c:
        b = get_backend("opensearch", urls=c.url, field_type="sparse_vector")
        b.create_index("seis", SCHEMA)
        assert not b.ingest("seis", _corpus(anti_correlated)).failures
        req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))], filter=Term("colour", "red"),
                            top_k=5)
        res = b.search("seis", req)
        assert len(res.hits) == 5
        assert all(h.metadata["colour"] == "red" for h in res.hits)
        want = [d.id for d in _corpus(anti_correlated) if d.metadata["colour"] == "red"][:5]
        assert [h.id for h in res.hits] == want
        retried = [n for n in res.notes if "repeated" in n]
        assert bool(retried) == anti_correlated, res.notes
        if anti_correlated:
            assert "30 documents pass the filter" in retried[0] and "exactly" in retried[0]
        exp = b.explain("seis", res.hits[0].id, req)
        assert any("SEISMIC" in n and "scored exactly" in n for n in exp.notes)
