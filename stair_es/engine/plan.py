"""What a search did per segment and why: the strategy each segment was searched with (numpy,
block-max or TAAT), how it was chosen (forced, ``auto``'s cost model, its no-record rule, ...) and
the cost model's estimates, for ``explain`` output, ``--json`` and profiles.

The kernels write their choice and estimates into a few slots of the search state
(:data:`.layout.PLAN_FIELDS`) as they choose; the searcher keeps those numbers per segment as
they are, and this module turns them into words only when someone asks (:meth:`SearchPlan.lines`,
:meth:`SearchPlan.to_dict`), so a search that nobody explains pays a list of a few integers per
segment. It knows nothing of files or kernels' code.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .layout import (CHOSEN_COST_MODEL, CHOSEN_EMPTY, CHOSEN_FORCED, CHOSEN_NUMPY, CHOSEN_RENEW, CHOSEN_RULE,
                     PLAN_FIELDS, STRATEGY_NAMES)

#: how each ``CHOSEN_*`` reads in the output
CHOSEN_NAMES = {CHOSEN_FORCED: "forced", CHOSEN_COST_MODEL: "cost model", CHOSEN_RULE: "no-record rule",
                CHOSEN_EMPTY: "no postings", CHOSEN_RENEW: "record renewal", CHOSEN_NUMPY: "small work"}


class SegmentPlan(NamedTuple):
    """One segment's search: its name and size, the strategy that ran, the kernel's plan slots
    (:data:`.layout.PLAN_FIELDS`, as it wrote them), how the choice was made when the searcher
    decided it (``CHOSEN_*``, else -1: the kernel's own), and the threads it was split over."""

    segment: str
    docs: int
    blocks: int
    strategy: str
    slots: list
    chosen: int = -1
    threads: int = 1


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


class SearchPlan:
    """The per-segment plans of one search (``SearchResult.plan`` of the embedded engine)."""

    def __init__(self, setting: str, segments, numpy_max_postings: int):
        self.setting = setting  # the index's strategy setting: "auto", or the strategy forced
        self._segments = segments  # a list of SegmentPlan, or a function making it (on first use)
        self.numpy_max_postings = numpy_max_postings

    @property
    def segments(self) -> list[SegmentPlan]:
        if callable(self._segments):
            self._segments = self._segments()
        return self._segments

    def _row(self, p: SegmentPlan) -> dict[str, Any]:
        f = dict(zip(PLAN_FIELDS, p.slots))
        chosen = p.chosen if p.chosen >= 0 else int(f["chosen"])
        P, pairs = int(f["postings"]), int(f["pairs"])
        est: dict[str, Any] = {"postings": P, "pairs": pairs, "blocks": p.blocks}
        if chosen == CHOSEN_FORCED:
            reason = f"the index's strategy is {self.setting!r}"
        elif chosen == CHOSEN_NUMPY:
            reason = f"{P:,} postings of the query terms <= {self.numpy_max_postings:,}: scored with numpy (no numba start-up)"
        elif chosen == CHOSEN_RENEW:
            reason = "block-max run again to renew auto's record of it on this segment, after a series of TAAT queries"
        elif chosen == CHOSEN_EMPTY:
            reason = "the query terms have no postings here"
        elif chosen == CHOSEN_COST_MODEL:
            from .kernels.search import BM_NS_BLOCK, BM_NS_PAIR, BM_NS_STREAMED  # (loaded: the kernel wrote this row)

            taat, bm, blocks, streamed = f["taat_ns"], f["blockmax_ns"], f["blocks_scored"], f["postings_streamed"]
            est.update(taat_ms=taat / 1e6, blockmax_ms=bm / 1e6, blockmax_setup_ms=BM_NS_PAIR * pairs / 1e6,
                       blocks_scored=blocks, postings_streamed=streamed)
            cmp = "<" if p.strategy == "taat" else ">="
            reason = (f"TAAT ~{_ms(taat)} ({P:,} postings, {p.docs:,} docs) {cmp} block-max ~{_ms(bm)} "
                      f"(set-up ~{_ms(BM_NS_PAIR * pairs)} over {pairs:,} (term, block) pairs, ~{blocks:,} of {p.blocks:,} "
                      f"blocks scored ~{_ms(BM_NS_BLOCK * blocks)}, ~{streamed:,} postings streamed "
                      f"~{_ms(BM_NS_STREAMED * streamed)}: predicted from block-max's recent queries here)")
        elif chosen == CHOSEN_RULE:
            taat, rescoring = f["taat_ns"], f["blockmax_ns"]
            est.update(taat_ms=taat / 1e6, rescoring_ms=rescoring / 1e6)
            cmp = ">" if p.strategy == "taat" else "<="
            reason = (f"no record of block-max on this segment yet: rescoring its heap's entries ~{_ms(rescoring)} "
                      f"{cmp} half of TAAT's ~{_ms(taat)} ({P:,} postings)")
        else:
            reason = "unknown"
        if p.threads > 1:
            reason += f"; split over {p.threads} threads by block ranges"
        return {"segment": p.segment, "docs": p.docs, "strategy": p.strategy, "chosen_by": CHOSEN_NAMES.get(chosen, "unknown"),
                "reason": reason, "estimates": {k: v for k, v in est.items() if v >= 0}}  # (-1: not counted on that path)

    def to_dict(self) -> dict[str, Any]:
        return {"setting": self.setting, "segments": [self._row(p) for p in self.segments]}

    def lines(self, limit: int = 10) -> list[str]:
        """One line per segment searched (at most ``limit``, then how many more)."""
        rows = [self._row(p) for p in self.segments]
        out = [f"{r['segment']} ({r['docs']:,} docs): {r['strategy']} ({r['chosen_by']}): {r['reason']}" for r in rows[:limit]]
        if len(rows) > limit:
            out.append(f"... and {len(rows) - limit} more segments")
        return out

    @property
    def strategies(self) -> list[str]:
        return [p.strategy for p in self.segments]

    def __repr__(self) -> str:
        return f"SearchPlan({self.setting!r}, {self.strategies})"
