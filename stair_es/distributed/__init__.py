"""Catalogs beyond one machine: encode a catalog into Parquet shards on a process pool or a Ray
cluster (``stair-es encode-catalog``), then ingest the shards into any backend.

* :mod:`.shards` owns the folder format: shard files, the failures files, the manifest of
  finished shards, reading them back column by column;
* :mod:`.sources` reads what to encode (a folder, a JSONL manifest as ``ingest`` reads, or a
  Parquet/CSV list of paths or URLs, local or on s3:// / gs://);
* :mod:`.pipeline` cuts the catalog into shards, encodes each one in a worker (the same code
  for the process pool and for Ray actors) and resumes after a crash;
* :mod:`.cpu` measures where a worker's CPU goes while it makes a shard;
* :mod:`.ingest_shards` streams finished shards into an index.

Nothing here imports Ray, and pyarrow is imported only when a shard is written or read: the
default install stays light (pyarrow and Ray come with the ``distributed`` extra).
This package must not know how a backend stores documents: it calls the backend protocol
(and the embedded backend's ``add_arrays`` fast path).
"""

from __future__ import annotations

from .shards import is_shard_folder

__all__ = ["is_shard_folder"]
