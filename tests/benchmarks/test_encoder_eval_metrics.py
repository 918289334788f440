"""The encoder evaluation's ranking metrics: ties count against the query, groups of equal
descriptions are all relevant (benchmarks/encoders/run.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.encoders.run import _relevance, rank_metrics


def test_hand_computed_ranks():
    scores = np.array([
        [3.0, 1.0, 2.0],  # right image first: rank 1
        [2.0, 1.0, 3.0],  # two images above: rank 3
        [1.0, 1.0, 1.0],  # all tied: ties count against the query, rank 3
    ])
    m = rank_metrics(scores, [np.array([0]), np.array([1]), np.array([2])])
    assert m["p1"] == pytest.approx(1 / 3)
    assert m["mrr"] == pytest.approx((1 + 1 / 3 + 1 / 3) / 3)
    assert m["r5"] == 1.0 and m["median_rank"] == 3.0


def test_an_all_zero_encoder_scores_chance_not_perfect():
    n = 50
    m = rank_metrics(np.zeros((n, n)), [np.array([i]) for i in range(n)])
    assert m["p1"] == 0.0 and m["median_rank"] == n


def test_equal_descriptions_are_all_relevant():
    rel = _relevance(["A dog.", "a  dog.", "A cat."])
    assert [r.tolist() for r in rel] == [[0, 1], [0, 1], [2]]
    scores = np.array([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    m = rank_metrics(scores, rel)
    assert m["p1"] == pytest.approx(2 / 3)  # the dog queries find the other dog drawing first
