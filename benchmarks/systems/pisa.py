"""PISA through ``pyterrier-pisa``: exact top-k (MaxScore / block-max WAND) on integer impacts.

Impacts are ``int(weight x scale)`` (``params.scale``, default 1000: three decimals, so the
smallest idf-shaped weights keep a few significant digits); queries are scaled the same way and
scored with the ``quantized`` scorer (a dot product of integer impacts). Two ways in
(``params.ingest``): ``"toks_indexer"``, the package's own ``{"docno", "toks": {token: weight}}``
indexer (a Python loop per posting: about 2.3 ms per 200-token document here, 40 minutes for
1M documents), and ``"numpy"`` (default), which writes the same files that indexer writes --
PISA's binary collection (``inv.docs`` = ``[1, n_docs]`` then per term ``[n, doc ids...]``,
``inv.freqs`` = per term ``[n, impacts...]``, ``inv.sizes`` = ``[n_docs, lengths...]``, all
uint32; terms in string order, as the indexer re-maps them) plus ``fwd.documents`` /
``fwd.terms`` and their binary lexicons -- from the CSR arrays in one numpy pass. The compressed
index and its block-max data are built by PISA itself on the first retrieval context, inside
the timed build. The
ranking is exact for the *quantised* weights, so its recall against float scores can fall a
little below 1 where scores are close. Searching calls the package's compiled ``retrieve`` on a
prepared context directly (one query per call), bypassing the pandas DataFrames of
``PisaRetrieve.transform``, which would add milliseconds the engine does not pay.
pyterrier-pisa imports python-terrier, but runs no Java for this path.
"""

from __future__ import annotations

import numpy as np

from ..corpora import Corpus
from .base import SkipSystem, System, dir_bytes


def _pisa():
    try:
        import pyterrier_pisa
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SkipSystem(f"pyterrier-pisa is not installed or cannot import ({e}); pip install 'stair-es[scale]'") from e
    return pyterrier_pisa


def write_collection(path, indptr: np.ndarray, ids: np.ndarray, w: np.ndarray, scale: float) -> None:
    """The files ``PisaToksIndexer`` writes, from CSR arrays (see the module docstring)."""
    import json
    from pathlib import Path

    from pyterrier_pisa import _pisathon

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    n = indptr.size - 1
    imp = (w.astype(np.float64) * scale).astype(np.int64)  # the indexer's int(score * scale)
    keep = imp > 0
    doc = np.repeat(np.arange(n, dtype=np.uint32), np.diff(indptr))[keep]
    tok, imp = ids[keep], imp[keep].astype(np.uint32)
    order = np.argsort(tok, kind="stable")  # by token, doc ids stay increasing
    tok, doc, imp = tok[order], doc[order], imp[order]
    present, start, count = np.unique(tok, return_index=True, return_counts=True)
    names = [str(t) for t in present.tolist()]
    by_name = sorted(range(len(names)), key=names.__getitem__)
    with open(path / "inv.docs", "wb") as fd, open(path / "inv.freqs", "wb") as ff:
        fd.write(np.array([1, n], np.uint32).tobytes())
        for j in by_name:
            a, c = int(start[j]), int(count[j])
            head = np.array([c], np.uint32).tobytes()
            fd.write(head)
            fd.write(doc[a : a + c].tobytes())
            ff.write(head)
            ff.write(imp[a : a + c].tobytes())
    lens = np.bincount(np.repeat(np.arange(n), np.diff(indptr))[keep], weights=(w.astype(np.float64) * scale).astype(np.int64)[keep],
                       minlength=n).astype(np.uint32)
    (path / "inv.sizes").write_bytes(np.array([n], np.uint32).tobytes() + lens.tobytes())
    (path / "fwd.documents").write_text("".join(f"{i}\n" for i in range(n)))
    (path / "fwd.terms").write_text("".join(names[j] + "\n" for j in by_name))
    _pisathon.build_binlex(str(path / "fwd.documents"), str(path / "fwd.doclex"))
    _pisathon.build_binlex(str(path / "fwd.terms"), str(path / "fwd.termlex"))
    (path / "pt_meta.json").write_text(json.dumps({"type": "sparse_index", "format": "pisa", "package_hint": "pyterrier-pisa",
                                                   "stemmer": "none"}))


class Pisa(System):
    exact = True
    native_batch = True

    def build(self, corpus: Corpus) -> None:
        pp = _pisa()
        d = corpus.docs
        self.scale = float(self.params.get("scale", 1000.0))
        self.path = self.workdir / "pisa-index"
        threads = int(self.params.get("build_threads", 1))
        index = pp.PisaIndex(str(self.path), stemmer="none", threads=threads, overwrite=True)
        ids, w, ptr = np.asarray(d.indices), np.asarray(d.weights), np.asarray(d.indptr)
        ingest = self.params.get("ingest", "numpy")
        if ingest == "toks_indexer":
            def docs():
                for i in range(d.n_rows):
                    a, b = int(ptr[i]), int(ptr[i + 1])
                    yield {"docno": str(i), "toks": dict(zip(map(str, ids[a:b].tolist()), w[a:b].tolist()))}

            index.toks_indexer(scale=self.scale).index(docs())
        elif ingest == "numpy":
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
            write_collection(self.path, ptr, ids, w, self.scale)
            index = pp.PisaIndex(str(self.path), stemmer="none", threads=threads)
        else:
            raise SkipSystem(f"unknown pisa ingest {ingest!r}; use numpy or toks_indexer")
        self.index = index
        self.algorithms = list(self.params.get("algorithms", ["maxscore", "block_max_wand"]))
        self._retrievers = {}
        for a in self.algorithms:  # PISA compresses the index and builds block-max data here: part of the build
            self._retriever(a, 10)

    def _retriever(self, algorithm: str, k: int, threads: int = 1):
        key = (algorithm, k, threads)
        if key not in self._retrievers:
            # toks_scale multiplies query weights: the same integer scale as the documents
            self._retrievers[key] = self.index.quantized(num_results=k, threads=threads, query_algorithm=algorithm,
                                                         toks_scale=self.scale)
        return self._retrievers[key]

    def prepare_queries(self, corpus):
        super().prepare_queries(corpus)
        q = corpus.queries
        self.qtoks = [{str(t): float(x) * self.scale for t, x in zip(*(a.tolist() for a in q.row(i)))} for i in range(q.n_rows)]

    def settings(self):
        return [{"algorithm": a} for a in self.algorithms]

    def _run(self, setting, k, inp, threads):
        from pyterrier_pisa import _pisathon

        r = self._retriever(setting["algorithm"], k, threads)
        shape = (len(inp) * k,)
        qidx, docnos = np.empty(shape, np.int32), np.empty(shape, dtype=object)
        ranks, scores = np.empty(shape, np.int32), np.empty(shape, np.float32)
        n = _pisathon.retrieve(r._ctxt, r.query_algorithm.value, inp, k=k, threads=threads, query_weighted=1,
                               pretokenised=True, result_qidxs=qidx, result_docnos=docnos, result_ranks=ranks,
                               result_scores=scores)
        return qidx[:n], docnos[:n], ranks[:n]

    def search_one(self, qi, k, setting):
        _, docnos, ranks = self._run(setting, k, [(0, self.qtoks[qi])], 1)
        return np.array([int(x) for x in docnos[np.argsort(ranks, kind="stable")]], dtype=np.int64)

    def search_batch(self, k, setting, threads):
        qidx, docnos, ranks = self._run(setting, k, list(enumerate(self.qtoks)), threads)
        out = np.full((len(self.qtoks), k), -1, dtype=np.int64)
        for q, d, r in zip(qidx, docnos, ranks):
            if 0 <= r < k:
                out[q, r] = int(d)
        return out

    def index_bytes(self):
        return dir_bytes(self.path)
