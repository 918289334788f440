"""Neighbour statistics and query expansion on the cluster backends (fake node): counted by a scan."""

import math

import pytest

from stair_es.backends.base import get_backend
from stair_es.neighbours import neighbours
from stair_es.schema import Document, IndexSchema
from stair_es.search import QuerySpec, make_request
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

V = default_vocabulary()
CORPUS = [("d1", "cat on a sofa", {"cat": 1.0, "sofa": 0.5}), ("d2", "a cat", {"cat": 0.8, "animal": 0.7}),
          ("d3", "a dog", {"dog": 1.0, "animal": 0.6}), ("d4", None, {"dog": 0.9})]


def test_cluster_neighbours_and_expansion_match_the_hand_count(fake):
    b = get_backend(fake.flavor, urls=fake.url, backoff=0.01, backoff_max=0.05, timeout=2)
    b.create_index("tiny", IndexSchema())
    b.ingest("tiny", [Document(i, {"image": SparseVector.from_token_map(t)}, caption=c) for i, c, t in CORPUS])
    rep = neighbours(b, "tiny", "cat", min_count=1)
    assert [V.token(n.token_id) for n in rep.as_word] == ["cat", "sofa"]
    assert rep.as_word[1].ppmi == pytest.approx(math.log(1.5)) and (rep.n_docs, rep.n_captioned) == (4, 3)
    assert any("scan" in n for n in rep.notes)
    req, _ = make_request(b, "tiny", QuerySpec(tokens={"cat": 2.0}, expand=1, expand_min_count=1))
    image = next(c for c in req.clauses if c.field == "image")
    assert image.vector.to_token_map() == pytest.approx({"cat": 2.0, "sofa": math.log(1.5) / math.log(3)})
    assert b.search("tiny", req).hits[0].id == "d1"
