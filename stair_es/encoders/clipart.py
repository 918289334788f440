"""``clipart``: words for drawings, icons and clip art, learned from the public-domain Openclipart.

The ``imagenet`` source reads words off a photo classifier; on drawings its 1,000 photo
classes fire on the wrong things ("envelope", "web site", "jigsaw puzzle"), so a drawn car
is rarely found by "car". This source is a small head trained on top of the *same*
classifier output: it takes the 1,000 ImageNet log-probabilities the ``imagenet`` source
has already computed (no second network, no second inference) and predicts, per token,
the probability ``p_t`` that a drawing showing what the classifier saw is described with
that word. It was trained by ``scripts/build_clipart_head.py`` on the ~8,000 drawings of
Debian's ``openclipart-svg`` (public domain), their titles, keywords and collection folders;
the drawings the encoder evaluation samples were held out.

The head was trained on drawings only, so on photos it guesses (a cat photo would get
``computer`` or ``symbols``). A **drawing gate** keeps it to pictures that look drawn:
drawings are made of flat fills, photos of noise and texture. The picture is reduced to at
most 128 px (area averaging, which keeps a flat fill exactly flat) and ``flat`` is the share
of pixels equal, within 1 of 255 per channel, to their upper and left neighbours. The gate
``g = clip((flat - 0.15) / 0.30, 0, 1)`` is 0 for most photos (the sample photos' median
``flat`` is 0.11; the cat photo 0.01) and 1 for most drawings (Openclipart's median 0.80,
Tux Paint's 0.56), and multiplies the head's probabilities.

Weights follow the other sources' scale, ``w_t = log(1 + 10 g p_t)``, pruned below
``min_weight`` and to the ``top_tokens`` largest. The head's ``version`` (a content hash,
plus the gate's version) is recorded in the index config. Numpy only: two small matrix
products and one pass over a 128 px copy of the picture (about 1 ms).

This module must not know about indices, backends or other token sources.
"""

from __future__ import annotations

import json
from functools import cached_property, lru_cache
from importlib import resources
from typing import Any, Sequence

import numpy as np

from ..errors import ModelError
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .colour import small_copy

SCALE = 10.0
HEAD_FILE = "clipart_head.npz"
GATE_VERSION = "flatgate1"
GATE_SIDE = 128
GATE_LOW, GATE_RANGE = 0.15, 0.30


def _flat_pixels(image: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The picture at most ``GATE_SIDE`` px (int16 RGB) and which of its pixels (all but the first
    row and column) equal their upper and left neighbours; None for a picture under 2 x 2 px."""
    a = np.asarray(small_copy(image, GATE_SIDE), dtype=np.int16)
    if a.shape[0] < 2 or a.shape[1] < 2:
        return None
    core = a[1:, 1:]
    return a, (np.abs(core - a[:-1, 1:]).max(axis=-1) <= 1) & (np.abs(core - a[1:, :-1]).max(axis=-1) <= 1)


def drawing_score(image: Any) -> float:
    """The share of flat pixels of a picture (see the module docstring): ~0 for photos, ~1 for drawings."""
    found = _flat_pixels(image)
    return 1.0 if found is None else float(found[1].mean())


def foreground_flatness(image: Any) -> float:
    """:func:`drawing_score` of what is not a plain background: when one colour holds at least half
    of the picture's border, the pixels of that colour are left out. A product photo on a white
    studio background scores ~1 by :func:`drawing_score` (all that white is flat) but ~0.05 here
    (its object is a photo); a drawing's own fills stay flat. Without a plain background, or
    with almost nothing else, it equals :func:`drawing_score`."""
    found = _flat_pixels(image)
    if found is None:
        return 1.0
    a, flat = found
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    colours, counts = np.unique(border, axis=0, return_counts=True)
    if counts.max() * 2 < len(border):
        return float(flat.mean())
    foreground = np.abs(a[1:, 1:] - colours[counts.argmax()]).max(axis=-1) > 2
    return float(flat[foreground].mean()) if foreground.mean() >= 0.05 else float(flat.mean())


def drawing_gate(image: Any, score: float | None = None) -> float:
    """The gate of a picture (or of its :func:`drawing_score`, when already computed)."""
    return float(np.clip(((drawing_score(image) if score is None else score) - GATE_LOW) / GATE_RANGE, 0.0, 1.0))


def _open_head():
    try:
        return np.load(resources.files("stair_es.encoders.configs").joinpath(HEAD_FILE).open("rb"), allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ModelError(f"the clipart token head ({HEAD_FILE}) is missing or damaged ({e}); reinstall stair-es "
                         "or rebuild it with scripts/build_clipart_head.py") from None


@lru_cache(maxsize=1)
def head_provenance() -> dict[str, Any]:
    """The head's provenance and ``version``, read without loading its weights (a text search
    on an index built with this source checks the version and never needs the weights)."""
    with _open_head() as data:
        try:
            provenance = json.loads(str(data["provenance"]))
            provenance["version"]
        except (KeyError, ValueError, TypeError, OSError) as e:
            raise ModelError(f"the clipart token head ({HEAD_FILE}) has no readable provenance ({e}); reinstall stair-es") from None
    return provenance


@lru_cache(maxsize=1)
def _load_head() -> dict[str, Any]:
    with _open_head() as data:
        try:
            head = {k: data[k] for k in ("w1", "b1", "w2", "b2", "tokens")}
        except (KeyError, ValueError, OSError) as e:
            raise ModelError(f"the clipart token head ({HEAD_FILE}) is damaged ({e}); reinstall stair-es "
                             "or rebuild it with scripts/build_clipart_head.py") from None
    n_tokens = head["tokens"].shape[0]
    if head["w1"].shape[0] != 1000 or head["w2"].shape != (head["w1"].shape[1], n_tokens) or head["b2"].shape != (n_tokens,):
        raise ModelError(f"the clipart token head ({HEAD_FILE}) has inconsistent shapes; reinstall stair-es")
    head["w1"] = head["w1"].astype(np.float32)
    head["w2"] = head["w2"].astype(np.float32)
    head["provenance"] = head_provenance()
    head["version"] = head["provenance"]["version"]
    return head


class ClipartSource:
    """ImageNet class probabilities -> token weights for drawings (see the module docstring)."""

    name = "clipart"

    def __init__(self, *, min_weight: float = 0.1, top_tokens: int = 24, vocab: Vocabulary | None = None):
        self.vocab = vocab or default_vocabulary()
        if self.vocab.digest != default_vocabulary().digest:
            raise ModelError("the clipart source only supports the bert-base-uncased vocabulary")
        self.min_weight = float(min_weight)
        self.top_tokens = int(top_tokens)
        self.version = f"{head_provenance()['version']}+{GATE_VERSION}"

    @property
    def head(self) -> dict[str, Any]:
        return _load_head()

    @cached_property
    def tokens(self) -> frozenset[str]:
        """Tokens this source can produce (computed once: explain asks per matched token)."""
        return frozenset(self.vocab.token(int(t)) for t in self.head["tokens"])

    def probabilities(self, class_probs: np.ndarray) -> np.ndarray:
        """``(n, 1000)`` ImageNet probabilities -> ``(n, tokens)`` probabilities of each head token."""
        logp = np.log(np.clip(np.asarray(class_probs, dtype=np.float32), 1e-12, 1.0))
        if logp.ndim != 2 or logp.shape[1] != 1000:
            raise ModelError(f"the clipart source expects (n, 1000) class probabilities, got {logp.shape}")
        h = np.maximum(logp @ self.head["w1"] + self.head["b1"], 0.0)
        z = h @ self.head["w2"] + self.head["b2"]
        return 1.0 / (1.0 + np.exp(-np.clip(z, -30.0, 30.0)))

    def encode_probabilities(self, class_probs: np.ndarray, images: Sequence[Any] | None = None, *,
                             gates: np.ndarray | None = None) -> list[SparseVector]:
        """Token weights per image; with ``images`` (or their :func:`drawing_gate` values,
        ``gates``) the head is gated by how drawn each looks."""
        probs = self.probabilities(class_probs)
        if images is not None and gates is None:
            gates = np.array([drawing_gate(im) for im in images], dtype=np.float32)
        if gates is not None:
            if len(gates) != len(probs):
                raise ModelError(f"{len(gates)} images for {len(probs)} rows of class probabilities")
            probs = probs * np.asarray(gates, dtype=np.float32)[:, None]
        out = []
        for p in probs:
            w = np.log1p(SCALE * p)
            keep = np.flatnonzero(w >= self.min_weight)
            if keep.size > self.top_tokens:
                keep = keep[np.argsort(-w[keep], kind="stable")[: self.top_tokens]]
            out.append(SparseVector.from_arrays(self.head["tokens"][keep].astype(np.int64), w[keep], self.vocab,
                                                drop_special=True))
        return out
