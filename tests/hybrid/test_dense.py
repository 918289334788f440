"""Dense vectors in hybrid search on the embedded engine: stored beside the segments, consistent
with updates, deletes, merges and crashes, searched exactly, fused with the other retrievers
exactly as a brute-force fusion computed here; clear errors for bad vectors and indices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stair_es.backends.embedded import EmbeddedBackend
from stair_es.dense import DenseSpec, DenseStore, read_spec, view_of
from stair_es.errors import DamagedIndexError, InvalidInputError, InvalidVectorError
from stair_es.hybrid import HybridOptions, hybrid_search
from stair_es.lexical import BM25Index, document_text
from stair_es.query import SearchRequest, SparseClause
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

DIMS = 8
WORDS = ["dog", "cat", "car", "tree", "boat", "house", "bird", "red", "blue", "green"]


def _corpus(n=60, seed=0):
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        toks = rng.choice(len(WORDS), size=3, replace=False)
        # weights on a 1/4 grid: exact in float16, so the engine's scores equal the ones computed here
        tmap = {WORDS[t]: float(rng.integers(1, 12)) / 4 for t in toks}
        caption = " ".join(WORDS[t] for t in rng.choice(len(WORDS), size=4))
        docs.append((f"d{i:03d}", tmap, caption, rng.standard_normal(DIMS).astype(np.float32)))
    return docs


def _unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v.astype(np.float64))


def _ranked(scores: dict[str, float], window: int) -> list[str]:
    """Best first, ties by id order of insertion (the test inserts in id order)."""
    items = [(i, s) for i, s in scores.items() if s is not None]
    return [i for i, _ in sorted(items, key=lambda kv: (-kv[1], kv[0]))][:window]


def _ref_rrf(lists: dict[str, list[str]], k: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for ids in lists.values():
        for r, i in enumerate(ids, start=1):
            out[i] = out.get(i, 0.0) + 1.0 / (k + r)
    return out


def _ref_linear(lists: dict[str, list[str]], scores: dict[str, dict[str, float]], weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    out: dict[str, float] = {}
    for name, ids in lists.items():
        vals = [scores[name][i] for i in ids]
        lo, hi = min(vals), max(vals)
        for i, v in zip(ids, vals):
            norm = 1.0 if hi == lo else (v - lo) / (hi - lo)
            out[i] = out.get(i, 0.0) + weights[name] / total * norm
    return out


@pytest.fixture
def setup(tmp_path):
    be = EmbeddedBackend(tmp_path / "home")
    be.create_index("shop", IndexSchema(dense=DenseSpec(DIMS, "cosine", "float32").to_dict()))
    docs = _corpus()
    rep = be.ingest("shop", [Document(i, {"image": SparseVector.from_token_map(t)}, {}, c, None, v)
                             for i, t, c, v in docs])
    assert rep.summary()["failed"] == 0
    yield be, {i: (t, c, v) for i, t, c, v in docs}
    be.close()


def _dense(res):
    """(id, the dense retriever's own score) per hit (a hit's ``score`` is the fused one)."""
    return [(h.id, h.retrievers["dense"]["score"]) for h in res.hits]


def _request(qmap, top_k=10):
    return SearchRequest([SparseClause("image", SparseVector.from_token_map(qmap), 1.0)], top_k=top_k)


def _brute(docs, qmap, text, qvec, window):
    """Each retriever's top ``window`` computed here, from the documents as given."""
    sparse = {i: sum(w * t.get(tok, 0.0) for tok, w in qmap.items()) for i, (t, _, _) in docs.items()}
    sparse = {i: s for i, s in sparse.items() if s > 0}
    q = _unit(qvec)
    dense = {i: float(_unit(v) @ q) for i, (_, _, v) in docs.items()}
    ids = list(docs)
    bm = BM25Index.build([document_text(docs[i][1], {}) for i in ids], np.zeros(len(ids)), np.arange(len(ids)), ())
    s = bm.scores(text)
    bm25 = {ids[r]: float(s[r]) for r in range(len(ids)) if s[r] > 0}
    scores = {"sparse": sparse, "bm25": bm25, "dense": dense}
    return {n: _ranked(v, window) for n, v in scores.items()}, scores


def test_three_way_rrf_equals_a_brute_force_fusion(setup):
    be, docs = setup
    qmap, text, qvec = {"dog": 1.0, "red": 0.5}, "a blue boat", np.arange(DIMS, dtype=np.float32) - 3
    window, k = 20, 60
    opts = HybridOptions("rrf", k, window=window, retrievers=("sparse", "bm25", "dense"))
    res = hybrid_search(be, "shop", _request(qmap, 10), text, opts, vector=qvec)
    lists, _ = _brute(docs, qmap, text, qvec, window)
    ref = _ref_rrf(lists, k)
    assert [h.id for h in res.hits] == sorted(ref, key=lambda i: (-ref[i], min(
        lists[n].index(i) for n in lists if i in lists[n]), i))[:10]
    for h in res.hits:
        assert h.score == pytest.approx(ref[h.id])
        for name in ("sparse", "bm25", "dense"):
            want = lists[name].index(h.id) + 1 if h.id in lists[name] else None
            assert h.retrievers[name]["rank"] == want
    top = res.hits[0]
    assert top.retrievers["dense"]["score"] == pytest.approx(float(_unit(docs[top.id][2]) @ _unit(qvec)), abs=1e-5)
    assert any("dense vectors" in n and "RRF (k=60)" in n for n in res.notes)


def test_linear_sparse_dense_equals_a_brute_force_fusion(setup):
    be, docs = setup
    qmap, qvec = {"cat": 1.0, "tree": 0.75}, np.ones(DIMS, np.float32)
    opts = HybridOptions("linear", weights=(0.3, 0.7), window=15, retrievers=("sparse", "dense"))
    res = hybrid_search(be, "shop", _request(qmap, 8), None, opts, vector=qvec)
    lists, scores = _brute(docs, qmap, "", qvec, 15)
    lists = {n: lists[n] for n in ("sparse", "dense")}
    ref = _ref_linear(lists, scores, {"sparse": 0.3, "dense": 0.7})
    got = {h.id: h.score for h in res.hits}
    best = sorted(ref.values(), reverse=True)[:8]
    assert sorted(got.values(), reverse=True) == pytest.approx(best, abs=1e-5)
    for i, s in got.items():
        assert s == pytest.approx(ref[i], abs=1e-5)


def test_dense_alone_is_the_exact_cosine_ranking_and_respects_the_filter(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("f", IndexSchema(dense=DenseSpec(DIMS, "cosine", "float16").to_dict()))
    docs = _corpus(40, seed=5)
    be.ingest("f", [Document(i, {"image": SparseVector.from_token_map(t)}, {"half": "a" if n % 2 else "b"}, c, None, v)
                    for n, (i, t, c, v) in enumerate(docs)])
    q = np.linspace(-1, 1, DIMS).astype(np.float32)
    from stair_es.query import Term

    req = SearchRequest([SparseClause("image", SparseVector.from_token_map({"dog": 1.0}), 1.0)], top_k=5,
                        filter=Term("half", "a"))
    res = hybrid_search(be, "f", req, None, HybridOptions(retrievers=("dense",), window=10), vector=q)
    # stored as float16: the reference rounds the unit vectors the same way
    ref = {i: float(_unit(v).astype(np.float16).astype(np.float32) @ _unit(q))
           for n, (i, _, _, v) in enumerate(docs) if n % 2}
    assert [h.id for h in res.hits] == _ranked(ref, 5)
    assert all(h.metadata["half"] == "a" for h in res.hits)


def test_updates_deletes_merges_and_reopening_keep_vectors_consistent(setup, tmp_path):
    be, docs = setup
    q = np.zeros(DIMS, np.float32)
    q[0] = 1.0
    opts = HybridOptions(retrievers=("dense",), window=10)
    target = np.zeros(DIMS, np.float32)
    target[0] = 5.0
    # an update gives d010 the query's direction: it comes first; its old vector is no longer used
    be.ingest("shop", [Document("d010", {"image": SparseVector.from_token_map({"dog": 1.0})}, {}, "dog", None, target)])
    hits = hybrid_search(be, "shop", _request({"dog": 1.0}), None, opts, vector=q).hits
    assert hits[0].id == "d010" and hits[0].retrievers["dense"]["score"] == pytest.approx(1.0, abs=1e-6)
    be.delete_documents("shop", ["d010"])
    hits = hybrid_search(be, "shop", _request({"dog": 1.0}), None, opts, vector=q).hits
    assert "d010" not in [h.id for h in hits]
    before = [(h.id, round(h.retrievers["dense"]["score"], 6)) for h in hits]
    be.optimize("shop")  # merging renumbers documents inside segments: seqs keep vectors attached
    after = [(i, round(s, 6)) for i, s in _dense(hybrid_search(be, "shop", _request({"dog": 1.0}), None, opts, vector=q))]
    assert after == before
    assert be.get("shop", "d011").dense == pytest.approx(_unit(docs["d011"][2]), abs=1e-6)
    be2 = EmbeddedBackend(be.home)  # another process's view, from disk
    assert [(i, round(s, 6)) for i, s in _dense(hybrid_search(be2, "shop", _request({"dog": 1.0}), None, opts, vector=q))] == before
    be2.close()


def test_compaction_drops_dead_vectors_and_keeps_live_ones(tmp_path):
    be = EmbeddedBackend(tmp_path, batch_size=10)
    be.create_index("c", IndexSchema(dense=DenseSpec(4, "dot_product", "float32").to_dict()))
    rng = np.random.default_rng(1)
    vecs = {}
    for rnd in range(4):  # the same 30 ids re-ingested 4 times: 3 of 4 stored vectors become dead
        batch = []
        for i in range(30):
            v = rng.standard_normal(4).astype(np.float32)
            vecs[f"x{i}"] = v
            batch.append(Document(f"x{i}", {"image": SparseVector.from_token_map({"dog": 1.0})}, {}, None, None, v))
        be.ingest("c", batch)
    ix = be._reader("c")
    store = DenseStore(ix.path, read_spec(ix.path))
    assert store.maybe_compact(be._writer("c"), force=True)
    assert len(store.parts()) == 1
    q = np.array([1, 0, 0, 0], np.float32)
    res = hybrid_search(be, "c", _request({"dog": 1.0}, 30), None, HybridOptions(retrievers=("dense",), window=30), vector=q)
    assert dict(_dense(res)) == pytest.approx({i: float(v @ q) for i, v in vecs.items()}, abs=1e-5)


def test_a_crash_before_or_after_the_engine_commit_never_mixes_vectors(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("k", IndexSchema(dense=DenseSpec(2, "dot_product", "float32").to_dict()))
    be.ingest("k", [Document("a", {"image": SparseVector.from_token_map({"dog": 1.0})}, {}, None, None, [1.0, 0.0])])
    ix = be._writer("k")
    store = DenseStore(ix.path, read_spec(ix.path))
    q = np.array([0.0, 1.0], np.float32)
    opts = HybridOptions(retrievers=("dense",), window=10)

    # crash before the commit: a pending file whose documents the engine never got
    store.begin(ix, ["a", "b"], [np.array([0.0, 9.0], np.float32), np.array([0.0, 8.0], np.float32)])
    res = hybrid_search(be, "k", _request({"dog": 1.0}), None, opts, vector=q)
    assert _dense(res) == [("a", 0.0)]  # a keeps its committed vector

    # the next batch reuses the same seqs for other documents: the stale pending file must not leak into them
    be.ingest("k", [Document("c", {"image": SparseVector.from_token_map({"dog": 1.0})}, {}, None, None, [0.0, 2.0])])
    res = hybrid_search(be, "k", _request({"dog": 1.0}), None, opts, vector=q)
    assert _dense(res) == [("c", 2.0), ("a", 0.0)]

    # crash after the commit, before the part file: readers use the pending file, the next writer keeps it
    store.begin(ix, ["d"], [np.array([0.0, 3.0], np.float32)])
    ix.add([Document("d", {"image": SparseVector.from_token_map({"dog": 1.0})})])
    res = hybrid_search(EmbeddedBackend(tmp_path), "k", _request({"dog": 1.0}), None, opts, vector=q)
    assert _dense(res) == [("d", 3.0), ("c", 2.0), ("a", 0.0)]
    store.recover(ix)
    assert not (store.dir / "pending.stair").exists()
    res = hybrid_search(be, "k", _request({"dog": 1.0}), None, opts, vector=q)
    assert [h.id for h in res.hits] == ["d", "c", "a"]


def test_bad_vectors_are_refused_per_document(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("v", IndexSchema(dense=DenseSpec(3).to_dict()))
    vec = {"image": SparseVector.from_token_map({"dog": 1.0})}
    with pytest.raises(InvalidVectorError, match="non-finite value .* at position 1"):
        Document("nan", vec, dense=[0.1, float("nan"), 0.2])
    rep = be.ingest("v", [Document("ok", vec, dense=[1, 2, 3]), Document("short", vec, dense=[1, 2]),
                          Document("zero", vec, dense=[0, 0, 0]), Document("none", vec)])
    by = {i.id: i for i in rep.items}
    assert by["ok"].ok and by["none"].ok and "no dense vector" in by["none"].warning
    assert not by["short"].ok and "has 2 dimensions but the index's dense field has 3" in by["short"].error
    assert not by["zero"].ok and "all zeros" in by["zero"].error
    assert be.existing_ids("v", ["ok", "short", "zero", "none"]) == {"ok", "none"}
    res = hybrid_search(be, "v", _request({"dog": 1.0}), None, HybridOptions(retrievers=("dense",)), vector=[1, 0, 0])
    assert [h.id for h in res.hits] == ["ok"]
    assert any("1 of 2 documents have no dense vector" in n for n in res.notes)
    with pytest.raises(InvalidVectorError, match="has 2 dimensions but the index's dense field has 3"):
        hybrid_search(be, "v", _request({"dog": 1.0}), None, HybridOptions(retrievers=("dense",)), vector=[1, 0])


def test_dense_on_an_index_without_vectors_names_the_field_and_the_fix(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("plain", IndexSchema())
    vec = {"image": SparseVector.from_token_map({"dog": 1.0})}
    rep = be.ingest("plain", [Document("a", vec, dense=[1.0, 2.0])])
    assert not rep.items[0].ok and "has no dense field" in rep.items[0].error and "--dense-dims" in rep.items[0].error
    be.ingest("plain", [Document("a", vec, caption="a dog")])
    with pytest.raises(InvalidInputError, match="has no dense vectors \\(no 'dense' field\\).*--dense-dims N.*--dense-model"):
        hybrid_search(be, "plain", _request({"dog": 1.0}), "dog", HybridOptions(retrievers=("sparse", "dense")), vector=[1, 2])


def test_a_query_text_needs_a_recorded_dense_model(setup):
    be, _ = setup
    with pytest.raises(InvalidInputError, match="records no dense model.*--vector-file"):
        hybrid_search(be, "shop", _request({"dog": 1.0}), "a dog", HybridOptions(retrievers=("dense", "bm25")))


def test_a_damaged_vector_file_is_an_error_that_says_what_to_do(setup):
    be, _ = setup
    ix = be._reader("shop")
    part = DenseStore(ix.path, read_spec(ix.path)).parts()[0]
    data = bytearray(part.read_bytes())
    data[200] ^= 0xFF
    part.write_bytes(bytes(data))
    be2 = EmbeddedBackend(be.home)
    with pytest.raises(DamagedIndexError, match="dense vector file .* is damaged.*--reindex"):
        hybrid_search(be2, "shop", _request({"dog": 1.0}), None, HybridOptions(retrievers=("dense",)), vector=np.ones(DIMS))


def test_bad_retriever_lists_and_weights_are_refused():
    with pytest.raises(InvalidInputError, match="unknown retriever 'colbert'"):
        HybridOptions(retrievers="sparse,colbert").checked(10)
    with pytest.raises(InvalidInputError, match="names a retriever twice"):
        HybridOptions(retrievers=("dense", "dense")).checked(10)
    with pytest.raises(InvalidInputError, match="needs 3 numbers \\(sparse,bm25,dense\\), got 2"):
        HybridOptions("linear", weights=(1, 1), retrievers=("sparse", "bm25", "dense")).checked(10)
    assert HybridOptions(retrievers=("sparse", "bm25", "dense")).checked(10).weights == pytest.approx((1 / 3,) * 3)


def test_spec_is_kept_beside_the_segments_and_shown_in_index_info(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("s", IndexSchema(dense=DenseSpec(16, "dot_product", "float32").to_dict()))
    info = be.index_info("s")
    assert info.schema.dense == {"dims": 16, "similarity": "dot_product", "dtype": "float32", "encoder": None}
    assert json.loads((tmp_path / "s" / "dense" / "spec.json").read_text())["dims"] == 16
    with pytest.raises(InvalidInputError, match="dense dimension must be a whole number from 1 to 4096"):
        DenseSpec(0)


def test_a_manifest_dense_value_that_is_not_a_list_is_refused_on_its_line(tmp_path):
    from stair_es.catalog import read_manifest

    m = tmp_path / "m.jsonl"
    m.write_text('{"id": "a", "path": "a.png", "dense": "0.1,0.2"}\n{"id": "b", "path": "b.png", "dense": [0.1, 0.2]}\n')
    items = list(read_manifest(m))
    assert not items[0].ok and "'dense' must be a list of numbers, got str" in items[0].error
    assert items[1].dense == [0.1, 0.2]


def test_many_batches_merge_part_files_tiered_and_keep_every_vector(tmp_path):
    from stair_es.dense import MAX_PARTS

    be = EmbeddedBackend(tmp_path, batch_size=3)
    be.create_index("t", IndexSchema(dense=DenseSpec(2, "dot_product", "float32").to_dict()))
    docs = [Document(f"t{i:03d}", {"image": SparseVector.from_token_map({"dog": 1.0})}, {}, None, None, [float(i), 1.0])
            for i in range(3 * (MAX_PARTS + 5))]
    be.ingest("t", docs)
    ix = be._reader("t")
    parts = DenseStore(ix.path, read_spec(ix.path)).parts()
    assert len(parts) <= MAX_PARTS
    res = hybrid_search(be, "t", _request({"dog": 1.0}, 100), None, HybridOptions(retrievers=("dense",), window=100),
                        vector=[1.0, 0.0])
    assert dict(_dense(res)) == {d.id: float(d.dense[0]) for d in docs}


# Ingests batches of new documents plus an update of an earlier one, each document's dense
# vector encoding its version (also in its metadata), and prints each acknowledged batch.
WRITER = """
import sys
from stair_es.backends.embedded import EmbeddedBackend
from stair_es.dense import DenseSpec
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
be = EmbeddedBackend(sys.argv[1])
be.create_index("k", IndexSchema(dense=DenseSpec(3, "dot_product", "float32").to_dict()), exist_ok=True)
start = int(sys.argv[2])
for b in range(start, start + 400):
    docs = [Document(f"b{b}-{i}", {"image": SparseVector.from_token_map({"dog": 1.0})}, {"ver": float(b)}, None, None,
                     [float(b), float(i), 1.0]) for i in range(5)]
    if b > start:
        docs.append(Document(f"b{b - 1}-0", {"image": SparseVector.from_token_map({"dog": 1.0})}, {"ver": float(b)}, None,
                             None, [float(b), 0.0, 1.0]))
    be.ingest("k", docs)
    print(b, flush=True)
"""


@pytest.mark.process
def test_sigkill_while_ingesting_never_leaves_a_document_with_a_wrong_or_missing_vector(tmp_path):
    from fakes import acked_until_killed

    start = 0
    for delay in (0.2, 0.7, 1.3):
        acked = acked_until_killed(WRITER, [str(tmp_path), str(start)], delay)
        assert acked, "the writer acknowledged nothing"
        be = EmbeddedBackend(tmp_path)
        ix = be._reader("k")
        live = [s.seg.doc_id(int(d)) for s in ix._segs for d in range(s.seg.n_docs)
                if s.deleted is None or not s.deleted[d]]
        assert be.existing_ids("k", [f"b{acked[-1]}-{i}" for i in range(5)]) == {f"b{acked[-1]}-{i}" for i in range(5)}
        for doc_id in live:
            doc = be.get("k", doc_id)
            i = int(doc_id.split("-")[1])
            # the vector is the one written with this version of the document, never an older or newer one
            assert doc.dense is not None and list(doc.dense) == [doc.metadata["ver"], float(i), 1.0], doc_id
        be.close()
        start = acked[-1] + 2  # the next run writes new ids (and its first update touches none of these)


def test_an_id_twice_in_one_batch_keeps_the_later_vector_once(tmp_path):
    be = EmbeddedBackend(tmp_path)
    be.create_index("d", IndexSchema(dense=DenseSpec(2, "dot_product", "float32").to_dict()))
    vec = {"image": SparseVector.from_token_map({"dog": 1.0})}
    be.ingest("d", [Document("a", vec, dense=[1.0, 0.0]), Document("b", vec, dense=[0.5, 0.0]),
                    Document("a", vec, dense=[2.0, 0.0])])
    res = hybrid_search(be, "d", _request({"dog": 1.0}), None, HybridOptions(retrievers=("dense",)), vector=[1.0, 0.0])
    assert _dense(res) == [("a", 2.0), ("b", 0.5)]
