"""Exact top-k search of an embedded index: the query's terms per segment, the choice of kernel
(numpy twins for small work, numba block-max or TAAT), threads, and the exact merge of the
per-segment heaps into hits. A part of :class:`~stair_es.engine.index.EngineIndex` (a mixin:
it reads the index's loaded commit, schema and settings); the kernels themselves are in
:mod:`.kernels` and :mod:`.npkernels`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Sequence

import numpy as np

from ..errors import InvalidInputError
from ..query import SearchRequest
from ..schema import Hit, SearchResult
from ..vocab import VOCAB_SIZE
from . import npkernels as NP
from . import pages
from .layout import CHOSEN_FORCED, CHOSEN_NUMPY, CHOSEN_RENEW, F16_TABLE, PLAN, PLAN_SLOTS, TAAT_WINDOW_DOCS, TopK
from .npkernels import K
from .plan import SearchPlan, SegmentPlan

#: segments smaller than this are searched on one thread whatever ``threads`` says (splitting costs more)
SPLIT_MIN_DOCS = 1 << 16
#: ``auto`` runs block-max again on a segment after this many of its queries went to TAAT, so that
#: its record of how well block-max prunes there follows the queries (see :meth:`Searcher._auto_options`)
AUTO_RETRY = 32
#: the weight of a new block-max run in that record (an exponential moving average)
AUTO_EMA = 0.25
#: a one-thread search over at least this many documents starts from a lower bound of its k-th best
#: score (``kernels.seed``): the documents of the :data:`SEED_POSTINGS` heaviest postings of each of
#: its :data:`SEED_TERMS` heaviest terms, scored exactly
SEED_MIN_DOCS = 500_000
SEED_TERMS = 2
SEED_POSTINGS = 20


#: a reader maps the page-cache-resident pages of each segment it opens of at least this many bytes
#: in a background thread (``$STAIR_ES_MAP_AHEAD=0``: never; see :meth:`Searcher._opened`)
MAP_AHEAD_MIN_BYTES = 64 << 20
#: the background mapping also verifies the chunk checksums of what it maps, once the compiled
#: CRC-32 is loaded (``$STAIR_ES_MAP_AHEAD_VERIFY=0``: never), so that a first search finds them
#: verified (see :meth:`.segment.Segment.map_resident`)
MAP_AHEAD_VERIFY = True


def _map_ahead(state: dict, lock: threading.Lock) -> None:
    """The background mapping thread: maps the resident pages of the queued segments, one after
    the other, until the queue is empty or the reader closes; then (``state["verify"]``) goes
    over them again verifying the chunk checksums of their resident pages in compiled code (the
    numba kernels imported for it: a segment this big is searched with them anyway), so that the
    first searches find most chunks verified, and fills each segment's per-term block maxima (the
    seed's term ranking, :meth:`.segment.Segment.fill_term_max`) once its block maxima are verified.
    (Every segment's block tables first, then the postings, was tried: the first queries then
    faulted more, docs/scale.md.)"""
    try:  # below the searching threads' priority (Linux: per thread), so a first query waits less for a core
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or not allowed
        pass
    done: list = []
    while True:
        with lock:
            if state["stop"].is_set() or not (state["pending"] or (done and state.get("verify"))):
                state["running"] = False
                state["pending"].clear()
                return
            verify = not state["pending"]
            seg = done.pop(0) if verify else state["pending"].pop(0)
        try:
            if verify:
                from . import kernels  # noqa: F401 - registers the compiled CRC-32 (segment.map_resident uses it)

                seg.map_resident(state["stop"], verify=True)
                seg.fill_term_max()
            else:
                state["mapped"] += seg.map_resident(state["stop"])
                done.append(seg)
        except Exception:  # noqa: BLE001 - a hint only: a search faults the pages in (and verifies them) as before
            pass


def _add_state(state: np.ndarray, part: np.ndarray) -> None:
    """Fold the search state of a part searched apart (a block range, a group of segments) into
    ``state``: matches add up, the total stays exact only if every part's is, work adds up."""
    state[1] += part[1]
    state[2] &= part[2]
    state[3:7] += part[3:7]


class Searcher:
    """Search methods of :class:`~stair_es.engine.index.EngineIndex`."""

    #: a one-thread search over at least ``seed_min_docs`` documents starts its heap at the k-th best
    #: exact score of the documents of the ``seed_postings`` heaviest postings of its ``seed_terms``
    #: heaviest terms (``kernels.seed``; 0: no seed). Set on an index to change them
    seed_terms = SEED_TERMS
    seed_postings = SEED_POSTINGS
    seed_min_docs = SEED_MIN_DOCS
    seed_order = True

    def _opened(self, seg):
        """A segment this reader has just opened. One of at least :data:`MAP_AHEAD_MIN_BYTES`
        is queued for a background thread that maps its pages found in the page cache (a
        ``mincore`` then ``MADV_POPULATE_READ`` per resident run; never a disk read): a process's
        first read of a mapped page costs a fault, and at 10M documents the faults of a query's
        first pass cost more than its steady-state search (~700 faults, ~5 ms of a 15 ms first
        pass against 7.7 ms steady; docs/scale.md). Readers only (a writer's segments are its
        own, just written); ``$STAIR_ES_MAP_AHEAD=0`` turns it off. Returns ``seg``."""
        if (self.writable or seg.nbytes < MAP_AHEAD_MIN_BYTES
                or os.environ.get("STAIR_ES_MAP_AHEAD", "1").strip().lower() in ("0", "off", "false", "no")):
            return seg
        with self._pool_lock:
            st = self.__dict__.setdefault("_mapping", {"pending": [], "running": False, "stop": threading.Event(),
                                                        "mapped": 0, "verify": MAP_AHEAD_VERIFY and os.environ.get(
                                                            "STAIR_ES_MAP_AHEAD_VERIFY", "1").strip().lower()
                                                        not in ("0", "off", "false", "no")})
            st["pending"].append(seg)
            if not st["running"]:
                st["running"] = True
                threading.Thread(target=_map_ahead, args=(st, self._pool_lock), name="stair-es-map-ahead",
                                 daemon=True).start()
        return seg

    def _stop_mapping(self) -> None:
        st = self.__dict__.get("_mapping")
        if st is not None:
            st["stop"].set()

    def mapping_done(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for the background mapping of the opened
        segments (:meth:`_opened`) to finish; True when none is left."""
        st = self.__dict__.get("_mapping")
        t0 = time.perf_counter()
        while st is not None and st["running"]:
            if timeout is not None and time.perf_counter() - t0 >= timeout:
                return False
            time.sleep(0.005)
        return True

    def _query_terms(self, req: SearchRequest) -> list[tuple[int, str, np.ndarray, np.ndarray]]:
        out = []
        for c in req.clauses:
            fi = self.schema.sparse_fields.index(c.field)
            w = (c.vector.weights.astype(np.float32) * np.float32(c.weight)).astype(np.float32)
            out.append((fi, c.field, c.vector.ids.astype(np.int64), w))
        return out

    def _allowed(self, s, flt) -> np.ndarray:
        if flt is None and s.deleted is None:
            return np.zeros(0, np.uint8)
        if flt is None:
            return s.live_mask()
        m = s.seg.filter_mask(flt, self.schema, self.vocab)
        if s.deleted is not None:
            m &= ~s.deleted
        return m.view(np.uint8) if m.dtype == bool else m.astype(np.uint8)

    def _strategy_code(self) -> int:
        try:
            return NP.STRATEGY_NAMES.index(self.strategy)
        except ValueError:
            raise InvalidInputError(f"unknown search strategy {self.strategy!r}; use one of {', '.join(NP.STRATEGY_NAMES)}") from None

    def _taat_scratch(self) -> np.ndarray:
        """This thread's TAAT accumulator window (the kernel leaves it all zeros)."""
        buf = getattr(self._scratch, "acc", None)
        if buf is None:
            buf = np.zeros(TAAT_WINDOW_DOCS, np.float32)
            self._scratch.acc = buf
        return buf

    def search(self, request: SearchRequest, *, threads: int | None = None) -> SearchResult:
        """Exact top k. ``threads`` (default :attr:`search_threads`, 1): threads this one query may
        use. Several segments of at least :data:`SPLIT_MIN_DOCS` documents are shared out among
        the threads, each searching its own in turn (its threshold carried from one to the next);
        a single one is split into that many block ranges searched at once. Either way each part
        has its own top k, and the merge is exact."""
        t0 = time.perf_counter()
        self.refresh()
        req = request.prepared(self.schema, self.vocab)
        n = self.search_threads if threads is None else threads
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
            raise InvalidInputError(f"threads must be an integer from 1 to 64, got {n!r}")
        result, state, used = self._search(req, self._segs, self._strategy_code(), t0, n)
        # [hits, matched, total exact?, blocks scored, candidate blocks, postings streamed, lookups]: for tuning
        self.last_search_stats = state
        self.last_search_strategies = used  # per searched segment: "blockmax", "taat" or "numpy"
        self.last_search_plan = result.plan  # the same, with why (stair_es.engine.plan.SearchPlan)
        return result

    def _auto_options(self, seg, strategy: int) -> tuple:
        """The kernel's options (a plain :class:`.layout.SearchOptions`) for one segment. With
        ``auto`` they carry block-max's record on this segment -- the shares of the query terms'
        postings it streamed and of the blocks it scored, averaged over its recent runs -- from
        which the kernel's cost model predicts block-max against TAAT for this query
        (``kernels.search.choose_strategy``); once TAAT has taken :data:`AUTO_RETRY` queries in
        a row, block-max runs again to renew the record."""
        rec = self._auto_seen.get(seg.name) if strategy == NP.STRATEGY_AUTO else None
        if rec is None or rec[0] < 0:
            return (strategy, self.head_blocks, 0, -1, -1.0, -1.0)
        streamed, scored, since = rec.tolist()
        if since >= AUTO_RETRY:
            return (NP.STRATEGY_BLOCKMAX, self.head_blocks, 0, -1, -1.0, -1.0)
        return (strategy, self.head_blocks, 0, -1, streamed, scored)

    def _auto_row(self, name: str) -> np.ndarray:
        """The record of segment ``name`` (float64: streamed share, scored share, queries since
        block-max ran; share -1: none yet), made on first use. Rows are updated in place, by
        :meth:`_auto_record` or by the compiled all-segments search (:meth:`_fused`)."""
        rec = self._auto_seen.get(name)
        if rec is None:
            rec = self._auto_seen[name] = np.array([-1.0, -1.0, 0.0])
        return rec

    def _auto_record(self, seg, ran: str, work: np.ndarray, postings: int) -> None:
        """Fold one kernel run into ``auto``'s record of the segment (``work``: the blocks scored
        and postings streamed by that run)."""
        rec = self._auto_row(seg.name)
        if ran == "blockmax":
            n_blocks = max((seg.n_docs + (1 << seg.bshift) - 1) >> seg.bshift, 1)
            streamed, scored = float(work[1]) / max(postings, 1), float(work[0]) / n_blocks
            if rec[0] >= 0:
                streamed = rec[0] + AUTO_EMA * (streamed - rec[0])
                scored = rec[1] + AUTO_EMA * (scored - rec[1])
            rec[:] = (streamed, scored, 0.0)
        elif rec[0] >= 0:
            rec[2] += 1.0

    def warm(self, huge_pages: bool | None = None) -> dict[str, float]:
        """Ready this reader for its first query, so that it runs as fast as the hundredth: every
        segment's pages mapped now (:meth:`Segment.prefetch_all`), every byte verified against its
        checksums (what first reads would verify chunk by chunk), and the numba search kernels
        loaded for this index's array types (from numba's cache, or compiled on a first run).
        Returns the seconds each step took. Costs a read of the whole index: for a server at
        start, not for a one-off search.

        ``huge_pages`` (default: ``$STAIR_ES_WARM_HUGE``, off): segments of at least
        :data:`MAP_AHEAD_MIN_BYTES` that this process maps mostly with 4 KiB pages are read again
        from the disk into the page cache as 2 MiB folios (:meth:`Segment.reread_huge`; Linux with
        transparent huge pages for ``madvise``). The page cache keeps them so for later processes
        too: a reader started afterwards faults once per 2 MiB instead of once per 64 KiB, which at
        10M documents is most of what its first queries pay beyond the steady state
        (docs/scale.md). ``huge_s`` and ``huge_share`` (mapped with 2 MiB entries, after) are
        added to the result."""
        out = {}
        self.refresh()
        if huge_pages is None:
            huge_pages = os.environ.get("STAIR_ES_WARM_HUGE", "0").strip().lower() in ("1", "on", "true", "yes")
        t = time.perf_counter()
        if huge_pages and pages.huge_pages_enabled():
            big = [s.seg for s in self._segs if s.seg.nbytes >= MAP_AHEAD_MIN_BYTES]
            for seg in big:
                if seg.huge_share() < 0.5:
                    seg.reread_huge()
            out["huge_s"] = time.perf_counter() - t
            size = sum(seg.nbytes for seg in big)
            out["huge_share"] = sum(seg.huge_share() * seg.nbytes for seg in big) / size if size else 0.0
            t = time.perf_counter()
        for s in self._segs:
            s.seg.prefetch_all()
        out["map_s"] = time.perf_counter() - t
        t = time.perf_counter()
        kernel = K.search_segment  # imports the kernels (and registers the compiled CRC-32 used below)
        out["import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for s in self._segs:
            s.seg.verify_all()
            s.seg.fill_term_max()
        out["verify_s"] = time.perf_counter() - t
        t = time.perf_counter()
        none = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        for s in self._segs[:1]:  # every segment has the same array types
            seg = s.seg
            for strategy in (NP.STRATEGY_BLOCKMAX, NP.STRATEGY_TAAT):  # an empty query: loads, reads nothing
                kernel(*none, tuple(seg.kernel_arrays()), np.zeros(0, np.uint8), np.int64(0), tuple(TopK.empty(1)),
                       (strategy, self.head_blocks, 0, -1, -1.0, -1.0), self._taat_scratch(), seg.kernel_check())
            K.choose_strategy(none[0], tuple(seg.kernel_arrays()), tuple(TopK.empty(1)), (0, self.head_blocks, 0, -1, -1.0, -1.0))
        fused = self._fused(self._segs)
        if fused is not None:  # the all-segments kernel, with an empty query
            desc, allowed, checks, tmax, rec, every, _, _ = fused
            K.search_segments(*none, every, 0, desc, allowed, checks, tmax, F16_TABLE, rec, tuple(TopK.empty(1)), self._taat_scratch(),
                              np.array([0, self.head_blocks, 0, AUTO_RETRY, 0, 0], np.int64), AUTO_EMA,
                              np.empty((len(self._segs), K.MULTI_OUT_COLUMNS), np.int64))
        out["kernels_s"] = time.perf_counter() - t
        return out

    def auto_record(self) -> dict[str, dict[str, float]]:
        """What ``auto`` knows of block-max on each segment searched so far (for profiles):
        shares of the query terms' postings streamed and of the blocks scored, and the queries
        since its last block-max run there."""
        return {name: {"streamed_share": float(r[0]), "scored_share": float(r[1]), "queries_since_blockmax": int(r[2])}
                for name, r in self._auto_seen.items() if r[0] >= 0}

    def search_batch(self, requests: Sequence[SearchRequest], *, threads: int | None = None) -> list[SearchResult]:
        """Search several requests at once on ``threads`` threads (default: one per CPU).

        For throughput: the numba kernel runs without the GIL, so queries proceed in parallel
        (each one stays single-threaded; its latency is that of :meth:`search`). All requests
        see the same commit. Results are in request order; an invalid request raises (as
        :meth:`search` would) before any is run."""
        self.refresh()
        reqs = [r.prepared(self.schema, self.vocab) for r in requests]
        segs = self._segs
        strategy = self._strategy_code()
        n = max(1, min(len(reqs), threads if threads is not None else (os.cpu_count() or 1)))
        if n == 1 or len(reqs) <= 1:
            return [self._search(r, segs, strategy, time.perf_counter())[0] for r in reqs]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="stair-es-search") as pool:
            return [res for res, _, _ in pool.map(lambda r: self._search(r, segs, strategy, time.perf_counter()), reqs)]

    def _split_search(self, kernel, args: tuple, chk, n_blocks: int, parts: int, k: int) -> list[tuple[np.ndarray, ...]]:
        """Block-max over ``parts`` block ranges of one segment at once (the kernel releases the
        GIL), each into its own heap; ``args`` = (q_j, q_w, segment arrays, allowed, ref base);
        returns (heap scores, seqs, refs, state) per part."""
        cuts = np.linspace(0, n_blocks, parts + 1).astype(np.int64)

        def run(i: int):
            top = TopK.empty(k)
            kernel(*args, tuple(top), (NP.STRATEGY_BLOCKMAX, self.head_blocks, int(cuts[i]), int(cuts[i + 1]), -1.0, -1.0),
                   None, chk)
            n = top.state[0]
            return top.scores[:n], top.seqs[:n], top.refs[:n], top.state

        return self._run_parallel([(lambda i=i: run(i)) for i in range(parts)])

    def _run_parallel(self, fns: list) -> list:
        """Call each of ``fns`` (no arguments) at once: the first on this thread, the others on
        the index's query pool (the numba kernels release the GIL); results in order."""
        if len(fns) == 1:
            return [fns[0]()]
        with self._pool_lock:  # submitted under the lock: a pool replaced later still runs what it was given
            if self._pool is None or self._pool_size < len(fns) - 1:
                from concurrent.futures import ThreadPoolExecutor

                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(max_workers=len(fns) - 1, thread_name_prefix="stair-es-query")
                self._pool_size = len(fns) - 1
            futures = [self._pool.submit(fn) for fn in fns[1:]]
        return [fns[0]()] + [f.result() for f in futures]

    def _search(self, req: SearchRequest, segs: list, strategy: int, t0: float,
                threads: int = 1) -> tuple[SearchResult, np.ndarray, list[str]]:
        """Exact top k over ``segs``. With ``threads`` > 1 and several segments big enough to
        split, the segments are shared out among the threads (largest first, each to the
        least loaded) and each thread searches its own in turn into its own heap, so its
        threshold carries from one segment to the next as in a one-thread search; the heaps are
        then merged (exact: the top k of all is within the union of each group's top k). A
        single big segment is split by block ranges instead (:meth:`_split_search`)."""
        terms = self._query_terms(req)
        big = [si for si, s in enumerate(segs) if s.seg.n_docs >= SPLIT_MIN_DOCS]
        if threads > 1 and len(big) >= 2 and strategy in (NP.STRATEGY_AUTO, NP.STRATEGY_BLOCKMAX):
            groups: list[list[int]] = [[] for _ in range(min(threads, len(big)))]
            loads = [0] * len(groups)
            for si in sorted(range(len(segs)), key=lambda i: -segs[i].seg.n_docs):
                g = loads.index(min(loads))
                groups[g].append(si)
                loads[g] += segs[si].seg.n_docs
            parts = self._run_parallel([
                (lambda grp=sorted(grp): self._search_segments(req, segs, grp, terms, strategy, 1)) for grp in groups])
            state = np.zeros(8 + PLAN_SLOTS, np.int64)
            state[2] = 1
            small: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
            used: list[str] = []
            plans: list[SegmentPlan] = []
            for hs_g, hq_g, hr_g, st, small_g, used_g, plans_g in parts:
                n = int(st[0])
                small.append((hs_g[:n], hq_g[:n], hr_g[:n]))
                small.extend(small_g)
                _add_state(state, st)
                used.extend(used_g)
                plans.extend(plans_g() if callable(plans_g) else plans_g)
            hs, hq, hr = np.zeros(0, np.float32), np.zeros(0, np.uint64), np.zeros(0, np.int64)
        else:
            hs, hq, hr, state, small, used, plans = self._search_segments(req, segs, range(len(segs)), terms, strategy, threads)
        result, state, used = self._finish(req, segs, hs, hq, hr, state, small, used, t0)
        result.plan = SearchPlan(NP.STRATEGY_NAMES[strategy], plans, self.numpy_max_postings)
        return result, state, used

    def _fused(self, segs: list):
        """What the compiled all-segments search (``kernels.multi.search_segments``) takes of the
        segments ``segs``, made once per list of segments (a refresh makes a new one): rows of
        int64 tables holding their arrays' addresses (``kernels.multi.describe``; the list ``segs``
        is kept with them, so the arrays outlive the rows), the allowed masks when no filter is
        given (empty: all, or the live docs), verification data, the rows of ``auto``'s records
        (views of ``_auto_seen``'s arrays); every segment's sequence numbers verified. None when
        the segments cannot be searched that way (arrays of other types than the kernels'): then
        :meth:`_search_segments` takes them one by one as before."""
        cache = self.__dict__.get("_fused_cache")
        if cache is not None and cache[0] is segs:
            return cache[1]
        from .kernels import multi

        fused = None
        try:
            if not segs:
                raise ValueError("no segments")
            n = len(segs)
            desc = np.zeros((n, multi.DESC_COLUMNS), np.int64)
            checks = np.zeros((n, multi.CHECK_COLUMNS), np.int64)
            keep: list = []  # what the rows point into, kept alive with them
            want = dict(post_ptr=np.int64, pair_ptr=np.int64, pair_block=np.uint16, pair_cnt=np.uint8, pair_max=np.uint16,
                        pair_sub=np.uint8, post_off=np.uint8, post_w=np.uint16, seq=np.uint64, terms=np.int64)
            for i, st in enumerate(segs):
                seg = st.seg
                a = seg.kernel_arrays()._asdict()
                a["terms"] = seg.term_table()
                for name, dt in want.items():
                    if a[name].dtype != dt or a[name].ndim != 1:
                        raise ValueError(f"{name} is {a[name].dtype}")
                desc[i] = multi.describe(a, seg.n_docs, seg.bshift)
                keep.append(a)
                chk = seg.kernel_check()
                if chk is None:
                    if seg.verifier is not None:  # (no compiled CRC-32: verified from Python, segment by segment)
                        raise ValueError("verification without compiled checksums")
                    continue
                mm, table, ok, shift, content, off_po, off_pw = chk
                tables_ok, layout = seg.table_check()
                layout = np.ascontiguousarray(layout, np.int64).ravel()
                if mm.dtype != np.uint8 or table.dtype != np.uint32 or ok.dtype != np.bool_ or tables_ok.dtype != np.bool_:
                    raise ValueError("verification arrays of other types")
                checks[i] = (1, *multi.address(mm), *multi.address(table), *multi.address(ok), *multi.address(tables_ok),
                             *multi.address(layout), shift, content, off_po, off_pw)
                keep.append((chk, tables_ok, layout))
            for st in segs:
                st.seg.verify_arrays(("seq",))
            masks = [self._allowed(st, None) for st in segs]
            allowed = np.array([multi.address(m) for m in masks], np.int64).reshape(n, 2)
            keep.append(masks)
            rec = np.full((n, 3), -1.0)
            rec[:, 2] = 0.0
            for i, st in enumerate(segs):
                old = self._auto_seen.get(st.seg.name)
                if old is not None:
                    rec[i] = old
                self._auto_seen[st.seg.name] = rec[i]  # (a view: both paths update the same record)
            tmax = [st.seg.term_max() for st in segs]  # see multi.seed_bound (kept by the segment: refreshes keep it)
            keep.append(tmax)
            tmax_rows = np.array([multi.address(t) for t in tmax], np.int64).reshape(n, 2)
            fused = (desc, allowed, checks, tmax_rows, rec, np.arange(n, dtype=np.int64), keep, int(desc[:, 0].sum()))
        except ValueError:
            fused = None
        self.__dict__["_fused_cache"] = (segs, fused)
        return fused

    def _search_fused(self, req: SearchRequest, segs: list, which, terms: list, strategy: int):
        """:meth:`_search_segments` in one compiled call (``kernels.multi.search_segments``), or
        None when it does not apply (see :meth:`_fused`; also: numba not loaded yet and ``auto``,
        which may leave every segment to numpy; tokens outside the vocabulary)."""
        if strategy == NP.STRATEGY_NUMPY or not (NP.numba_loaded() or strategy != NP.STRATEGY_AUTO):
            return None
        fused = self._fused(segs)
        if fused is None:
            return None
        desc, allowed_all, checks, tmax, rec, every, _, all_docs = fused
        if len(terms) == 1:
            fi, _, tok, w = terms[0]
            keys, weights = tok + fi * VOCAB_SIZE, w
        else:
            keys = np.concatenate([t[2] + t[0] * VOCAB_SIZE for t in terms]) if terms else np.zeros(0, np.int64)
            weights = np.concatenate([t[3] for t in terms]) if terms else np.zeros(0, np.float32)
        if keys.size and (keys.min() < 0 or any(t[2].size and (t[2].min() < 0 or t[2].max() >= VOCAB_SIZE) for t in terms)):
            return None
        masks = None
        if req.filter is None:
            allowed = allowed_all
        else:
            masks = [np.ascontiguousarray(self._allowed(s, req.filter), np.uint8) for s in segs]  # (kept alive here)
            allowed = np.array([(m.ctypes.data, m.size) for m in masks], np.int64).reshape(len(segs), 2)
        which = every if isinstance(which, range) and len(which) == len(segs) else np.asarray(list(which), np.int64)
        k = req.top_k
        heap = tuple(TopK.empty(k))
        hs, hq, hr, state = heap
        search = K.search_segments  # (each K.name imports: bound once here, not per segment below)
        done, damaged, no_terms, wants_numpy = K.MULTI_DONE, K.MULTI_DAMAGED, K.MULTI_NO_TERMS, K.MULTI_WANTS_NUMPY
        out = np.empty((len(segs), K.MULTI_OUT_COLUMNS), np.int64)
        seed = (self.seed_terms > 0 and self.seed_postings > 0 and strategy != NP.STRATEGY_TAAT and all_docs >= self.seed_min_docs
                and (which is every or int(desc[which, 0].sum()) >= self.seed_min_docs))
        if seed and strategy == NP.STRATEGY_AUTO and 2 * int((rec[which, 2] > 0).sum()) > len(which):
            seed = False  # auto runs TAAT on most of these segments now (its record): the seed would not pay
        settings = np.array([strategy, self.head_blocks, self.numpy_max_postings, AUTO_RETRY,
                             self.seed_terms if seed else 0, self.seed_postings if seed else 0,
                             int(self.seed_order)], np.int64)
        if seed and self.seed_order:
            which = which.copy()  # (the kernel visits the segments in its own order: see multi.search_segments)
        keys = np.ascontiguousarray(keys, np.int64)
        weights = np.ascontiguousarray(weights, np.float32)
        small: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        x = 0
        while True:
            code, x = search(keys, weights, which, x, desc, allowed, checks, tmax, F16_TABLE, rec, heap,
                             self._taat_scratch(), settings, AUTO_EMA, out)
            if code == done:
                break
            si = int(which[x])
            if code == damaged:
                segs[si].seg.raise_damaged_chunk(int(state[7]))
            # small work: numpy, as _search_segments does, in its turn (auto's rule reads the state)
            seg = segs[si].seg
            js, ws = [], []
            for fi, _, tok, w in terms:
                j = seg.term_index(fi, tok)
                js.append(j[j >= 0])
                ws.append(w[j >= 0])
            q_j = np.ascontiguousarray(np.concatenate(js), np.int64)
            q_w = np.ascontiguousarray(np.concatenate(ws), np.float32)
            seg.verify_terms(q_j)
            sc, sq, refs, matched, read = NP.search_segment(q_j, q_w, seg.kernel_arrays(), self._allowed(segs[si], req.filter),
                                                            np.int64(si) << 32, k)
            small.append((sc, sq, refs))
            state[1] += matched
            state[5] += read
            x += 1
        used: list[str] = []
        rows = []
        for si, code in zip(which.tolist(), out[which, 0].tolist()):
            if code == no_terms:
                continue
            if code == wants_numpy:
                used.append("numpy")
                rows.append((si, NP.STRATEGY_NUMPY, CHOSEN_NUMPY))
            else:
                used.append(NP.STRATEGY_NAMES[code])
                rows.append((si, code, -1))

        def plans() -> list[SegmentPlan]:  # (words only when someone asks: see plan.py)
            out_rows = []
            for si, code, chosen in rows:
                seg = segs[si].seg
                if code == NP.STRATEGY_NUMPY:
                    slots = [NP.STRATEGY_NUMPY, chosen, int(out[si, 2 + PLAN_SLOTS])] + [-1] * 5
                    out_rows.append(SegmentPlan(seg.name, seg.n_docs, seg.n_blocks, "numpy", slots))
                else:
                    out_rows.append(SegmentPlan(seg.name, seg.n_docs, seg.n_blocks, NP.STRATEGY_NAMES[code],
                                                out[si, 2:2 + PLAN_SLOTS].tolist(), int(out[si, 1])))
            return out_rows

        return hs, hq, hr, state, small, used, plans

    def _search_segments(self, req: SearchRequest, segs: list, which, terms: list, strategy: int, threads: int):
        """Search the segments ``which`` (indices into ``segs``) in turn into one heap; returns
        (heap scores, seqs, refs, state, the top k of numpy searches and split parts, strategies, and
        per segment its :class:`.plan.SegmentPlan`: the kernel's plan slots as written, words later;
        or a function returning those). With one thread, one compiled call searches them all
        (:meth:`_search_fused`) where it can."""
        if threads == 1:
            fused = self._search_fused(req, segs, which, terms, strategy)
            if fused is not None:
                return fused
        k = req.top_k
        heap = tuple(TopK.empty(k))
        hs, hq, hr, state = heap
        used = []
        plans: list[SegmentPlan] = []
        small: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # top k of numpy searches and of split parts
        for si in which:
            s = segs[si]
            js, ws = [], []
            for fi, _, tok, w in terms:
                j = s.seg.term_index(fi, tok)
                ok = j >= 0
                js.append(j[ok])
                ws.append(w[ok])
            if len(js) == 1:  # (one clause, the usual case: no copies)
                q_j, q_w = js[0], ws[0]
            else:
                q_j = np.concatenate(js) if js else np.zeros(0, np.int64)
                q_w = np.concatenate(ws) if ws else np.zeros(0, np.float32)
            if q_j.size == 0:
                continue
            q_j = np.ascontiguousarray(q_j, np.int64)
            q_w = np.ascontiguousarray(q_w, np.float32)
            allowed = self._allowed(s, req.filter)
            seg = s.seg
            postings = NP.postings_touched(q_j, seg.post_ptr)
            if strategy == NP.STRATEGY_NUMPY or (strategy == NP.STRATEGY_AUTO and postings <= self.numpy_max_postings):
                # small work: numpy is about as fast, and a new process never pays for starting numba
                seg.verify_arrays(("seq",))  # checksummed segments: verify what the search reads, before it reads
                seg.verify_terms(q_j)
                sc, sq, refs, matched, read = NP.search_segment(q_j, q_w, seg.kernel_arrays(), allowed, np.int64(si) << 32, k)
                small.append((sc, sq, refs))
                state[1] += matched
                state[5] += read
                used.append("numpy")
                how = CHOSEN_NUMPY if strategy == NP.STRATEGY_AUTO else CHOSEN_FORCED
                plans.append(SegmentPlan(seg.name, seg.n_docs, seg.n_blocks, "numpy", [NP.STRATEGY_NUMPY, how, postings] + [-1] * 5))
                continue
            # the kernel verifies each postings run the first time it reads it (block-max reads few of
            # them); it needs the query terms' block tables verified first
            kernel = K.search_segment  # imports the numba kernels (and their compiled CRC-32)
            seg.verify_arrays(("seq",))  # (after that import: 8 MB at 1M docs, verified in compiled code)
            chk = seg.kernel_check()
            if chk is None:
                seg.verify_terms(q_j)
            else:
                seg.verify_term_tables(q_j)
            state[7] = -1
            # (plain tuples: numba types them from Python in a third of the time of named ones; the
            # kernel names them again: SegmentArrays, TopK, SearchOptions)
            arrays = tuple(seg.kernel_arrays())
            opts = self._auto_options(seg, strategy)
            chosen = CHOSEN_RENEW if strategy == NP.STRATEGY_AUTO and opts[0] != strategy else -1
            # (choose_strategy writes the plan: with auto it decides, else the plan's counts are what it adds)
            if threads > 1 and seg.n_docs >= SPLIT_MIN_DOCS and strategy in (NP.STRATEGY_AUTO, NP.STRATEGY_BLOCKMAX) and (
                    K.choose_strategy(q_j, arrays, heap, opts) == NP.STRATEGY_BLOCKMAX or opts[0] == NP.STRATEGY_BLOCKMAX):
                args = (q_j, q_w, arrays, allowed, np.int64(si) << 32)
                n_blocks = (seg.n_docs + (1 << seg.bshift) - 1) >> seg.bshift
                before = state[[3, 5]].copy()
                for hs_i, hq_i, hr_i, st in self._split_search(kernel, args, chk, n_blocks, threads, k):
                    if st[7] >= 0:
                        seg.raise_damaged_chunk(int(st[7]))
                    small.append((hs_i, hq_i, hr_i))
                    _add_state(state, st)
                used.append("blockmax")
                if strategy != NP.STRATEGY_AUTO:
                    chosen = CHOSEN_FORCED
                plans.append(SegmentPlan(seg.name, seg.n_docs, n_blocks, "blockmax", state[PLAN:].tolist(), chosen, threads))
                if strategy == NP.STRATEGY_AUTO:
                    self._auto_record(seg, "blockmax", state[[3, 5]] - before, postings)
                continue
            before = state[[3, 5]].copy()
            ran = kernel(q_j, q_w, arrays, allowed, np.int64(si) << 32, heap, opts, self._taat_scratch(), chk)
            if state[7] >= 0:
                seg.raise_damaged_chunk(int(state[7]))
            used.append(NP.STRATEGY_NAMES[ran])
            plans.append(SegmentPlan(seg.name, seg.n_docs, seg.n_blocks, NP.STRATEGY_NAMES[ran], state[PLAN:].tolist(), chosen))
            if strategy == NP.STRATEGY_AUTO:
                self._auto_record(seg, NP.STRATEGY_NAMES[ran], state[[3, 5]] - before, postings)
        return hs, hq, hr, state, small, used, plans

    def _finish(self, req: SearchRequest, segs: list, hs, hq, hr, state, small, used, t0: float):
        """The top k of the heap and the extra top-k lists, best first, as hits."""
        k = req.top_k
        n = int(state[0])
        if sum(x[0].size for x in small) + n <= 64:
            # a few candidates (one heap, the usual case): Python lists, Python's sort, no numpy call
            # per step (a dozen of them cost ~10 us of a 0.4 ms search, 2026-11-27)
            sc, sq, rf = hs[:n].tolist(), hq[:n].tolist(), hr[:n].tolist()
            for x in small:
                sc += x[0].tolist()
                sq += x[1].tolist()
                rf += x[2].tolist()
            top = sorted(range(len(sc)), key=lambda i: (-sc[i], sq[i]))[:k]  # best first; ties: older first
            hit_score = [sc[i] for i in top]
            hit_seg = [rf[i] >> 32 for i in top]
            hit_doc = [rf[i] & 0xFFFFFFFF for i in top]
        else:
            scores, seqs, refs = hs[:n], hq[:n], hr[:n]
            if small:
                scores = np.concatenate([scores] + [x[0] for x in small])
                seqs = np.concatenate([seqs] + [x[1] for x in small])
                refs = np.concatenate([refs] + [x[2] for x in small])
            order = np.lexsort((seqs, -scores))[:k]  # best first; ties: older first
            hit_score = scores[order].tolist()
            hit_seg = (refs[order] >> 32).tolist()
            hit_doc = (refs[order] & 0xFFFFFFFF).tolist()
        state[0] = len(hit_score)
        by_seg: dict[int, list[int]] = {}
        for si, d in zip(hit_seg, hit_doc):
            by_seg.setdefault(si, []).append(d)
        for si in sorted(by_seg):
            segs[si].seg.verify_docs(by_seg[si])
        hits = []
        for si, d, score in zip(hit_seg, hit_doc, hit_score):
            seg = segs[si].seg
            hits.append(Hit(seg.doc_id(d), score, seg.metadata(d), seg.caption(d), seg.source(d)))
        total = int(state[1]) if state[2] else None
        return SearchResult(hits, total, (time.perf_counter() - t0) * 1000.0, list(req.notes)), state, used
