"""Fusion math on hand-computed cases: RRF and min-max linear, ties, bad parameters."""

import pytest

from stair_es.errors import InvalidInputError
from stair_es.fusion import Ranked, fuse, linear, minmax, parse_weights, rrf


A = Ranked("sparse", ["a", "b", "c"], [9.0, 5.0, 1.0])
B = Ranked("bm25", ["c", "a", "d"], [3.0, 2.0, 1.0])


def test_rrf_by_hand():
    got = {f.id: f for f in rrf([A, B], k=60)}
    assert got["a"].score == pytest.approx(1 / 61 + 1 / 62)
    assert got["c"].score == pytest.approx(1 / 63 + 1 / 61)
    assert got["b"].score == pytest.approx(1 / 62)
    assert got["d"].score == pytest.approx(1 / 63)
    assert [f.id for f in rrf([A, B], k=60)] == ["a", "c", "b", "d"]
    assert got["c"].ranks == {"sparse": 3, "bm25": 1} and got["d"].ranks == {"bm25": 3}
    assert got["c"].scores == {"sparse": 1.0, "bm25": 3.0}


def test_rrf_small_k_favours_top_ranks():
    # k=1: a = 1/2 + 1/3 = .833, c = 1/4 + 1/2 = .75
    order = [f.id for f in rrf([A, B], k=1)]
    assert order[:2] == ["a", "c"]
    got = {f.id: f.score for f in rrf([A, B], k=1)}
    assert got["c"] == pytest.approx(0.75)


def test_minmax_and_linear_by_hand():
    assert minmax([9.0, 5.0, 1.0]) == [1.0, 0.5, 0.0]
    assert minmax([2.0, 2.0]) == [1.0, 1.0]  # all equal: each is the best
    # weights 3,1 -> 0.75, 0.25; bm25 normalised: c 1.0, a 0.5, d 0.0
    got = {f.id: f.score for f in linear([A, B], [3, 1])}
    assert got["a"] == pytest.approx(0.75 * 1.0 + 0.25 * 0.5)
    assert got["b"] == pytest.approx(0.75 * 0.5)
    assert got["c"] == pytest.approx(0.75 * 0.0 + 0.25 * 1.0)
    assert got["d"] == pytest.approx(0.0)
    assert [f.id for f in linear([A, B], [3, 1])] == ["a", "b", "c", "d"]


def test_weights_only_bm25_follows_bm25():
    assert [f.id for f in linear([A, B], [0, 1])][:2] == ["c", "a"]


def test_ties_break_by_best_rank_then_id():
    x = Ranked("sparse", ["p", "q"], [1.0, 1.0])
    y = Ranked("bm25", ["q", "p"], [1.0, 1.0])
    assert [f.id for f in rrf([x, y])] == ["p", "q"]  # equal RRF, equal best rank: by id


@pytest.mark.parametrize("w", [[-1, 1], [0, 0], [float("nan"), 1], [1]])
def test_bad_weights_are_refused(w):
    with pytest.raises(InvalidInputError):
        linear([A, B], w)


@pytest.mark.parametrize("k", [0, -5, 1.5, 10001, True])
def test_bad_rrf_k_is_refused(k):
    with pytest.raises(InvalidInputError, match="rrf-k"):
        rrf([A, B], k=k)


def test_parse_weights():
    assert parse_weights("0.7,0.3") == pytest.approx([0.7, 0.3])
    assert parse_weights("2,2") == pytest.approx([0.5, 0.5])
    with pytest.raises(InvalidInputError, match="comma"):
        parse_weights("a,b")
    with pytest.raises(InvalidInputError, match="sum to 0"):
        parse_weights("0,0")
    with pytest.raises(InvalidInputError):
        fuse([A, B], "max")
