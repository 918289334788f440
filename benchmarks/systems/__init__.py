"""Systems under benchmark, one module per system, all behind :class:`~benchmarks.systems.base.System`.

``SYSTEMS`` maps a config's ``kind`` to ``module:Class``; modules are imported only when a config
uses them, so a missing optional dependency skips that system (with the reason) instead of the run.
"""

from __future__ import annotations

from importlib import import_module

from .base import SkipSystem, System

SYSTEMS = {
    "bruteforce": "benchmarks.systems.bruteforce:BruteForce",
    "embedded": "benchmarks.systems.embedded:EmbeddedEngine",
    "faiss_flat": "benchmarks.systems.dense:FaissFlat",
    "faiss_hnsw": "benchmarks.systems.dense:FaissHNSW",
    "seismic": "benchmarks.systems.seismic:Seismic",
    "pisa": "benchmarks.systems.pisa:Pisa",
    "elasticsearch": "benchmarks.systems.search_backend:BackendSystem",
    "opensearch": "benchmarks.systems.search_backend:BackendSystem",
}


def system_class(kind: str) -> type[System]:
    if kind not in SYSTEMS:
        raise ValueError(f"unknown system kind {kind!r}; known: {', '.join(sorted(SYSTEMS))}")
    module, _, name = SYSTEMS[kind].partition(":")
    return getattr(import_module(module), name)


__all__ = ["SYSTEMS", "SkipSystem", "System", "system_class"]
