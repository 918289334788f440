"""EngineIndex: opening, errors, add/update/delete/get, metadata, filters, explain."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.errors import (
    DocumentNotFoundError,
    EmptyQueryError,
    IncompatibleIndexError,
    IndexExistsError,
    IndexNotFoundError,
    InvalidInputError,
    InvalidVectorError,
    UnknownFieldError,
)
from stair_es.query import Exists, HasTokens, Range, SearchRequest, SparseClause, Term, Terms
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector


def vec(**weights: float) -> SparseVector:
    return SparseVector.from_token_map(weights)


def req(field: str = "image", top_k: int = 10, flt=None, **weights: float) -> SearchRequest:
    return SearchRequest([SparseClause(field, vec(**weights))], filter=flt, top_k=top_k)


@pytest.fixture
def ix(tmp_path):
    index = EngineIndex.create(tmp_path / "ix", IndexSchema(fields={"brand": "keyword", "taken": "date"}))
    index.add([
        Document("a", {"image": vec(dog=1.0, cat=0.5)}, {"brand": "acme", "price": 3, "tags": ["red", "big"],
                                                           "taken": "2024-01-02", "sale": True}, "a dog", "a.jpg"),
        Document("b", {"image": vec(dog=2.0), "caption": vec(dog=1.0)}, {"brand": "globex", "price": 10,
                                                                          "taken": "2024-03-01T10:00:00Z"}),
        Document("c", {"image": vec(cat=2.0, beach=1.0)}, {"brand": "acme", "tags": "red", "sale": False}),
        Document("d", {"caption": vec(beach=3.0)}, {}),
    ])
    yield index
    index.close()


def ids(result) -> list[str]:
    return [h.id for h in result.hits]


def test_create_twice_and_open_missing(tmp_path, ix):
    with pytest.raises(IndexExistsError):
        EngineIndex.create(tmp_path / "ix", IndexSchema())
    with pytest.raises(IndexNotFoundError, match="stair-es index create") as e:
        EngineIndex.open(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(e.value)


def test_incompatible_version_names_writer(tmp_path):
    p = tmp_path / "old"
    EngineIndex.create(p, IndexSchema()).close()
    m = json.loads((p / "manifest.json").read_text())
    m["format_version"] = 99
    m["writer"] = "stair_es 9.9.9"
    (p / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IncompatibleIndexError, match=r"format version 99.*stair_es 9\.9\.9.*rebuild"):
        EngineIndex.open(p)
    (p / "manifest.json").write_text("{not json")
    with pytest.raises(IncompatibleIndexError, match="damaged"):
        EngineIndex.open(p)


def test_search_scores_and_stored_fields(ix):
    r = ix.search(req(dog=1.0, cat=1.0))
    assert [h.score for h in r.hits] == [2.0, 2.0, 1.5]
    a = next(h for h in r.hits if h.id == "a")
    assert a.metadata == {"brand": "acme", "price": 3.0, "tags": ["red", "big"], "taken": "2024-01-02", "sale": True}
    assert a.caption == "a dog" and a.source == "a.jpg"
    b = next(h for h in r.hits if h.id == "b")
    assert b.metadata["taken"] == "2024-03-01T10:00:00Z"
    assert r.total == 3


def test_ties_broken_by_insertion_order(ix):
    r = ix.search(req(dog=1.0, cat=1.0))
    # b (dog 2) and c (cat 2) tie at 2.0: b was inserted first
    assert [(h.id, h.score) for h in r.hits] == [("b", 2.0), ("c", 2.0), ("a", 1.5)]


def test_multi_field_clauses_with_weights(ix):
    r = ix.search(SearchRequest([SparseClause("image", vec(dog=1.0)), SparseClause("caption", vec(beach=1.0, dog=1.0), 2.0)]))
    scores = {h.id: h.score for h in r.hits}
    assert scores == {"b": 2.0 + 2.0, "d": 6.0, "a": 1.0}
    assert ids(r) == ["d", "b", "a"]


def test_filters(ix):
    q = dict(dog=1.0, cat=1.0, beach=1.0)
    assert ids(ix.search(req(flt=Term("brand", "acme"), **q))) == ["c", "a"]
    assert ids(ix.search(req(flt=Terms("brand", ["globex", "nope"]), **q))) == ["b"]
    assert ids(ix.search(req(flt=Term("tags", "red"), **q))) == ["c", "a"]
    assert ids(ix.search(req(flt=Term("tags", "big"), **q))) == ["a"]
    assert ids(ix.search(req(flt=Range("price", gte=3, lt=10), **q))) == ["a"]
    assert ids(ix.search(req(flt=Range("taken", gte="2024-02-01"), **q))) == ["b"]
    assert ids(ix.search(req(flt=Term("taken", "2024-01-02"), **q))) == ["a"]
    assert ids(ix.search(req(flt=Term("sale", False), **q))) == ["c"]
    assert ids(ix.search(req(flt=Exists("price"), **q))) == ["b", "a"]
    assert ids(ix.search(req(flt=~Exists("price"), **q))) == ["c"]
    assert ids(ix.search(req(flt=Term("brand", "acme") | Term("price", 10), **q))) == ["c", "b", "a"]
    assert ids(ix.search(req(flt=Term("brand", "acme") & ~Term("tags", "big"), **q))) == ["c"]


def test_token_filters(ix):
    q = dict(dog=1.0, cat=1.0, beach=1.0)
    assert ids(ix.search(req(flt=HasTokens(["cat"]), **q))) == ["c", "a"]
    assert ids(ix.search(req(flt=HasTokens(["cat", "dog"], mode="all"), **q))) == ["a"]
    assert ids(ix.search(req(flt=HasTokens(["cat", "dog"], mode="any"), **q))) == ["c", "b", "a"]
    assert ids(ix.search(req(flt=~HasTokens(["cat"]), **q))) == ["b"]
    assert ids(ix.search(req("caption", flt=HasTokens(["beach"], field="caption"), **q))) == ["d"]


def test_unknown_fields_and_empty_query(ix):
    with pytest.raises(UnknownFieldError):
        ix.search(req(flt=Term("nope", 1), dog=1.0))
    with pytest.raises(UnknownFieldError):
        ix.search(req("nofield", dog=1.0))
    with pytest.raises(EmptyQueryError):
        ix.search(SearchRequest([SparseClause("image", vec(dog=1.0))], drop_tokens=("dog",)))


def test_update_replaces_and_reports(ix):
    res = ix.add([Document("a", {"image": vec(beach=5.0)}, {"brand": "new"}), Document("e", {"image": vec(dog=0.25)})])
    assert [(r.id, r.ok, r.action) for r in res] == [("a", True, "update"), ("e", True, "index")]
    r = ix.search(req(dog=1.0, beach=1.0))
    assert ids(r) == ["a", "b", "c", "e"]
    assert r.hits[0].score == 5.0 and r.hits[0].metadata == {"brand": "new"}
    assert ix.get("a").vectors["image"].to_token_map() == {"beach": 5.0}
    assert ix.stats()["docs"] == 5


def test_per_document_errors_do_not_fail_the_batch(ix):
    res = ix.add([
        Document("x", {"image": vec(dog=1.0)}, {"brand": 5}),  # keyword field given a number
        Document("y", {"nofield": vec(dog=1.0)}),
        Document("z", {"image": vec(dog=1.0)}, {"price": 1, "newfield": "v"}),
    ])
    assert [(r.id, r.ok) for r in res] == [("x", False), ("y", False), ("z", True)]
    assert "keyword" in res[0].error and "nofield" in res[1].error
    assert ix.schema.fields["newfield"] == "keyword"
    assert ix.contains(["x", "y", "z"]) == {"z"}
    reopened = EngineIndex.open(ix.path)
    assert reopened.schema.fields["newfield"] == "keyword"


def test_delete_and_get(ix):
    res = ix.delete(["a", "missing"])
    assert [(r.id, r.ok) for r in res] == [("a", True), ("missing", False)]
    assert "missing" in res[1].error
    with pytest.raises(DocumentNotFoundError):
        ix.get("a")
    assert "a" not in ids(ix.search(req(dog=1.0, cat=1.0)))
    doc = ix.get("b")
    assert doc.vectors["image"].to_token_map() == {"dog": 2.0}
    assert doc.vectors["caption"].to_token_map() == {"dog": 1.0}
    assert doc.metadata["brand"] == "globex"
    assert ix.stats()["deleted"] == 1 and ix.stats()["docs"] == 3


def test_explain_sums_to_search_score(ix):
    r = SearchRequest([SparseClause("image", vec(dog=0.3, cat=0.7)), SparseClause("caption", vec(dog=1.1), 1.5)])
    hits = ix.search(r).hits
    for h in hits:
        e = ix.explain(h.id, r)
        assert e.score == h.score
        assert e.total == pytest.approx(h.score, rel=1e-6)
        assert e.matched_filter
    e = ix.explain("b", r)
    assert {(c.field, c.token) for c in e.contributions} == {("image", "dog"), ("caption", "dog")}
    cap = next(c for c in e.contributions if c.field == "caption")
    assert cap.query_weight == pytest.approx(1.1 * 1.5, rel=1e-6) and cap.doc_weight == 1.0
    e = ix.explain("b", SearchRequest(r.clauses, filter=Term("brand", "acme")))
    assert not e.matched_filter


def test_float16_storage_precision(tmp_path):
    ix = EngineIndex.create(tmp_path / "p", IndexSchema())
    ix.add([Document("a", {"image": vec(dog=0.123456789)})])
    w = ix.get("a").vectors["image"].weights[0]
    assert w == np.float32(np.float16(0.123456789))
    assert abs(w - 0.123456789) / 0.123456789 < 2**-11
    ix.close()


def test_add_arrays_fast_path(tmp_path):
    ix = EngineIndex.create(tmp_path / "arr", IndexSchema())
    indptr = np.array([0, 2, 2, 3])
    tok = np.array([2000, 3000, 2500], np.int32)
    w = np.array([1.0, 0.5, 2.0], np.float32)
    assert ix.add_arrays(["p", "q", "r"], {"image": (indptr, tok, w)}, [{"n": 1}, None, {"n": 2}]) == 3
    assert ix.get("r").vectors["image"].ids.tolist() == [2500]
    assert ix.get("p").metadata == {"n": 1.0}
    q = SearchRequest([SparseClause("image", SparseVector.from_arrays([2000, 2500], [1.0, 1.0]))])
    assert [h.id for h in ix.search(q).hits] == ["r", "p"]
    with pytest.raises(InvalidVectorError, match="sorted"):
        ix.add_arrays(["s"], {"image": (np.array([0, 2]), np.array([4000, 3500]), np.array([1.0, 1.0]))})
    with pytest.raises(InvalidVectorError, match="special"):
        ix.add_arrays(["s"], {"image": (np.array([0, 1]), np.array([0]), np.array([1.0]))})
    with pytest.raises(InvalidVectorError, match="finite"):
        ix.add_arrays(["s"], {"image": (np.array([0, 1]), np.array([2000]), np.array([np.nan]))})
    with pytest.raises(InvalidInputError):
        ix.add_arrays(["s", "s"], {"image": (np.array([0, 0, 0]), np.zeros(0), np.zeros(0))})
    assert ix.contains(["s", "p"]) == {"p"}
    ix.close()


def _one_token_each(n: int, token: int = 2000):
    return {"image": (np.arange(n + 1, dtype=np.int64), np.full(n, token, np.int32), np.arange(1, n + 1, dtype=np.float32))}


def test_add_arrays_takes_metadata_as_columns(tmp_path):
    """Bulk metadata as one array per field (a DataFrame's columns): typed once per column,
    NaN = missing in a float column, filters see the values, get() gives them back."""
    ix = EngineIndex.create(tmp_path / "cols", IndexSchema(fields={"shot": "date"}))
    ids = ["a", "b", "c", "d"]
    cols = {
        "price": np.array([10.0, np.nan, 30.0, 40.0]),
        "stock": np.array([3, 0, 7, 1], np.int32),
        "sale": np.array([True, False, True, False]),
        "shot": np.array(["2024-01-01", "2024-06-01", "NaT", "2025-01-01"], "datetime64[ms]"),
        "brand": ["acme", float("nan"), ["acme", "zeta"], "zeta"],  # NaN: pandas' missing string
    }
    assert ix.add_arrays(ids, _one_token_each(4), columns=cols) == 4
    assert ix.schema.fields == {"shot": "date", "price": "number", "stock": "number", "sale": "boolean", "brand": "keyword"}
    assert ix.get("b").metadata == {"stock": 0.0, "sale": False, "shot": "2024-06-01"}
    assert ix.get("c").metadata["brand"] == ["acme", "zeta"] and "shot" not in ix.get("c").metadata

    def hits(flt):
        q = SearchRequest([SparseClause("image", SparseVector.from_arrays([2000], [1.0]))], filter=flt)
        return sorted(h.id for h in ix.search(q).hits)

    assert hits(Range("price", gte=20)) == ["c", "d"]
    assert hits(Exists("price")) == ["a", "c", "d"]
    assert hits(Term("sale", True)) == ["a", "c"]
    assert hits(Term("brand", "zeta")) == ["c", "d"]
    assert hits(Range("shot", lt="2024-12-31")) == ["a", "b"]
    # per-document dicts and columns together, for different fields
    ix.add_arrays(["e"], _one_token_each(1), [{"brand": "acme"}], columns={"price": np.array([5.0])})
    assert ix.get("e").metadata == {"brand": "acme", "price": 5.0}
    ix.close()


def test_add_arrays_refuses_bad_metadata_naming_the_document(tmp_path):
    ix = EngineIndex.create(tmp_path / "bad", IndexSchema(fields={"price": "number"}))
    cases = [
        ({"columns": {"price": np.array([1.0, np.inf])}}, "'y'.*finite"),
        ({"columns": {"price": [1.0, "cheap"]}}, "'y'.*number field"),
        ({"metadata": [{"price": 1.0}, {"price": float("nan")}]}, "'y'.*finite"),  # NaN is "missing" only in columns
        ({"columns": {"price": np.array([True, False])}}, "number field"),
        ({"columns": {"price": np.array([1.0])}}, "1 values for 2 ids"),
        ({"metadata": [{"price": 1}, {"price": "x"}]}, "'y'.*number field"),
        ({"metadata": [{"price": 1}, "price=2"]}, "'y'.*JSON object"),
        ({"metadata": [{"id": 1}, None]}, "reserved"),
        ({"metadata": [{"brand": "a"}, {"brand": 3}]}, "'y'.*keyword field"),
        ({"metadata": [{"price": 1.0}, None], "columns": {"price": np.array([2.0, 3.0])}}, "both per document and as a column"),
        ({"columns": {"brand": ["ok", "\ud800"]}}, "'y'.*not valid Unicode"),
    ]
    for kwargs, why in cases:
        with pytest.raises(InvalidInputError, match=why):
            ix.add_arrays(["x", "y"], _one_token_each(2), **kwargs)
    assert ix.doc_count == 0 and ix.schema.fields == {"price": "number"}  # nothing written, no field added
    with pytest.raises(InvalidVectorError, match="'y'.*above 65504"):
        ix.add_arrays(["x", "y"], {"image": (np.array([0, 1, 2]), np.array([2000, 2000], np.int32), np.array([1.0, 7e4], np.float32))})
    for bad_id in ["", "a\nb", "x" * 513, "\ud800", 7]:
        with pytest.raises(InvalidInputError, match="document id"):
            ix.add_arrays(["ok", bad_id], _one_token_each(2))
    ix.close()


def test_add_arrays_drops_weights_too_small_for_fp16(tmp_path):
    """A weight that rounds to fp16 zero is not indexed, as a zero is not: the document keeps
    its other tokens and the rows after it stay aligned."""
    ix = EngineIndex.create(tmp_path / "tiny", IndexSchema())
    indptr = np.array([0, 2, 3, 5])
    tok = np.array([2000, 2001, 2002, 2003, 2004], np.int32)
    w = np.array([1e-9, 1.0, 0.0, 2.0, 3.0], np.float32)
    ix.add_arrays(["a", "b", "c"], {"image": (indptr, tok, w)})
    assert ix.get("a").vectors["image"].ids.tolist() == [2001]
    assert ix.get("b").vectors.get("image") is None or ix.get("b").vectors["image"].nnz == 0
    assert ix.get("c").vectors["image"].ids.tolist() == [2003, 2004]
    ix.close()


def test_doc_freqs_and_stats(ix):
    df, n = ix.doc_freqs("image")
    v = ix.vocab
    assert n == 4 and df[v.id("dog")] == 2 and df[v.id("cat")] == 2 and df[v.id("beach")] == 1
    ix.delete(["a"])
    df, n = ix.doc_freqs("image")
    assert n == 3 and df[v.id("dog")] == 1
    st = ix.stats()
    assert st["postings_per_field"] == {"image": 5, "caption": 2}
    assert st["bytes_on_disk"] > 0 and st["segments"] >= 1


def test_stats_while_a_writer_renames_its_temporary_files(ix, monkeypatch):
    """Another process's temporary segment file may vanish between the listing and its size
    (a reader's stats() failed with FileNotFoundError while an ingest ran)."""
    real = type(ix.path).iterdir

    class Vanishing(type(ix.path)):  # listed as a file, gone by the time its size is read
        def is_file(self):
            return True

        def stat(self, **kwargs):
            raise FileNotFoundError(2, "No such file or directory", str(self))

    def listing_with_a_vanished_file(self):
        yield Vanishing(self / ".tmp-seg-000099.seg.gone")
        yield from real(self)

    monkeypatch.setattr(type(ix.path), "iterdir", listing_with_a_vanished_file)
    assert ix.stats()["bytes_on_disk"] > 0


def test_read_only_handle_refuses_writes(ix):
    r = EngineIndex.open(ix.path)
    with pytest.raises(InvalidInputError, match="read-only"):
        r.add([Document("zz", {"image": vec(dog=1.0)})])
    r.close()


def test_segments_never_outgrow_their_block_numbers(tmp_path):
    """Block numbers are 16-bit: with 2-document blocks a segment holds 131,072 documents, so a
    larger batch is cut into several segments and optimize packs them without going round in
    circles; the last documents are still found."""
    from stair_es.engine.segment import segment_capacity

    cap = segment_capacity(1)
    assert cap == 131072
    n = cap + 5000
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(), bshift=1)
    ids = np.full(n, 2000, np.int64)
    ids[-1] = 2001  # a token only the very last document has
    ix.add_arrays([f"d{i}" for i in range(n)], {"image": (np.arange(n + 1, dtype=np.int64), ids, np.ones(n, np.float32))})
    assert ix.stats()["segments"] == 2
    ix.delete(["d0"])
    ix.optimize()  # the two cannot be merged into one: each is rewritten within its capacity
    st = ix.stats()
    assert st["segments"] == 2 and st["deleted"] == 0 and st["docs"] == n - 1
    res = ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays([2001], [1.0]))], top_k=3))
    assert [h.id for h in res.hits] == [f"d{n - 1}"]
    ix.close()
