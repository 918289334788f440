"""The shipped clip-vocab word list: whole BERT tokens, WordNet nouns/adjectives, provenance and licence."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from stair_es.encoders.base import read_packaged_map
from stair_es.encoders.text import DEFAULT_STOPWORDS
from stair_es.vocab import default_vocabulary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data():
    return read_packaged_map("clip_vocab.json", "the clip-vocab word list")


def test_every_word_is_one_whole_bert_token(data):
    vocab = default_vocabulary()
    words = data["words"]
    assert len(words) == data["counts"]["words"] == len(set(words)) == 10979
    for w in words:
        assert re.fullmatch(r"[a-z]{3,}", w), w
        assert w in vocab and not vocab.is_special(vocab.id(w))
        assert vocab.wordpiece(w) == [w]  # one token: an image's word is one id
    assert not set(words) & DEFAULT_STOPWORDS


def test_common_picture_words_are_in_and_names_are_out(data):
    words = set(data["words"])
    assert {"dog", "cat", "red", "beach", "car", "tree", "wooden", "sunset"} <= words
    assert not {"paris", "london", "photo", "the", "and"} & words  # a name, stopwords


def test_provenance_and_licence(data):
    assert data["version"].startswith("bert-wordnet3.0-v")
    assert "WordNet 3.0" in data["provenance"] and "Princeton University" in data["license_notice"]
    assert data["generated_by"].startswith("scripts/build_clip_vocab.py")


@pytest.mark.skipif(not Path("/usr/share/wordnet/data.noun").is_file(), reason="WordNet 3.0 (Debian wordnet-base) is not installed")
def test_the_script_regenerates_the_shipped_list(tmp_path, data):
    out = tmp_path / "words.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "build_clip_vocab.py"), "--out", str(out)], check=True,
                   capture_output=True)
    import json

    again = json.loads(out.read_text("utf-8"))
    assert again["version"] == data["version"] and again["words"] == data["words"]


def test_an_unknown_option_names_the_valid_ones():
    """Checked before the model is looked for: no model is needed to learn the option names."""
    from stair_es.encoders import get_encoder
    from stair_es.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=r"'clip-vocab' encoder does not take the option topk; its options are "
                                                r"model, top_k, .*templates, .*vocabulary, allow_version_mismatch$"):
        get_encoder("clip-vocab", model="openai/clip-vit-base-patch32", topk=5)
