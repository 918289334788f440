"""The search-backend protocol and the backend registry.

A backend stores documents (sparse vectors + metadata) in named indices and answers
:class:`~stair_es.query.SearchRequest` objects. The embedded engine, Elasticsearch and
OpenSearch each implement it in their own module; a new backend is one new module
registered here (or through the ``stair_es.backends`` entry-point group).

Contract every backend keeps:

* ``search`` scores by the exact dot product ``sum_c weight_c * <q_c, d[field_c]>``
  (ES/OS: with their stored 9-bit precision), after the request's filter;
* ``ingest`` returns an :class:`IngestReport` with one item per input document; a document
  that fails never makes the whole batch fail silently, and what is reported ok is durable;
* ``explain`` gives per-token contributions that sum to the hit's score.

Optional capabilities (``hybrid_search``, ``optimize``, ``check``, ``scan``, ``generation``,
``index_folder``) have defaults here that raise :class:`~stair_es.errors.UnsupportedError` (or
return None), so callers never ask which backend they hold: a plugin backend gains a capability
by overriding its method, without an edit anywhere else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import DocumentNotFoundError, UnknownNameError, UnsupportedError
from ..plugins import entry_points
from ..query import SearchRequest
from ..schema import Document, Explanation, IndexSchema, IngestReport, ItemResult, SearchResult

if TYPE_CHECKING:  # types only: hybrid.py is imported by the backends that implement hybrid search
    from ..hybrid import HybridOptions


@dataclass
class IndexInfo:
    name: str
    schema: IndexSchema
    doc_count: int
    size_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific figures (segments, postings...)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "doc_count": self.doc_count, "size_bytes": self.size_bytes,
                "schema": self.schema.to_dict(), **self.extra}


ProgressCallback = Callable[[list[ItemResult]], None]


class SearchBackend(ABC):
    """What stair_es needs from a search engine."""

    name: str = "abstract"
    #: searches run in this process (no network): batching them and counting statistics is cheap
    in_process: bool = False

    @abstractmethod
    def create_index(self, index: str, schema: IndexSchema, *, exist_ok: bool = False) -> None: ...

    @abstractmethod
    def list_indices(self) -> list[str]: ...

    @abstractmethod
    def index_info(self, index: str) -> IndexInfo: ...

    @abstractmethod
    def delete_index(self, index: str) -> None: ...

    @abstractmethod
    def ingest(self, index: str, docs: Iterable[Document], *, on_batch: ProgressCallback | None = None) -> IngestReport:
        """Add or replace documents by id. ``on_batch`` is called after each durable batch."""

    @abstractmethod
    def get(self, index: str, doc_id: str) -> Document: ...

    def vectors_of(self, index: str, doc_ids: Sequence[str], field: str) -> list[Any]:
        """Each document's sparse vector of ``field`` (a :class:`~stair_es.sparse.SparseVector`), or
        None when the document is gone or lacks the field: what re-ranking by meaning reads back for
        a search's hits. Backends may read them all at once."""
        out = []
        for doc_id in doc_ids:
            try:
                out.append(self.get(index, doc_id).vectors.get(field))
            except DocumentNotFoundError:
                out.append(None)
        return out

    @abstractmethod
    def existing_ids(self, index: str, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` are in the index (used to resume an interrupted ingest)."""

    @abstractmethod
    def delete_documents(self, index: str, ids: Iterable[str]) -> IngestReport: ...

    @abstractmethod
    def search(self, index: str, request: SearchRequest) -> SearchResult: ...

    def search_batch(self, index: str, requests: Sequence[SearchRequest], *, threads: int | None = None) -> list[SearchResult]:
        """Several searches on one index, results in request order. This default runs them one
        after another; a backend that can do better (the embedded engine runs them on
        ``threads`` threads at once) overrides it. Any request's error is raised."""
        return [self.search(index, r) for r in requests]

    @abstractmethod
    def explain(self, index: str, doc_id: str, request: SearchRequest) -> Explanation: ...

    @abstractmethod
    def doc_freqs(self, index: str, field: str) -> tuple[np.ndarray, int]:
        """(document frequency per vocabulary id for sparse ``field``, number of live documents)."""

    # --- optional capabilities: override to provide ------------------------------------------
    def hybrid_search(self, index: str, request: SearchRequest, text: str | None, opts: "HybridOptions | None" = None,
                      *, explain: bool = False, vector: Any = None) -> SearchResult:
        """The sparse retriever, BM25 over the documents' text and dense vectors, fused
        (:mod:`stair_es.hybrid` says what each argument means)."""
        raise UnsupportedError(f"the {self.name} backend has no hybrid search; search it without --hybrid")

    def optimize(self, index: str, *, max_segments: int | None = None) -> None:
        """Merge the index's segments into one (or into at most ``max_segments``)."""
        raise UnsupportedError(f"`index optimize` is for the embedded engine; the {self.name} backend merges segments itself")

    def check(self, index: str, *, repair: bool = False) -> dict[str, Any]:
        """Verify every file of the index (and, with ``repair``, commit it without damaged parts);
        the report of :func:`stair_es.engine.check_index`."""
        raise UnsupportedError(f"index check verifies embedded indexes; the {self.name} backend checks its own files")

    def scan(self, index: str, field: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[str | None]]]:
        """Every live document as ``(indptr, token ids of field, captions)`` chunks."""
        raise UnsupportedError(f"the {self.name} backend cannot list an index's documents (so it has no neighbour "
                               "statistics); use the embedded backend (or a copy of the index in it)")

    def generation(self, index: str, *, refresh: bool = True) -> int | None:
        """A number that changes with every commit of the index; None when the backend has none."""
        return None

    def index_folder(self, index: str) -> Path | None:
        """The local folder of the index (where derived files such as statistics can live); None when remote."""
        return None

    def close(self) -> None:  # noqa: B027 - optional
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


_BUILTIN = {
    "embedded": "stair_es.backends.embedded:EmbeddedBackend",
    "elasticsearch": "stair_es.backends.elasticsearch:ElasticsearchBackend",
    "opensearch": "stair_es.backends.opensearch:OpenSearchBackend",
}


def list_backends() -> list[str]:
    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group="stair_es.backends"))
    return sorted(names)


def backend_class(name: str) -> type[SearchBackend]:
    target = _BUILTIN.get(name)
    if target is None:
        for ep in entry_points(group="stair_es.backends"):
            if ep.name == name:
                return ep.load()
        raise UnknownNameError(f"unknown backend {name!r}; available: {', '.join(list_backends())}")
    module, _, attr = target.partition(":")
    return getattr(import_module(module), attr)


def get_backend(name: str = "embedded", **options: Any) -> SearchBackend:
    """Instantiate a backend by name, e.g. ``get_backend("embedded", home="./indices")``."""
    return backend_class(name)(**options)
