"""Retrieval metrics: every image a query caption describes counts as a right answer."""

import numpy as np

from stair_es.stair.evaluate import recall_at_k


def test_recall_with_one_relevant_candidate_per_query():
    sim = np.array([[0.9, 0.1, 0.2], [0.8, 0.7, 0.1], [0.1, 0.2, 0.3]])
    r = recall_at_k(sim, np.array([0, 1, 2]), ks=(1, 2))
    assert r == {1: 2 / 3, 2: 1.0}


def test_duplicate_captions_are_all_relevant():
    # query 0's caption describes images 0 and 1 (same caption drawn twice); image 1 scores higher
    sim = np.array([[0.5, 0.9, 0.1], [0.5, 0.9, 0.1]])
    one = recall_at_k(sim, np.array([0, 1]), ks=(1,))
    assert one[1] == 0.5  # with one "correct" image per query, query 0 misses at rank 1
    rel = np.array([[True, True, False], [True, True, False]])
    assert recall_at_k(sim, rel, ks=(1,))[1] == 1.0
    # an irrelevant candidate above every relevant one still costs a rank
    sim2 = np.array([[0.5, 0.6, 0.95]])
    assert recall_at_k(sim2, np.array([[True, True, False]]), ks=(1, 2)) == {1: 0.0, 2: 1.0}


def test_ties_count_against_the_query():
    # an all-equal (e.g. all-zero) model ranks the right candidate last among equals: chance is 0 at R@1
    sim = np.zeros((20, 20))
    r = recall_at_k(sim, np.arange(20), ks=(1, 5, 10))
    assert r == {1: 0.0, 5: 0.0, 10: 0.0}
    # with fewer candidates than K, even a tie-everything model finds the answer within K
    assert recall_at_k(np.zeros((3, 3)), np.arange(3), ks=(5,)) == {5: 1.0}


def test_a_perfect_model_scores_one():
    sim = np.eye(10) + 0.01 * np.random.default_rng(0).random((10, 10))
    assert recall_at_k(sim, np.arange(10), ks=(1, 5)) == {1: 1.0, 5: 1.0}


def test_hand_computed_ranks_with_a_tie():
    # query 0: right = 0.5, one irrelevant tie (0.5) and one higher (0.7) -> rank 2 (0-based), R@1 0, R@3 1
    # query 1: right = 0.9 strictly best -> rank 0
    # query 2: right = 0.2, ties with one, below two -> rank 3
    sim = np.array([[0.5, 0.5, 0.7, 0.1], [0.3, 0.9, 0.2, 0.1], [0.9, 0.8, 0.2, 0.2]])
    right = np.array([0, 1, 3])
    assert recall_at_k(sim, right, ks=(1, 2, 3, 4)) == {1: 1 / 3, 2: 1 / 3, 3: 2 / 3, 4: 1.0}
