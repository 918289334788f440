"""The vocabulary and the one sparse-vector type."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from stair_es.errors import InvalidInputError, InvalidVectorError
from stair_es.sparse import SparseVector
from stair_es.vocab import VOCAB_MD5, VOCAB_SIZE, Vocabulary, basic_tokenize, default_vocabulary


def test_shipped_vocabulary_is_bert_uncased():
    v = default_vocabulary()
    assert len(v) == VOCAB_SIZE == 30522
    assert v.digest == VOCAB_MD5
    assert v.token(0) == "[PAD]" and v.id("[CLS]") == 101 and v.id("dog") == 3899


def test_special_tokens_are_marked():
    v = default_vocabulary()
    specials = {v.token(i) for i in np.flatnonzero(v.special_mask)}
    assert {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused993]"} <= specials
    assert not v.is_special(v.id("dog")) and not v.is_special(v.id("##s"))
    assert len(specials) == 5 + 994


def test_tokenizer_lowercases_strips_accents_splits_punctuation_and_wordpieces():
    v = default_vocabulary()
    assert basic_tokenize("Hello, Wörld!") == ["hello", ",", "world", "!"]
    assert v.tokenize("frisbee") == ["fr", "##is", "##bee"]
    assert v.tokenize("") == []


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_tokenizer_agrees_with_transformers_bert_tokenizer():
    from transformers import BertTokenizer

    path = Path(importlib.util.find_spec("stair_es.data").origin).parent / "bert_uncased_vocab.txt"
    try:  # transformers >= 5 takes `vocab`, 4.x `vocab_file`
        ref = BertTokenizer(vocab=str(path), do_lower_case=True)
    except TypeError:
        ref = BertTokenizer(vocab_file=str(path), do_lower_case=True)
    texts = ["A dog on the BEACH, playing frisbee!", "naïve café déjà-vu", "snowboarders' 3-point jump",
             "中文 mixed text", "e-mail: someone@example.com", "tab\there\nnewline", "unbelievably xyzzyqq"]
    for t in texts:
        assert default_vocabulary().tokenize(t) == ref.tokenize(t), t


def test_from_token_map_sorted_and_top_ordered():
    s = SparseVector.from_token_map({"dog": 1.5, "beach": 0.25, "##s": 0.1})
    assert list(s.ids) == sorted(s.ids)
    assert s.top() == [("dog", 1.5), ("beach", 0.25), ("##s", 0.1)]
    assert s.to_token_map(2) == {"dog": 1.5, "beach": 0.25}
    assert json.loads(s.to_json()) == {"dog": 1.5, "beach": 0.25, "##s": 0.1}


@pytest.mark.parametrize("bad,msg", [
    ({"dog": float("nan")}, "finite"), ({"dog": float("inf")}, "finite"), ({"dog": -1.0}, "non-negative"),
    ({"dogz": 1.0}, "unknown token"), ({"[CLS]": 1.0}, "special"), ({"dog": "high"}, "must be a number"),
])
def test_bad_token_maps_are_rejected_with_the_reason(bad, msg):
    with pytest.raises(InvalidVectorError, match=msg):
        SparseVector.from_token_map(bad)


def test_unknown_tokens_can_be_ignored_and_zero_weights_mean_absent():
    s = SparseVector.from_token_map({"dogz": 1.0, "cat": 0.0, "dog": 2.0}, unknown="ignore")
    assert s.to_token_map() == {"dog": 2.0}


def test_encoder_output_drops_special_tokens():
    dense = np.zeros(VOCAB_SIZE, np.float32)
    dense[[0, 101, 3899]] = [1.0, 2.0, 3.0]
    assert SparseVector.from_dense(dense).to_token_map() == {"dog": 3.0}


def test_prune_top_k_and_min_weight():
    s = SparseVector.from_token_map({"a": 0.1, "b": 0.5, "c": 0.9, "d": 0.5})
    assert [t for t, _ in s.prune(top_k=2).top()] == ["c", "b"]  # tie on 0.5: lower id (b) wins
    assert s.prune(min_weight=0.5).to_token_map() == {"c": 0.9, "b": 0.5, "d": 0.5}
    assert s.prune(top_k=0).nnz == 0


def test_dot_and_contributions_sum():
    a = SparseVector.from_token_map({"dog": 2.0, "beach": 1.0, "cat": 0.5})
    b = SparseVector.from_token_map({"dog": 0.5, "beach": 3.0, "sea": 1.0})
    assert a.dot(b) == pytest.approx(4.0)
    contribs = a.contributions(b)
    assert [c[0] for c in contribs] == ["beach", "dog"]
    assert math.isclose(sum(c[3] for c in contribs), a.dot(b), rel_tol=1e-6)


def test_vocabulary_from_file_errors(tmp_path):
    with pytest.raises(Exception, match="cannot read"):
        Vocabulary.from_file(tmp_path / "missing.txt")
    with pytest.raises(InvalidInputError, match="unknown token"):
        default_vocabulary().id("notatoken!!")
