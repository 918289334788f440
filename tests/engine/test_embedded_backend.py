"""EmbeddedBackend: index naming, handle caching, ingest batches, the backend protocol."""

from __future__ import annotations

import pytest

from stair_es.backends.base import get_backend
from stair_es.backends.embedded import EmbeddedBackend
from stair_es.errors import IndexExistsError, IndexNotFoundError, InvalidInputError
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector


def doc(i: int) -> Document:
    return Document(f"d{i}", {"image": SparseVector.from_token_map({"dog": 1.0 + i, "cat": 0.5})}, {"n": i})


def test_protocol_round_trip(tmp_path):
    be = get_backend("embedded", home=tmp_path)
    assert isinstance(be, EmbeddedBackend)
    be.create_index("photos", IndexSchema())
    be.create_index("photos", IndexSchema(), exist_ok=True)
    with pytest.raises(IndexExistsError):
        be.create_index("photos", IndexSchema())
    batches = []
    be.batch_size = 4
    rep = be.ingest("photos", (doc(i) for i in range(10)), on_batch=batches.append)
    summary = rep.summary()
    assert (summary["ok"], summary["failed"], summary["total"]) == (10, 0, 10)
    assert [len(b) for b in batches] == [4, 4, 2]
    assert be.list_indices() == ["photos"]
    info = be.index_info("photos")
    assert info.doc_count == 10 and info.size_bytes > 0 and info.extra["segments"] >= 1
    q = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))], top_k=3)
    assert [h.id for h in be.search("photos", q).hits] == ["d9", "d8", "d7"]
    assert be.explain("photos", "d9", q).score == 10.0
    assert be.get("photos", "d3").metadata == {"n": 3.0}
    assert be.existing_ids("photos", ["d1", "x"]) == {"d1"}
    rep = be.delete_documents("photos", ["d1", "x"])
    assert [i.ok for i in rep.items] == [True, False]
    df, n = be.doc_freqs("photos", "image")
    assert n == 9
    # a second backend (another process in real life) reads without blocking the writer
    other = EmbeddedBackend(tmp_path)
    assert other.index_info("photos").doc_count == 9
    be.ingest("photos", [doc(20)])
    assert other.index_info("photos").doc_count == 10
    other.close()
    be.delete_index("photos")
    assert be.list_indices() == []
    be.close()


def test_names_and_missing_indices(tmp_path, monkeypatch):
    be = EmbeddedBackend(tmp_path)
    for bad in ("Photos", "a b", "../x", "", "-x"):
        with pytest.raises(InvalidInputError, match="lowercase"):
            be.create_index(bad, IndexSchema())
    with pytest.raises(IndexNotFoundError, match="stair-es index create nope"):
        be.search("nope", SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))]))
    monkeypatch.setenv("STAIR_ES_HOME", str(tmp_path / "home"))
    assert EmbeddedBackend().home == tmp_path / "home"
