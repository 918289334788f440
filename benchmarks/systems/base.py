"""The interface every benchmarked system implements, and nothing else.

A system builds an index from a :class:`~benchmarks.corpora.Corpus` and answers the corpus's
queries by their row number; results are document row numbers (int64, ``-1`` pads a short list).
Query conversion into the system's own format happens in :meth:`System.prepare_queries`, outside
the timed region: the timer measures what a caller holding an encoded query waits for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..corpora import Corpus


class SkipSystem(Exception):
    """The system cannot run here (missing package, no server URL...); the message says why."""


class System:
    modality = "sparse"  # "sparse": ground truth is the exact sparse ranking; "dense": FAISS Flat's
    exact = False
    native_batch = False  # True when search_batch uses the system's own batch API
    batch_threads_max: int | None = None  # e.g. 1 for a single-threaded batch API

    def __init__(self, name: str, params: dict[str, Any], workdir: Path):
        self.name = name
        self.params = dict(params)
        self.workdir = workdir

    def warmup(self, corpus: Corpus) -> None:
        """Untimed, before ``build``: e.g. JIT-compile kernels on a few documents of the same
        array types, so build time does not include compilation."""

    def build(self, corpus: Corpus) -> None:
        raise NotImplementedError

    def prepare_queries(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def settings(self) -> list[dict[str, Any]]:
        """Search-time variants measured on one build (e.g. HNSW efSearch, Seismic heap_factor)."""
        return [{}]

    def search_one(self, qi: int, k: int, setting: dict[str, Any]) -> np.ndarray:
        raise NotImplementedError

    def search_batch(self, k: int, setting: dict[str, Any], threads: int) -> np.ndarray:
        """All queries at once, through the system's batch API if it has one."""
        return np.stack([pad(self.search_one(q, k, setting), k) for q in range(self.corpus.queries.n_rows)])

    def set_threads(self, n: int) -> None:
        """Limit the threads the system's search uses (single-query latency is measured on 1)."""

    def index_bytes(self) -> int | None:
        return None

    def extra_info(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def pad(ids: np.ndarray, k: int) -> np.ndarray:
    out = np.full(k, -1, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)[:k]
    out[: ids.size] = ids
    return out


def topk_from_scores(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest positive scores, best first (ties by lower index)."""
    k = min(k, scores.size)
    cand = np.argpartition(-scores, k - 1)[:k] if k < scores.size else np.arange(scores.size)
    cand = cand[np.lexsort((cand, -scores[cand]))]
    return cand[scores[cand] > 0]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
