"""Elasticsearch / OpenSearch through the stair_es backend protocol, when a server URL is given.

Runs only with ``params.url`` (or the ``STAIR_BENCH_ES_URL`` / ``STAIR_BENCH_OS_URL`` environment
variable); otherwise it is skipped with the reason. Against the emulators this checks that results
agree (recall), not speed: keep such corpora to a few hundred documents.
"""

from __future__ import annotations

import os
import uuid

import numpy as np

from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

from ..corpora import Corpus
from .base import SkipSystem, System

FIELD = "image"
ENV = {"elasticsearch": "STAIR_BENCH_ES_URL", "opensearch": "STAIR_BENCH_OS_URL"}


class BackendSystem(System):
    def build(self, corpus: Corpus) -> None:
        kind = self.params.get("backend", self.params.get("kind", "elasticsearch"))
        url = self.params.get("url") or os.environ.get(ENV.get(kind, ""), "")
        if not url:
            raise SkipSystem(f"no {kind} URL given (set params.url or {ENV.get(kind)})")
        max_docs = int(self.params.get("max_docs", 5000))
        if corpus.docs.n_rows > max_docs:
            raise SkipSystem(f"{corpus.docs.n_rows} docs is above this system's max_docs={max_docs}")
        from stair_es.backends.base import get_backend

        try:
            self.backend = get_backend(kind, urls=url)
        except Exception as e:  # noqa: BLE001 - any failure to connect is a reason to skip
            raise SkipSystem(f"cannot use {kind} at {url}: {e}") from e
        self.url = url
        self.index_name = f"stair-bench-{uuid.uuid4().hex[:8]}"
        self.backend.create_index(self.index_name, IndexSchema(fields={}, sparse_fields=(FIELD,)))
        vocab = default_vocabulary()
        docs = (
            Document(id=str(i), vectors={FIELD: SparseVector(*corpus.docs.row(i), vocab)}, metadata={})
            for i in range(corpus.docs.n_rows)
        )
        report = self.backend.ingest(self.index_name, docs)
        if report.failures:
            raise SkipSystem(f"ingest failed for {len(report.failures)} documents: {report.failures[0].error}")

    def extra_info(self):
        return {"url": self.url}

    def prepare_queries(self, corpus):
        super().prepare_queries(corpus)
        vocab = default_vocabulary()
        self.vectors = [SparseVector(*corpus.queries.row(i), vocab) for i in range(corpus.queries.n_rows)]

    def search_one(self, qi, k, setting):
        res = self.backend.search(self.index_name, SearchRequest([SparseClause(FIELD, self.vectors[qi])], top_k=k))
        return np.array([int(h.id) for h in res.hits], dtype=np.int64)

    def close(self):
        if hasattr(self, "backend"):
            try:
                self.backend.delete_index(self.index_name)
            finally:
                self.backend.close()
