"""Query words grounded onto the words an index holds.

A query is useful only through tokens the index's documents carry. A photo catalog encoded
with ImageNet words holds ``mammal``, ``animal``, ``flower``, ``daisy``, ``restaurant``... but
no ``giraffe``, ``dandelion`` or ``pub``; and a word BERT splits into WordPiece fragments
(``giraffe`` -> ``gi ##raf ##fe``) must never be searched as its loose pieces, which match
unrelated fragments of other words. Given which tokens occur in the index
(:class:`IndexStats`, the document frequencies every backend reports), each query word is
planned here (:func:`plan_query`):

* **kept**: the word is one whole token the index holds -- searched as itself, nothing else
  happens ("where the index holds a word, no grounding happens");
* **lemma**: an inflected form whose lemma the index holds (``clouds`` -> ``cloud``; WordNet's
  exception lists and suffix rules);
* **grounded**: otherwise the word (or a multiword expression WordNet knows, looked up first:
  ``aloe vera``, ``storm cloud``) is looked up in a map generated from WordNet 3.0
  (``configs/query_grounding.bin``, ``scripts/build_query_grounding.py``) and replaced by its
  best relatives that the index holds -- synonyms, hypernyms, hyponyms, holonyms, meronyms,
  related adjectives, words of the definition -- each with a *share* that falls with the
  WordNet distance (``giraffe`` -> ``mammal`` via hypernym, distance 3, share 0.66);
* **split**: a word neither the vocabulary nor WordNet knows that is several whole words
  written together (``blueman`` -> ``blue`` + ``man``, the fewest parts of 3+ letters) is
  searched as those words (each kept or grounded as above);
* **not found**: no relative is in the index: a whole-token word is kept (it matches nothing),
  a split word's fragments are dropped.

Then every query word that is one whole token (an inflected form: its base form) gets up to
:data:`SIMILAR_MAX` **similar words** the index holds (:func:`add_similar_words`): words used
like it, found offline with the sentence encoder all-MiniLM-L6-v2, WordNet's siblings and
spelling neighbours left out (``configs/similar_words.npz``, ``scripts/build_similar_words.py``):
``desert`` -> ``sand``, ``winter`` -> ``snow``, ``road`` -> ``street``, but never ``red`` -> ``blue``,
``cat`` -> ``dog`` or ``desert`` -> ``dessert``. WordNet says what a thing *is*; a
photo is found as often by what is seen *with* it. Each weighs :data:`SIMILAR_SHARE` x its cosine
x the word's own final weight (half the query's strongest weight for a word the index lacks),
so the word itself always counts more.

The encoders (``stair_es.encoders.text``) turn the plan into weights: a grounded token gets
the word's own weight times the share; fragments of split words are removed from the
vector; and a model's expansion tokens (SPLADE's) are restricted to tokens the index holds
and capped relative to the query's own words. Every step is a :class:`GroundingStep` that
``stair-es search --explain`` / ``--json`` print.

The map is read lazily: its JSON header (~0.1 MB) on first need, then one ~10 kB
compressed block per word looked up (the 4.4 MB file is never read whole), so a query whose
words the index holds never opens it.

This module must not know about backends: the caller hands it the document frequencies.
"""

from __future__ import annotations

import bisect
import json
import threading
import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from ..errors import InvalidInputError, ModelError
from ..vocab import Vocabulary

MAP_FILE = "query_grounding.bin"
SIMILAR_FILE = "similar_words.npz"
#: similar words (see the module docstring) added per query word, the most similar the index holds
SIMILAR_MAX = 10
#: a similar word's weight: this x its cosine x the query word's final weight (0 turns them off)
SIMILAR_SHARE = 0.2
#: only words at least this similar (cosine) are added
SIMILAR_MIN = 0.55
#: relatives of one word kept in a query (the best shares among those the index holds)
MAX_RELATIVES = 3
#: a relative is kept only if its share is at least this fraction of the best one's
RELATIVE_RATIO = 0.6
#: SPLADE expansion tokens weigh at most this fraction of the query's strongest own word
EXPANSION_CAP = 0.1
#: relations never used for grounding (names as in the map's header)
SKIP_RELATIONS: frozenset[str] = frozenset()
#: hyponyms further down than this are not used (a query word names the kind, not a rare sub-kind)
MAX_HYPONYM_DISTANCE = 2
#: a word's relatives share the best one's mass (see plan_query)
SPREAD = True
#: counting words are never grounded: WordNet's nouns for them are playing cards and dice
#: ("two" -> deuce -> card, paper), which a query for "two people" does not mean
NUMBER_WORDS = frozenset("""zero one two three four five six seven eight nine ten eleven twelve dozen
hundred thousand million""".split())


@dataclass(frozen=True)
class IndexStats:
    """What a query encoder may know of the index it searches: per vocabulary id, how many
    documents of ``field`` carry the token, and how many documents there are."""

    doc_freqs: np.ndarray
    n_docs: int
    field: str = "image"

    def __post_init__(self) -> None:
        df = np.asarray(self.doc_freqs).ravel()
        if df.ndim != 1 or (df.size and (not np.all(np.isfinite(df)) or df.min() < 0)):
            raise InvalidInputError("doc_freqs must be one non-negative count per vocabulary entry")
        object.__setattr__(self, "doc_freqs", df)

    @property
    def present(self) -> np.ndarray:
        """Boolean mask over vocabulary ids: the token occurs in at least one document."""
        return self.doc_freqs > 0

    def idf(self) -> np.ndarray:
        """BM25-style IDF (the one ``stair_es.search.idf`` computes)."""
        df = self.doc_freqs.astype(np.float64)
        return np.log1p((max(self.n_docs, 0) - df + 0.5) / (df + 0.5)).astype(np.float32)


def check_stats(stats: Any, vocab: Vocabulary) -> IndexStats | None:
    if stats is None:
        return None
    if not isinstance(stats, IndexStats):
        raise InvalidInputError(f"index_stats must be an IndexStats, got {type(stats).__name__}")
    if stats.doc_freqs.size != len(vocab):
        raise InvalidInputError(f"index_stats must have one document frequency per vocabulary entry ({len(vocab)}), "
                                f"got {stats.doc_freqs.size}")
    return stats


def parse_grounding(value: Any) -> bool:
    """``grounding=`` option -> on/off. Accepts on/off/true/false and a recorded map version
    (an index records the version it was built beside; grounding is query-side, so any
    version means on and the installed map is used)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = value.strip().lower()
        if v in ("on", "true", "yes", "1", "wordnet") or v.startswith("wordnet3.0-qg-"):
            return True
        if v in ("off", "false", "no", "0", "none"):
            return False
    raise InvalidInputError(f"grounding must be on or off, got {value!r}")


# --- the map ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Relative:
    word: str
    relation: str  # synonym, hypernym, ...
    distance: int
    share: float


class GroundingMap:
    """The WordNet grounding map: lemma -> relatives, read block by block (see module docstring)."""

    def __init__(self, source: Any):
        """``source``: the map's bytes, or something with ``open("rb")`` (a path or an
        ``importlib.resources`` file), from which only the header and the blocks looked up are read."""
        self._source = source
        with self._open() as f:
            head = f.readline()
        try:
            self.header = json.loads(head)
            self.version: str = self.header["version"]
            self.relations: dict[str, str] = self.header["relations"]
            self.exceptions: dict[str, str] = self.header["exceptions"]
            table = self.header["blocks"]
        except (ValueError, KeyError, TypeError):
            raise ModelError(f"the query grounding map {MAP_FILE} is damaged; reinstall stair-es or regenerate it "
                             "with scripts/build_query_grounding.py") from None
        self._firsts = [b[0] for b in table]
        starts = np.cumsum([0] + [b[1] for b in table]) + len(head)
        self._spans = list(zip(starts[:-1].tolist(), starts[1:].tolist()))
        self._blocks: dict[int, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _open(self):
        import io

        if isinstance(self._source, (bytes, bytearray)):
            return io.BytesIO(self._source)
        try:
            return self._source.open("rb")
        except OSError as e:
            raise ModelError(f"the query grounding map {MAP_FILE} cannot be read ({e}); reinstall stair-es") from None

    def _block(self, i: int) -> dict[str, str]:
        with self._lock:
            if i not in self._blocks:
                a, b = self._spans[i]
                with self._open() as f:
                    f.seek(a)
                    raw = f.read(b - a)
                try:
                    text = zlib.decompress(raw).decode("utf-8")
                except zlib.error:
                    raise ModelError(f"the query grounding map {MAP_FILE} is damaged; reinstall stair-es") from None
                self._blocks[i] = dict(line.split("\t", 1) for line in text.splitlines() if "\t" in line)
            return self._blocks[i]

    def __contains__(self, lemma: str) -> bool:
        return self._line(lemma) is not None

    def _line(self, lemma: str) -> str | None:
        i = bisect.bisect_right(self._firsts, lemma) - 1
        return None if i < 0 else self._block(i).get(lemma)

    def relatives(self, lemma: str) -> list[Relative]:
        line = self._line(lemma)
        if not line:
            return []
        out = []
        for cell in line.split(" "):
            word, kd, share = cell.rsplit(":", 2)
            out.append(Relative(word, self.relations.get(kd[0], kd[0]), int(kd[1:]), int(share) / 100.0))
        return out

    def lemmas(self, word: str) -> list[str]:
        """Base forms of ``word`` the map knows (WordNet's morphy for nouns and adjectives):
        the word itself, its exception-list base, then suffix rules."""
        out = [word]
        if word in self.exceptions:
            out.append(self.exceptions[word])
        for suffix, repl in (("ies", "y"), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
                             ("men", "man"), ("s", ""), ("er", ""), ("est", ""), ("er", "e"), ("est", "e")):
            if word.endswith(suffix) and len(word) > len(suffix) + 1:
                out.append(word[: -len(suffix)] + repl)
        seen: list[str] = []
        for w in out:
            if w not in seen and (w == word or w in self):
                seen.append(w)
        return seen


@lru_cache(maxsize=1)
def grounding_map() -> GroundingMap:
    from importlib import resources

    return GroundingMap(resources.files("stair_es.encoders").joinpath(f"configs/{MAP_FILE}"))


def map_version() -> str:
    return grounding_map().version


# --- planning a query --------------------------------------------------------------------------
@dataclass
class GroundingStep:
    """What became of one query word (or multiword expression)."""

    word: str
    action: str  # kept | lemma | grounded | not found
    #: token -> share of the word's weight it gets (1.0 for the word itself)
    tokens: dict[str, float] = field(default_factory=dict)
    #: for grounded tokens: token -> (relation, WordNet distance, lemma looked up)
    via: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    #: WordPiece fragments of the word that are not searched
    dropped: list[str] = field(default_factory=list)
    #: token -> final query weight, filled in by the encoder
    weights: dict[str, float] = field(default_factory=dict)
    #: for ``split``: the whole words the word was written as
    parts: list[str] = field(default_factory=list)
    #: similar words added (token -> cosine), see :func:`add_similar_words`
    similar: dict[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.similar:
            return self._describe()
        return self._describe() + "; similar words it holds: " + ", ".join(
            f"{self._fmt(t)} (cosine {c:.2f})" for t, c in self.similar.items())

    def _describe(self) -> str:
        if self.action == "kept":
            return f"word {self.word!r} is in this index: token {self._fmt(next(iter(self.tokens)))}"
        if self.action == "lemma":
            tok = next(iter(self.tokens))
            return f"word {self.word!r} is not in this index: its base form -> token {self._fmt(tok)}"
        frag = f" (its WordPiece fragments {' '.join(self.dropped)} are not searched)" if self.dropped else ""
        if self.action == "not found":
            return f"word {self.word!r} is not in this index and WordNet gives no relative it holds{frag}"
        if self.action == "split":
            parts = []
            for tok in self.tokens:
                if tok in self.via:
                    rel, dist, lemma = self.via[tok]
                    parts.append(f"{lemma!r} -> {rel} {tok!r} (distance {dist}) -> token {self._fmt(tok)}")
                else:
                    parts.append(f"token {self._fmt(tok)}")
            return (f"word {self.word!r} is not in this index nor in WordNet: read as the words "
                    f"{' + '.join(self.parts)}: " + "; ".join(parts) + frag)
        parts = []
        for tok in self.tokens:
            rel, dist, lemma = self.via[tok]
            src = "" if lemma == self.word else f"{lemma!r} -> "
            parts.append(f"{src}{rel} {tok!r} (distance {dist}) -> token {self._fmt(tok)}")
        return f"word {self.word!r} is not in this index: grounded via WordNet " + "; ".join(parts) + frag

    def _fmt(self, tok: str) -> str:
        w = self.weights.get(tok)
        return tok if w is None else f"{tok} {w:.2f}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"word": self.word, "action": self.action, **({"parts": self.parts} if self.parts else {}),
                             "tokens": [{"token": t, "share": round(s, 3),
                                         **({"weight": round(self.weights[t], 4)} if t in self.weights else {}),
                                         **({"relation": self.via[t][0], "distance": self.via[t][1],
                                             "lemma": self.via[t][2]} if t in self.via else {})}
                                        for t, s in self.tokens.items()]}
        if self.dropped:
            d["dropped_fragments"] = list(self.dropped)
        if self.similar:
            d["similar"] = [{"token": t, "cosine": round(c, 2),
                             **({"weight": round(self.weights[t], 4)} if t in self.weights else {})}
                            for t, c in self.similar.items()]
        d["explain"] = self.describe()
        return d


@dataclass
class QueryPlan:
    steps: list[GroundingStep]
    #: vocabulary ids of the query's own words' tokens (kept words, lemmas)
    own_ids: set[int]
    #: vocabulary ids that must not be searched: fragments of split words
    drop_ids: set[int]


def _whole_id(word: str, vocab: Vocabulary) -> int | None:
    pieces = vocab.wordpiece(word)
    if len(pieces) == 1 and pieces[0] == word:
        i = vocab.get(word)
        if i is not None and not vocab.is_special(i):
            return i
    return None


_WORD = None


def query_words(text: str) -> list[str]:
    """The words of a query as BERT's basic tokenizer finds them (lowercased, accents
    stripped, split at spaces and punctuation), keeping those with a letter or digit. A
    regular expression instead of ``vocab.basic_tokenize``, which builds a tokenizer on first
    use (13-40 ms of a cold search that SPLADE, with its own tokenizer, never needs)."""
    import re
    import unicodedata

    global _WORD
    if _WORD is None:
        cjk = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff"  # one token per character, as BERT
        _WORD = re.compile(f"[{cjk}]|[^\\W_{cjk}]+")
    norm = unicodedata.normalize("NFD", text.lower())
    norm = "".join(ch for ch in norm if unicodedata.category(ch) != "Mn")
    return _WORD.findall(norm)


def compound_parts(word: str, vocab: Vocabulary, min_len: int = 3) -> list[str] | None:
    """``word`` as the fewest whole-token words of at least ``min_len`` letters written
    together (``blueman`` -> blue + man), or None. Dynamic programming over split points."""
    if not word.isalpha() or len(word) < 2 * min_len:
        return None
    n = len(word)
    best: list[list[str] | None] = [None] * (n + 1)
    best[0] = []
    for end in range(min_len, n + 1):
        for start in range(0, end - min_len + 1):
            prev = best[start]
            if prev is None or (best[end] is not None and len(best[end]) <= len(prev) + 1):
                continue
            if _whole_id(word[start:end], vocab) is not None:
                best[end] = prev + [word[start:end]]
    parts = best[n]
    return parts if parts and 2 <= len(parts) <= 3 else None


def plan_query(text: str, vocab: Vocabulary, stats: IndexStats, stopwords: Iterable[str], *,
               max_relatives: int | None = None, ratio: float | None = None) -> QueryPlan:
    """Decide, per query word, how it is searched on an index holding ``stats`` (module docstring)."""
    max_relatives = MAX_RELATIVES if max_relatives is None else max_relatives
    ratio = RELATIVE_RATIO if ratio is None else ratio
    present = stats.present
    stop = frozenset(stopwords)
    words = [w for w in query_words(text) if w not in stop]
    steps: list[GroundingStep] = []
    own: set[int] = set()
    drop: set[int] = set()
    gmap: GroundingMap | None = None

    def the_map() -> GroundingMap:
        nonlocal gmap
        if gmap is None:
            gmap = grounding_map()
        return gmap

    def held(word: str) -> int | None:
        i = _whole_id(word, vocab)
        return i if i is not None and present[i] else None

    def fragments(word: str) -> list[str]:
        pieces = vocab.wordpiece(word)
        return [] if len(pieces) == 1 and pieces[0] == word else pieces

    def ground(label: str, lemmas: list[str]) -> GroundingStep:
        best: dict[str, tuple[float, Relative, str]] = {}
        for lemma in lemmas:
            for r in the_map().relatives(lemma):
                i = vocab.get(r.word)
                if i is None or not present[i] or r.relation in SKIP_RELATIONS:
                    continue
                if r.relation == "hyponym" and r.distance > MAX_HYPONYM_DISTANCE:
                    continue
                if r.word not in best or r.share > best[r.word][0]:
                    best[r.word] = (r.share, r, lemma)
        ranked = sorted(best.values(), key=lambda x: (-x[0], x[1].distance, x[1].word))
        if ranked:
            top = ranked[0][0]
            ranked = [x for x in ranked if x[0] >= ratio * top][:max_relatives]
        step = GroundingStep(label, "grounded" if ranked else "not found")
        # One word is one concept: its relatives share the mass of the best one
        # (x best / sum), so a word grounded on three tokens does not outweigh a word kept as one.
        spread = ranked[0][0] / sum(x[0] for x in ranked) if ranked and SPREAD else 1.0
        for share, r, lemma in ranked:
            step.tokens[r.word] = share * spread
            step.via[r.word] = (r.relation, r.distance, lemma)
        return step

    # Which (not held) words WordNet knows only together: longest expression first.
    covered = [False] * len(words)
    i = 0
    while i < len(words):
        for n in (3, 2):
            if i + n > len(words):
                continue
            if all(held(w) is not None for w in words[i:i + n]):
                continue  # every word is in the index: searched as themselves
            head = words[i + n - 1]
            phrase = None
            if any(not w.isalpha() for w in words[i:i + n]):
                continue
            for form in the_map().lemmas(head):
                cand = " ".join(words[i:i + n - 1] + [form])
                if cand in the_map():
                    phrase = cand
                    break
            if phrase is None:
                continue
            step = ground(" ".join(words[i:i + n]), [phrase])
            for w in words[i:i + n]:  # the expression's own words the index holds are kept too
                j = held(w)
                if j is not None:
                    own.add(j)
                else:
                    step.dropped.extend(fragments(w))
            if step.tokens or step.dropped:
                steps.append(step)
            for k in range(i, i + n):
                covered[k] = True
            i += n - 1
            break
        i += 1

    for w, done in zip(words, covered):
        if done:
            continue
        j = held(w)
        if j is not None:
            own.add(j)
            steps.append(GroundingStep(w, "kept", {w: 1.0}))
            continue
        lemma_ids = [(f, held(f)) for f in (the_map().lemmas(w) if w.isalpha() else [w])[1:]]
        lemma_ids = [(f, k) for f, k in lemma_ids if k is not None]
        if lemma_ids:
            f, k = lemma_ids[0]
            own.add(k)
            step = GroundingStep(w, "lemma", {f: 1.0})
            step.dropped = fragments(w)
            steps.append(step)
            continue
        # the word's own entry if WordNet has one, else its first base form that it has
        # ("gander" is a lemma: never also read as "gand" + "-er")
        # (counting words never: see NUMBER_WORDS)
        forms = [f for f in the_map().lemmas(w) if f in the_map()][:1] if w.isalpha() and w not in NUMBER_WORDS else []
        step = ground(w, forms) if forms else GroundingStep(w, "not found")
        step.dropped = fragments(w)
        # only for words WordNet does not know: "dandelion" is never "dan" + "del" + "ion"
        parts = compound_parts(w, vocab) if not forms and step.dropped else None
        if parts:  # "blueman", "fruitcollection": words written together are searched as those words
            step.action = "split"
            step.parts = parts
            for part in parts:
                k = held(part)
                if k is not None:
                    own.add(k)
                    step.tokens[part] = 1.0
                else:
                    sub = ground(part, [f for f in the_map().lemmas(part) if f in the_map()][:1])
                    for tok, share in sub.tokens.items():
                        if tok not in step.tokens:
                            step.tokens[tok] = share
                            step.via[tok] = sub.via[tok]
            if not step.tokens:
                step.action = "not found"
        if step.action == "not found" and not step.dropped:
            k = _whole_id(w, vocab)
            if k is not None:
                own.add(k)  # a whole word the index lacks: kept (it matches nothing, harms nothing)
        steps.append(step)

    for s in steps:
        for p in s.dropped:
            k = vocab.get(p)
            if k is not None:
                drop.add(k)
    drop -= own
    return QueryPlan(steps, own, drop)


def apply_plan(weights: dict[int, float], plan: QueryPlan, vocab: Vocabulary, present: np.ndarray, *,
               base_weight: float | None = None, restrict_expansions: bool = True,
               expansion_cap: float | None = EXPANSION_CAP) -> dict[int, float]:
    """Turn a text encoder's raw weights (vocabulary id -> weight, before IDF) into the
    grounded query: fragments of split words removed, expansion tokens (ids that are not the
    query's own words) restricted to the index and capped at ``expansion_cap`` x the query's
    strongest own word, and each grounded token added with ``share x`` the word's weight
    (``base_weight`` if given -- a bag of words gives every word 1 --, else the strongest
    weight the model gave the word's own token or fragments, else the strongest own word's,
    else 1). A token keeps its largest weight."""
    out = {i: w for i, w in weights.items() if i not in plan.drop_ids and w > 0}
    own_w = [out[i] for i in plan.own_ids if i in out]
    bases: dict[int, float] = {}  # step index -> the weight of the word it grounds
    for n, step in enumerate(plan.steps):
        if step.action not in ("grounded", "lemma", "split"):
            continue
        base = base_weight
        if base is None:
            frag = [weights.get(vocab.get(p) or -1, 0.0) for p in step.dropped]
            own_whole = _whole_id(step.word, vocab)
            if own_whole is not None:
                frag.append(weights.get(own_whole, 0.0))
            base = max(frag, default=0.0) or (max(own_w) if own_w else 0.0) or 1.0
        bases[n] = base
    # the cap is relative to the query's strongest word, kept or grounded
    ref = max(own_w + list(bases.values())) if own_w or bases else None
    for i in list(out):
        if i in plan.own_ids:
            continue
        if (restrict_expansions and not present[i]) or vocab.tokens[i].startswith("##"):
            del out[i]
        elif expansion_cap is not None and ref is not None:
            out[i] = min(out[i], expansion_cap * ref)
    for n, base in bases.items():
        for tok, share in plan.steps[n].tokens.items():
            i = vocab.get(tok)
            if i is None:
                continue
            w = share * base
            if w > out.get(i, 0.0):
                out[i] = w
    return out


class SimilarWords:
    """The similar-word table (``configs/similar_words.npz``, module docstring): per vocabulary
    id, its neighbours best first with their cosines."""

    def __init__(self, source: Any):
        try:
            with np.load(source, allow_pickle=False) as z:
                self.version = json.loads(str(z["meta"]))["version"]
                self.words, self.offsets = z["words"], z["offsets"]
                self.neighbours, self.cosines = z["neighbours"], z["similarity"]  # uint16 ids, uint8 cosine x 100
            if len(self.offsets) != len(self.words) + 1 or self.offsets[-1] != len(self.neighbours):
                raise ValueError("offsets")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ModelError(f"the similar-word table {SIMILAR_FILE} is damaged ({e}); reinstall stair-es or "
                             "regenerate it with scripts/build_similar_words.py") from None

    def of(self, token_id: int) -> tuple[np.ndarray, np.ndarray]:
        r = int(np.searchsorted(self.words, token_id))
        a, b = (self.offsets[r], self.offsets[r + 1]) if r < len(self.words) and self.words[r] == token_id else (0, 0)
        return self.neighbours[a:b].astype(np.int64), self.cosines[a:b] / 100.0


@lru_cache(maxsize=1)
def similar_words() -> SimilarWords:
    from importlib import resources

    with resources.files("stair_es.encoders").joinpath(f"configs/{SIMILAR_FILE}").open("rb") as f:
        return SimilarWords(f)


def add_similar_words(final: dict[int, float], plan: QueryPlan, vocab: Vocabulary, present: np.ndarray, *,
                      share: float = SIMILAR_SHARE, max_words: int = SIMILAR_MAX) -> dict[int, float]:
    """Add each query word's similar words the index holds (module docstring) to the query's
    final weights (after IDF), recording them on the word's step for explain."""
    if not share or not final:
        return final
    table = similar_words()
    ref = max(final.values())
    out = dict(final)
    for step in plan.steps:
        # the word's own token, or for an inflected form the base form it was searched as
        i = vocab.get(next(iter(step.tokens))) if step.action == "lemma" else _whole_id(step.word, vocab)
        if i is None:
            continue
        base = final.get(i, 0.0) or 0.5 * ref
        ids, cos = table.of(i)
        held = present[ids] & (cos >= SIMILAR_MIN)
        for j, c in list(zip(ids[held].tolist(), cos[held].tolist()))[:max_words]:
            w = share * c * base
            if w > out.get(j, 0.0):
                out[j] = w
                step.similar[vocab.tokens[j]] = c
    return out


def finish_steps(plan: QueryPlan, final: dict[int, float], vocab: Vocabulary) -> list[GroundingStep]:
    """Record each step's tokens' final query weights (after IDF) for explain."""
    for step in plan.steps:
        for tok in list(step.tokens) + list(step.similar):
            i = vocab.get(tok)
            if i is not None and i in final:
                step.weights[tok] = float(final[i])
    return plan.steps


@dataclass
class EncodedQuery:
    """A query vector with the grounding steps that made it (empty without index statistics)."""

    vector: Any
    grounding: list[GroundingStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
