"""Evaluating a resolved filter tree (:mod:`stair_es.query`) on one segment into a per-document
mask: token presence from the postings, terms, ranges and existence from the metadata columns.
A part of :class:`~stair_es.engine.segment.Segment` (a mixin: it reads the segment's postings
and columns)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..query import And, Exists, Filter, HasTokens, Not, Or, Range, Term, Terms
from ..schema import IndexSchema
from ..vocab import Vocabulary
from . import npkernels as NP
from .columns import DATE_MISSING, str_at
from .npkernels import K


class SegmentFilters:
    """Filter evaluation of :class:`~stair_es.engine.segment.Segment`."""

    def _keyword(self, name: str) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
        if name not in self._kw_cache:
            c = self.column(name)
            words = {str_at(c["dict"], c["dict_offs"], i): i for i in range(c["dict_offs"].size - 1)}
            ptr = c["ptr"]
            rows = np.repeat(np.arange(self.n_docs, dtype=np.int64), np.diff(ptr))
            self._kw_cache[name] = (words, rows, np.asarray(c["codes"]))
        return self._kw_cache[name]

    def filter_mask(self, flt: Filter, schema: IndexSchema, vocab: Vocabulary) -> np.ndarray:
        n = self.n_docs
        if isinstance(flt, And):
            m = np.ones(n, bool)
            for f in flt.filters:
                m &= self.filter_mask(f, schema, vocab)
            return m
        if isinstance(flt, Or):
            m = np.zeros(n, bool)
            for f in flt.filters:
                m |= self.filter_mask(f, schema, vocab)
            return m
        if isinstance(flt, Not):
            return ~self.filter_mask(flt.filter, schema, vocab)
        if isinstance(flt, HasTokens):
            fi = schema.sparse_fields.index(flt.field)
            js = self.term_index(fi, np.array(flt.token_ids(vocab), np.int64))
            self.verify_terms(js[js >= 0])
            m = np.ones(n, bool) if flt.mode == "all" else np.zeros(n, bool)
            for j in js:
                tm = np.zeros(n, np.uint8)
                if j >= 0:
                    if int(self.post_ptr[j + 1] - self.post_ptr[j]) <= NP.NUMPY_MAX_SCAN:
                        docs = NP.term_docs(int(j), self.post_ptr, self.pair_ptr, self.pair_block, self.pair_cnt,
                                            self.post_off, self.bshift)
                        tm[docs[docs < n]] = 1
                    else:
                        K.term_docs(int(j), self.post_ptr, self.pair_ptr, self.pair_block, self.pair_cnt,
                                    self.post_off, self.bshift, tm)
                if flt.mode == "all":
                    m &= tm.astype(bool)
                else:
                    m |= tm.astype(bool)
            return m
        if isinstance(flt, (Term, Terms, Range, Exists)):
            name = flt.field
            ftype = self.column_types.get(name)
            if ftype is None:
                return np.zeros(n, bool)
            self.verify_column(name)
            c = self.column(name)
            if isinstance(flt, Exists):
                if ftype == "number":
                    return ~np.isnan(c["v"])
                if ftype == "date":
                    return c["v"] != DATE_MISSING
                if ftype == "boolean":
                    return c["v"] >= 0
                return np.diff(c["ptr"]) > 0
            if isinstance(flt, Range):
                v = c["v"]
                # a bound never admits a missing value (NaN compares false; a missing date is the
                # lowest int64, below any lower bound), so the column is read once per bound: at
                # 10M documents these passes are memory-bound (8 bytes a document)
                bounds = [(np.greater, flt.gt), (np.greater_equal, flt.gte), (np.less, flt.lt), (np.less_equal, flt.lte)]
                bounds = [(op, x) for op, x in bounds if x is not None]
                if ftype == "date" and flt.gt is None and (flt.gte is None or flt.gte <= DATE_MISSING):
                    bounds.insert(0, (np.not_equal, DATE_MISSING))
                if not bounds:
                    return ~np.isnan(v)
                m = bounds[0][0](v, bounds[0][1])
                for op, x in bounds[1:]:
                    m &= op(v, x)
                return m
            values: list[Any] = []
            for v in ([flt.value] if isinstance(flt, Term) else list(flt.values)):
                values.extend(v if isinstance(v, tuple) else [v])
            if ftype == "keyword":
                words, rows, codes = self._keyword(name)
                want = [words[w] for w in values if w in words]
                m = np.zeros(n, bool)
                if want:
                    m[rows[np.isin(codes, want)]] = True
                return m
            v = c["v"]
            if ftype == "boolean":
                return np.isin(v, [int(x) for x in values])
            return np.isin(v, values) & (v != DATE_MISSING if ftype == "date" else True)
        raise TypeError(f"unsupported filter {type(flt).__name__}")
