#!/usr/bin/env python3
"""Generate the ImageNet-1k class -> WordPiece token map of the ``imagenet`` encoder from WordNet 3.0.

    python scripts/build_imagenet_tokens.py                       # writes stair_es/encoders/configs/imagenet_wordnet.json
    python scripts/build_imagenet_tokens.py --query-expansion     # and wordnet_query_expansion.json (grounded queries)
    python scripts/build_imagenet_tokens.py --wordnet /usr/share/wordnet --synsets imagenet_synsets.txt --out map.json

ImageNet-1k classes are WordNet 3.0 noun synsets (``n02085620`` = offset 02085620 in
``data.noun``). For every class this script collects, with a *share* in (0, 1] of the class
probability each token receives:

* **names**: the cleaned class name (open_clip's, shipped in
  ``stair_es/data/imagenet_classnames.json``) and the synset's WordNet lemmas. In a name the
  head noun gets 1.0 and modifiers 0.6 (``great white shark``: ``shark`` 1.0, ``great`` 0.6);
  a parenthesised gloss counts half. **Only words that are one whole BERT token are kept**
  (a hyphenated compound counts as one word: ``drop-off``): the WordPiece fragments of a
  longer word (``tabby`` -> ``tab ##by``, ``Egyptian Mau`` -> ``ma ##u``) would match unrelated
  fragments of queries, so such a word is carried by its WordNet relatives instead. WordNet
  lemmas (synonyms) count :data:`SYNONYM_FACTOR` (Latin names such as *Tinca tinca* add
  nothing: they are not whole tokens).
* **a head carried by a relative**: when no name of the class keeps its head noun (``goldfish``,
  ``Egyptian Mau``, ``espresso`` are not whole tokens), the class's nearest whole-token
  relative takes the head's share :data:`HEAD_SHARE`: the heads of its synonyms
  (``Egyptian cat`` -> ``cat``) or else the words of the nearest hypernym level that gives any
  (``goldfish`` -> ``fish``, ``espresso`` -> ``coffee``). (Script version 1 kept the fragments,
  each with the word's weight divided among them.)
  When every relative is one of WordNet's category words that are otherwise skipped
  (``toaster``, ``syringe``, ``salt shaker``), the nearest of them carries the head
  (``appliances``, ``instrument``, ``container``) rather than leaving the class without a token.
* **hypernyms**: walking up the ``@`` (hypernym) and ``@i`` (instance) pointers, the first
  :data:`LEMMAS_PER_HYPERNYM` lemmas of each ancestor synset, head noun only, kept only when
  that word is one whole BERT token (``beagle`` -> ``hound``, ``dog``, ``canine``,
  ``carnivore``, ``mammal``, ``animal``). The share decays with the distance ``d`` (1 for the
  parent): ``max(HYPERNYM_FLOOR, HYPERNYM_FIRST - HYPERNYM_STEP * (d - 1))``. The walk stops
  at the uninformative top of the hierarchy (:data:`STOP_SYNSETS`: ``entity``, ``object``,
  ``whole``, ``artifact``, ``instrumentality``, ``organism``...): a query never says
  "instrumentality", and a token every image carries ranks nothing. Taxonomic jargon that
  only blurs rankings (``chordate``, ``vertebrate``, ``placental``...) is skipped but the
  walk goes on through it.

* **context words** (script version 3), what a class says about the rest of the picture: up
  to :data:`DEFINITION_WORDS` words of the synset's definition (:data:`DEFINITION_SHARE`:
  ``beach`` -> ``sea``, ``ocean``), the two parts of a head written as one word
  (:data:`COMPOUND_SHARE`: ``lakeside`` -> ``lake``), and ``person`` for classes under
  clothing, headdress, footwear, jewelry, masks and cosmetics (:data:`WORN_SHARE`). Each is a
  colour name or a common noun (not a proper noun, not mostly an adjective or verb in WordNet's
  tagged counts, ``cntlist.rev``) whose most frequent sense lies in a lexicographer file of
  things one can see (:data:`PICTURABLE_LEXFILES`).

A token reached several ways keeps its largest share. Stopwords and punctuation are never
tokens. The output records its provenance (WordNet 3.0 with the WordNet licence notice,
which requires the notice to go with copies of derived data), the parameters, and a
``version`` string (parameters + content hash) that the encoder stores in every index it
builds, so vectors made with another map are never mixed with these.

Inputs, all offline:

* WordNet 3.0: Debian ``wordnet-base`` (``/usr/share/wordnet``); installed with apt-get when
  missing (needs root). The database itself is not shipped with stair_es.
* the 1,000 class wnids in class order: ``timm/data/_info/imagenet_synsets.txt`` from the
  ``timm`` wheel on PyPI, fetched with ``pip download timm --no-deps`` into a temporary
  folder (timm is not a dependency of stair_es), or a local file given with ``--synsets``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stair_es.encoders.imagenet import (  # noqa: E402
    GLOSS_FACTOR,
    HEAD_SHARE,
    MODIFIER_SHARE,
    _split_names,
    _word_shares,
)
from stair_es.vocab import default_vocabulary  # noqa: E402

SCRIPT_VERSION = 3
SYNONYM_FACTOR = 0.8
LEMMAS_PER_HYPERNYM = 2
HYPERNYM_FIRST = 0.85
HYPERNYM_STEP = 0.07
HYPERNYM_FLOOR = 0.4
MAX_DEPTH = 12
# The walk stops at these synsets (first lemma as in WordNet 3.0): too general to be searched
# for, and a token on most images ranks nothing.
STOP_SYNSETS = frozenset("""entity physical_entity abstraction abstract_entity object whole artifact
instrumentality organism living_thing causal_agent matter unit thing part substance
physical_object group grouping attribute measure relation communication psychological_feature
event act process state location""".split())
# Skipped (the walk continues through them): taxonomy words a catalog user does not search by.
SKIP_WORDS = frozenset("""chordate vertebrate craniate placental eutherian metazoan invertebrate
arthropod mollusk gastropod passerine oscine diapsid anapsid archosaur saurian ungulate
artiodactyl perissodactyl odontoceti cetacean teleost ganoid elasmobranch selachian
commodity instrument implement device equipment container structure covering conveyance
creation product way system medium article being object part solid organ goods good nutrient
individual produce java matter entity whole mammalian unit element piece thing form kind type
construction cover covering mechanism constraint restraint obstruction formation establishment articles
elevation apparatus lodging housing""".split())
# (Version 2 added the last two lines: WordNet's category words for buildings, landforms and
# gadgets -- "construction" was on 59 classes, "cover" on 34 -- which nobody types.)

# Context words (version 3): what a class says about the rest of the picture.
#: share of a word of the class's WordNet definition ("beach" -> sea, ocean; "ski" -> snow)
DEFINITION_SHARE = 0.35
#: at most this many definition words per class, in the definition's order
DEFINITION_WORDS = 4
#: share of each part of a class head written as two words ("snowmobile" -> snow, "lakeside" -> lake)
COMPOUND_SHARE = 0.5
#: share of ``person`` for things people wear (a suit, a bikini, a sombrero are on someone)
WORN_SHARE = 0.5
#: WordNet lexicographer files of things one can see: definition words and compound parts are
#: kept only when their most frequent noun sense is in one of them (noun.animal, .artifact,
#: .body, .food, .object, .person, .phenomenon, .plant, .substance), so "any", "time", "kind",
#: "Europe" or "measure" never become image tokens
PICTURABLE_LEXFILES = frozenset({5, 6, 8, 13, 17, 18, 19, 20, 27})
#: the WordNet synsets (first sense of each lemma) under which a class is worn by a person
WORN_ROOTS = ("clothing", "headdress", "footwear", "jewelry", "mask", "protective_garment", "cosmetic")
#: definition words never kept (function words WordNet's glosses are made of; "can" is nearly
#: always the modal there, which WordNet does not list)
DEFINITION_STOPWORDS = frozenset("""a an the of or and to in on for with by from as at is are be that which who
its it this used usually often especially any some one two such other various small large very typically
having has have made something someone part kind type form sort piece member body act thing things set
several like same can world""".split())


def ensure_wordnet(folder: Path) -> Path:
    if (folder / "data.noun").is_file():
        return folder
    if shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "wordnet-base"], check=True)
        if (folder / "data.noun").is_file():
            return folder
    sys.exit(f"WordNet 3.0 not found in {folder}: install the Debian package wordnet-base (as root: apt-get install wordnet-base)")


def fetch_synsets(explicit: Path | None) -> list[str]:
    if explicit is not None:
        lines = explicit.read_text().split()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "timm", "-d", tmp], check=True)
            wheel = next(Path(tmp).glob("timm-*.whl"))
            with zipfile.ZipFile(wheel) as z:
                lines = z.read("timm/data/_info/imagenet_synsets.txt").decode().split()
    if len(lines) != 1000 or not all(re.fullmatch(r"n\d{8}", w) for w in lines):
        sys.exit(f"expected 1000 wnids like n01440764, got {len(lines)}")
    return lines


def read_index(folder: Path) -> dict[str, list[str]]:
    """lemma -> its noun synset offsets, most frequent sense first (``index.noun``)."""
    out: dict[str, list[str]] = {}
    with open(folder / "index.noun", encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            fields = line.split()
            n_synsets, n_ptr = int(fields[2]), int(fields[3])
            offsets = fields[6 + n_ptr : 6 + n_ptr + n_synsets]
            out[fields[0]] = offsets
    return out


def read_exceptions(folder: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(folder / "noun.exc", encoding="latin-1") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2:
                out[parts[0]] = parts[1]
    return out


def read_wordnet(folder: Path) -> dict[str, tuple[list[str], list[str], str, int]]:
    """offset -> (lemmas, hypernym offsets, definition, lexicographer file number) for every noun
    synset of ``data.noun`` (the definition is the gloss up to its first ``;``, quoted examples
    removed)."""
    out: dict[str, tuple[list[str], list[str], str, int]] = {}
    with open(folder / "data.noun", encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # the licence header
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            offset, n_words = fields[0], int(fields[3], 16)
            words = [fields[4 + 2 * i] for i in range(n_words)]
            p = 4 + 2 * n_words
            n_ptr = int(fields[p])
            hyper = []
            for i in range(n_ptr):
                sym, target, pos = fields[p + 1 + 4 * i : p + 4 + 4 * i]
                if sym in ("@", "@i") and pos == "n":
                    hyper.append(target)
            definition = re.sub(r'"[^"]*"', " ", gloss).split(";")[0]
            out[offset] = ([re.sub(r"\(.*\)$", "", w) for w in words], hyper, definition, int(fields[1]))
    return out


def _join_hyphens(text: str) -> str:
    """``drop-off`` -> ``dropoff``: a hyphenated compound is one word (a token only if BERT has it)."""
    return re.sub(r"(?<=\w)-(?=\w)", "", text)


class Builder:
    def __init__(self) -> None:
        self.vocab = default_vocabulary()

    def _pieces(self, word: str) -> list[str] | None:
        pieces = self.vocab.wordpiece(word)
        if not pieces or any(p not in self.vocab or self.vocab.is_special(self.vocab.id(p)) for p in pieces):
            return None
        return pieces

    def name_shares(self, name: str, factor: float, out: dict[str, float], skip_jargon: bool = False) -> list[str]:
        """Head noun 1.0, modifiers 0.6, whole-token words only (see the module docstring).
        Returns the head nouns kept (of full alternatives, not of glosses)."""
        heads = []
        # the encoder's own name rules (head noun, modifiers, glosses, "X of Y"), one implementation
        for text, f in _split_names(name):
            for word, word_share in _word_shares(_join_hyphens(text.replace("_", " "))):
                pieces = self._pieces(word)
                if pieces is None or len(pieces) > 1 or (skip_jargon and word in SKIP_WORDS):
                    continue
                out[word] = max(out.get(word, 0.0), round(word_share * f * factor, 4))
                if word_share == HEAD_SHARE and f == 1.0:
                    heads.append(word)
        return heads

    def hypernym_shares(self, offset: str, wn: dict, out: dict[str, float], first_share: float | None = None,
                        skip: frozenset[str] = SKIP_WORDS) -> list[str]:
        """The hypernym chain's head nouns with decaying shares; ``first_share`` (when given) is
        the share of the nearest level that gives any word (a class whose own head is no token);
        words in ``skip`` are passed through."""
        seen = {offset}
        frontier = [offset]
        path: list[str] = []
        level: list[tuple[str, float]] = []  # this depth's words: one share for the whole level
        for depth in range(1, MAX_DEPTH + 1):
            nxt = []
            for off in frontier:
                for h in wn[off][1]:
                    if h in seen:
                        continue
                    seen.add(h)
                    lemmas = wn[h][0]
                    if lemmas[0].lower() in STOP_SYNSETS:
                        continue
                    nxt.append(h)
                    share = max(HYPERNYM_FLOOR, HYPERNYM_FIRST - HYPERNYM_STEP * (depth - 1))
                    if first_share is not None and not path:
                        share = max(share, first_share)
                    for lemma in lemmas[:LEMMAS_PER_HYPERNYM]:
                        # the head noun by the class-name rules: "drug of abuse" -> drug (v1 took the last word)
                        heads = [w for w, sh in _word_shares(lemma.replace("_", " ")) if sh == HEAD_SHARE]
                        if not heads:
                            continue
                        head = heads[0]
                        if head in skip or head not in self.vocab:
                            continue
                        if self.vocab.is_special(self.vocab.id(head)):
                            continue
                        level.append((head, share))
            for head, share in level:
                if share > out.get(head, 0.0):
                    out[head] = round(share, 4)
                path.append(head)
            level = []
            frontier = nxt
            if not frontier:
                break
        return path


class Context:
    """Context words of a class (script version 3): definition words, compound parts, and
    ``person`` for what people wear. Each is a whole BERT token whose most frequent WordNet
    noun sense is something one can see (:data:`PICTURABLE_LEXFILES`)."""

    def __init__(self, wordnet: Path, wn: dict, vocab) -> None:
        from stair_es.encoders.colour import COLOUR_TOKENS

        self.index = read_index(wordnet)
        self.wn = wn
        self.vocab = vocab
        self.worn = {self.index[w][0] for w in WORN_ROOTS if w in self.index}
        self.colours = frozenset(COLOUR_TOKENS)
        # how often each word was tagged as a noun, verb or adjective in WordNet's semantic
        # concordance (cntlist.rev): "american", "short", "flat" are adjectives first
        self.tagged: dict[tuple[str, str], int] = {}
        with open(wordnet / "cntlist.rev", encoding="latin-1") as f:
            for line in f:
                key, _, count = line.split()
                lemma, _, rest = key.partition("%")
                pos = {"1": "n", "2": "v", "3": "a", "5": "a"}.get(rest[:1])
                if pos:
                    self.tagged[(lemma, pos)] = self.tagged.get((lemma, pos), 0) + int(count)

    def picturable(self, word: str) -> bool:
        """A colour name, or a word used mostly as a common noun whose most frequent sense is
        something one can see (not "Africa", not "short")."""
        i = self.vocab.get(word)
        if i is None or self.vocab.is_special(i):
            return False
        if word in self.colours:
            return True
        senses = self.index.get(word)
        if not senses or self.wn[senses[0]][3] not in PICTURABLE_LEXFILES:
            return False
        if any(w.lower() == word and w != w.lower() for w in self.wn[senses[0]][0]):
            return False  # a proper noun
        noun = self.tagged.get((word, "n"), 0)
        return noun >= max(self.tagged.get((word, "v"), 0), self.tagged.get((word, "a"), 0))

    def definition_words(self, offset: str) -> list[str]:
        words = []
        for w in re.findall(r"[a-z]+", self.wn[offset][2].lower()):
            if len(w) >= 3 and w not in DEFINITION_STOPWORDS and w not in words and self.picturable(w):
                words.append(w)
        return words[:DEFINITION_WORDS]

    def compound_parts(self, word: str) -> list[str]:
        """``snowmobile`` -> [snow, mobile]: the first split into two picturable words of 3+ letters."""
        w = word.lower()
        if not w.isalpha() or len(w) < 7:
            return []
        for k in range(3, len(w) - 2):
            if self.picturable(w[:k]) and self.picturable(w[k:]):
                return [w[:k], w[k:]]
        return []

    def is_worn(self, offset: str) -> bool:
        seen, stack = set(), [offset]
        while stack:
            for h in self.wn[stack.pop()][1]:
                if h not in seen:
                    seen.add(h)
                    stack.append(h)
        return bool(seen & self.worn)

    def add(self, offset: str, names: list[str], tokens: dict[str, float]) -> None:
        extra: dict[str, float] = {}
        for w in self.definition_words(offset):
            extra[w] = max(extra.get(w, 0.0), DEFINITION_SHARE)
        for name in names:
            for w in self.compound_parts(name.replace("_", " ").split()[-1]):
                extra[w] = max(extra.get(w, 0.0), COMPOUND_SHARE)
        if self.is_worn(offset):
            extra["person"] = max(extra.get("person", 0.0), WORN_SHARE)
        for w, share in extra.items():  # a token reached several ways keeps its largest share
            if share > tokens.get(w, 0.0):
                tokens[w] = share


QUERY_SYNONYM_SHARE = 0.8
SENSES_PER_WORD = 2


def build_query_expansion(wordnet: Path, synsets: list[str], image_map: dict) -> dict:
    """Word -> tokens an image can carry, for query words the classifier has no class for.

    For every single-token noun of WordNet (and its irregular plurals), the senses that
    concern what ImageNet shows are kept: senses that are an ImageNet class, an ancestor of
    one, or a descendant of one (``drake``: the male duck, not Sir Francis Drake; ``tiger``:
    the cat, not the fierce person); without such a sense, the most frequent one. Each kept
    sense gives its synonyms (share 0.8) and its hypernym chain (the shares of the image
    map), restricted to tokens the image map can produce: an expansion no image can carry
    only adds noise. A token keeps its largest share.
    """
    wn = read_wordnet(wordnet)
    index = read_index(wordnet)
    b = Builder()
    emittable = {t for c in image_map["classes"] for t in c["tokens"]}
    classes = {w[1:] for w in synsets}
    ancestors: set[str] = set()
    for off in classes:
        stack = list(wn[off][1])
        while stack:
            h = stack.pop()
            if h not in ancestors:
                ancestors.add(h)
                stack.extend(wn[h][1])

    def descends_from_class(off: str) -> bool:
        seen, stack = set(), list(wn[off][1])
        while stack:
            h = stack.pop()
            if h in classes:
                return True
            if h not in seen:
                seen.add(h)
                stack.extend(wn[h][1])
        return False

    words: dict[str, dict[str, float]] = {}
    for lemma, offsets in index.items():
        if "_" in lemma or lemma not in b.vocab or b.vocab.is_special(b.vocab.id(lemma)):
            continue
        visual = [o for o in offsets if o in classes or (o in ancestors and wn[o][0][0].lower() not in STOP_SYNSETS)
                  or descends_from_class(o)]
        chosen = (visual or offsets[:1])[:SENSES_PER_WORD]
        expansion: dict[str, float] = {}
        for rank, off in enumerate(chosen):
            factor = 1.0 / (rank + 1)
            for syn in wn[off][0]:
                w = syn.lower()
                if w != lemma and w in emittable and w not in SKIP_WORDS:
                    expansion[w] = max(expansion.get(w, 0.0), round(QUERY_SYNONYM_SHARE * factor, 4))
            hyper: dict[str, float] = {}
            b.hypernym_shares(off, wn, hyper)
            for w, share in hyper.items():
                if w != lemma and w in emittable:
                    expansion[w] = max(expansion.get(w, 0.0), round(share * factor, 4))
        if expansion:
            words[lemma] = dict(sorted(expansion.items(), key=lambda kv: (-kv[1], kv[0])))
    exceptions = {k: v for k, v in read_exceptions(wordnet).items() if v in words and " " not in k}
    return {
        "version": "wordnet3.0-qx-v%d-%s" % (SCRIPT_VERSION, hashlib.sha256(json.dumps(words, sort_keys=True).encode()).hexdigest()[:12]),
        "image_token_map": image_map["version"],
        "generated_by": "scripts/build_imagenet_tokens.py (stair_es); re-run it to regenerate",
        "provenance": "WordNet 3.0 (Debian package wordnet-base): noun senses, synonyms and hypernyms; "
                      "targets restricted to the tokens of the ImageNet token map " + image_map["version"],
        "license_notice": WORDNET_NOTICE,
        "parameters": {"synonym_share": QUERY_SYNONYM_SHARE, "senses_per_word": SENSES_PER_WORD},
        "plurals": exceptions,
        "words": words,
    }


def build(wordnet: Path, synsets: list[str], classnames: list[str]) -> dict:
    wn = read_wordnet(wordnet)
    b = Builder()
    context = Context(wordnet, wn, b.vocab)
    classes = []
    for idx, (wnid, cname) in enumerate(zip(synsets, classnames)):
        offset = wnid[1:]
        if offset not in wn:
            sys.exit(f"class {idx} {wnid} ({cname}) is not a WordNet 3.0 noun synset")
        tokens: dict[str, float] = {}
        head_kept = bool(b.name_shares(cname, 1.0, tokens))
        lemmas = wn[offset][0]
        synonym_heads: list[str] = []
        for lemma in lemmas:
            synonym_heads += b.name_shares(lemma.replace("_", " "), SYNONYM_FACTOR, tokens, skip_jargon=True)
        if not head_kept and synonym_heads:  # "Egyptian Mau" -> its synonym "Egyptian cat" carries the head
            for w in synonym_heads:
                tokens[w] = HEAD_SHARE
            head_kept = True
        b.hypernym_shares(offset, wn, tokens, first_share=None if head_kept else HEAD_SHARE)
        if not head_kept and max(tokens.values(), default=0.0) < HEAD_SHARE:
            # every relative is a category word (toaster, syringe, salt shaker: "device",
            # "container"...): the nearest one still says more than nothing
            b.hypernym_shares(offset, wn, tokens, first_share=HEAD_SHARE, skip=frozenset())
        context.add(offset, lemmas[:1] + [cname], tokens)
        ordered = dict(sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0])))
        classes.append({"index": idx, "wnid": wnid, "name": cname, "lemmas": [w.replace("_", " ") for w in lemmas],
                        "tokens": ordered})
    params = {
        "script_version": SCRIPT_VERSION, "head_share": HEAD_SHARE, "modifier_share": MODIFIER_SHARE,
        "gloss_factor": GLOSS_FACTOR, "synonym_factor": SYNONYM_FACTOR, "lemmas_per_hypernym": LEMMAS_PER_HYPERNYM,
        "hypernym_first": HYPERNYM_FIRST, "hypernym_step": HYPERNYM_STEP, "hypernym_floor": HYPERNYM_FLOOR,
        "whole_words_only": True, "head_from_relative": True,
        "max_depth": MAX_DEPTH, "stop_synsets": sorted(STOP_SYNSETS), "skip_words": sorted(SKIP_WORDS),
        "definition_share": DEFINITION_SHARE, "definition_words": DEFINITION_WORDS, "compound_share": COMPOUND_SHARE,
        "worn_share": WORN_SHARE, "worn_roots": list(WORN_ROOTS), "picturable_lexfiles": sorted(PICTURABLE_LEXFILES),
    }
    content = json.dumps([c["tokens"] for c in classes], sort_keys=True).encode()
    version = f"wordnet3.0-v{SCRIPT_VERSION}-{hashlib.sha256(content).hexdigest()[:12]}"
    return {
        "version": version,
        "generated_by": "scripts/build_imagenet_tokens.py (stair_es); re-run it to regenerate",
        "provenance": (
            "Class ids: ImageNet-1k wnids in class order (timm/data/_info/imagenet_synsets.txt). "
            "Lemmas and hypernyms: WordNet 3.0 (Debian package wordnet-base). Class names: open_clip's cleaned "
            "ImageNet class names (stair_es/data/imagenet_classnames.json)."
        ),
        "license_notice": WORDNET_NOTICE,
        "parameters": params,
        "classes": classes,
    }


WORDNET_NOTICE = (
    "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved. "
    "Permission to use, copy, modify and distribute this software and database and its documentation for any "
    "purpose and without fee or royalty is hereby granted, provided that you agree to comply with the following "
    "copyright notice and statements, including the disclaimer, and that the same appear on ALL copies of the "
    "software, database and documentation, including modifications that you make for internal use or for "
    "distribution. THIS SOFTWARE AND DATABASE IS PROVIDED \"AS IS\" AND PRINCETON UNIVERSITY MAKES NO "
    "REPRESENTATIONS OR WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON "
    "UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES OF MERCHANTABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR "
    "THAT THE USE OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS, "
    "COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS. The name of Princeton University or Princeton may not be used in "
    "advertising or publicity pertaining to distribution of the software and/or database. Title to copyright in "
    "this software, database and any associated documentation shall at all times remain with Princeton "
    "University and LICENSEE agrees to preserve same."
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="folder with data.noun")
    ap.add_argument("--synsets", type=Path, help="file with the 1000 wnids in class order (default: from the timm wheel)")
    ap.add_argument("--out", type=Path, default=ROOT / "stair_es" / "encoders" / "configs" / "imagenet_wordnet.json")
    ap.add_argument("--query-expansion", action="store_true",
                    help="also regenerate wordnet_query_expansion.json (the grounded query encoder's map) beside --out")
    args = ap.parse_args()
    wordnet = ensure_wordnet(args.wordnet)
    synsets = fetch_synsets(args.synsets)
    classnames = json.loads((ROOT / "stair_es" / "data" / "imagenet_classnames.json").read_text("utf-8"))
    data = build(wordnet, synsets, classnames)
    text = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text, "utf-8")
    os.replace(tmp, args.out)
    n_tokens = sum(len(c["tokens"]) for c in data["classes"])
    print(f"wrote {args.out}: {len(data['classes'])} classes, {n_tokens} class-token shares, version {data['version']}")
    if not args.query_expansion:
        print("left configs/wordnet_query_expansion.json (the grounded query encoder's map) as it is: "
              "--query-expansion regenerates it from this map (a new version: grounded indexes record it)")
        return
    qx = build_query_expansion(wordnet, synsets, data)
    out = args.out.with_name("wordnet_query_expansion.json")
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(qx, separators=(",", ":"), ensure_ascii=False) + "\n", "utf-8")
    os.replace(tmp, out)
    print(f"wrote {out}: {len(qx['words'])} words, version {qx['version']}")


if __name__ == "__main__":
    main()
