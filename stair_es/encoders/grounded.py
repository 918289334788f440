"""``grounded``: a query's own words plus the WordNet words an image can carry (no model).

The default image encoder describes a picture with the words of ImageNet classes, their
WordNet synonyms and hypernyms (``configs/imagenet_wordnet.json``). A user's query uses
their own words: "a drake", "an automobile", "a puppy" -- none of which need appear in any
image vector even when the image shows exactly that. This encoder keeps the query's own
tokens (as the ``bow`` encoder does: stopwords dropped, the pieces of a word share its
weight, BM25 count saturation, optional index IDF) and adds, for each word, the tokens that
WordNet relates to it *and* that the image encoder can produce
(``configs/wordnet_query_expansion.json``, generated with the image map by
``scripts/build_imagenet_tokens.py``): ``drake`` -> ``duck`` 0.85, ``bird`` 0.78;
``automobile`` -> ``car``, ``vehicle``; ``puppy`` -> ``dog``. Senses are chosen among those
that concern what ImageNet shows (``tiger`` the cat, not the fierce person). Plurals are
reduced to their noun with WordNet's exception list and the usual suffix rules.

An expansion token gets ``expansion`` (0.5) times its WordNet share, times the IDF of the
token when the caller passes one, so a literal query word always outweighs what it was
expanded to; a token keeps its largest weight. Runs in microseconds, imports no model.

This module must not know about indices or backends.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from ..errors import EmptyQueryError, InvalidInputError, ModelError
from ..sparse import SparseVector
from ..vocab import Vocabulary, basic_tokenize
from .base import check_recorded_version, read_packaged_map
from .text import BOW_K1, BagOfWordsEncoder, _check_idf

DEFAULT_EXPANSION = 0.5


@lru_cache(maxsize=1)
def query_expansion_map() -> dict[str, Any]:
    data = read_packaged_map("wordnet_query_expansion.json", "the query expansion map")
    if not isinstance(data, dict) or not isinstance(data.get("words"), dict) or not data.get("version"):
        raise ModelError("the query expansion map wordnet_query_expansion.json is damaged; reinstall stair-es "
                         "or regenerate it with scripts/build_imagenet_tokens.py")
    return data


def noun_base(word: str, words: dict[str, Any], plurals: dict[str, str]) -> str | None:
    """WordNet's morphy for nouns, enough for queries: exceptions, then suffix rules."""
    if word in words:
        return word
    if word in plurals:
        return plurals[word]
    for suffix, repl in (("ies", "y"), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
                         ("men", "man"), ("s", "")):
        if word.endswith(suffix) and len(word) > len(suffix) + 1:
            base = word[: -len(suffix)] + repl
            if base in words:
                return base
    return None


class GroundedQueryEncoder(BagOfWordsEncoder):
    """Query words plus their WordNet relatives that images can carry (see module docstring).

    A :class:`BagOfWordsEncoder` (the query's own tokens, stopwords, saturation, idf) whose
    ``encode_text`` adds the expansion."""

    name = "grounded"
    modalities = frozenset({"text"})

    def __init__(self, *, expansion: float = DEFAULT_EXPANSION, stopwords: Iterable[str] | None = None,
                 k1: float = BOW_K1, expansion_map: str | None = None, allow_version_mismatch: bool = False,
                 vocab: Vocabulary | None = None, name: str | None = None, grounding: Any = "on"):
        super().__init__(stopwords=stopwords, k1=k1, vocab=vocab, name=name, grounding=grounding)
        if not (isinstance(expansion, (int, float)) and 0 <= expansion <= 1):
            raise InvalidInputError(f"expansion must be a number in [0, 1], got {expansion!r}")
        self.expansion = float(expansion)
        data = query_expansion_map()
        self.map_version = data["version"]
        check_recorded_version("the query expansion map", expansion_map, self.map_version, allow_version_mismatch,
                               "query words would expand to other tokens")
        self._words: dict[str, dict[str, float]] = data["words"]
        self._plurals: dict[str, str] = data.get("plurals", {})

    def config(self) -> dict[str, Any]:
        return {**super().config(), "expansion": self.expansion, "expansion_map": self.map_version}

    def expansions(self, text: str) -> dict[str, dict[str, float]]:
        """Per query word (after stopwords), the tokens it expands to with their shares."""
        out: dict[str, dict[str, float]] = {}
        for word in basic_tokenize(text):
            if not word.isalpha() or word in self.stopwords:
                continue
            base = noun_base(word, self._words, self._plurals)
            if base is not None:
                out[word] = dict(self._words[base])
                if base != word and base in self.vocab:
                    out[word].setdefault(base, 1.0)  # "puppies" -> "puppy" itself too
        return out

    def encode_query(self, text: str, idf: np.ndarray | None = None, index_stats: Any = None):
        from .grounding import EncodedQuery, finish_steps

        idf_arr = _check_idf(idf, self.vocab)
        weights: dict[int, float] = {}
        steps: list = []
        try:
            own = super().encode_query(text, idf_arr, index_stats)
            weights.update(zip(own.vector.ids.tolist(), own.vector.weights.tolist()))
            steps = own.grounding
        except EmptyQueryError:
            own = None
        if self.expansion > 0:
            for related in self.expansions(text).values():
                for tok, share in related.items():
                    i = self.vocab.get(tok)
                    if i is None or self.vocab.is_special(i):
                        continue
                    w = self.expansion * share * (float(idf_arr[i]) if idf_arr is not None else 1.0)
                    if w > weights.get(i, 0.0):
                        weights[i] = w
        weights = {i: w for i, w in weights.items() if w > 0}
        if not weights:
            raise EmptyQueryError(
                f"the text {text[:60]!r} has no searchable tokens (only stopwords, punctuation, unknown characters, "
                "or words that occur in no document)")
        ids = np.fromiter(weights.keys(), np.int64, len(weights))
        vec = SparseVector.from_arrays(ids, np.fromiter(weights.values(), np.float64, len(weights)), self.vocab,
                                       drop_special=True)
        if steps:
            from types import SimpleNamespace

            finish_steps(SimpleNamespace(steps=steps), dict(zip(vec.ids.tolist(), vec.weights.tolist())), self.vocab)
        return EncodedQuery(vec, steps)
