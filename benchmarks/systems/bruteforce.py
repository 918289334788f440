"""Exact sparse brute force on a scipy CSC matrix: the recall ground truth for sparse systems.

Per query it gathers the query tokens' columns (posting lists) and sums ``weight * column``, the
same dot product every stair_es backend promises; batches go through one sparse matrix product.
"""

from __future__ import annotations

import numpy as np

from ..corpora import Corpus
from .base import System, pad, topk_from_scores


class BruteForce(System):
    exact = True
    native_batch = True
    batch_threads_max = 1  # scipy's sparse product is single-threaded

    def build(self, corpus: Corpus) -> None:
        import scipy.sparse as sp

        self.n_docs = corpus.docs.n_rows
        # token-major CSR == the document matrix's CSC: row t is token t's posting list
        self.postings = sp.csr_matrix(corpus.docs.to_scipy().T)

    def prepare_queries(self, corpus: Corpus) -> None:
        super().prepare_queries(corpus)
        self.qmat = corpus.queries.to_scipy()

    def search_one(self, qi, k, setting):
        ids, w = self.corpus.queries.row(qi)
        scores = self.postings[ids].T @ w  # (n_docs,) dense
        return topk_from_scores(np.asarray(scores).ravel(), k)

    def search_batch(self, k, setting, threads):
        out = np.empty((self.qmat.shape[0], k), dtype=np.int64)
        for a in range(0, self.qmat.shape[0], 64):
            s = (self.qmat[a : a + 64] @ self.postings).toarray()
            for j, row in enumerate(s):
                out[a + j] = pad(topk_from_scores(row, k), k)
        return out

    def index_bytes(self):
        p = self.postings
        return int(p.data.nbytes + p.indices.nbytes + p.indptr.nbytes)
