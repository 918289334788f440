"""The `tokenizers`-based BERT tokenization equals stair_es's former pure-Python tokenizer
(kept below as the reference) and transformers' own BertTokenizer on varied text."""

from __future__ import annotations

import random
import unicodedata

import pytest

from stair_es.errors import ModelError
from stair_es.vocab import Vocabulary, basic_tokenize, default_vocabulary, hf_tokenizer

V = default_vocabulary()


# --- the reference: stair_es's hand-written BERT tokenizer before it moved to `tokenizers` ---------
def _ref_is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _ref_is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def _ref_basic(text: str) -> list[str]:
    chars = []
    for ch in text:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or (unicodedata.category(ch) in ("Cc", "Cf") and ch not in "\t\n\r"):
            continue
        if _ref_is_cjk(cp):
            chars.append(f" {ch} ")
        elif ch.isspace():
            chars.append(" ")
        else:
            chars.append(ch)
    words = []
    for word in "".join(chars).lower().split():
        word = "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")
        cur = ""
        for c in word:
            if _ref_is_punct(c):
                if cur:
                    words.append(cur)
                    cur = ""
                words.append(c)
            else:
                cur += c
        if cur:
            words.append(cur)
    return words


def _ref_wordpiece(word: str) -> list[str]:
    if len(word) > 100:
        return ["[UNK]"]
    pieces, start = [], 0
    while start < len(word):
        end, found = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else "##" + word[start:end]
            if sub in V:
                found = sub
                break
            end -= 1
        if found is None:
            return ["[UNK]"]
        pieces.append(found)
        start = end
    return pieces


def _ref_tokenize(text: str) -> list[str]:
    return [p for w in _ref_basic(text) for p in _ref_wordpiece(w)]


# --- generated text ----------------------------------------------------------------------------
_POOLS = ["àéîõüçñÅØß", "你好世界猫狗山水", "😀🐱🚗❤️👍🏽", "!?.,;:'\"()[]{}-_/\\@#$%^&*~`", "\t\n\r\x00\x07\u200b\ufeff\u00ad",
          "ﬁ½²Å™°", "ʼʻ–—…«»", "abcXYZ0123", "Привет мир", "مرحبا", "ㄱㄴㄷ한국어", "ﾃｽﾄ"]


def _strings(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [t for t in V.tokens if t.isalpha()]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                w = rng.choice(words)
                parts.append(w.upper() if rng.random() < 0.2 else w.capitalize() if rng.random() < 0.2 else w)
            elif r < 0.9:
                pool = rng.choice(_POOLS)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(rng.choice(["x", "ab", "supercalifragilistic"]) * rng.randint(5, 40))  # long words
        out.append(rng.choice([" ", "", "  ", "\t", "\n"]).join(parts))
    return out


STRINGS = _strings(3000)


def test_tokenize_equals_the_former_tokenizer_on_3000_varied_strings():
    different = [(s, V.tokenize(s), _ref_tokenize(s)) for s in STRINGS if V.tokenize(s) != _ref_tokenize(s)]
    assert not different, f"{len(different)} of {len(STRINGS)} differ, e.g. {different[:3]}"


def test_basic_tokenize_and_wordpiece_equal_the_former_ones():
    for s in STRINGS[:1000]:
        words = basic_tokenize(s)
        assert words == _ref_basic(s)
        for w in words:
            assert V.wordpiece(w) == _ref_wordpiece(w)


def test_tokenize_equals_transformers_bert_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("\n".join(V.tokens) + "\n", encoding="utf-8")
    ref = transformers.BertTokenizer(vocab_file=str(vocab_file), do_lower_case=True)
    if len(ref.get_vocab()) < len(V):  # transformers 5 takes the vocabulary as a mapping
        ref = transformers.BertTokenizer(vocab={t: i for i, t in enumerate(V.tokens)}, do_lower_case=True)
    different = [s for s in STRINGS[:1000] if ref.tokenize(s) != V.tokenize(s)]
    assert not different, f"{len(different)} of 1000 differ from transformers, e.g. {different[:3]!r}"


def test_special_tokens_and_truncation():
    tok = hf_tokenizer(max_length=6)
    enc = tok.encode("a red running shoe on a beach")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]" and len(enc.ids) == 6
    assert V.tokenize("") == [] and V.wordpiece("x" * 101) == ["[UNK]"]


def test_a_vocabulary_without_the_bert_special_tokens_is_a_clear_error():
    with pytest.raises(ModelError, match=r"no \[UNK\] token"):
        Vocabulary(["a", "b", "##c"]).tokenize("abc")
