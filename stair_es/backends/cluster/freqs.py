"""Document frequencies of a cluster's index, remembered on this machine between commands.

Every text query needs its index's document frequencies (IDF, the query's words grounded on the
words the index holds, re-ranking by meaning). The embedded engine keeps them per segment; on
Elasticsearch and OpenSearch a ``rank_features`` field cannot be aggregated, so they are counted
by scanning the whole index, which a one-shot ``stair-es search`` would otherwise pay on every
query (minutes on a million documents). They are kept in ``<data home>/_cluster_stats`` and
reused while the index holds the same number of documents and for at most
``$STAIR_ES_CLUSTER_STATS_TTL`` seconds (default :data:`DEFAULT_TTL_S`; 0 turns the cache off):
an update that keeps the count changes them a little, which IDF and grounding tolerate. An
ingest or a delete through this process forgets them.

This module knows files and arrays, not HTTP: the backend gives it the key and the count.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TTL_S = 3600.0


def ttl_s() -> float:
    """``$STAIR_ES_CLUSTER_STATS_TTL`` in seconds, else :data:`DEFAULT_TTL_S` (a bad value: the default)."""
    try:
        return max(0.0, float(os.environ.get("STAIR_ES_CLUSTER_STATS_TTL", DEFAULT_TTL_S)))
    except ValueError:
        return DEFAULT_TTL_S


def _path(key: tuple[Any, ...]) -> Path:
    from ...models.store import data_home

    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:32]
    return data_home() / "_cluster_stats" / f"{digest}.npz"


def load(key: tuple[Any, ...], count: int) -> tuple[np.ndarray, int] | None:
    """The remembered (document frequencies, documents) for ``key``, or None when there are none,
    they are older than :func:`ttl_s`, the index's document count is no longer ``count``, or the
    file cannot be read (it is then counted again)."""
    ttl = ttl_s()
    path = _path(key)
    if ttl <= 0 or not path.is_file():
        return None
    try:
        with np.load(path) as f:
            if int(f["count"]) != count or time.time() - float(f["made"]) > ttl:
                return None
            return f["df"].astype(np.int64), int(f["n"])
    except (OSError, ValueError, KeyError):
        return None


def save(key: tuple[Any, ...], count: int, df: np.ndarray, n: int) -> None:
    """Remember them (written whole, then renamed into place); a failure to write is ignored."""
    if ttl_s() <= 0:
        return
    path = _path(key)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".stats-", suffix=".npz", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(f, df=df, n=np.int64(n), count=np.int64(count), made=np.float64(time.time()))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def forget(key_prefix: tuple[Any, ...], fields: Any) -> None:
    """Drop the remembered frequencies of every field of ``fields`` under ``key_prefix``."""
    for field in fields:
        with contextlib.suppress(OSError):
            _path((*key_prefix, field)).unlink(missing_ok=True)
