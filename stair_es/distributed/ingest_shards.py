"""``stair-es ingest INDEX OUT_DIR``: finished shards of ``encode-catalog`` into an index.

Shards are read batch by batch as columns. Into the embedded engine they go through
``add_arrays`` (CSR token ids and weights straight from the Parquet list columns, no
per-document vector objects), into Elasticsearch/OpenSearch through the backend's usual bulk
path. Each shard's encoder config (its Parquet metadata) must match the index's: a shard of
another encoder is refused with the reason, the others go on. Ids already in the index are
skipped (unless ``reindex``), so running the same command again resumes. Inputs that could
not be encoded (the failures files) and shards that are unfinished, truncated or unreadable
are reported one by one; nothing is dropped silently.
"""

from __future__ import annotations

import gc
import json
import logging
from dataclasses import dataclass, field
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from typing import Any, Callable

import numpy as np

from ..backends.base import SearchBackend
from ..errors import IndexNotFoundError, InvalidInputError, StairError
from ..schema import Document, IngestReport, ItemResult
from .shards import csr, list_shards, open_fs, pyarrow_modules, read_failures, shard_metadata

log = logging.getLogger(__name__)

#: documents per commit into the embedded engine (rows of several shards are gathered)
COMMIT_ROWS = 32768


@dataclass
class _Pending:
    """Rows gathered from shards for one commit, as columns."""

    fields: tuple[str, ...]
    ids: list[str] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    captions: list[str | None] = field(default_factory=list)
    metadata: list[str | None] = field(default_factory=list)
    warnings: list[str | None] = field(default_factory=list)
    shard_of: list[str] = field(default_factory=list)
    vec: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, rb, shard: str) -> None:
        n = rb.num_rows
        cols = {name: rb.column(i) for i, name in enumerate(rb.schema.names)}
        self.ids += cols["id"].to_pylist()
        self.sources += cols["source"].to_pylist()
        self.captions += cols["caption"].to_pylist()
        self.metadata += cols["metadata"].to_pylist()
        self.warnings += cols["warning"].to_pylist()
        self.shard_of += [shard] * n
        for f in self.fields:
            if f"{f}_ids" in cols:
                ptr, tok = csr(cols[f"{f}_ids"])
                _, w = csr(cols[f"{f}_weights"])
            else:
                ptr, tok, w = np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32)
            self.vec.setdefault(f, []).append((ptr, tok, w))

    def columns(self, keep: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """CSR per field of the kept rows."""
        out = {}
        for f, parts in self.vec.items():
            lens = np.concatenate([np.diff(p) for p, _, _ in parts])
            tok = np.concatenate([t for _, t, _ in parts])
            w = np.concatenate([x for _, _, x in parts])
            if not keep.all():
                mask = np.repeat(keep, lens)
                tok, w, lens = tok[mask], w[mask], lens[keep]
            ptr = np.zeros(lens.size + 1, np.int64)
            np.cumsum(lens, out=ptr[1:])
            out[f] = (ptr, tok, w)
        return out


def ingest_shards(backend: SearchBackend, index: str, folder: str, *, ensure_index: Callable[..., Any],
                  encoder_signature: Callable[[Any], Any], reindex: bool = False, progress: bool = False,
                  on_items: Callable[[list[ItemResult]], None] | None = None, commit_rows: int = COMMIT_ROWS) -> IngestReport:
    """Ingest the finished shards of ``folder`` into ``index`` (created with the shards' encoder if missing).

    Called by :func:`stair_es.ingest.ingest_catalog` (use that), which passes its own
    ``ensure_index`` and ``encoder_signature`` so that shards and catalogs are held to the same
    rules (and this package never imports the module that dispatches to it).
    """
    from ..encoders.base import progress_bar

    _, pq, _ = pyarrow_modules()
    fs, root = open_fs(str(folder))
    shards = list_shards(fs, root)
    if not shards:
        raise InvalidInputError(f"{folder}: no shards yet (encode-catalog has not finished any); run encode-catalog first")
    report = IngestReport()
    try:
        schema = backend.index_info(index).schema
    except IndexNotFoundError:
        schema = None
    fast = getattr(backend, "name", "") == "embedded" and hasattr(backend, "add_arrays")
    total = sum(s.entry.get("inputs", 0) for s in shards if s.entry)
    bar = progress_bar(total, f"ingest {index}", progress, unit="doc")

    def emit(items: list[ItemResult]) -> None:
        report.extend(items)
        bar.update(len(items))
        if on_items:
            on_items(items)

    pending: _Pending | None = None
    # Hundreds of thousands of strings and report items are made here and none forms a cycle:
    # the cyclic collector would only rescan them again and again (measured: 0.71 s of item
    # building for 300k documents with it, 0.1 s without).
    gc_was_on = gc.isenabled()
    gc.disable()

    def flush() -> None:
        nonlocal pending
        if pending is None or not len(pending):
            return
        p, pending = pending, None
        emit(_commit(backend, index, p, reindex, fast))

    def load(s):
        """(shard metadata, table) of one whole shard, or the reason it cannot be read: a damaged
        shard is found before any of its rows is taken."""
        try:
            table = pq.read_table(s.path, filesystem=fs)
            return shard_metadata(table), table
        except Exception as e:  # noqa: BLE001 - truncated, not Parquet, not ours
            return f"{s.path}: cannot read this shard ({e}); run encode-catalog again to rewrite it", None

    readable = [s for s in shards if s.problem() is None]
    # The next shard is read (pyarrow, outside the GIL) while this one is committed.
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stair-es-shards")
    ahead = {readable[0].k: reader.submit(load, readable[0])} if readable else {}
    try:
        for s in shards:
            why = s.problem()
            if why is not None:
                emit([ItemResult(None, False, why, source=s.path, action="shard")])
                if s.entry is None and s.size is None and s.has_failures:  # given up on: each input and why
                    try:
                        emit([ItemResult(f["id"], False, f["reason"], f["origin"]) for f in read_failures(fs, root, s.k)
                              if f["action"] != "skipped"])
                    except Exception as e:  # noqa: BLE001
                        emit([ItemResult(None, False, f"failures file of {s.path} unreadable: {e}", source=s.path,
                                         action="shard")])
                continue
            nxt = readable.index(s) + 1
            if nxt < len(readable):
                ahead[readable[nxt].k] = reader.submit(load, readable[nxt])
            meta, table = ahead.pop(s.k).result()
            try:
                failed = read_failures(fs, root, s.k)
            except Exception as e:  # noqa: BLE001 - an unreadable failures file is itself reported
                emit([ItemResult(None, False, f"failures file of {s.path} unreadable: {e}", source=s.path, action="shard")])
                failed = []
            if failed:
                emit([ItemResult(f["id"], f["action"] == "skipped", None if f["action"] == "skipped" else f["reason"],
                                 f["origin"], "skip" if f["action"] == "skipped" else "index",
                                 f["reason"] if f["action"] == "skipped" else None) for f in failed])
            if table is None:
                emit([ItemResult(None, False, meta, source=s.path, action="shard")])
                continue
            cfg = meta.get("encoder")
            if schema is None:
                schema = ensure_index(backend, index, cfg)
            else:
                have, want = encoder_signature(schema.encoder), encoder_signature(cfg)
                if have and have.get("name") != "precomputed" and have != want:
                    emit([ItemResult(None, False, f"{s.path}: encoded with {want}, but index {index!r} was built with "
                                     f"{have}; vectors of different encoders are not comparable: ingest this shard "
                                     "into another index", source=s.path, action="shard")])
                    continue
            unknown = [f for f in meta.get("sparse_fields", []) if f not in schema.sparse_fields]
            if unknown:
                emit([ItemResult(None, False, f"{s.path}: sparse fields {unknown} are not in index {index!r} "
                                 f"({', '.join(schema.sparse_fields)})", source=s.path, action="shard")])
                continue
            for rb in table.to_batches(max_chunksize=commit_rows):
                if pending is None:
                    pending = _Pending(tuple(schema.sparse_fields))
                pending.add(rb, s.path)
                if len(pending) >= commit_rows:
                    flush()
        flush()
    finally:
        reader.shutdown(wait=True, cancel_futures=True)
        if gc_was_on:
            gc.enable()
        bar.close()
    return report


def _commit(backend: SearchBackend, index: str, p: _Pending, reindex: bool, fast: bool) -> list[ItemResult]:
    n = len(p)
    keep = np.ones(n, bool)
    items: list[ItemResult | None] = [None] * n
    if len(set(p.ids)) != n:  # the same id in two shards (e.g. folders copied together)
        seen: dict[str, int] = {}
        for i, doc_id in enumerate(p.ids):
            j = seen.setdefault(doc_id, i)
            if j != i:
                keep[i] = False
                items[i] = ItemResult(doc_id, False, f"duplicate id {doc_id!r} (also in {p.shard_of[j]}); this copy "
                                      "was not ingested", p.shard_of[i])
    if not reindex:
        existing = backend.existing_ids(index, p.ids if keep.all() else [d for d, k in zip(p.ids, keep) if k])
        if existing:
            for i, doc_id in enumerate(p.ids):
                if keep[i] and doc_id in existing:
                    keep[i] = False
                    items[i] = ItemResult(doc_id, True, None, p.sources[i], "skip",
                                          "already indexed (use --reindex to write it again)")
    rows = np.flatnonzero(keep).tolist()
    if rows:
        every = len(rows) == n  # the usual case (a fresh ingest): the columns as they are

        def pick(values: list) -> list:
            return values if every else [values[i] for i in rows]

        ids, sources = pick(p.ids), pick(p.sources)
        meta = _metadata(pick(p.metadata))
        vectors = p.columns(keep)
        done: list[ItemResult] | None = None
        if fast:
            try:
                backend.add_arrays(index, ids, vectors, metadata=meta, captions=pick(p.captions), sources=sources)
                done = list(map(ItemResult, ids, repeat(True), repeat(None), sources, repeat("index"), pick(p.warnings)))
            except StairError as e:  # all-or-nothing: find the culprit(s) document by document below
                log.info("column commit refused (%s); writing document by document", e)
        if done is None:
            done = _per_document(backend, index, p, np.asarray(rows), vectors, meta)
        if every and not any(items):
            return done
        for i, it in zip(rows, done):
            items[i] = it
    return [it for it in items if it is not None]


def _metadata(texts: list[str | None]) -> list[dict[str, Any] | None]:
    """The rows' metadata objects (None for none): one JSON parse for the whole batch."""
    if all(t in (None, "{}") for t in texts):
        return [None] * len(texts)
    parsed = json.loads("[" + ",".join(t if t else "{}" for t in texts) + "]")
    return [m or None for m in parsed]


def _per_document(backend, index, p: _Pending, rows: np.ndarray, vectors, meta) -> list[ItemResult]:
    """The bulk path (Elasticsearch/OpenSearch, or the embedded engine after a refused column
    commit): one Document per row, one result per document."""
    from ..sparse import SparseVector

    docs: list[Document] = []
    results: dict[int, ItemResult] = {}
    for r, i in enumerate(rows):
        try:
            vec = {}
            for f, (ptr, tok, w) in vectors.items():
                lo, hi = ptr[r], ptr[r + 1]
                if hi > lo:
                    vec[f] = SparseVector.from_arrays(tok[lo:hi], w[lo:hi])
            docs.append(Document(p.ids[i], vec, meta[r] or {}, p.captions[i], p.sources[i]))
        except StairError as e:
            results[r] = ItemResult(p.ids[i], False, str(e), p.sources[i])
    out = backend.ingest(index, docs).items if docs else []
    got = iter(out)
    final = []
    for r, i in enumerate(rows):
        if r in results:
            final.append(results[r])
            continue
        it = next(got)
        it.source = it.source or p.sources[i]
        it.warning = it.warning or p.warnings[i]
        final.append(it)
    return final
