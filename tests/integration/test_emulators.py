"""Elasticsearch (noida-db) and OpenSearch (osmem-server) emulators: the translated queries rank
as the exact dot product does, within the engines' 9-bit stored precision.

The emulators were written by others: agreement with them is evidence, not proof.
"""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.backends.cluster.translate import translate
from stair_es.backends.base import get_backend
from stair_es.backends.codec import stored_value
from stair_es.query import HasTokens, Not, Range, SearchRequest, SparseClause, Term
from stair_es.schema import Document, IndexSchema, parse_date
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

pytestmark = pytest.mark.process

VOCAB = default_vocabulary()
N_DOCS = 300
N_QUERIES = 20
TOP_K = 10
SCHEMA = IndexSchema(fields={"brand": "keyword", "price": "number", "taken": "date"})


def zipf_corpus(n=N_DOCS, seed=42):
    """Token maps with Zipf-distributed token ids (a few frequent tokens, a long tail) and log-normal weights."""
    rng = np.random.default_rng(seed)
    allowed = np.flatnonzero(~VOCAB.special_mask)
    rank_of = rng.permutation(allowed)
    docs = []
    for i in range(n):
        nnz = int(rng.integers(20, 60))
        ranks = np.minimum(rng.zipf(1.3, nnz * 2) - 1, rank_of.size - 1)
        ids = np.unique(rank_of[ranks])[:nnz]
        w = rng.lognormal(-0.5, 0.8, ids.size)
        docs.append(Document(
            f"doc-{i:03d}", {"image": SparseVector.from_arrays(ids, w)},
            {"brand": ["acme", "globex", "initech", "umbrella"][i % 4], "price": float(rng.integers(1, 100)),
             "taken": f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}"},
            caption=f"synthetic item {i}", source=f"images/{i:03d}.png"))
    return docs, rank_of


def queries(rank_of, seed=7):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(N_QUERIES):
        k = int(rng.integers(10, 30))
        ranks = np.minimum(rng.zipf(1.3, k * 2) - 1, 500)
        ids = np.unique(rank_of[ranks])[:k]
        out.append(SparseVector.from_arrays(ids, rng.lognormal(0, 0.5, ids.size)))
    return out


def filters(docs):
    common = VOCAB.tokens[int(docs[0].vectors["image"].ids[0])]
    frequent = [VOCAB.tokens[int(i)] for i in docs[1].vectors["image"].ids[:3]]
    return {
        "none": None,
        "brand": Term("brand", "acme"),
        "price+date": Range("price", lte=60) & Range("taken", gte="2024-03-01"),
        "whitelist": HasTokens(frequent, mode="any"),
        "blacklist": Not(HasTokens([common])),
        "nested": (Term("brand", "globex") | Range("price", gt=80)) & ~HasTokens([frequent[0]]),
    }


def matches(flt, doc):
    if flt is None:
        return True
    from stair_es.query import And, Or, Range as R, Term as T

    if isinstance(flt, T):
        return doc.metadata.get(flt.field) == flt.value
    if isinstance(flt, R):
        v = doc.metadata.get(flt.field)
        v = parse_date(v) if flt.field == "taken" else v
        c = lambda x: parse_date(x) if flt.field == "taken" else x  # noqa: E731
        return ((flt.gt is None or v > c(flt.gt)) and (flt.gte is None or v >= c(flt.gte))
                and (flt.lt is None or v < c(flt.lt)) and (flt.lte is None or v <= c(flt.lte)))
    if isinstance(flt, HasTokens):
        have = set(doc.vectors["image"].ids.tolist())
        want = [VOCAB.id(t) for t in flt.tokens]
        return all(w in have for w in want) if flt.mode == "all" else any(w in have for w in want)
    if isinstance(flt, And):
        return all(matches(f, doc) for f in flt.filters)
    if isinstance(flt, Or):
        return any(matches(f, doc) for f in flt.filters)
    if isinstance(flt, Not):
        return not matches(flt.filter, doc)
    raise TypeError(flt)


def brute_force(docs, q, flt, precision):
    """(score, id) sorted best first; ``precision="stored"`` uses the engines' 9-bit weights."""
    out = []
    for d in docs:
        if not matches(flt, d):
            continue
        v = d.vectors["image"]
        w = stored_value(v.weights) if precision == "stored" else v.weights
        s = SparseVector(v.ids, np.asarray(w, np.float32), VOCAB).dot(q)
        if s > 0:
            out.append((s, d.id))
    out.sort(key=lambda t: (-t[0], t[1]))
    return out


_loaded: dict[str, object] = {}


@pytest.fixture
def loaded(cluster):
    name, url = cluster
    key = f"{name}@{url}"
    if key not in _loaded:
        b = get_backend(name, urls=url, timeout=60)
        try:
            b.delete_index("stair-it")
        except Exception:  # noqa: BLE001
            pass
        b.create_index("stair-it", SCHEMA)
        docs, rank_of = zipf_corpus()
        rep = b.ingest("stair-it", docs)
        assert not rep.failures, rep.failures[:3]
        _loaded[key] = (b, docs, rank_of)
    return _loaded[key]


def test_ranking_equals_the_exact_dot_product(loaded):
    b, docs, rank_of = loaded
    qs = queries(rank_of)
    identical_stored = identical_full = total = 0
    for fname, flt in filters(docs).items():
        for q in qs[:5] if fname != "none" else qs:
            res = b.search("stair-it", SearchRequest([SparseClause("image", q)], filter=flt, top_k=TOP_K))
            ref = brute_force(docs, q, flt, "stored")
            full = brute_force(docs, q, flt, "full")
            got = [(h.score, h.id) for h in res.hits]
            total += 1
            assert res.total == len(ref)
            # the engine's scores are the dot product with its stored weights
            for (s, i), (rs, ri) in zip(got, ref[:TOP_K]):
                assert s == pytest.approx(rs, rel=1e-5, abs=1e-6), (fname, got[:3], ref[:3])
            identical_stored += [i for _, i in got] == [i for _, i in ref[:TOP_K]]
            identical_full += [i for _, i in got] == [i for _, i in full[:TOP_K]]
            # against full precision, any disagreement is within the 9-bit rounding
            if full:
                kth = full[min(TOP_K, len(full)) - 1][0]
                exact = dict((i, s) for s, i in full)
                assert all(exact[i] >= kth * (1 - 2 ** -7) for _, i in got)
    print(f"\n{b.name}: top-{TOP_K} identical to brute force on stored weights in {identical_stored}/{total} queries, "
          f"to full-precision float32 in {identical_full}/{total}")
    assert identical_stored >= total - 1


def test_explain_matches_the_engine(loaded):
    b, docs, rank_of = loaded
    q = queries(rank_of)[0]
    req = SearchRequest([SparseClause("image", q, 1.5)], top_k=3)
    res = b.search("stair-it", req)
    for hit in res.hits:
        ex = b.explain("stair-it", hit.id, req)
        assert ex.matched_filter
        assert ex.score == pytest.approx(hit.score, rel=1e-5)
        assert ex.total == pytest.approx(hit.score, rel=1e-5)
        prepared = req.prepared(SCHEMA)
        tr = translate(prepared, engine=b.adapter.engine)
        native = b.adapter.request(b.client, "POST", f"/stair-it/_explain/{hit.id}", {"query": tr.query})
        assert native["explanation"]["value"] == pytest.approx(ex.score, rel=1e-5)


def test_get_existing_ids_doc_freqs(loaded):
    b, docs, _ = loaded
    d = b.get("stair-it", "doc-007")
    assert d.vectors["image"] == docs[7].vectors["image"]
    assert d.metadata["taken"] == "2024-08-08" and d.caption == "synthetic item 7"
    assert b.existing_ids("stair-it", ["doc-001", "nope"]) == {"doc-001"}
    df, n = b.doc_freqs("stair-it", "image")
    assert n == N_DOCS
    expect = np.zeros_like(df)
    for doc in docs:
        expect[doc.vectors["image"].ids] += 1
    assert np.array_equal(df, expect)
    assert b.index_info("stair-it").doc_count == N_DOCS


def test_cluster_rejections_are_reported(cluster):
    name, url = cluster
    b = get_backend(name, urls=url)
    b.create_index("stair-bad", IndexSchema(fields={"price": "number"}), exist_ok=True)
    docs = [Document("ok", {"image": SparseVector.from_token_map({"dog": 1.0, ".": 2.0})}, {"price": 1.0}),
            Document("bad", {"image": SparseVector.from_token_map({"dog": 1.0})}, {"price": "x"})]
    rep = b.ingest("stair-bad", docs)
    assert [i.ok for i in rep.items] == [True, False]
    assert b.search("stair-bad", SearchRequest([SparseClause("image", SparseVector.from_token_map({".": 1.0}))])).hits[0].id == "ok"
    b.delete_index("stair-bad")


def test_same_ranking_as_the_embedded_engine(loaded, tmp_path):
    pytest.importorskip("stair_es.backends.embedded", reason="the embedded engine is not in this tree yet")
    b, docs, rank_of = loaded
    emb = get_backend("embedded", home=str(tmp_path))
    emb.create_index("stair-it", SCHEMA)
    emb.ingest("stair-it", docs)
    agree = total = 0
    for fname, flt in filters(docs).items():
        for q in queries(rank_of)[:5]:
            req = SearchRequest([SparseClause("image", q)], filter=flt, top_k=TOP_K)
            a = b.search("stair-it", req)
            e = emb.search("stair-it", req)
            total += 1
            agree += [h.id for h in a.hits] == [h.id for h in e.hits]
            exact = {h.id: h.score for h in e.hits}
            for h in a.hits:
                if h.id in exact:
                    assert h.score == pytest.approx(exact[h.id], rel=2 ** -7)
    print(f"\n{b.name} vs embedded: identical top-{TOP_K} in {agree}/{total} queries")
    assert agree >= total * 0.8
    emb.close()


def test_elasticsearch_sparse_vector_field(es_url):
    """The sparse_vector field and query (noida-db 8.15: no index_options, which stair_es drops)."""
    b = get_backend("elasticsearch", urls=es_url, field_type="sparse_vector")
    try:
        b.delete_index("stair-sv")
    except Exception:  # noqa: BLE001
        pass
    b.create_index("stair-sv", SCHEMA)
    docs, rank_of = zipf_corpus(80, seed=3)
    assert not b.ingest("stair-sv", docs).failures
    assert b.index_info("stair-sv").extra["field_type"] == "sparse_vector"
    for q in queries(rank_of)[:5]:
        for flt in (None, Not(HasTokens([VOCAB.tokens[int(docs[0].vectors["image"].ids[0])]]))):
            res = b.search("stair-sv", SearchRequest([SparseClause("image", q, 1.5)], filter=flt, top_k=TOP_K))
            ref = brute_force(docs, q, flt, "stored")
            assert [h.id for h in res.hits] == [i for _, i in ref[:TOP_K]]
            assert [h.score for h in res.hits] == pytest.approx([1.5 * s for s, _ in ref[:TOP_K]], rel=1e-5)
    b.delete_index("stair-sv")


def test_a_searchs_hits_are_read_back_in_one_request(cluster):
    """Re-ranking by meaning reads its hits' tokens back: one ``_mget`` for all of them, the
    stored weights (at the engine's precision), None for an id that is gone."""
    name, url = cluster
    backend = get_backend(name, urls=url, timeout=60)
    index = "stair-readback"
    try:
        backend.delete_index(index)
    except Exception:  # noqa: BLE001 - absent
        pass
    backend.create_index(index, IndexSchema())
    maps = {"cat": {"cat": 2.0, "animal": 1.0}, "car": {"car": 1.5, "road": 0.5, "sky": 0.25}}
    assert not backend.ingest(index, [Document(k, {"image": SparseVector.from_token_map(v)}) for k, v in maps.items()]).failures
    try:
        got = backend.vectors_of(index, ["car", "gone", "cat"], "image")
        assert got[1] is None
        assert got[0].to_token_map() == pytest.approx(maps["car"], rel=1e-2)
        assert got[2].to_token_map() == pytest.approx(maps["cat"], rel=1e-2)
        assert backend.vectors_of(index, [], "image") == []
    finally:
        backend.delete_index(index)
        backend.close()


def test_cli_search_reranks_by_meaning_on_a_cluster_as_on_the_embedded_engine(cluster, tmp_path, monkeypatch):
    """`stair-es search --rerank auto` on Elasticsearch/OpenSearch: the query encoder's document
    frequencies are reused and the hits read back in one _mget, so the hits come in the embedded
    engine's order (a sentence encoder with hand-made embeddings, tests/test_rerank.py)."""
    import json

    from click.testing import CliRunner
    from test_rerank import DOCS, HandMadeSentences  # tests/ is on the path

    from stair_es import rerank
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.cli.main import cli

    enc = HandMadeSentences()
    monkeypatch.setattr(rerank, "semantic_encoder", lambda mode, model=None: None if mode == "off" else enc)
    name, url = cluster
    index = "stair-rerank"
    docs = [Document(k, {"image": SparseVector.from_token_map(v)}) for k, v in DOCS.items()]
    backend = get_backend(name, urls=url, timeout=60)
    try:
        backend.delete_index(index)
    except Exception:  # noqa: BLE001 - absent
        pass
    backend.create_index(index, IndexSchema(encoder={"name": "bow"}))
    assert not backend.ingest(index, docs).failures
    home = tmp_path / "home"
    embedded = EmbeddedBackend(home)
    embedded.create_index(index, IndexSchema(encoder={"name": "bow"}))
    assert not embedded.ingest(index, docs).failures
    embedded.close()
    try:
        orders = []
        for where in (["--backend", name, "--url", url], ["--home", str(home)]):
            r = CliRunner().invoke(cli, ["search", index, "sunset sky", "-k", "4", "--caption-weight", "0", "--json",
                                         "--rerank", "auto", *where])
            assert r.exit_code == 0, r.output
            out = json.loads(r.stdout)
            assert any("re-ranked the best 3 hits" in n for n in out["notes"]), out["notes"]
            orders.append([h["id"] for h in out["hits"]])
        assert orders[0] == orders[1] == ["beach", "volcano", "car"]
    finally:
        backend.delete_index(index)
        backend.close()


def test_a_clusters_document_frequencies_are_counted_once_and_remembered(cluster, tmp_path, monkeypatch):
    """Every text query needs the index's document frequencies, a scan of the whole index on a
    cluster: they are remembered on this machine while the document count stays the same, and
    counted again after an ingest (here, or by another process: the count changed)."""
    from stair_es.backends.cluster import freqs
    from stair_es.models import store

    monkeypatch.setenv("STAIR_ES_CLUSTER_STATS_TTL", "3600")
    monkeypatch.setattr(store, "data_home", lambda: tmp_path)
    name, url = cluster
    index = "stair-freqs"
    backend = get_backend(name, urls=url, timeout=60)
    try:
        backend.delete_index(index)
    except Exception:  # noqa: BLE001 - absent
        pass
    backend.create_index(index, IndexSchema())
    assert not backend.ingest(index, [Document("a", {"image": SparseVector.from_token_map({"cat": 1.0})}),
                                      Document("b", {"image": SparseVector.from_token_map({"cat": 1.0, "dog": 2.0})})]
                              ).failures
    scans = []
    real = backend._scroll
    monkeypatch.setattr(backend, "_scroll", lambda *a: scans.append(a) or real(*a))
    try:
        cat, dog = VOCAB.id("cat"), VOCAB.id("dog")
        df, n = backend.doc_freqs(index, "image")
        assert (n, df[cat], df[dog]) == (2, 2, 1) and len(scans) == 1
        again = get_backend(name, urls=url, timeout=60)  # another command on this machine
        df2, n2 = again.doc_freqs(index, "image")
        assert n2 == 2 and np.array_equal(df, df2) and len(scans) == 1
        assert len(list((tmp_path / "_cluster_stats").glob("*.npz"))) == 1
        # another machine adds a document (nothing forgotten here): the count differs, so they are counted again
        monkeypatch.setattr(again, "_forget_freqs", lambda index: None)
        assert not again.ingest(index, [Document("c", {"image": SparseVector.from_token_map({"dog": 1.0})})]).failures
        again.close()
        df3, n3 = backend.doc_freqs(index, "image")
        assert (n3, df3[dog]) == (3, 2) and len(scans) == 2
        monkeypatch.setenv("STAIR_ES_CLUSTER_STATS_TTL", "0")  # off: every call counts
        backend.doc_freqs(index, "image")
        assert len(scans) == 3
    finally:
        backend.delete_index(index)
        backend.close()
    assert freqs.ttl_s() == 0
