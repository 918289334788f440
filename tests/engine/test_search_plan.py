"""Which exact strategy each segment was searched with, and why, as a user sees it: the engine's
``SearchResult.plan``, ``stair-es search --json`` ("plan") and ``--explain`` ("searched ...")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()
TOKENS = np.flatnonzero(~VOCAB.special_mask)[2000:2040]  # few tokens, each in a third of the docs


def _build(path, n_docs: int = 20000) -> EngineIndex:
    """Weights independent of frequency, every query token in most blocks: block-max cannot prune."""
    rng = np.random.default_rng(7)
    ix = EngineIndex.create(path, IndexSchema(sparse_fields=("image",)))
    rows = [np.sort(rng.choice(TOKENS.size, size=12, replace=False)) for _ in range(n_docs)]
    indptr = np.zeros(n_docs + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r in rows])
    ids = TOKENS[np.concatenate(rows)].astype(np.int32)
    ix.add_arrays([f"d{i}" for i in range(n_docs)], {"image": (indptr, ids, rng.uniform(0.5, 1.5, ids.size).astype(np.float32))})
    return ix


def _request(k: int = 3) -> SearchRequest:
    return SearchRequest([SparseClause("image", SparseVector.from_arrays(TOKENS[:5], np.linspace(1.0, 2.0, 5)))], top_k=k)


def test_auto_says_which_strategy_it_chose_and_why(tmp_path):
    ix = _build(tmp_path / "ix")
    ix.numpy_max_postings = 0  # the numba kernels, as on segments too large for numpy
    first = ix.search(_request()).plan.to_dict()
    (seg,) = first["segments"]
    assert first["setting"] == "auto"
    # no record of block-max yet: the rescoring rule decides, with its two estimates
    assert seg["strategy"] == "blockmax" and seg["chosen_by"] == "no-record rule", seg
    assert "rescoring" in seg["reason"] and seg["estimates"]["taat_ms"] > 0 and seg["estimates"]["rescoring_ms"] > 0
    s = ix._segs[0].seg
    postings = sum(int(s.post_ptr[j + 1] - s.post_ptr[j]) for j in s.term_index(0, TOKENS[:5].astype(np.int64)))
    assert seg["estimates"]["postings"] == postings
    # block-max's record (it scored every block) makes the cost model pick TAAT, and it says by how much
    res = ix.search(_request())
    (seg,) = res.plan.to_dict()["segments"]
    assert seg["strategy"] == "taat" == ix.last_search_strategies[0] and seg["chosen_by"] == "cost model", seg
    est = seg["estimates"]
    assert est["taat_ms"] < est["blockmax_ms"] and 0 < est["blockmax_setup_ms"] < est["blockmax_ms"]
    assert est["blocks_scored"] > 0.5 * est["blocks"] and est["pairs"] > 0 and est["postings"] == postings
    (line,) = res.plan.lines()
    assert line.startswith(f"{s.name} (20,000 docs): taat (cost model): TAAT ~")
    assert "set-up" in line and "blocks scored" in line


@pytest.mark.parametrize("strategy", ["blockmax", "taat", "numpy"])
def test_a_forced_strategy_is_reported_as_forced(tmp_path, strategy):
    ix = _build(tmp_path / "ix", 3000)
    ix.strategy = strategy
    (seg,) = ix.search(_request()).plan.to_dict()["segments"]
    assert (seg["strategy"], seg["chosen_by"]) == (strategy, "forced")
    assert seg["reason"] == f"the index's strategy is {strategy!r}"
    assert seg["estimates"]["postings"] > 0


def test_small_work_goes_to_numpy_and_says_so(tmp_path):
    ix = _build(tmp_path / "ix", 500)
    (seg,) = ix.search(_request()).plan.to_dict()["segments"]
    assert (seg["strategy"], seg["chosen_by"]) == ("numpy", "small work")
    assert f"<= {ix.numpy_max_postings:,}" in seg["reason"]


def test_every_segment_searched_has_its_line(tmp_path):
    ix = _build(tmp_path / "ix", 3000)
    ix.add_arrays(["x1", "x2"], {"image": (np.array([0, 2, 4]), TOKENS[[0, 1, 0, 2]].astype(np.int32), np.ones(4, np.float32))})
    res = ix.search(_request())
    assert len(ix._segs) == 2 and len(res.plan.segments) == 2
    assert [line.split(" (")[0] for line in res.plan.lines()] == [s.seg.name for s in ix._segs]


def test_cli_json_and_explain_show_the_plan(tmp_path, run):
    _build(tmp_path / "home" / "plans").close()
    tokens = json.dumps({VOCAB.token(int(t)): 1.0 for t in TOKENS[:5]})
    r = run("search", "plans", "--tokens", tokens, "--top-k", "3", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)["plan"]
    (seg,) = plan["segments"]
    assert plan["setting"] == "auto" and seg["strategy"] in ("blockmax", "taat") and seg["reason"]
    assert seg["estimates"]["postings"] > 16384
    r = run("search", "plans", "--tokens", tokens, "--top-k", "3", "--explain")
    assert r.exit_code == 0, r.output
    searched = [line for line in r.output.splitlines() if line.startswith("searched ")]
    assert len(searched) == 1 and f": {seg['strategy']} ({seg['chosen_by']}): " in searched[0], r.output
    plain = run("search", "plans", "--tokens", tokens, "--top-k", "3")
    assert "searched " not in plain.output  # only with --explain


def test_a_segment_split_over_threads_says_so(tmp_path, monkeypatch):
    from stair_es.engine import searcher as searcher_mod

    monkeypatch.setattr(searcher_mod, "SPLIT_MIN_DOCS", 0)  # a small segment: split it anyway
    ix = _build(tmp_path / "ix", 3000)
    ix.numpy_max_postings = 0
    ix.strategy = "blockmax"
    want = [(h.id, h.score) for h in ix.search(_request()).hits]
    res = ix.search(_request(), threads=2)
    assert [(h.id, h.score) for h in res.hits] == want
    (seg,) = res.plan.to_dict()["segments"]
    assert (seg["strategy"], seg["chosen_by"]) == ("blockmax", "forced")
    assert seg["reason"].endswith("split over 2 threads by block ranges") and seg["estimates"]["postings"] > 0
