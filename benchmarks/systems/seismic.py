"""Seismic (``pyseismic-lsr``): approximate learned-sparse retrieval, the speed reference.

Documents go in through ``SeismicDataset.add_documents_by_id`` (CSR, integer component ids, no
token strings); queries address component ``t`` as the string ``"t"``. Build parameters come from
the config's ``params``; ``settings`` sweeps the search-time (query_cut, heap_factor) pairs.
"""

from __future__ import annotations

import numpy as np

from ..corpora import Corpus
from .base import SkipSystem, System

BUILD_KEYS = ("n_postings", "centroid_fraction", "min_cluster_size", "summary_energy", "max_fraction", "doc_cut")


def _seismic():
    try:
        import seismic
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SkipSystem("pyseismic-lsr is not installed (pip install 'stair-es[seismic]')") from e
    return seismic


class Seismic(System):
    native_batch = True

    def build(self, corpus: Corpus) -> None:
        seismic = _seismic()
        d = corpus.docs
        ds = seismic.SeismicDataset()
        ids = [str(i) for i in range(d.n_rows)]
        ds.add_documents_by_id(
            ids,
            np.asarray(d.indices, dtype=np.int64),
            np.asarray(d.weights, dtype=np.float32),
            np.asarray(d.indptr, dtype=np.int64),
        )
        kw = {k: self.params[k] for k in BUILD_KEYS if k in self.params}
        self.index = seismic.SeismicIndex.build_from_dataset(ds, num_threads=int(self.params.get("build_threads", 0)), **kw)
        self.string_dtype = seismic.get_seismic_string()

    def prepare_queries(self, corpus):
        super().prepare_queries(corpus)
        q = corpus.queries
        self.qids = np.array([str(i) for i in range(q.n_rows)], dtype=self.string_dtype)
        self.qcomp = [np.array([str(t) for t in q.row(i)[0]], dtype=self.string_dtype) for i in range(q.n_rows)]
        self.qval = [np.ascontiguousarray(q.row(i)[1], dtype=np.float32) for i in range(q.n_rows)]

    def settings(self):
        return [
            {"query_cut": int(c), "heap_factor": float(h)}
            for c, h in self.params.get("search", [[10, 0.7], [20, 0.9], [30, 1.0]])
        ]

    def search_one(self, qi, k, s):
        res = self.index.search(str(qi), self.qcomp[qi], self.qval[qi], k, s["query_cut"], s["heap_factor"])
        return np.array([int(r[2]) for r in res], dtype=np.int64)

    def search_batch(self, k, s, threads):
        res = self.index.batch_search(self.qids, self.qcomp, self.qval, k, s["query_cut"], s["heap_factor"], num_threads=threads)
        out = np.full((len(self.qids), k), -1, dtype=np.int64)
        for r in res:
            if r:  # results carry their query id: do not rely on the order
                ids = [int(x[2]) for x in r][:k]
                out[int(r[0][0]), : len(ids)] = ids
        return out

    def index_bytes(self):
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            self.index.save(str(Path(tmp) / "idx"))
            return sum(p.stat().st_size for p in Path(tmp).iterdir())
