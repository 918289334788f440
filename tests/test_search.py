"""Query encoding: document frequencies are fetched only for encoders that weight by idf."""

import numpy as np
import pytest

from fakes import ColorEncoder, MemoryBackend
from stair_es.encoders.text import BagOfWordsEncoder
from stair_es.errors import InvalidInputError
from stair_es.schema import Document, IndexSchema
from stair_es.search import encode_query_text, idf, query_encoder
from stair_es.sparse import SparseVector


class CountingBackend(MemoryBackend):
    def __init__(self):
        super().__init__()
        self.df_calls = 0

    def doc_freqs(self, index, field):
        self.df_calls += 1
        return super().doc_freqs(index, field)


@pytest.fixture
def backend():
    be = CountingBackend()
    be.create_index("x", IndexSchema())
    be.ingest("x", [Document("a", {"image": SparseVector.from_token_map({"dog": 1.0, "cat": 1.0})}),
                    Document("b", {"image": SparseVector.from_token_map({"dog": 1.0})})])
    return be


def test_idf_is_fetched_only_when_the_encoder_uses_it(backend):
    encode_query_text(ColorEncoder(), "dog", backend, "x")
    assert backend.df_calls == 0
    v = encode_query_text(BagOfWordsEncoder(), "dog cat", backend, "x")
    assert backend.df_calls == 1
    assert v.weight("cat") > v.weight("dog") > 0  # rarer in the index -> heavier


def test_idf_is_positive_and_decreasing_in_frequency():
    w = idf(np.array([0, 1, 5, 10]), 10)
    assert np.all(w > 0) and np.all(np.diff(w) < 0)


def test_query_encoder_needs_a_recorded_encoder_or_a_name():
    with pytest.raises(InvalidInputError, match="--tokens"):
        query_encoder(IndexSchema(encoder={"name": "precomputed"}))
    assert query_encoder(IndexSchema(encoder={"name": "bow"})).name == "bow"
    with pytest.raises(InvalidInputError, match="empty"):
        encode_query_text(BagOfWordsEncoder(), "   ")


def test_idf_that_a_backend_cannot_give_is_reported_not_dropped_silently():
    from stair_es.encoders import get_encoder
    from stair_es.search import encode_query_text

    class NoFreqs:
        def doc_freqs(self, index, field):
            raise NotImplementedError

    notes: list[str] = []
    vec = encode_query_text(get_encoder("bow"), "red shoe", NoFreqs(), "ix", notes=notes)
    assert vec.to_token_map() == {"red": 1.0, "shoe": 1.0}
    assert len(notes) == 1 and "without IDF" in notes[0]


def test_query_spec_carries_a_whole_cli_query_to_any_backend(tmp_path):
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.errors import InvalidInputError
    from stair_es.schema import Document, IndexSchema
    from stair_es.search import QuerySpec, make_request
    from stair_es.sparse import SparseVector

    be = EmbeddedBackend(tmp_path)
    be.create_index("ix", IndexSchema(encoder={"name": "bow"}))
    be.ingest("ix", [Document("a", {"image": SparseVector.from_token_map({"red": 1.0, "shoe": 1.0})}, {"brand": "acme"}),
                     Document("b", {"image": SparseVector.from_token_map({"red": 2.0, "hat": 1.0})}, {"brand": "globex"})])
    request, qvec = make_request(be, "ix", QuerySpec(text="red shoe", wheres=["brand=acme"], excludes=["hat"]))
    assert set(qvec.to_token_map()) == {"red", "shoe"}
    assert [h.id for h in be.search("ix", request).hits] == ["a"]
    request, _ = make_request(be, "ix", QuerySpec(tokens='{"red": 1.0}', top_k=1))
    assert [h.id for h in be.search("ix", request).hits] == ["b"]
    with pytest.raises(InvalidInputError, match="give one query"):
        make_request(be, "ix", QuerySpec(text="red", tokens={"red": 1.0}))
