"""The embedded backend: named indices as subdirectories of a home directory.

Each index is an :class:`~stair_es.engine.EngineIndex` in ``home/<name>``; the default home
is ``$STAIR_ES_HOME`` or ``~/.local/share/stair-es``. Read handles are cached and opened
without a lock; the writable handle (which takes the index's writer lock) is opened only
when something is written, so a reading process never blocks a writing one.
This module owns naming and handle caching; everything about storage is in the engine.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..engine import EngineIndex, check_index
from ..neighbours import StatsUpdater
from ..errors import IndexExistsError, IndexNotFoundError, InvalidInputError, StairError
from ..query import SearchRequest
from ..schema import Document, Explanation, Hit, IndexSchema, IngestReport, ItemResult, SearchResult
from .base import IndexInfo, ProgressCallback, SearchBackend


def _written(batch, items):
    """(image ids, caption) of each document an ``add`` wrote, and the ids it replaced."""
    added, replaced = [], []
    for d, it in zip(batch, items):
        if it.ok and it.action in ("index", "update"):
            v = d.vectors.get("image")
            added.append((v.ids if v is not None else np.zeros(0, np.int32), d.caption))
            if it.action == "update":
                replaced.append(d.id)
    return added, replaced

def _dense_checked(batch, spec, index):
    """The documents whose dense vector (if any) fits the index's dense field with those vectors in
    their stored form (None: no vector), and an error item for each document that does not fit
    (checked per document, before anything is written)."""
    # lazy: a plain search needs no dense code (about 15 ms of import)
    from ..dense import prepare

    todo, vectors, refused = [], [], {}
    for k, d in enumerate(batch):
        vec = getattr(d, "dense", None)
        if vec is None or not isinstance(d, Document):
            todo.append(d)
            vectors.append(None)
        elif spec is None:
            refused[k] = ItemResult(d.id, False, f"{d.id!r} has a dense vector but index {index!r} has no dense field: "
                                    "create the index with --dense-dims N (or ingest without dense vectors)", d.source)
        else:
            try:
                vectors.append(prepare(vec, spec, f"the dense vector of {d.id!r}"))
                todo.append(d)
            except StairError as e:
                refused[k] = ItemResult(d.id, False, str(e), d.source)
    return todo, vectors, refused


def _in_order(batch, todo, items, refused):
    """Item results in the order of the batch (refused documents where they were)."""
    if not refused:
        return items
    it = iter(items)
    return [refused[k] if k in refused else next(it) for k in range(len(batch))]


def _hit(s, d: int, score: float) -> Hit:
    """A hit of a sidecar retriever (BM25, dense) from its (segment, local doc, score)."""
    return Hit(s.seg.doc_id(d), score, s.seg.metadata(d), s.seg.caption(d), s.seg.source(d))


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,127}$")
DEFAULT_BATCH = 256


def default_home() -> Path:
    env = os.environ.get("STAIR_ES_HOME")
    return Path(env).expanduser() if env else Path.home() / ".local" / "share" / "stair-es"


def check_index_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidInputError(f"invalid index name {name!r}: use lowercase letters, digits, '-' and '_' "
                                "(starting with a letter or digit, at most 128 characters)")
    return name


class EmbeddedBackend(SearchBackend):
    """Indices on local disk, searched in-process (no server)."""

    name = "embedded"
    in_process = True

    def __init__(self, home: str | Path | None = None, *, batch_size: int = DEFAULT_BATCH):
        self.home = Path(home).expanduser() if home is not None else default_home()
        self.batch_size = int(batch_size)
        self._readers: dict[str, EngineIndex] = {}
        self._writers: dict[str, EngineIndex] = {}

    # --- handles -------------------------------------------------------------------------------
    def _path(self, index: str) -> Path:
        return self.home / check_index_name(index)

    def _open(self, index: str, writable: bool) -> EngineIndex:
        path = self._path(index)
        try:
            return EngineIndex.open(path, writable=writable)
        except IndexNotFoundError:
            raise self._not_found(index) from None

    def _not_found(self, index: str) -> IndexNotFoundError:
        return IndexNotFoundError(f"no index named {index!r} in {self.home}; create it with `stair-es ingest {index} "
                                  f"SOURCE` or `stair-es index create {index}`")

    def _reader(self, index: str) -> EngineIndex:
        if index in self._writers:  # the freshest view this process has
            return self._writers[index]
        if index not in self._readers:
            self._readers[index] = self._open(index, writable=False)
        return self._readers[index]

    def _writer(self, index: str) -> EngineIndex:
        if index not in self._writers:
            self._writers[index] = self._open(index, writable=True)
            old = self._readers.pop(index, None)
            if old is not None:
                old.close()
        return self._writers[index]

    def _forget(self, index: str) -> None:
        for cache in (self._readers, self._writers):
            h = cache.pop(index, None)
            if h is not None:
                h.close()

    # --- indices ------------------------------------------------------------------------------
    def create_index(self, index: str, schema: IndexSchema, *, exist_ok: bool = False) -> None:
        path = self._path(index)
        if (path / "manifest.json").exists():
            if exist_ok:
                return
            raise IndexExistsError(f"index {index!r} already exists in {self.home}; delete it first or pick another name")
        # lazy: a plain search needs no dense code (about 15 ms of import)
        from ..dense import DenseSpec, write_spec

        spec = DenseSpec.from_dict(schema.dense)
        # the dense field lives beside the segments (stair_es.dense), not in the engine's manifest
        EngineIndex.create(path, replace(schema, dense=None)).close()
        if spec is not None:
            write_spec(path, spec)

    def dense_spec(self, index: str):
        """The index's :class:`~stair_es.dense.DenseSpec`, or None when it has no dense field."""
        # lazy: a plain search needs no dense code (about 15 ms of import)
        from ..dense import read_spec

        return read_spec(self._reader(index).path)

    def list_indices(self) -> list[str]:
        if not self.home.is_dir():
            return []
        return sorted(p.name for p in self.home.iterdir() if (p / "manifest.json").is_file() and _NAME_RE.match(p.name))

    def index_info(self, index: str) -> IndexInfo:
        ix = self._reader(index)
        st = ix.stats()
        spec = self.dense_spec(index)
        schema = replace(ix.schema, dense=spec.to_dict()) if spec is not None else ix.schema
        figures = {k: st[k] for k in ("segments", "deleted", "postings", "postings_per_field", "bytes_per_posting")}
        return IndexInfo(index, schema, st["docs"], st["bytes_on_disk"], {"path": str(ix.path), **figures})

    def delete_index(self, index: str) -> None:
        path = self._path(index)
        if not (path / "manifest.json").exists():
            raise IndexNotFoundError(f"no index named {index!r} in {self.home}")
        self._forget(index)
        EngineIndex.open(path, writable=True).close()  # raises IndexLockedError while another process writes
        shutil.rmtree(path)

    def optimize(self, index: str, *, max_segments: int | None = None) -> None:
        ix = self._writer(index)
        upkeep = StatsUpdater(ix)  # merging changes the generation, not the documents: re-tag stored statistics
        upkeep.before([])
        ix.optimize(max_segments)
        upkeep.after([], [])
        upkeep.finish()

    # --- documents ----------------------------------------------------------------------------
    def ingest(self, index: str, docs: Iterable[Document], *, on_batch: ProgressCallback | None = None) -> IngestReport:
        ix = self._writer(index)
        report = IngestReport()
        upkeep = StatsUpdater(ix)  # keeps stored neighbour statistics current (a no-op when there are none)
        # lazy: a plain search needs no dense code (about 15 ms of import)
        from ..dense import DenseStore, read_spec

        spec = read_spec(ix.path)
        store = DenseStore(ix.path, spec) if spec is not None else None

        def flush(batch: list[Document]) -> None:
            upkeep.before([d.id for d in batch if isinstance(d, Document)])
            todo, vectors, refused = _dense_checked(batch, spec, index)
            if store is not None:
                kept = [(d.id, v) for d, v in zip(todo, vectors) if v is not None]
                store.begin(ix, [i for i, _ in kept], [v for _, v in kept])
            items = ix.add(todo) if todo else []
            if store is not None:
                store.finish(ix)
                for v, it in zip(vectors, items):
                    if it.ok and v is None and not it.warning:
                        it.warning = "no dense vector: the dense retriever of hybrid search cannot find this document"
            upkeep.after(*_written(todo, items))
            items = _in_order(batch, todo, items, refused)
            report.extend(items)
            if on_batch is not None:
                on_batch(items)

        it = iter(docs)
        while batch := list(itertools.islice(it, max(1, self.batch_size))):
            flush(batch)
        upkeep.finish()
        return report

    def add_arrays(self, index: str, ids: Sequence[str], vectors, *, metadata=None, captions=None, sources=None) -> int:
        """Already-encoded documents as columns (``EngineIndex.add_arrays``: CSR vectors per field,
        all-or-nothing), keeping stored neighbour statistics current; used by ``ingest`` of
        Parquet shards (stair_es.distributed). Returns the number of documents committed."""
        ix = self._writer(index)
        upkeep = StatsUpdater(ix)
        ids = list(ids)
        upkeep.before(ids)
        had = ix.contains(ids) if upkeep.active else set()
        n = ix.add_arrays(ids, vectors, metadata, captions=captions, sources=sources)
        if upkeep.active:
            ptr, tok, _ = vectors.get("image", (np.zeros(len(ids) + 1, np.int64), np.zeros(0, np.int32), None))
            caps = captions if captions is not None else [None] * len(ids)
            upkeep.after([(np.asarray(tok[ptr[i]:ptr[i + 1]]), caps[i]) for i in range(len(ids))], sorted(had))
        upkeep.finish()
        return n

    def get(self, index: str, doc_id: str) -> Document:
        ix = self._reader(index)
        doc = ix.get(doc_id)
        spec = self.dense_spec(index)
        if spec is not None:
            # lazy: a plain search needs no dense code (about 15 ms of import)
            from ..dense import vector_of

            doc.dense = vector_of(ix, spec, doc_id)  # as stored: unit length for cosine, float16-rounded
        return doc

    def vectors_of(self, index: str, doc_ids: Sequence[str], field: str) -> list[Any]:
        return self._reader(index).vectors_of(doc_ids, field)

    def existing_ids(self, index: str, ids: Iterable[str]) -> set[str]:
        return self._reader(index).contains(list(ids))

    def delete_documents(self, index: str, ids: Iterable[str]) -> IngestReport:
        ix, ids = self._writer(index), list(ids)
        upkeep = StatsUpdater(ix)
        upkeep.before(ids)
        items = ix.delete(ids)
        upkeep.after([], [it.id for it in items if it.ok])
        upkeep.finish()
        return IngestReport(items)

    def search(self, index: str, request: SearchRequest) -> SearchResult:
        return self._reader(index).search(request)

    def search_batch(self, index: str, requests: Sequence[SearchRequest], *, threads: int | None = None) -> list[SearchResult]:
        return self._reader(index).search_batch(requests, threads=threads)

    def explain(self, index: str, doc_id: str, request: SearchRequest) -> Explanation:
        return self._reader(index).explain(doc_id, request)

    def doc_freqs(self, index: str, field: str) -> tuple[np.ndarray, int]:
        return self._reader(index).doc_freqs(field)

    def hybrid_search(self, index: str, request: SearchRequest, text: str | None, opts=None, *, explain: bool = False,
                      vector=None) -> SearchResult:
        """Hybrid search fused in stair_es (BM25 from :mod:`stair_es.lexical`, dense from
        :mod:`stair_es.dense`); every hit carries each retriever's rank and score (``explain``
        changes nothing here)."""
        # lazy: hybrid search loads only when asked for (fusion and BM25 code)
        from ..hybrid import checked_options, fuse_results, fusion_note

        opts = checked_options(request, text, opts)
        t0 = time.perf_counter()
        ix = self._reader(index)
        req = request.prepared(ix.schema, ix.vocab)
        notes = list(req.notes)
        lists: dict[str, list] = {}
        if "dense" in opts.retrievers:
            # lazy: a plain search needs no dense code (about 15 ms of import)
            from ..dense import no_dense_error, query_vector, search_embedded as dense_search

            spec = self.dense_spec(index)
            if spec is None:
                raise no_dense_error(index)
            q = query_vector(spec, index, text=text, vector=vector)
            lists["dense"] = [_hit(s, d, score) for s, d, score in dense_search(ix, spec, q, opts.window, req.filter, notes)]
        if "sparse" in opts.retrievers:
            lists["sparse"] = ix.search(replace(req, top_k=opts.window)).hits if req.clauses else []
            if not req.clauses:
                notes.append("the query gave no tokens for the sparse retriever: the other retrievers rank the hits")
        if "bm25" in opts.retrievers:
            # lazy: BM25 loads only for hybrid search
            from ..lexical import search_embedded

            lists["bm25"] = [_hit(s, d, score) for s, d, score in search_embedded(ix, text, opts.window, req.filter, notes)]
        hits = fuse_results(lists, opts, request.top_k)
        notes.append(fusion_note(opts, "in stair_es"))
        return SearchResult(hits, None, (time.perf_counter() - t0) * 1000.0, notes)  # fusion sees only the windows

    def check(self, index: str, *, repair: bool = False) -> dict:
        """:func:`stair_es.engine.check_index` of the index folder, with its dense vector files
        (:func:`stair_es.dense.check_files`) under ``"dense"`` when it has any."""
        # lazy: a plain search needs no dense code (about 15 ms of import)
        from ..dense import check_files

        path = self._path(index)
        if not path.exists():
            raise self._not_found(index)
        self._forget(index)  # a repair rewrites the commit: no cached handle may outlive it
        report = check_index(path, repair=repair)
        dense = check_files(path, repair=repair) if path.is_dir() else None
        if dense is not None:
            report["dense"] = dense
            report["ok"] = report["ok"] and dense["ok"]
        return report

    # --- document scan (neighbour statistics, stair_es.neighbours) -------------------------------
    def scan(self, index: str, field: str):
        """Live documents as ``(indptr, token ids of field, captions)`` per segment."""
        return self._reader(index).scan(field)

    def generation(self, index: str, *, refresh: bool = True) -> int:
        ix = self._reader(index)
        if refresh:
            ix.refresh()
        return ix.generation

    def index_folder(self, index: str) -> Path:
        return self._reader(index).path

    def close(self) -> None:
        for name in list(self._readers) + list(self._writers):
            self._forget(name)
