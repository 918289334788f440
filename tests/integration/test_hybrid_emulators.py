"""Hybrid search on the emulators agrees with the embedded engine.

noida-db (Elasticsearch 8.15) runs the ``rrf`` retriever itself; it has no ``linear`` retriever
(Elasticsearch 8.18+), so linear fusion falls back to stair_es. osmem-server (OpenSearch 3.x)
has neither the ``hybrid`` query nor search pipelines, so both fusions fall back there; the
request JSON for the real engines is checked in tests/hybrid/test_hybrid_dsl.py.
"""

from __future__ import annotations

import pytest

from stair_es.backends.base import get_backend
from stair_es.hybrid import HybridOptions, hybrid_search
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

pytestmark = pytest.mark.process

SCHEMA = IndexSchema(fields={"kind": "keyword"})
WORDS = ["dog", "cat", "car", "beach", "tree", "cup", "boat", "bird"]


def corpus():
    """20 documents without ties: distinct token weights, and distinct caption lengths (2..24
    terms, which Lucene's one-byte length norms still store exactly)."""
    docs = []
    for i in range(20):
        a, b, c = WORDS[i % 8], WORDS[(i * 3 + 1) % 8], WORDS[(i + 2) % 8]
        tm = {a: 1.0 + i * 0.031, b: 0.5 + i * 0.017}
        cap = " ".join([b] + [c] * (1 + i % 3) + [f"w{i}x{j}" for j in range(i)])
        docs.append(Document(f"d{i:02d}", {"image": SparseVector.from_token_map(tm)},
                             {"kind": "photo" if i % 2 else "drawing"}, cap))
    return docs


@pytest.fixture
def pair(cluster, tmp_path):
    name, url = cluster
    b = get_backend(name, urls=url, timeout=60)
    try:
        b.delete_index("stair-hyb")
    except Exception:  # noqa: BLE001
        pass
    b.create_index("stair-hyb", SCHEMA)
    assert not b.ingest("stair-hyb", corpus()).failures
    emb = get_backend("embedded", home=str(tmp_path))
    emb.create_index("stair-hyb", SCHEMA)
    emb.ingest("stair-hyb", corpus())
    yield name, b, emb
    b.delete_index("stair-hyb")
    emb.close()


@pytest.mark.parametrize("fusion", ["rrf", "linear"])
def test_hybrid_agrees_with_the_embedded_engine(pair, fusion):
    name, b, emb = pair
    opts = HybridOptions(fusion, rrf_k=10, weights=(0.6, 0.4), window=20)
    for text, flt in [("a dog on the beach", None), ("cat tree", Term("kind", "photo")), ("boat", None)]:
        req = SearchRequest([SparseClause("image", SparseVector.from_token_map({w: 1.0 for w in text.split() if w in WORDS}))],
                            filter=flt, top_k=5)
        c = hybrid_search(b, "stair-hyb", req, text, opts, explain=True)
        e = hybrid_search(emb, "stair-hyb", SearchRequest(req.clauses, req.filter, 20), text, opts)
        server = any("by the cluster" in n for n in c.notes)
        assert server == (name == "elasticsearch" and fusion == "rrf"), c.notes
        if not server:
            assert any("fused in stair_es instead" in n for n in c.notes)
        assert len(c.hits) == 5
        fused = {h.id: h for h in e.hits}
        for h in c.hits:  # the same sparse ranks (the 9-bit stored weights keep this corpus's order)
            assert h.retrievers["sparse"]["rank"] == fused[h.id].retrievers["sparse"]["rank"]
            if flt is not None:
                assert h.metadata["kind"] == "photo"
        if name == "elasticsearch":
            # the same ranking up to exact ties in the fused score (broken differently by the cluster):
            # the embedded fused scores of the cluster's hits are the embedded top-5 scores
            assert [fused[h.id].score for h in c.hits] == pytest.approx([h.score for h in e.hits[:5]], rel=2e-2, abs=1e-3)
        else:
            # osmem's BM25 scores are not Lucene's (e.g. 1.64 vs 1.39 where Lucene's formula gives
            # 1.53 vs 1.51), so near-ties in BM25 can swap; most of the top 5 must agree
            assert len({h.id for h in c.hits} & {h.id for h in e.hits[:5]}) >= 3
