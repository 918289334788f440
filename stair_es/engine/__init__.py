"""The embedded search engine: on-disk, crash-safe, exact top-k by sparse dot product.

``EngineIndex.create(path, schema)`` / ``EngineIndex.open(path, writable=False)``; see
:mod:`stair_es.engine.index` for the on-disk layout, durability and score precision.

One module per job:

* ``index``: :class:`EngineIndex`, the writer and reader of one index folder (add, delete,
  commit, merge policy, stored fields, statistics) and its :class:`Snapshot` read API;
* ``searcher``: exact top-k (strategy per segment, threads, the exact merge of heaps);
* ``manifest``: the commit record (manifest files, validation, writer lock, tombstones);
* ``check``: ``index check`` and its repairs (like Lucene's CheckIndex);
* ``ids``: a batch's ids hashed once, id lookup across segments;
* ``segment``: one immutable segment (file format, build, reading, merge input);
* ``columns``: the columnar batch a segment is built from, metadata columns, packed strings;
* ``filters``: a filter tree evaluated on one segment into a document mask;
* ``storage``: atomic files and the checksummed array container;
* ``pages``: ``madvise`` hints for memory-mapped segments (the first query's page faults);
* ``checksum``: the registry of compiled checksum helpers (numba, when loaded);
* ``layout``: constants and the tuples (segment arrays, top-k heap, options) shared by the
  kernels and their twins;
* ``kernels/``: the numba kernels, one job a module (``verify``, ``ids``, ``build``, ``postings``,
  ``heap``, ``taat``, ``blockmax``, ``search``, ``simd``); ``npkernels/``: their numpy twins
  for small work, under the same module names.
"""

from .check import check_index
from .index import FORMAT_VERSION, EngineIndex, Snapshot

__all__ = ["EngineIndex", "FORMAT_VERSION", "Snapshot", "check_index"]
