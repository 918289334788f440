"""Generate the word list of the ``clip-vocab`` encoder from the BERT vocabulary and WordNet 3.0.

    python scripts/build_clip_vocab.py            # writes stair_es/encoders/configs/clip_vocab.json
    python scripts/build_clip_vocab.py --wordnet /usr/share/wordnet --out words.json

A word is kept when it is

* a *whole-word* token of the 30,522-token BERT uncased vocabulary (no ``##`` piece, no
  special token), made of ASCII letters only and at least ``MIN_LENGTH`` (3) long: each
  kept word is then exactly one token id, so an image's words map to ids with no splitting;
* not one of the ``bow`` encoder's stopwords (``stair_es.encoders.text.DEFAULT_STOPWORDS``:
  function words and "photo", "picture", "image", which every prompt already says);
* a lower-case lemma of at least one noun or adjective synset in WordNet 3.0 (``data.noun``,
  ``data.adj``). WordNet writes proper nouns capitalised (``Paris``, ``John``), so a
  token that is only ever a name is not a lemma here and is left out.

Only the generated list ships (with the WordNet licence notice), never the database.
WordNet 3.0 comes from the Debian package ``wordnet-base`` (installed with apt-get when
run as root and missing).
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from build_imagenet_tokens import WORDNET_NOTICE  # noqa: E402  (one copy of WordNet's licence text)
from stair_es.encoders.text import DEFAULT_STOPWORDS  # noqa: E402
from stair_es.vocab import default_vocabulary  # noqa: E402

SCRIPT_VERSION = 1
MIN_LENGTH = 3



def ensure_wordnet(folder: Path) -> Path:
    if (folder / "data.noun").is_file() and (folder / "data.adj").is_file():
        return folder
    if shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "wordnet-base"], check=True)
        if (folder / "data.noun").is_file():
            return folder
    sys.exit(f"WordNet 3.0 not found in {folder}: install the Debian package wordnet-base (as root: apt-get install wordnet-base)")


def lower_case_lemmas(path: Path) -> set[str]:
    """Single-word lemmas written in lower case in a WordNet ``data.*`` file (adjective
    markers such as ``(a)`` and ``(p)`` removed)."""
    out: set[str] = set()
    with open(path, encoding="latin-1") as f:
        for line in f:
            if line.startswith("  "):
                continue  # the licence header
            fields = line.split(" | ")[0].split()
            n_words = int(fields[3], 16)
            for i in range(n_words):
                word = re.sub(r"\(.*\)$", "", fields[4 + 2 * i])
                if word.isalpha() and word.islower():
                    out.add(word)
    return out


def build(wordnet: Path) -> dict:
    vocab = default_vocabulary()
    nouns = lower_case_lemmas(wordnet / "data.noun")
    adjectives = lower_case_lemmas(wordnet / "data.adj")
    whole = [t for i, t in enumerate(vocab.tokens)
             if not vocab.is_special(i) and re.fullmatch(r"[a-z]+", t) and len(t) >= MIN_LENGTH]
    candidates = [t for t in whole if t not in DEFAULT_STOPWORDS]
    words = [t for t in candidates if t in nouns or t in adjectives]
    words.sort(key=vocab.id)
    content = json.dumps(words).encode()
    return {
        "version": f"bert-wordnet3.0-v{SCRIPT_VERSION}-{hashlib.sha256(content).hexdigest()[:12]}",
        "generated_by": "scripts/build_clip_vocab.py (stair_es); re-run it to regenerate",
        "provenance": (
            "Words: whole-word tokens of the BERT uncased WordPiece vocabulary (stair_es/data/bert_uncased_vocab.txt) "
            f"of ASCII letters, at least {MIN_LENGTH} long, not stopwords, that are lower-case lemmas of a noun or "
            "adjective synset in WordNet 3.0 (Debian package wordnet-base: data.noun, data.adj)."
        ),
        "license_notice": WORDNET_NOTICE,
        "counts": {
            "bert_whole_word_tokens": len(whole),
            "after_stopwords": len(candidates),
            "wordnet_nouns": sum(1 for t in words if t in nouns),
            "wordnet_adjectives": sum(1 for t in words if t in adjectives),
            "nouns_and_adjectives": sum(1 for t in words if t in nouns and t in adjectives),
            "words": len(words),
        },
        "parameters": {"script_version": SCRIPT_VERSION, "min_length": MIN_LENGTH},
        "words": words,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="folder with data.noun and data.adj")
    ap.add_argument("--out", type=Path, default=ROOT / "stair_es" / "encoders" / "configs" / "clip_vocab.json")
    args = ap.parse_args()
    data = build(ensure_wordnet(args.wordnet))
    text = json.dumps(data, indent=1, ensure_ascii=False)
    # one word a line would make a 20k-line file; keep the list on one line
    text = re.sub(r'"words": \[\n(.*?)\n \]', lambda m: '"words": [' + ", ".join(w.strip() for w in m.group(1).split(",\n")) + "]",
                  text, flags=re.S)
    args.out.write_text(text + "\n", "utf-8")
    print(json.dumps({"out": str(args.out), "version": data["version"], **data["counts"]}, indent=1))


if __name__ == "__main__":
    main()
