"""Shards of `stair-es encode-catalog` into Elasticsearch/OpenSearch (emulators) through the bulk path."""

from __future__ import annotations

import pytest

pytest.importorskip("pyarrow", reason="Parquet shards need the 'distributed' extra (pyarrow)")

from encode_catalog_util import color_encoder, make_catalog  # noqa: E402

from stair_es import get_backend  # noqa: E402
from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog  # noqa: E402
from stair_es.ingest import ingest_catalog  # noqa: E402
from stair_es.query import SearchRequest, SparseClause  # noqa: E402
from stair_es.sparse import SparseVector  # noqa: E402

pytestmark = pytest.mark.process


def test_shards_into_a_cluster_match_the_embedded_engine(cluster, tmp_path):
    name, url = cluster
    src = make_catalog(tmp_path / "cat", n_drawings=6, bad=True)
    out = tmp_path / "out"
    encode_catalog(str(src), str(out), color_encoder, EncodeCatalogOptions(workers=1, shard_size=4, batch_size=4))
    b = get_backend(name, urls=url, timeout=60)
    try:
        b.delete_index("stair-shards")
    except Exception:  # noqa: BLE001 - not there yet
        pass
    emb = get_backend("embedded", home=tmp_path / "home")
    try:
        rep = ingest_catalog(b, "stair-shards", out, None)
        ref = ingest_catalog(emb, "ref", out, None)
        assert rep.summary() == ref.summary()
        assert {f.id for f in rep.failures} == {"notes.jpg", "empty.png", "cut.jpg"}
        assert b.index_info("stair-shards").schema.encoder == {"name": "fake-color"}
        again = ingest_catalog(b, "stair-shards", out, None)  # resumes: everything is there already
        assert again.summary()["ok"] == 0 and again.summary()["skipped"] == ref.summary()["ok"]
        for q in ({"red": 1.0, "bright": 0.5}, {"blue": 1.0}, {"drawing": 1.0}):
            req = SearchRequest([SparseClause("image", SparseVector.from_token_map(q))], top_k=50)  # every match: the 9-bit precision of the cluster may swap near-ties
            got = b.search("stair-shards", req).hits
            want = emb.search("ref", req).hits
            assert [h.id for h in got][:1] == [h.id for h in want][:1]
            assert {h.id: (h.caption, h.metadata) for h in got} == {h.id: (h.caption, h.metadata) for h in want}
    finally:
        b.delete_index("stair-shards")
