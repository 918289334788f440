"""The real elasticsearch / opensearch-py clients against a fake node: behaviour and faults.

Every fault test asserts the user-visible contract: after ingest, every document reported ok
is in the index, every failure is reported with its id and reason, nothing else is missing.
"""

import numpy as np
import pytest

from stair_es.backends.base import get_backend
from stair_es.errors import (
    DocumentNotFoundError,
    EmptyQueryError,
    IncompatibleIndexError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidInputError,
)
from stair_es.query import HasTokens, Not, Range, SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

from .fake_cluster import FakeCluster, Faults

VOCAB = default_vocabulary()
FAST = dict(backoff=0.01, backoff_max=0.05, timeout=2)


def corpus(n, seed=0, nnz=12):
    rng = np.random.default_rng(seed)
    ok = np.flatnonzero(~VOCAB.special_mask)
    docs = []
    for i in range(n):
        ids = rng.choice(ok, nnz, replace=False)
        w = rng.pareto(2.0, nnz) + 0.05
        docs.append(Document(f"d{i:04d}", {"image": SparseVector.from_arrays(ids, w)},
                             {"brand": ["acme", "globex", "initech"][i % 3], "price": float(i % 50)},
                             caption=f"item {i}", source=f"img/{i}.jpg"))
    return docs


def backend(c, **kw):
    return get_backend(c.flavor, urls=c.url, **{**FAST, **kw})


def test_round_trip_search_explain_get(fake):
    b = backend(fake)
    b.create_index("cat", IndexSchema(fields={"brand": "keyword"}))
    docs = corpus(60)
    rep = b.ingest("cat", docs)
    assert rep.summary()["ok"] == 60 and not rep.failures
    assert b.index_info("cat").doc_count == 60
    assert b.index_info("cat").schema.fields == {"brand": "keyword", "price": "number"}
    q = docs[3].vectors["image"].prune(top_k=5)
    res = b.search("cat", SearchRequest([SparseClause("image", q, 2.0)], filter=Range("price", lte=40), top_k=5))
    assert res.hits[0].id == "d0003"
    assert res.hits[0].metadata["brand"] == "acme" and res.hits[0].caption == "item 3" and res.hits[0].source == "img/3.jpg"
    ex = b.explain("cat", "d0003", SearchRequest([SparseClause("image", q, 2.0)]))
    assert ex.score == pytest.approx(ex.total, rel=1e-5)
    assert ex.score == pytest.approx(res.hits[0].score, rel=1e-5)
    assert any("9 significant bits" in n for n in ex.notes)
    got = b.get("cat", "d0003")
    assert got.vectors["image"] == docs[3].vectors["image"] and got.metadata["price"] == 3.0
    with pytest.raises(DocumentNotFoundError):
        b.get("cat", "nope")
    assert b.existing_ids("cat", ["d0001", "zz", "d0059"]) == {"d0001", "d0059"}
    rep = b.delete_documents("cat", ["d0001", "zz"])
    assert [i.ok for i in rep.items] == [True, False] and "not found" in rep.items[1].error
    assert b.list_indices() == ["cat"]
    b.delete_index("cat")
    with pytest.raises(IndexNotFoundError):
        b.index_info("cat")


def test_index_errors(fake):
    b = backend(fake)
    b.create_index("a", IndexSchema())
    with pytest.raises(IndexExistsError, match="already exists on http://.*; delete it first or pick another name"):
        b.create_index("a", IndexSchema())
    b.create_index("a", IndexSchema(), exist_ok=True)
    with pytest.raises(IncompatibleIndexError):
        b.create_index("a", IndexSchema(sparse_fields=("image",)), exist_ok=True)
    b.adapter.request(b.client, "PUT", "/theirs", {"mappings": {"properties": {"x": {"type": "keyword"}}}})
    with pytest.raises(IncompatibleIndexError, match="not created by stair_es"):
        b.search("theirs", SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))]))
    # a missing index says how to make it, whichever request found it missing
    make_it = r"index 'missing' does not exist on http://\S+; create it with `stair-es ingest missing SOURCE` or `stair-es index create missing`"
    with pytest.raises(IndexNotFoundError, match=make_it):
        b.ingest("missing", corpus(1))
    with pytest.raises(IndexNotFoundError, match=make_it):
        b.index_info("missing")
    with pytest.raises(IndexNotFoundError, match=make_it):
        b.delete_index("missing")
    with pytest.raises(InvalidInputError, match="invalid index name"):
        b.create_index("Bad Name", IndexSchema())


def test_filters_whitelist_blacklist(fake):
    b = backend(fake)
    b.create_index("f", IndexSchema())
    docs = [
        Document("a", {"image": SparseVector.from_token_map({"dog": 1.0, "beach": 1.0})}, {"brand": "x"}),
        Document("b", {"image": SparseVector.from_token_map({"dog": 2.0, "cat": 1.0})}, {"brand": "y"}),
        Document("c", {"image": SparseVector.from_token_map({"dog": 0.5, ".": 3.0})}, {"brand": "x"}),
    ]
    b.ingest("f", docs)
    q = SparseVector.from_token_map({"dog": 1.0, ".": 1.0})
    ids = lambda flt: [h.id for h in b.search("f", SearchRequest([SparseClause("image", q)], filter=flt)).hits]  # noqa: E731
    assert ids(None) == ["c", "b", "a"]
    assert ids(Term("brand", "x")) == ["c", "a"]
    assert ids(HasTokens(["beach", "cat"])) == ["b", "a"]
    assert ids(Not(HasTokens(["cat"]))) == ["c", "a"]
    assert ids(HasTokens(["dog", "."], mode="all")) == ["c"]
    with pytest.raises(EmptyQueryError):
        b.search("f", SearchRequest([SparseClause("image", q)], drop_tokens=("dog", ".")))


def test_bad_documents_are_reported_not_dropped(fake):
    b = backend(fake)
    b.create_index("bad", IndexSchema(fields={"price": "number"}))
    docs = corpus(10)
    docs[2].metadata["price"] = "cheap"
    docs[5].caption = "POISON"  # the cluster rejects it permanently
    docs[7] = Document("d0007", {"image": SparseVector.empty()})
    rep = b.ingest("bad", docs)
    failed = {i.id: i.error for i in rep.failures}
    assert set(failed) == {"d0002", "d0005", "d0007"}
    assert "number field" in failed["d0002"] and "HTTP 400" in failed["d0005"] and "no non-zero" in failed["d0007"]
    assert set(fake.docs("bad")) == {d.id for d in docs} - set(failed)


def run_faulty_ingest(flavor, faults, n=300, **kw):
    with FakeCluster(flavor, faults=faults) as c:
        b = backend(c, chunk_docs=kw.pop("chunk_docs", 50), **kw)
        b.create_index("cat", IndexSchema(fields={"brand": "keyword"}))
        docs = corpus(n, seed=1)
        batches = []
        rep = b.ingest("cat", docs, on_batch=batches.append)
        stored = c.docs("cat")
        ok = {i.id for i in rep.items if i.ok}
        return rep, ok, stored, c.counts, b.stats, batches, docs


@pytest.mark.parametrize("faults", [
    Faults(seed=1, bulk_status={429: 0.6}),  # 429 storm
    Faults(seed=2, bulk_status={503: 0.4, 502: 0.1, 504: 0.1}),
    Faults(seed=3, item_429=0.3),  # partial bulk failures
    Faults(seed=4, drop=0.5),  # dropped connections after the write
    Faults(seed=10, drop=0.5, drop_after_apply=False),  # dropped before the write
    Faults(seed=6, slow=0.5, slow_seconds=1.5),  # slower than the client timeout
], ids=["429-storm", "5xx", "partial-429", "drop-after-write", "drop-before-write", "slow"])
def test_ingest_survives_faults_and_loses_nothing(flavor, faults):
    rep, ok, stored, counts, stats, batches, docs = run_faulty_ingest(flavor, faults, timeout=1.0, max_retries=12)
    assert counts["faults"] > 0
    assert not rep.failures, rep.failures[:3]
    assert ok == set(stored) == {d.id for d in docs}
    assert sum(len(b) for b in batches) == len(docs)
    from stair_es.backends.codec import feature_map

    for d in docs[:20]:  # what the cluster holds is each document's own token weights, once, unaltered by retries
        assert stored[d.id]["image"] == feature_map(d.vectors["image"])
    assert stats["retried_items"] > 0


def test_only_failed_items_are_resent():
    faults = Faults(seed=7, item_429=0.2)
    rep, ok, stored, counts, stats, _, docs = run_faulty_ingest("elasticsearch", faults, n=200, chunk_docs=200)
    assert not rep.failures
    # one round of 200 + retries of roughly 20% then 4%...: far fewer than re-sending whole chunks
    assert counts["item_faults"] == stats["retried_items"]
    assert stats["retried_items"] < 100


def test_giving_up_reports_exactly_what_failed():
    faults = Faults(seed=8, bulk_status={503: 1.0}, max_faulty_requests=None)
    rep, ok, stored, counts, stats, _, docs = run_faulty_ingest("opensearch", faults, n=30, max_retries=2)
    assert not ok and not stored
    assert len(rep.failures) == 30 and {i.id for i in rep.failures} == {d.id for d in docs}
    assert all("gave up after 3 attempts" in i.error and "503" in i.error for i in rep.failures)


def test_search_retries_on_429(flavor):
    with FakeCluster(flavor, faults=Faults(seed=9, search_status={429: 0.5}, max_faulty_requests=3)) as c:
        b = backend(c, max_retries=5)
        b.create_index("s", IndexSchema())
        b.ingest("s", corpus(5))
        for _ in range(6):
            res = b.search("s", SearchRequest([SparseClause("image", corpus(5)[0].vectors["image"])]))
            assert res.hits[0].id == "d0000"
        assert c.counts["status_faults"] == 3


def test_clause_limit_is_respected(fake):
    b = backend(fake, max_clauses=10)
    b.create_index("c", IndexSchema())
    b.ingest("c", corpus(5, nnz=30))
    res = b.search("c", SearchRequest([SparseClause("image", corpus(5, nnz=30)[0].vectors["image"])]))
    assert res.hits[0].id == "d0000"
    assert any("clause limit of 10" in n for n in res.notes)


def test_metadata_named_source_does_not_clash_with_the_image_path(fake):
    b = backend(fake)
    b.create_index("m", IndexSchema())
    b.ingest("m", [Document("a", {"image": SparseVector.from_token_map({"dog": 1.0})}, {"source": "skimage"},
                            source="img/a.jpg")])
    hit = b.search("m", SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))],
                                      filter=Term("source", "skimage"))).hits[0]
    assert hit.source == "img/a.jpg" and hit.metadata == {"source": "skimage"}


def test_bulk_over_the_size_limit_is_split_and_a_too_large_document_reported(flavor):
    docs = corpus(40, nnz=40)
    big = Document("huge", {"image": SparseVector.from_arrays(np.flatnonzero(~VOCAB.special_mask)[:3000],
                                                             np.ones(3000))})
    with FakeCluster(flavor, faults=Faults(max_bulk_bytes=20_000)) as c:
        b = backend(c, chunk_docs=40, max_retries=8)
        b.create_index("cat", IndexSchema())
        rep = b.ingest("cat", docs + [big])
        assert {i.id for i in rep.failures} == {"huge"}
        assert "413" in rep.failures[0].error
        assert set(c.docs("cat")) == {d.id for d in docs}
