"""One sparse-vector type for the whole project.

A :class:`SparseVector` is a set of (token id, weight) pairs over a :class:`Vocabulary`:
ids sorted and unique, weights finite and strictly positive, no special tokens.
Every encoder returns it, every backend consumes it, explain prints it.

Serialisation: the JSON token map ``{"dog": 1.25, "##s": 0.5}`` (one per line in JSONL files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from .errors import InvalidVectorError
from .vocab import Vocabulary, default_vocabulary

#: The largest token weight a vector may carry: half precision's largest finite value, which
#: the embedded engine stores; with clause weights <= MAX_CLAUSE_WEIGHT (stair_es.query) no
#: score over the 30,522-token vocabulary can overflow float32.
MAX_WEIGHT = 65504.0


@dataclass(frozen=True, eq=False)
class SparseVector:
    ids: np.ndarray  # int32, sorted, unique
    weights: np.ndarray  # float32, > 0, finite
    vocab: Vocabulary

    # --- construction -------------------------------------------------------------------
    @classmethod
    def empty(cls, vocab: Vocabulary | None = None) -> "SparseVector":
        return cls(np.zeros(0, np.int32), np.zeros(0, np.float32), vocab or default_vocabulary())

    @classmethod
    def from_arrays(cls, ids: Sequence[int] | np.ndarray, weights: Sequence[float] | np.ndarray,
                    vocab: Vocabulary | None = None, *, drop_special: bool = False) -> "SparseVector":
        """Build from parallel arrays; duplicate ids keep their maximum weight.

        Zero weights are dropped (they mean "absent"). NaN, infinite or negative weights,
        ids outside the vocabulary, and special tokens raise :class:`InvalidVectorError`
        unless ``drop_special`` (used by encoders whose heads cover the whole vocabulary).
        """
        vocab = vocab or default_vocabulary()
        ids = np.asarray(ids, dtype=np.int64).ravel()
        try:
            w = np.asarray(weights, dtype=np.float64).ravel()
        except (OverflowError, TypeError, ValueError) as e:
            raise InvalidVectorError(f"weights must be numbers no larger than {MAX_WEIGHT:g} ({e})") from None
        if ids.shape != w.shape:
            raise InvalidVectorError(f"ids and weights differ in length ({ids.size} vs {w.size})")
        if w.size and not np.all(np.isfinite(w)):
            bad = ids[~np.isfinite(w)][:5]
            raise InvalidVectorError(f"weights must be finite; got NaN/inf for {_names(vocab, bad)}")
        if w.size and np.any(w > MAX_WEIGHT):
            bad = ids[w > MAX_WEIGHT][:5]
            raise InvalidVectorError(
                f"weights must be at most {MAX_WEIGHT:g} (the largest value an index stores: half precision); "
                f"got {float(w.max()):.3g} for {_names(vocab, bad)}. Learned sparse weights are usually below 10")
        if w.size and np.any(w < 0):
            bad = ids[w < 0][:5]
            raise InvalidVectorError(f"weights must be non-negative; got negative weights for {_names(vocab, bad)}")
        if ids.size and (ids.min() < 0 or ids.max() >= len(vocab)):
            raise InvalidVectorError(f"token ids must lie in [0, {len(vocab)}) for the {vocab.name} vocabulary")
        keep = w > 0
        if ids.size:
            special = vocab.special_mask[ids]
            if np.any(special & keep):
                if not drop_special:
                    raise InvalidVectorError(
                        f"special tokens are never indexed or scored: {_names(vocab, ids[special & keep][:5])}")
                keep &= ~special
        ids, w = ids[keep], w[keep].astype(np.float32)
        # float64 -> float32 can underflow a tiny positive weight to 0: drop those too
        nz = w > 0
        ids, w = ids[nz], w[nz]
        order = np.lexsort((-w, ids))  # by id, max weight first within an id
        ids, w = ids[order], w[order]
        if ids.size > 1:
            first = np.ones(ids.size, dtype=bool)
            first[1:] = ids[1:] != ids[:-1]
            ids, w = ids[first], w[first]
        return cls(ids.astype(np.int32), np.ascontiguousarray(w, dtype=np.float32), vocab)

    @classmethod
    def from_dense(cls, dense: np.ndarray, vocab: Vocabulary | None = None, *, drop_special: bool = True) -> "SparseVector":
        dense = np.asarray(dense, dtype=np.float32).ravel()
        vocab = vocab or default_vocabulary()
        if dense.size != len(vocab):
            raise InvalidVectorError(f"a dense vector must have {len(vocab)} entries, got {dense.size}")
        nz = np.flatnonzero(dense)
        return cls.from_arrays(nz, dense[nz], vocab, drop_special=drop_special)

    @classmethod
    def from_token_map(cls, token_map: Mapping[str, float], vocab: Vocabulary | None = None, *,
                       unknown: str = "error") -> "SparseVector":
        """Build from ``{"token": weight}``. ``unknown="error"`` (default) or ``"ignore"``."""
        vocab = vocab or default_vocabulary()
        if not isinstance(token_map, Mapping):
            raise InvalidVectorError(f"a token map must be a JSON object of token -> weight, got {type(token_map).__name__}")
        ids, weights, missing = [], [], []
        for tok, wt in token_map.items():
            i = vocab.get(tok) if isinstance(tok, str) else None
            if i is None:
                missing.append(tok)
                continue
            if isinstance(wt, bool) or not isinstance(wt, (int, float)):
                raise InvalidVectorError(f"weight of token {tok!r} must be a number, got {wt!r}")
            try:
                weights.append(float(wt))
            except OverflowError:
                raise InvalidVectorError(f"weight of token {tok!r} is too large; weights must be at most {MAX_WEIGHT:g}") from None
            ids.append(i)
        if missing and unknown == "error":
            shown = ", ".join(repr(m) for m in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise InvalidVectorError(f"unknown tokens {shown}{more}: not in the {vocab.name} vocabulary "
                                     "(WordPiece tokens are lower-case; sub-words start with '##')")
        return cls.from_arrays(ids, weights, vocab)

    @classmethod
    def from_json(cls, text: str, vocab: Vocabulary | None = None) -> "SparseVector":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidVectorError(f"not a JSON token map: {e}") from None
        return cls.from_token_map(data, vocab)

    # --- views --------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.ids.size)

    @property
    def nnz(self) -> int:
        return int(self.ids.size)

    def __repr__(self) -> str:
        top = ", ".join(f"{t}={w:.3g}" for t, w in self.top(5))
        return f"SparseVector(nnz={self.nnz}, top=[{top}])"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseVector):
            return NotImplemented
        return np.array_equal(self.ids, other.ids) and np.array_equal(self.weights, other.weights)

    def top(self, k: int | None = None) -> list[tuple[str, float]]:
        """``[(token, weight)]`` sorted by weight descending (ties by token id)."""
        order = np.lexsort((self.ids, -self.weights))
        if k is not None:
            order = order[: max(k, 0)]
        # str() of a float32 is its shortest round-trip form: 0.1, not 0.10000000149011612
        return [(self.vocab.tokens[self.ids[i]], float(str(self.weights[i]))) for i in order]

    def to_token_map(self, top_k: int | None = None) -> dict[str, float]:
        return dict(self.top(top_k))

    def to_json(self, top_k: int | None = None) -> str:
        return json.dumps(self.to_token_map(top_k), ensure_ascii=False)

    def to_dense(self) -> np.ndarray:
        out = np.zeros(len(self.vocab), dtype=np.float32)
        out[self.ids] = self.weights
        return out

    def weight(self, token: str) -> float:
        i = self.vocab.id(token)
        pos = np.searchsorted(self.ids, i)
        return float(self.weights[pos]) if pos < self.ids.size and self.ids[pos] == i else 0.0

    # --- operations ---------------------------------------------------------------------
    def prune(self, top_k: int | None = None, min_weight: float | None = None) -> "SparseVector":
        """Keep weights >= ``min_weight`` and then the ``top_k`` largest (ties broken by id)."""
        ids, w = self.ids, self.weights
        if min_weight is not None:
            keep = w >= min_weight
            ids, w = ids[keep], w[keep]
        if top_k is not None and ids.size > top_k:
            order = np.lexsort((ids, -w))[: max(top_k, 0)]
            order.sort()
            ids, w = ids[order], w[order]
        return SparseVector(ids, w, self.vocab)

    def without(self, token_ids: Iterable[int]) -> "SparseVector":
        drop = np.fromiter(token_ids, dtype=np.int32)
        keep = ~np.isin(self.ids, drop)
        return SparseVector(self.ids[keep], self.weights[keep], self.vocab)

    def dot(self, other: "SparseVector") -> float:
        _, a, b = np.intersect1d(self.ids, other.ids, assume_unique=True, return_indices=True)
        return float(np.dot(self.weights[a].astype(np.float32), other.weights[b].astype(np.float32)))

    def contributions(self, other: "SparseVector") -> list[tuple[str, float, float, float]]:
        """Per shared token: (token, self weight, other weight, product), largest product first."""
        common, a, b = np.intersect1d(self.ids, other.ids, assume_unique=True, return_indices=True)
        prods = self.weights[a] * other.weights[b]
        order = np.argsort(-prods, kind="stable")
        return [
            (self.vocab.tokens[common[i]], float(self.weights[a[i]]), float(other.weights[b[i]]), float(prods[i]))
            for i in order
        ]


def _names(vocab: Vocabulary, ids: Iterable[int]) -> str:
    return ", ".join(repr(vocab.tokens[int(i)]) if 0 <= i < len(vocab) else f"id {int(i)}" for i in ids)
