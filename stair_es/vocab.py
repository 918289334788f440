"""The BERT uncased WordPiece vocabulary (30,522 entries) and a dependency-free tokenizer.

Every sparse vector in stair_es is a weight map over this vocabulary. It ships with
the package (``stair_es/data/bert_uncased_vocab.txt``) and is checked by md5 on load,
so ids mean the same thing for every encoder, every index and every backend.

This module owns: token <-> id lookup, which ids are *special* (never indexed), and
BERT's basic + WordPiece tokenization (uncased, accents stripped) through the Hugging Face
``tokenizers`` library, which builds from the shipped ``vocab.txt`` in milliseconds, so query
parsing never imports ``transformers``. It must not know about encoders or indices.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import InvalidInputError, ModelError

VOCAB_SIZE = 30522
VOCAB_MD5 = "64800d5d8528ce344256daf115d4965e"
_SPECIAL_RE = re.compile(r"^\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]$")


class Vocabulary:
    """An ordered WordPiece vocabulary; ``id`` is the line number in ``vocab.txt``."""

    def __init__(self, tokens: Sequence[str], name: str = "bert-base-uncased"):
        self.tokens: list[str] = list(tokens)
        self.name = name
        self._index = {t: i for i, t in enumerate(self.tokens)}
        if len(self._index) != len(self.tokens):
            raise ModelError(f"vocabulary {name!r} has duplicate entries")
        self.special_mask = np.fromiter((t[:1] == "[" and bool(_SPECIAL_RE.match(t)) for t in self.tokens), bool,
                                        len(self.tokens))
        self.special_mask.flags.writeable = False
        self._digest: str | None = None

    # --- construction -------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> "Vocabulary":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ModelError(f"cannot read vocabulary file {path}: {e.strerror}") from e
        tokens = text.split("\n")
        if tokens and tokens[-1] == "":
            tokens.pop()
        return cls(tokens, name=name or path.name)

    # --- lookup -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def id(self, token: str) -> int:
        try:
            return self._index[token]
        except KeyError:
            raise InvalidInputError(f"unknown token {token!r}: not in the {self.name} vocabulary "
                                    f"(use `stair-es encode --text ...` to see how a word is tokenized)") from None

    def same_ids(self, table: dict[str, int]) -> bool:
        """Whether ``table`` (token -> id, e.g. a tokenizer's) maps exactly our tokens to our ids."""
        return table == self._index

    def mismatches(self, table: dict[str, int], limit: int = 3) -> tuple[int, list[str]]:
        """(number of our tokens ``table`` maps to another id or not at all, the first ``limit``)."""
        bad = [t for i, t in enumerate(self.tokens) if table.get(t) != i]
        return len(bad), bad[:limit]

    def get(self, token: str, default: int | None = None) -> int | None:
        return self._index.get(token, default)

    def token(self, i: int) -> str:
        return self.tokens[i]

    def is_special(self, i: int) -> bool:
        return bool(self.special_mask[i])

    @property
    def digest(self) -> str:
        """md5 of the vocabulary as ``vocab.txt`` text; stored in indices and checkpoints."""
        if self._digest is None:
            self._digest = hashlib.md5(("\n".join(self.tokens) + "\n").encode("utf-8")).hexdigest()
        return self._digest

    # --- tokenization -------------------------------------------------------------------
    def hf(self):
        """This vocabulary's Hugging Face ``tokenizers`` tokenizer (built once, see :func:`hf_tokenizer`)."""
        tok = self.__dict__.get("_hf_tokenizer")
        if tok is None:
            tok = hf_tokenizer(self)
            self.__dict__["_hf_tokenizer"] = tok
        return tok

    def tokenize(self, text: str) -> list[str]:
        """BERT uncased tokenization: basic split, then greedy longest-match WordPiece."""
        return self.hf().encode(text, add_special_tokens=False).tokens

    def wordpiece(self, word: str, max_chars: int = 100) -> list[str]:
        """WordPiece pieces of one word from :func:`basic_tokenize` (``[UNK]`` if it cannot be split)."""
        if len(word) > max_chars:
            return ["[UNK]"]
        return [t.value for t in self.hf().model.tokenize(word)] or ["[UNK]"]

    def encode(self, text: str) -> list[int]:
        return [self._index[t] for t in self.tokenize(text)]


def basic_tokenize(text: str) -> list[str]:
    """Lower-case, strip accents, drop control chars, split on whitespace and punctuation
    (BERT's basic tokenizer: the normalizer and pre-tokenizer of :func:`hf_tokenizer`)."""
    tok = _shipped_hf_tokenizer()
    return [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]


def hf_tokenizer(vocab: Vocabulary | None = None, *, max_length: int | None = None):
    """A Hugging Face ``tokenizers`` BERT WordPiece tokenizer over ``vocab`` (default: the shipped one).

    Uncased, accents stripped, Chinese characters split, ``[CLS] ... [SEP]`` added by
    ``encode`` (pass ``add_special_tokens=False`` to leave them out). ``max_length`` turns on
    truncation (special tokens included). Built in milliseconds; never imports transformers.
    A new object per call for a custom vocabulary; the shipped vocabulary's is cached.
    """
    shipped = vocab is None or vocab.digest == VOCAB_MD5
    base = _shipped_hf_tokenizer() if shipped else _build_hf_tokenizer(tuple(vocab.tokens))
    if max_length is None:
        return base
    # lazy: tokenizers loads only when text is tokenized
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(base.to_str())
    tok.enable_truncation(max_length=max_length)
    return tok


@lru_cache(maxsize=1)
def _shipped_hf_tokenizer():
    return _build_hf_tokenizer(tuple(default_vocabulary().tokens))


def _build_hf_tokenizer(tokens: tuple[str, ...]):
    try:
        # lazy: tokenizers loads only when text is tokenized
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    except ImportError:
        raise ModelError(
            "BERT tokenization needs the `tokenizers` package, a dependency of stair-es: pip install tokenizers"
        ) from None
    index = {t: i for i, t in enumerate(tokens)}
    for needed in ("[UNK]", "[CLS]", "[SEP]"):
        if needed not in index:
            raise ModelError(f"the vocabulary has no {needed} token; a BERT WordPiece vocabulary is required")
    tok = Tokenizer(models.WordPiece(index, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True,
                                                lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", index["[CLS]"]), ("[SEP]", index["[SEP]"])])
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


@lru_cache(maxsize=1)
def default_vocabulary() -> Vocabulary:
    """The shipped BERT uncased vocabulary, md5-checked."""
    ref = resources.files("stair_es.data").joinpath("bert_uncased_vocab.txt")
    data = ref.read_bytes()
    digest = hashlib.md5(data).hexdigest()
    if digest != VOCAB_MD5:
        raise ModelError(f"the packaged vocabulary is damaged (md5 {digest}, expected {VOCAB_MD5}); reinstall stair-es")
    tokens = data.decode("utf-8").split("\n")
    if tokens[-1] == "":
        tokens.pop()
    vocab = Vocabulary(tokens, name="bert-base-uncased")
    if len(vocab) != VOCAB_SIZE:
        raise ModelError(f"the packaged vocabulary has {len(vocab)} entries, expected {VOCAB_SIZE}")
    return vocab
