"""The dense baseline: FAISS on 512-d float32 unit vectors, as many as the sparse corpus has documents.

The vectors are random (seeded): a dense index's cost does not depend on their values, only on
``n x d``, so this is the latency a CLIP-style 512-d index of the same size would have. Recall of
HNSW is measured against FAISS Flat's exact ranking of the same vectors.
"""

from __future__ import annotations

import numpy as np

from ..corpora import Corpus
from .base import SkipSystem, System


def _faiss():
    try:
        import faiss
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SkipSystem("faiss-cpu is not installed (pip install 'stair-es[bench]')") from e
    return faiss


class FaissFlat(System):
    modality = "dense"
    exact = True
    native_batch = True

    def _make(self, dim: int):
        return _faiss().IndexFlatIP(dim)

    def build(self, corpus: Corpus) -> None:
        self.dim = corpus.spec.dense_dim
        self.index = self._make(self.dim)
        for x in corpus.dense_doc_chunks():  # never a second full copy of the vectors
            self.index.add(x)

    def prepare_queries(self, corpus):
        super().prepare_queries(corpus)
        self.q = np.ascontiguousarray(corpus.dense_queries())

    def set_threads(self, n):
        _faiss().omp_set_num_threads(n)

    def search_one(self, qi, k, setting):
        _, ids = self.index.search(self.q[qi : qi + 1], k)
        return ids[0]

    def search_batch(self, k, setting, threads):
        _, ids = self.index.search(self.q, k)
        return ids.astype(np.int64)

    def index_bytes(self):
        return int(self.index.ntotal) * self.dim * 4


class FaissHNSW(FaissFlat):
    exact = False

    def _make(self, dim):
        faiss = _faiss()
        idx = faiss.IndexHNSWFlat(dim, int(self.params.get("M", 32)), faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = int(self.params.get("efConstruction", 40))
        return idx

    def settings(self):
        return [{"efSearch": int(e)} for e in self.params.get("efSearch", [16, 64, 256])]

    def search_one(self, qi, k, setting):
        self.index.hnsw.efSearch = setting["efSearch"]
        return super().search_one(qi, k, setting)

    def search_batch(self, k, setting, threads):
        self.index.hnsw.efSearch = setting["efSearch"]
        return super().search_batch(k, setting, threads)

    def index_bytes(self):
        h = self.index.hnsw
        return super().index_bytes() + int(h.neighbors.size()) * 4 + int(h.offsets.size()) * 8 + int(h.levels.size()) * 4
