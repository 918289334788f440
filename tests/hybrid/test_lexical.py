"""BM25 on the embedded engine: the analyzer, caption matches ranked first, the derived file's
crash safety (a crash or damage while BM25 is written never loses documents, and is rebuilt)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fakes import acked_until_killed
from stair_es import lexical
from stair_es.backends.embedded import EmbeddedBackend
from stair_es.hybrid import HybridOptions, hybrid_search
from stair_es.query import SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector


def test_analyzer_lowercases_drops_stopwords_and_stems():
    assert lexical.analyze("The Running DOGS of the Beach") == ["run", "dog", "beach"]
    assert lexical.analyze("a dog's ball, and cafés!") == ["dog", "ball", "café"]
    assert lexical.analyze("the and of") == []


def test_document_text_is_caption_plus_keyword_metadata():
    t = lexical.document_text("a red car", {"kind": "photo", "tags": ("street", "city"), "year": 2020.0, "ok": True})
    assert t.split("\n") == ["a red car", "photo", "street", "city"]


def _docs():
    v = lambda tm: {"image": SparseVector.from_token_map(tm)}  # noqa: E731
    return [
        Document("car", v({"vehicle": 1.0}), {"kind": "photo"}, "a red sports car parked on a street"),
        Document("dog", v({"dog": 2.0}), {"kind": "photo"}, "a dog running on the beach"),
        Document("cat", v({"cat": 2.0, "dog": 0.5}), {"kind": "drawing"}, "a sleeping cat"),
        Document("cup", v({"cup": 1.0}), {"kind": "photo", "tags": ["coffee"]}, "a cup on a saucer"),
        Document("bare", v({"dog": 0.1})),
    ]


@pytest.fixture
def backend(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("x", IndexSchema())
    rep = be.ingest("x", _docs())
    assert rep.succeeded == 5
    yield be
    be.close()


def test_bm25_ranks_a_caption_match_first(backend):
    ix = backend._reader("x")
    hits = lexical.search_embedded(ix, "sports car", 10)
    assert [s.seg.doc_id(d) for s, d, _ in hits] == ["car"]
    hits = lexical.search_embedded(ix, "dogs run", 10)
    assert [s.seg.doc_id(d) for s, d, _ in hits][0] == "dog"
    # keyword metadata is searchable text too
    assert [s.seg.doc_id(d) for s, d, _ in lexical.search_embedded(ix, "coffee", 10)] == ["cup"]


def test_bm25_scores_match_lucene_formula(backend):
    ix = backend._reader("x")
    bm = lexical.load_or_build(ix)
    row = {ix._segs[p].seg.doc_id(int(d)): i for i, (p, d) in enumerate(zip(bm.seg_pos, bm.local))}
    s = bm.scores("sleeping")
    # one doc of the 4 with text has "sleep"; its text "a sleeping cat" + "drawing" has 3 terms;
    # as in Lucene, the document without text is not counted in N or avgdl
    lens = [len(lexical.analyze(lexical.document_text(ix._segs[p].seg.caption(int(d)), ix._segs[p].seg.metadata(int(d), display=False))))
            for p, d in zip(bm.seg_pos, bm.local)]
    avgdl = sum(lens) / len(lens)
    assert len(lens) == 4 and min(lens) > 0
    idf = np.log(1 + (4 - 1 + 0.5) / (1 + 0.5))
    assert lens[row["cat"]] == 3
    want = idf * 1 / (1 + 1.2 * (1 - 0.75 + 0.75 * 3 / avgdl))
    assert s[row["cat"]] == pytest.approx(want, rel=1e-5)


def test_bm25_honours_the_filter_and_deletes(backend):
    ix = backend._reader("x")
    flt = Term("kind", "drawing").resolve(ix.schema, ix.vocab)
    assert lexical.search_embedded(ix, "car", 10, flt) == []
    backend.delete_documents("x", ["car"])
    ix = backend._reader("x")
    assert lexical.search_embedded(ix, "car", 10) == []


def test_bm25_file_is_checksummed_and_rebuilt_when_damaged(backend, tmp_path):
    ix = backend._reader("x")
    first = [(s.seg.doc_id(d), sc) for s, d, sc in lexical.search_embedded(ix, "a dog on the beach", 10)]
    f = tmp_path / "x" / "lexical" / "bm25.stair"
    assert f.is_file()
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))
    lexical._cache.clear()
    notes: list[str] = []
    again = [(s.seg.doc_id(d), sc) for s, d, sc in lexical.search_embedded(ix, "a dog on the beach", 10, notes=notes)]
    assert again == first
    assert any("rebuilt" in n for n in notes)


def test_a_failed_bm25_write_loses_nothing(backend, tmp_path, monkeypatch):
    import stair_es.engine.storage as storage

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    lexical._cache.clear()
    (tmp_path / "x" / "lexical" / "bm25.stair").unlink(missing_ok=True)
    monkeypatch.setattr(storage, "write_arrays", boom)
    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))], top_k=3)
    res = hybrid_search(backend, "x", req, "beach dog")
    assert res.hits[0].id == "dog"
    assert any("could not be saved" in n for n in res.notes)
    assert backend.index_info("x").doc_count == 5
    assert not (tmp_path / "x" / "lexical" / "bm25.stair").exists()


def test_hybrid_on_an_index_without_text_is_a_clear_error(tmp_path):
    from stair_es.errors import InvalidInputError

    be = EmbeddedBackend(tmp_path)
    be.create_index("y", IndexSchema())
    be.ingest("y", [Document("a", {"image": SparseVector.from_token_map({"dog": 1.0})})])
    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))])
    with pytest.raises(InvalidInputError, match="no text for BM25"):
        hybrid_search(be, "y", req, "dog")


# Ingests batches and runs a hybrid search (which writes the BM25 file) after each one,
# printing each acknowledged batch number after ingest returns.
WRITER = textwrap.dedent(
    """
    import sys
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.hybrid import hybrid_search
    from stair_es.query import SearchRequest, SparseClause
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector
    be = EmbeddedBackend(sys.argv[1])
    be.create_index("x", IndexSchema(), exist_ok=True)
    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))])
    for b in range(200):
        docs = [Document(f"b{b}-{i}", {"image": SparseVector.from_token_map({"dog": 1.0 + i})}, {},
                         f"batch{b} picture {i} of a dog") for i in range(10)]
        be.ingest("x", docs)
        print(b, flush=True)
        hybrid_search(be, "x", req, f"batch{b}")
    """
)


@pytest.mark.process
def test_sigkill_during_bm25_writes_never_loses_acknowledged_documents(tmp_path):
    for delay in (0.3, 0.8, 1.5):
        acked = acked_until_killed(WRITER, [str(tmp_path)], delay)
        assert acked, "the writer acknowledged nothing"
        lexical._cache.clear()
        be = EmbeddedBackend(tmp_path)
        last = acked[-1]
        got = be.existing_ids("x", [f"b{last}-{i}" for i in range(10)])
        assert len(got) == 10
        ix = be._reader("x")
        found = {s.seg.doc_id(d) for s, d, _ in lexical.search_embedded(ix, f"batch{last}", 20)}
        assert found == {f"b{last}-{i}" for i in range(10)}
        req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}))], top_k=10)
        res = hybrid_search(be, "x", req, f"batch{last}")
        # the recovered BM25 side takes part in the fusion (which hit comes first is a tie between the two
        # lists' first hits, 1/61 each, once the sparse window no longer holds the last batch)
        by_bm25 = {h.id for h in res.hits if h.retrievers["bm25"]["rank"] is not None}
        assert len(res.hits) == 10 and by_bm25 and by_bm25 <= {f"b{last}-{i}" for i in range(10)}
        be.close()


def test_a_saved_bm25_file_is_searched_without_bm25s(backend, tmp_path):
    lexical.search_embedded(backend._reader("x"), "dog", 5)  # builds and saves the file
    code = textwrap.dedent(
        """
        import sys
        from stair_es.backends.embedded import EmbeddedBackend
        from stair_es import lexical
        ix = EmbeddedBackend(sys.argv[1])._reader("x")
        hits = lexical.search_embedded(ix, "sports car", 5)
        print(ix._segs[0].seg.doc_id(hits[0][1]), "bm25s" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["car", "False"]
