#!/usr/bin/env python3
"""Generate the query grounding map (``stair_es/encoders/configs/query_grounding.bin``) from WordNet 3.0.

    python scripts/build_query_grounding.py                 # writes the map shipped with stair_es
    python scripts/build_query_grounding.py --wordnet /usr/share/wordnet --out map.bin

A query word that no document of an index carries (``giraffe`` in a photo catalog whose
images are described with ImageNet words) is searched through its WordNet relatives that
the index *does* carry (``mammal``, ``animal``): see ``stair_es/encoders/grounding.py``. This
script writes, for every noun and adjective lemma of WordNet 3.0 (multiword ones such as
``aloe vera`` and ``storm cloud`` too), the relatives a search may fall back on:

* ``s`` synonyms (the other lemmas of its synsets), share 0.9;
* ``h`` hypernyms (``@``, ``@i``), walked up to :data:`MAX_UP` levels, stopping at WordNet's
  uninformative top (``entity``, ``object``, ``organism``...); share
  ``max(0.3, 0.8 - 0.07 (d - 1))`` at distance ``d``;
* ``o`` hyponyms (``~``, ``~i``) of the two most frequent senses, one and two levels down, each
  hyponym's first name only, share 0.6 / 0.45;
* ``p`` holonyms (what it is a part, member or substance of), share 0.55;
* ``m`` meronyms (its parts, members, substances), share 0.5;
* ``d`` for adjectives: the noun the word itself is derived from or pertains to (WordNet's
  lexical ``+`` and ``\\`` pointers: ``snowy`` -> ``snow``, ``cloudy`` -> ``cloud``), share 0.85;
* ``a`` for adjectives: similar adjectives (``&``), pertainyms (``\\``: ``aerial`` -> ``air``) and
  the noun attribute (``=``: ``tall`` -> ``stature``), share 0.7;
* ``g`` nouns of the definition (``dandelion``: "... bright yellow flowers" -> ``flower``,
  ``yellow``), share 0.45, at most :data:`GLOSS_WORDS` per synset.

Noun senses WordNet files as abstract (lexicographer files noun.Tops, attribute, cognition,
feeling, motive, possession, process, quantity, relation, state and time: :data:`ABSTRACT_LEXFILES`)
contribute the nouns of their definition only, never their hypernyms, hyponyms, holonyms or
meronyms: ``autumn`` is a time of year, and its hypernym ``measure`` (the head of ``fundamental
measure``) is what a ruler carries in a photo catalog; its definition gives ``leaf`` and ``tree``.
``log``'s logarithm sense no longer reaches ``power``, nor ``close``'s temporal sense ``point``.

A multiword relative contributes its head noun (the last word: ``vascular plant`` ->
``plant``). Only relatives that are one whole BERT WordPiece token are written (an index holds
tokens; a relative split into pieces could only match loose fragments), never stopwords.
Senses after the first are weighted down (``0.8 ** rank``, WordNet lists the most frequent
sense first), at most :data:`MAX_SENSES` senses per lemma. A relative reached several ways keeps
its best share; at most :data:`MAX_RELATIVES` per lemma are kept, best first.

Format (``query_grounding.bin``): one JSON line (version, provenance, the WordNet licence
notice, which must go with copies of derived data, parameters, the inflection exceptions of
``noun.exc``/``adj.exc``, and the block table), then zlib-compressed blocks of ~32 kB of text,
one lemma a line in sorted order: ``lemma<TAB>word:KD:SS word:KD:SS ...`` with ``K`` the
relation letter above, ``D`` the WordNet distance and ``SS`` the share in percent. A lookup
reads the header and decompresses the one block that can hold the lemma (under a
millisecond), so the 16 MB of text are never loaded whole.
"""

from __future__ import annotations

import argparse
import json
import zlib
import hashlib
import re
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from build_imagenet_tokens import STOP_SYNSETS, ensure_wordnet  # noqa: E402

from stair_es.encoders.text import DEFAULT_STOPWORDS  # noqa: E402
from stair_es.vocab import default_vocabulary  # noqa: E402

SCRIPT_VERSION = 4
#: lexicographer file numbers (data.noun's second field) of senses nobody photographs:
#: 03 noun.Tops, 07 attribute, 09 cognition, 12 feeling, 16 motive, 21 possession, 22 process,
#: 23 quantity, 24 relation, 26 state, 28 time. Acts, events and communication (sports,
#: weddings, signs, newspapers) stay: they are often seen.
ABSTRACT_LEXFILES = frozenset({3, 7, 9, 12, 16, 21, 22, 23, 24, 26, 28})
MAX_SENSES = 4
HYPONYM_SENSES = 2
SENSE_DECAY = 0.8
MAX_UP = 10
MAX_RELATIVES = 16
MIN_SHARE = 0.3
GLOSS_WORDS = 6
BLOCK_BYTES = 32_000
RELATIONS = {"d": "derived from", "s": "synonym", "h": "hypernym", "o": "hyponym", "p": "holonym", "m": "meronym", "a": "related adjective",
             "g": "word of the definition"}
SHARES = {"d": 0.85, "s": 0.9, "o1": 0.6, "o2": 0.45, "p": 0.55, "m": 0.5, "a": 0.7, "g": 0.45}


def hypernym_share(d: int) -> float:
    return max(0.3, 0.8 - 0.07 * (d - 1))


LICENSE = """WordNet Release 3.0. This software and database is being provided to you, the LICENSEE, by Princeton
University under the following license. By obtaining, using and/or copying this software and database,
you agree that you have read, understood, and will comply with these terms and conditions.: Permission to
use, copy, modify and distribute this software and database and its documentation for any purpose and
without fee or royalty is hereby granted, provided that you agree to comply with the following copyright
notice and statements, including the disclaimer, and that the same appear on ALL copies of the software,
database and documentation, including modifications that you make for internal use or for distribution.
WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved. THIS SOFTWARE AND DATABASE IS
PROVIDED "AS IS" AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES, EXPRESS OR IMPLIED. BY WAY
OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR WARRANTIES OF
MERCHANT-ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT THE USE OF THE LICENSED SOFTWARE, DATABASE OR
DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS, COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS. The name of
Princeton University or Princeton may not be used in advertising or publicity pertaining to distribution of
the software and/or database. Title to copyright in this software, database and any associated
documentation shall at all times remain with Princeton University and LICENSEE agrees to preserve same."""

POS_FILES = {"n": "noun", "a": "adj"}
HOLONYM = {"#m", "#p", "#s"}
MERONYM = {"%m", "%p", "%s"}


class Synset:
    __slots__ = ("pos", "lemmas", "ptrs", "gloss", "lexfile")

    def __init__(self, pos: str, lemmas: list[str], ptrs: list[tuple[str, str, str, str]], gloss: str, lexfile: int):
        self.pos, self.lemmas, self.ptrs, self.gloss, self.lexfile = pos, lemmas, ptrs, gloss, lexfile


def read_data(folder: Path) -> dict[tuple[str, str], Synset]:
    """(pos letter n|a, offset) -> Synset, for data.noun and data.adj (satellites are 'a' too)."""
    out: dict[tuple[str, str], Synset] = {}
    for pos, name in POS_FILES.items():
        with open(folder / f"data.{name}", encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                head, _, gloss = line.partition(" | ")
                fields = head.split()
                n_words = int(fields[3], 16)
                words = [re.sub(r"\(.*\)$", "", fields[4 + 2 * i]).lower() for i in range(n_words)]
                p = 4 + 2 * n_words
                n_ptr = int(fields[p])
                ptrs = []
                for i in range(n_ptr):
                    sym, target, tpos, st = fields[p + 1 + 4 * i: p + 5 + 4 * i]
                    ptrs.append((sym, target, "a" if tpos in ("a", "s") else tpos, st))
                out[(pos, fields[0])] = Synset(pos, words, ptrs, gloss.strip(), int(fields[1]))
    return out


def read_lemma_index(folder: Path, pos: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    with open(folder / f"index.{POS_FILES[pos]}", encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue
            fields = line.split()
            n_synsets, n_ptr = int(fields[2]), int(fields[3])
            out[fields[0].lower()] = fields[6 + n_ptr: 6 + n_ptr + n_synsets]
    return out


def read_exceptions(folder: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("noun.exc", "adj.exc"):
        with open(folder / name, encoding="latin-1") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] not in out and "_" not in parts[0]:
                    out[parts[0].lower()] = parts[1].lower()
    return out


class Builder:
    def __init__(self, wordnet: Path):
        self.vocab = default_vocabulary()
        self.data = read_data(wordnet)
        self.index = {pos: read_lemma_index(wordnet, pos) for pos in POS_FILES}
        self.noun_lemmas = set(self.index["n"])
        self.exceptions = read_exceptions(wordnet)

    def token(self, lemma: str) -> str | None:
        """The whole-token word a (possibly multiword) lemma contributes: its head, if one BERT token."""
        head = lemma.replace("-", "_").split("_")[-1]
        if not head.isalpha() or len(head) < 2 or head in DEFAULT_STOPWORDS:
            return None
        pieces = self.vocab.wordpiece(head)
        return head if len(pieces) == 1 and pieces[0] == head else None

    def gloss_words(self, gloss: str) -> list[str]:
        text = re.sub(r'"[^"]*"', " ", gloss.split(";")[0] if not gloss.startswith("(") else gloss)
        text = re.sub(r"\([^)]*\)", " ", text)
        out: list[str] = []
        for w in re.findall(r"[a-z]+", text.lower()):
            base = self.exceptions.get(w, w)
            if base not in self.noun_lemmas:
                base = next((w[: -len(s)] + r for s, r in (("ies", "y"), ("es", ""), ("s", ""))
                             if w.endswith(s) and w[: -len(s)] + r in self.noun_lemmas), None)
            if base is None:
                continue
            tok = self.token(base)
            if tok and tok not in out:
                out.append(tok)
            if len(out) >= GLOSS_WORDS:
                break
        return out

    def relatives(self, lemma: str) -> dict[str, tuple[str, int, float]]:
        """word -> (relation letter, distance, share) over the lemma's noun and adjective senses."""
        best: dict[str, tuple[str, int, float]] = {}
        own = self.token(lemma) if "_" not in lemma else None

        def add(word: str | None, kind: str, dist: int, share: float) -> None:
            if word is None or word == lemma or word == own:
                return
            if word not in best or share > best[word][2]:
                best[word] = (kind, dist, share)

        for pos in POS_FILES:
            for rank, off in enumerate(self.index[pos].get(lemma, [])[:MAX_SENSES]):
                f = SENSE_DECAY ** rank
                syn = self.data[(pos, off)]
                for lem in syn.lemmas:
                    if lem != lemma and "_" not in lem and "-" not in lem:  # a multiword synonym's head is not one
                        add(self.token(lem), "s", 1, SHARES["s"] * f)
                for w in self.gloss_words(syn.gloss):
                    add(w, "g", 1, SHARES["g"] * f)
                if pos == "n" and syn.lexfile in ABSTRACT_LEXFILES:
                    continue  # an abstract sense: its definition's nouns only (module docstring)
                if pos == "a":
                    me = syn.lemmas.index(lemma) + 1 if lemma in syn.lemmas else 0
                    for sym, target, tpos, st in syn.ptrs:
                        if (tpos, target) not in self.data:
                            continue
                        words = self.data[(tpos, target)].lemmas
                        if sym in ("+", "\\") and tpos == "n" and st != "0000":
                            # the noun this very word is derived from / pertains to ("snowy" -> "snow")
                            if int(st[:2], 16) == me and 0 < int(st[2:], 16) <= len(words):
                                add(self.token(words[int(st[2:], 16) - 1]), "d", 1, SHARES["d"] * f)
                        elif sym in ("&", "\\", "="):
                            for lem in words[:2]:
                                add(self.token(lem), "a", 1, SHARES["a"] * f)
                    continue
                # hypernyms, breadth first (a synset's distance is its shortest path)
                seen = {off}
                queue = deque([(off, 0)])
                while queue:
                    cur, d = queue.popleft()
                    if d >= MAX_UP:
                        continue
                    for sym, target, tpos, _ in self.data[("n", cur)].ptrs:
                        if sym in ("@", "@i") and tpos == "n" and target not in seen:
                            seen.add(target)
                            up = self.data[("n", target)]
                            if up.lemmas[0] in STOP_SYNSETS:
                                continue
                            for lem in up.lemmas[:2]:
                                add(self.token(lem), "h", d + 1, hypernym_share(d + 1) * f)
                            queue.append((target, d + 1))
                # hyponyms, two levels, of the two most frequent senses, each kind's first
                # (most common) name only: slang and rare senses ("man" -> "cat", "bull") are noise
                level = [off] if rank < HYPONYM_SENSES else []
                for d in (1, 2):
                    nxt = []
                    for cur in level:
                        for sym, target, tpos, _ in self.data[("n", cur)].ptrs:
                            if sym in ("~", "~i") and tpos == "n":
                                nxt.append(target)
                                add(self.token(self.data[("n", target)].lemmas[0]), "o", d, SHARES[f"o{d}"] * f)
                    level = nxt[:200]
                for sym, target, tpos, _ in syn.ptrs:
                    if tpos == "n" and (sym in HOLONYM or sym in MERONYM):
                        kind = "p" if sym in HOLONYM else "m"
                        for lem in self.data[("n", target)].lemmas[:2]:
                            add(self.token(lem), kind, 1, SHARES[kind] * f)
        return best

    def lines(self) -> list[str]:
        lemmas = sorted(set(self.index["n"]) | set(self.index["a"]))
        out = []
        for lemma in lemmas:
            if not re.fullmatch(r"[a-z][a-z'_-]*", lemma):
                continue  # numbers, abbreviations with dots: not words a query grounds
            rel = self.relatives(lemma)
            if not rel:
                continue
            ranked = sorted(((w, v) for w, v in rel.items() if v[2] >= MIN_SHARE),
                            key=lambda kv: (-kv[1][2], kv[0]))[:MAX_RELATIVES]
            if not ranked:
                continue
            cells = " ".join(f"{w}:{k}{d}:{round(100 * s)}" for w, (k, d, s) in ranked)
            out.append(f"{lemma.replace('_', ' ')}\t{cells}")
        return out


def build(wordnet: Path) -> tuple[bytes, str, int]:
    b = Builder(wordnet)
    body = b.lines()
    exceptions = {k: v.replace("_", " ") for k, v in sorted(read_exceptions(wordnet).items())}
    params = (f"min={MIN_SHARE} senses={MAX_SENSES} hyposenses={HYPONYM_SENSES} decay={SENSE_DECAY} up={MAX_UP} max={MAX_RELATIVES} gloss={GLOSS_WORDS} "
              f"shares={sorted(SHARES.items())} abstract={sorted(ABSTRACT_LEXFILES)} script={SCRIPT_VERSION}")
    digest = hashlib.sha256(("\n".join(body) + json.dumps(exceptions) + params).encode()).hexdigest()[:8]
    version = f"wordnet3.0-qg-v{SCRIPT_VERSION}-{digest}"
    # Independently compressed blocks of whole lines: a lookup decompresses one block
    # (~30 kB), never the whole map (16 MB of text, 0.2 s to decompress).
    blocks: list[bytes] = []
    index: list[list] = []
    cur: list[str] = []
    size = 0
    for line in body + [None]:
        if line is None or (size + len(line) > BLOCK_BYTES and cur):
            data = zlib.compress(("\n".join(cur) + "\n").encode("utf-8"), 9)
            index.append([cur[0].split("\t", 1)[0], len(data)])
            blocks.append(data)
            cur, size = [], 0
        if line is not None:
            cur.append(line)
            size += len(line) + 1
    header = {
        "format": "stair-es query grounding map 1", "version": version,
        "generated_by": "scripts/build_query_grounding.py",
        "provenance": "Princeton WordNet 3.0 (Debian wordnet-base): noun and adjective lemmas, their synonyms, "
                      "hypernyms, hyponyms, holonyms, meronyms, related adjectives and definition nouns",
        "license_notice": LICENSE, "parameters": params, "lemmas": len(body),
        "line_format": "lemma<TAB>word:KD:SS ... (K relation s|h|o|p|m|a|g, D WordNet distance, SS share in percent)",
        "relations": RELATIONS, "exceptions": exceptions, "blocks": index,
    }
    return json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n" + b"".join(blocks), version, len(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="folder with data.noun")
    ap.add_argument("--out", type=Path, default=ROOT / "stair_es/encoders/configs/query_grounding.bin")
    args = ap.parse_args()
    blob, version, n = build(ensure_wordnet(args.wordnet))
    args.out.write_bytes(blob)
    print(f"wrote {args.out}: {n} lemmas, {len(blob) / 1e6:.2f} MB, version {version}")


if __name__ == "__main__":
    main()
