"""The token <-> feature-name codec and the engines' stored precision."""


import numpy as np
import pytest
from hypothesis import given, strategies as st

from stair_es.backends.codec import (
    check_weights,
    decode_token,
    encode_token,
    feature_map,
    stored_value,
    vector_from_features,
)
from stair_es.errors import InvalidVectorError
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary


def test_every_vocabulary_entry_round_trips_without_dots_or_wildcards():
    vocab = default_vocabulary()
    names = [encode_token(t) for t in vocab.tokens]
    assert len(set(names)) == len(names)
    for tok, name in zip(vocab.tokens, names):
        assert decode_token(name) == tok
        assert not set(name) & set(".*?,\\\" "), name


def test_readable_tokens_stay_as_they_are():
    assert encode_token("dog") == "dog"
    assert encode_token("##s") == "##s"
    assert encode_token(".") == "%2E"
    assert encode_token("%") == "%25"
    assert encode_token("u.s") == "u%2Es"


@given(st.text(min_size=1, max_size=20))
def test_any_string_round_trips(text):
    assert decode_token(encode_token(text)) == text
    assert "." not in encode_token(text)


def test_malformed_feature_names_are_reported():
    with pytest.raises(InvalidVectorError):
        decode_token("a%2")
    with pytest.raises(InvalidVectorError):
        decode_token("a%zz")


def test_stored_value_truncates_to_nine_significant_bits():
    assert stored_value(1.2345) == 1.234375
    assert stored_value(0.3) == 0.2998046875
    assert stored_value(1.0) == 1.0
    w = np.random.default_rng(0).uniform(1e-3, 100, 1000).astype(np.float32)
    s = stored_value(w)
    assert np.all(s <= w) and np.all((w - s) / w < 2 ** -8)


def test_feature_map_and_back():
    v = SparseVector.from_token_map({"dog": 1.5, ".": 0.25, "##s": 3.0})
    fm = feature_map(v)
    assert fm == {"dog": 1.5, "%2E": 0.25, "##s": 3.0}
    assert vector_from_features(fm) == v
    ids = feature_map(v, keys="id")
    assert set(ids) == {str(i) for i in v.ids}
    assert vector_from_features(ids, keys="id") == v


def test_weights_that_no_engine_can_store_are_rejected():
    v = SparseVector.from_arrays([2000], [1e-39])
    with pytest.raises(InvalidVectorError, match="cannot be stored"):
        check_weights(v)
    check_weights(SparseVector.from_arrays([2000], [1e-30]))
