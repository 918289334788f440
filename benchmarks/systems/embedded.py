"""Adapter for the embedded engine (``stair_es.engine``): the one file to touch when its API drifts.

Two timings from one build (the ``api`` setting): ``search()`` end to end (a :class:`SearchRequest` in, a :class:`SearchResult` with
string ids out, including ``request.prepared``), and, when the engine exposes one, its lower-level
array search (query ids/weights arrays in, doc numbers out) -- the engine's raw speed; without one,
its numba kernel on the segment arrays. ``params.apis`` (default ``["search", "raw"]``) chooses;
``params.raw_method`` names the array method if it is not one of :data:`RAW_METHODS`.
"""

from __future__ import annotations

import numpy as np

from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

from ..corpora import Corpus
from .base import SkipSystem, System, dir_bytes

FIELD = "image"
RAW_METHODS = ("search_arrays", "search_raw", "search_ids")
_ADD_BATCH = 200_000


def _engine():
    try:
        from stair_es.engine import EngineIndex
    except ImportError as e:
        raise SkipSystem(f"stair_es.engine.EngineIndex is not available yet ({e})") from e
    return EngineIndex


class EmbeddedEngine(System):
    exact = True

    def warmup(self, corpus: Corpus) -> None:
        """Compile the engine's numba kernels (build, merge, search) on 64 documents of the
        same arrays: numba caches per file version and array flags, and a fresh compile would
        otherwise land in the build time."""
        import shutil

        n = min(64, corpus.docs.n_rows)
        small = Corpus(corpus.spec, corpus.docs.head(n), corpus.queries, corpus.info)
        saved = self.workdir
        self.workdir = saved / "warmup"
        try:
            self.build(small, add_batch=max(1, n // 2))  # two segments: optimize() merges
            self.prepare_queries(small)
            for api in self.apis:
                self.search_one(0, 10, {"api": api})
            self.close()
        finally:
            self.workdir = saved
            shutil.rmtree(saved / "warmup", ignore_errors=True)

    def build(self, corpus: Corpus, add_batch: int | None = None) -> None:
        EngineIndex = _engine()
        self.path = self.workdir / "engine-index"
        schema = IndexSchema(fields={}, sparse_fields=(FIELD,))
        self.index = EngineIndex.create(self.path, schema)
        d = corpus.docs
        batch = int(add_batch or self.params.get("add_batch", _ADD_BATCH))
        for a in range(0, d.n_rows, batch):
            b = min(d.n_rows, a + batch)
            lo, hi = int(d.indptr[a]), int(d.indptr[b])
            self.index.add_arrays(
                [str(i) for i in range(a, b)],
                {FIELD: (np.asarray(d.indptr[a : b + 1] - lo), np.asarray(d.indices[lo:hi]), np.asarray(d.weights[lo:hi]))},
            )
        # one segment per engine limit, like FAISS's one index: what a bulk-loaded index looks like
        for finish in self.params.get("after_build", ["optimize"]):
            if hasattr(self.index, finish):
                getattr(self.index, finish)()
        self._set_apis(d)

    def _set_apis(self, d) -> None:
        apis = self.params.get("apis", ["search", "raw"])
        self.apis = [x for x in apis if x == "search"]
        self.raw = None
        if "raw" in apis:
            names = [self.params["raw_method"]] if "raw_method" in self.params else RAW_METHODS
            self.raw = next((getattr(self.index, n) for n in names if hasattr(self.index, n)), None)
            try:
                self.raw = self.raw or self._kernel_search()
                probe = d.row(0) if d.n_rows else (np.zeros(0, np.int32), np.zeros(0, np.float32))
                self.raw(np.ascontiguousarray(probe[0], np.int32), np.ascontiguousarray(probe[1], np.float32), 10)
                self.apis.append("raw")
            except SkipSystem as e:
                self.raw_note = f"raw timing skipped: {e}"
            except Exception as e:  # noqa: BLE001 - a drifted kernel signature must not lose the search() timing
                self.raw_note = f"raw timing skipped: the array search failed ({type(e).__name__}: {e})"
        if not self.apis:
            raise SkipSystem(f"none of the engine APIs {apis} can be timed ({getattr(self, 'raw_note', '')})")

    def settings(self):
        return [{"api": a} for a in self.apis]

    def _kernel_search(self):
        """Query arrays -> the engine's numba kernel directly, skipping request objects, filters,
        hit materialisation and the manifest check. Uses engine internals (one segment's arrays):
        if they drift, this is skipped with the reason rather than measuring something else."""
        try:
            from stair_es.engine import kernels as K

            segs = self.index._segs
            fi = self.index.schema.sparse_fields.index(FIELD)
            seg = segs[0].seg
            if len(segs) != 1 or segs[0].deleted is not None:
                raise SkipSystem("raw kernel timing needs a single segment without deletions")
            arrays = seg.kernel_arrays()
            opts = K.SearchOptions(K.STRATEGY_AUTO, self.index.head_blocks)
            no_filter = np.zeros(0, np.uint8)
            search = K.search_segment
        except (AttributeError, ImportError, IndexError) as e:
            raise SkipSystem(f"the engine exposes no array search method and its internals changed ({e})") from e

        def raw(tok, w, k):
            j = seg.term_index(fi, tok.astype(np.int64))
            ok = j >= 0
            top = K.TopK.empty(k)
            hs, hq, hr, state = top
            search(j[ok], w[ok], arrays, no_filter, np.int64(0), top, opts, None, None)
            n = int(state[0])
            order = np.lexsort((hq[:n], -hs[:n]))
            # doc ids were added as str(row) in row order into one segment: local doc == row
            return hr[:n][order] & 0xFFFFFFFF

        self.raw_note = "kernel: stair_es.engine.kernels.search_segment on the single segment"
        return raw

    def extra_info(self):
        info = {}
        if hasattr(self, "raw_note"):
            info["raw"] = self.raw_note
        if hasattr(self.index, "stats"):
            try:
                info["stats"] = self.index.stats()
            except Exception:  # noqa: BLE001 - informational only
                pass
        return info

    def prepare_queries(self, corpus):
        super().prepare_queries(corpus)
        vocab = default_vocabulary()
        q = corpus.queries
        self.qarrays = [(np.ascontiguousarray(q.row(i)[0], np.int32), np.ascontiguousarray(q.row(i)[1], np.float32)) for i in range(q.n_rows)]
        # building the request is the caller's work (it holds an encoded query), so it is not timed
        self.requests = [SparseVector(ids, w, vocab) for ids, w in self.qarrays]

    def search_one(self, qi, k, setting):
        if setting["api"] == "raw":
            res = self.raw(*self.qarrays[qi], k) if "field" not in self.params else self.raw(self.params["field"], *self.qarrays[qi], k)
            ids = res[0] if isinstance(res, tuple) else res
            return np.asarray(ids, dtype=np.int64)
        req = SearchRequest([SparseClause(FIELD, self.requests[qi])], top_k=k)
        return np.array([int(h.id) for h in self.index.search(req).hits], dtype=np.int64)

    def set_threads(self, n):
        try:
            import numba

            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        except Exception:  # noqa: BLE001 - thread control is best effort
            pass

    def index_bytes(self):
        return dir_bytes(self.path)

    def close(self):
        if hasattr(self, "index") and hasattr(self.index, "close"):
            self.index.close()
