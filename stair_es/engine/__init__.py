"""The embedded search engine: on-disk, crash-safe, exact top-k by sparse dot product.

``EngineIndex.create(path, schema)`` / ``EngineIndex.open(path, writable=False)``; see
:mod:`stair_es.engine.index` for the on-disk layout, durability and score precision.
"""

from .index import FORMAT_VERSION, EngineIndex, Snapshot, check_index

__all__ = ["EngineIndex", "FORMAT_VERSION", "Snapshot", "check_index"]
