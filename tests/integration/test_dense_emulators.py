"""The dense retriever on the emulators: vectors ingested into the ``dense`` field, kNN searched,
fused with sparse and BM25, compared with the embedded engine on the same documents.

What each emulator does with it is stated in docs/hybrid.md (section "Dense vectors"); where an
emulator refuses the server-side form, stair_es runs the retrievers as plain searches and fuses
them itself, and this test checks that path instead.
"""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.backends.base import get_backend
from stair_es.dense import DenseSpec
from stair_es.hybrid import HybridOptions, hybrid_search
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

pytestmark = pytest.mark.process

DIMS = 4
WORDS = ["dog", "cat", "car", "beach", "tree", "cup", "boat", "bird"]


def schema():
    return IndexSchema(fields={"kind": "keyword"}, dense=DenseSpec(DIMS, "cosine", "float32").to_dict())


def corpus():
    rng = np.random.default_rng(7)
    docs = []
    for i in range(20):
        a, b = WORDS[i % 8], WORDS[(i * 3 + 1) % 8]
        tm = {a: 1.0 + i * 0.031, b: 0.5 + i * 0.017}
        cap = " ".join([b] + [f"w{i}x{j}" for j in range(i)])
        docs.append(Document(f"d{i:02d}", {"image": SparseVector.from_token_map(tm)},
                             {"kind": "photo" if i % 2 else "drawing"}, cap, None, rng.standard_normal(DIMS)))
    return docs


@pytest.fixture
def pair(cluster, tmp_path):
    name, url = cluster
    b = get_backend(name, urls=url, timeout=60)
    try:
        b.delete_index("stair-dense")
    except Exception:  # noqa: BLE001
        pass
    b.create_index("stair-dense", schema())
    rep = b.ingest("stair-dense", corpus())
    emb = get_backend("embedded", home=str(tmp_path))
    emb.create_index("stair-dense", schema())
    emb.ingest("stair-dense", corpus())
    yield name, b, emb, rep
    b.delete_index("stair-dense")
    emb.close()


def test_dense_vectors_are_stored_and_read_back(pair):
    name, b, emb, rep = pair
    assert not rep.failures, [f.error for f in rep.failures]
    doc = b.get("stair-dense", "d03")
    want = corpus()[3].dense
    assert np.asarray(doc.dense) == pytest.approx(want / np.linalg.norm(want), abs=1e-6)


def _skip_without_knn(name, b):
    """osmem-server 0.1.6 stores knn_vector fields but answers every knn query with HTTP 400."""
    from stair_es.errors import BackendError

    try:
        b.request("POST", "/stair-dense/_search", {"query": {"knn": {"dense": {"vector": [1.0] * DIMS, "k": 1}}}, "size": 1},
                action="probe knn", retry=False)
    except BackendError as e:
        if "not supported" in str(e):
            pytest.skip(f"{name} emulator has no knn query ({str(e)[-60:]}); the request JSON is pinned in "
                        "tests/hybrid/test_hybrid_dsl.py")
        raise


def test_dense_retriever_agrees_with_the_embedded_engine(pair):
    name, b, emb, rep = pair
    if name == "opensearch":
        _skip_without_knn(name, b)
    q = np.array([0.3, -1.0, 0.5, 0.2], np.float32)
    for flt in (None, Term("kind", "photo")):
        req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))], filter=flt, top_k=5)
        opts = HybridOptions("rrf", rrf_k=10, window=10, retrievers=("dense",), server=False)
        c = hybrid_search(b, "stair-dense", req, None, opts, vector=q)
        e = hybrid_search(emb, "stair-dense", req, None, opts, vector=q)
        assert [h.id for h in c.hits] == [h.id for h in e.hits], c.notes
        if flt is not None:
            assert all(h.metadata["kind"] == "photo" for h in c.hits)


def test_three_way_hybrid_agrees_with_the_embedded_engine(pair):
    name, b, emb, rep = pair
    if name == "opensearch":
        _skip_without_knn(name, b)
    q = np.array([1.0, 0.2, -0.3, 0.1], np.float32)
    opts = HybridOptions("rrf", rrf_k=10, window=20, retrievers=("sparse", "bm25", "dense"))
    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0, "beach": 0.5}))], top_k=5)
    c = hybrid_search(b, "stair-dense", req, "dog beach", opts, vector=q, explain=True)
    e = hybrid_search(emb, "stair-dense", SearchRequest(req.clauses, None, 20), "dog beach", opts, vector=q)
    fused = {h.id: h for h in e.hits}
    for h in c.hits:
        assert h.retrievers["dense"]["rank"] == fused[h.id].retrievers["dense"]["rank"]
        assert h.retrievers["sparse"]["rank"] == fused[h.id].retrievers["sparse"]["rank"]
    server = any("by the cluster" in n for n in c.notes)
    # noida-db (Elasticsearch 8.15) runs the rrf retriever with a knn retriever inside it itself
    assert server == (name == "elasticsearch"), c.notes
    assert [fused[h.id].score for h in c.hits] == pytest.approx([h.score for h in e.hits[:5]], rel=2e-2, abs=1e-3)
