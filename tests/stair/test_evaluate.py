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
