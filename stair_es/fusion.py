"""Fusing ranked lists from several retrievers (learned sparse, BM25, dense): RRF and linear.

* **RRF** (reciprocal rank fusion, Cormack et al. 2009): ``score(d) = sum_r 1 / (k + rank_r(d))``
  over the retrievers ``r`` that returned ``d`` (ranks from 1); ``k`` (default 60) is
  Elasticsearch's ``rank_constant`` and OpenSearch's ``combination.rank_constant``.
* **linear**: each retriever's scores are min-max normalised over its own result window,
  ``(s - min) / (max - min)`` (1.0 when all its scores are equal), and combined as
  ``sum_r w_r * norm_r(d)`` with the weights scaled to sum to 1; a document a retriever did not
  return contributes 0 for it. This is Elasticsearch's ``linear`` retriever with
  ``normalizer: minmax`` and OpenSearch's ``normalization-processor`` with ``min_max`` and
  ``arithmetic_mean`` (which divides by the sum of weights).

Ties in the fused score are broken by the best single-retriever rank, then by id, so the
order is deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from .errors import InvalidInputError

FUSIONS = ("rrf", "linear")
DEFAULT_RRF_K = 60


@dataclass
class Ranked:
    """One retriever's result: ids best first with their scores."""

    name: str
    ids: list[str]
    scores: list[float]


@dataclass
class Fused:
    id: str
    score: float
    ranks: dict[str, int] = field(default_factory=dict)      # retriever -> rank (1-based); absent = not returned
    scores: dict[str, float] = field(default_factory=dict)   # retriever -> its own score
    parts: dict[str, float] = field(default_factory=dict)    # retriever -> its share of the fused score


def check_rrf_k(k: float) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or not math.isfinite(k) or k != int(k) or not 1 <= k <= 10000:
        raise InvalidInputError(f"--rrf-k must be a whole number from 1 to 10000 (the rank constant), got {k!r}")
    return int(k)


def check_weights(weights: Sequence[float], n: int, names: Sequence[str] | None = None) -> list[float]:
    """Weights for ``n`` retrievers, scaled to sum to 1; negative or all-zero weights are refused."""
    w = [float(x) for x in weights]
    if len(w) != n:
        which = ",".join(names) if names else "one per retriever"
        raise InvalidInputError(f"--weights needs {n} numbers ({which}), got {len(w)}")
    if any(not math.isfinite(x) or x < 0 for x in w):
        raise InvalidInputError(f"fusion weights must be finite and not negative, got {','.join(map(str, weights))}")
    total = sum(w)
    if total <= 0:
        raise InvalidInputError("fusion weights sum to 0: give at least one positive weight, e.g. --weights 0.7,0.3")
    return [x / total for x in w]


def parse_weights(text: str, n: int = 2, names: Sequence[str] | None = None) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise InvalidInputError(f"--weights takes {n} numbers separated by a comma, e.g. 0.7,0.3; got {text!r}") from None
    return check_weights(vals, n, names)


def _order(fused: dict[str, Fused]) -> list[Fused]:
    return sorted(fused.values(), key=lambda f: (-f.score, min(f.ranks.values()), f.id))


def _entries(lists: Sequence[Ranked]) -> dict[str, Fused]:
    out: dict[str, Fused] = {}
    for r in lists:
        if len(r.ids) != len(r.scores):
            raise ValueError("ids and scores differ in length")
        for rank, (i, s) in enumerate(zip(r.ids, r.scores), start=1):
            f = out.setdefault(i, Fused(i, 0.0))
            if r.name not in f.ranks:  # a retriever returning an id twice: its first (best) rank counts
                f.ranks[r.name], f.scores[r.name] = rank, float(s)
    return out


def rrf(lists: Sequence[Ranked], k: int = DEFAULT_RRF_K) -> list[Fused]:
    k = check_rrf_k(k)
    out = _entries(lists)
    for f in out.values():
        f.parts = {name: 1.0 / (k + rank) for name, rank in f.ranks.items()}
        f.score = sum(f.parts.values())
    return _order(out)


def minmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    lo, hi = min(scores), max(scores)
    if hi == lo:
        return [1.0] * len(scores)
    return [(s - lo) / (hi - lo) for s in scores]


def linear(lists: Sequence[Ranked], weights: Sequence[float]) -> list[Fused]:
    w = check_weights(weights, len(lists))
    out = _entries(lists)
    for r, wr in zip(lists, w):
        for i, ns in zip(r.ids, minmax(r.scores)):
            f = out[i]
            if r.name not in f.parts:
                f.parts[r.name] = wr * ns
    for f in out.values():
        f.score = sum(f.parts.values())
    return _order(out)


def fuse(lists: Sequence[Ranked], method: str = "rrf", *, k: int = DEFAULT_RRF_K,
         weights: Sequence[float] | None = None) -> list[Fused]:
    if method == "rrf":
        return rrf(lists, k)
    if method == "linear":
        return linear(lists, weights if weights is not None else [1.0] * len(lists))
    raise InvalidInputError(f"unknown fusion {method!r}; use one of {', '.join(FUSIONS)}")
