"""encode-catalog with s3:// sources, images and output, against moto's S3 server on 127.0.0.1.

pyarrow's own S3 filesystem reads the lists and images and writes the shards (it honours
AWS_ENDPOINT_URL, as S3-compatible stores such as MinIO need); fsspec is the path for schemes
pyarrow does not know, tested here with s3fs and Hadoop-style s3a:// URIs. gs:// takes the same code path (pyarrow's
GCS filesystem, then fsspec) and is not tested here (no GCS emulator).
"""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("pyarrow", reason="Parquet shards need the 'distributed' extra (pyarrow)")
pytest.importorskip("moto.server", reason="the S3 tests need moto's server: pip install 'moto[server]'")
boto3 = pytest.importorskip("boto3", reason="the S3 tests need boto3 (comes with moto)")
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from encode_catalog_util import color_encoder, drawing  # noqa: E402

from stair_es import get_backend  # noqa: E402
from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog  # noqa: E402
from stair_es.ingest import ingest_catalog  # noqa: E402

BUCKET = "catalog"


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on 127.0.0.1 (a free port), and the environment every process of the run
    (driver and spawned workers) finds it through."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    yield client
    server.stop()


def put_images(client, n: int = 5) -> dict[str, bytes]:
    """n drawings under s3://catalog/img/, a text file named .png, and their bytes."""
    out = {}
    for i in range(n):
        buf = io.BytesIO()
        drawing(i).save(buf, format="PNG")
        out[f"img/d{i}.png"] = buf.getvalue()
    out["img/notes.png"] = b"not a picture"
    for key, data in out.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return out


def shard_ids(client, prefix: str) -> list[str]:
    ids = []
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    for obj in sorted(listing, key=lambda o: o["Key"]):
        name = obj["Key"].rsplit("/", 1)[-1]
        if name.startswith("part-") and name.endswith(".parquet"):
            body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
            ids += pq.read_table(pa.BufferReader(body)).column("id").to_pylist()
    return ids


def test_a_parquet_list_of_s3_images_encoded_into_s3_shards_then_ingested(s3, tmp_path):
    keys = put_images(s3)
    rows = [{"id": f"doc-{k.rsplit('/', 1)[-1]}", "path": f"s3://{BUCKET}/{k}", "caption": f"a drawing {k}",
             "metadata": json.dumps({"key": k})} for k in keys]
    rows.append({"id": "gone", "path": f"s3://{BUCKET}/img/missing.png", "caption": None, "metadata": None})
    rows.append({"id": "rel", "path": "img/d0.png", "caption": None, "metadata": None})  # relative to the list
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    s3.put_object(Bucket=BUCKET, Key="lists/catalog.parquet", Body=buf.getvalue())

    out = f"s3://{BUCKET}/shards"
    rep = encode_catalog(f"s3://{BUCKET}/lists/catalog.parquet", out, color_encoder,
                         EncodeCatalogOptions(engine="local", workers=2, shard_size=3, batch_size=3))
    good = {f"doc-d{i}.png" for i in range(5)}
    reasons = {f["id"]: f["reason"] for f in rep.failures}
    assert set(reasons) == {"doc-notes.png", "gone", "rel"}, reasons
    assert "not an image" in reasons["doc-notes.png"] and "s3://catalog/img/missing.png" in reasons["gone"]
    ids = shard_ids(s3, "shards/")
    assert sorted(ids) == sorted(good)  # each once, written to S3 by the workers
    # the finished folder resumes from S3 (nothing encoded twice)
    again = encode_catalog(f"s3://{BUCKET}/lists/catalog.parquet", out, color_encoder,
                           EncodeCatalogOptions(engine="local", workers=1, shard_size=3, batch_size=3))
    assert again.summary()["written"] == 0 and again.shards_done_before == rep.shards_total
    # and the shards go from S3 into the embedded engine, captions and metadata with them
    be = get_backend("embedded", home=tmp_path / "home")
    r = ingest_catalog(be, "x", out, None)
    assert r.summary()["ok"] == len(good) and {f.id for f in r.failures if f.id} == {"doc-notes.png", "gone", "rel"}
    doc = be.get("x", "doc-d1.png")
    assert doc.metadata == {"key": "img/d1.png"} and doc.caption == "a drawing img/d1.png"
    assert doc.source == f"s3://{BUCKET}/img/d1.png"


def test_a_jsonl_list_of_s3_images_on_s3_and_a_local_jsonl_naming_s3_urls(s3, tmp_path):
    keys = put_images(s3, n=3)
    lines = [json.dumps({"id": f"j{i}", "url": f"s3://{BUCKET}/{k}", "caption": "a shape"}) for i, k in enumerate(keys)]
    lines.insert(1, "{not json")
    lines.append(json.dumps({"id": "v", "path": f"s3://{BUCKET}/img/d0.png", "vectors": {"image": {"red": 1.0}}}))
    s3.put_object(Bucket=BUCKET, Key="lists/catalog.jsonl", Body="\n".join(lines).encode())
    rep = encode_catalog(f"s3://{BUCKET}/lists/catalog.jsonl", str(tmp_path / "out"), color_encoder,
                         EncodeCatalogOptions(engine="local", workers=1, shard_size=8, batch_size=4))
    reasons = {(f["id"], f["origin"]): f["reason"] for f in rep.failures}
    assert ("j3", "catalog.jsonl:5") in reasons and "not an image" in reasons[("j3", "catalog.jsonl:5")]
    assert any(o == "catalog.jsonl:2" and "not JSON" in why for (_, o), why in reasons.items())
    assert any(i == "v" and "precomputed" in why for (i, _), why in reasons.items())
    got = pq.read_table(tmp_path / "out" / "part-00000.parquet").to_pylist()
    assert [r["id"] for r in got] == ["j0", "j1", "j2"] and got[0]["source"] == f"s3://{BUCKET}/img/d0.png"

    local = tmp_path / "local.jsonl"  # a local manifest naming S3 images is read as a list of locations too
    local.write_text("\n".join(lines[:1] + lines[2:4]) + "\n")
    rep = encode_catalog(str(local), str(tmp_path / "out2"), color_encoder,
                         EncodeCatalogOptions(engine="local", workers=1, shard_size=8, batch_size=4))
    got2 = pq.read_table(tmp_path / "out2" / "part-00000.parquet").to_pylist()
    assert [r["id"] for r in got2] == ["j0", "j1", "j2"] and not rep.failures
    assert [r["image_weights"] for r in got2] == [r["image_weights"] for r in got]


def test_s3a_uris_go_through_fsspec_end_to_end(s3, tmp_path):
    """Locations pyarrow has no filesystem for go through fsspec: Hadoop-style s3a:// URIs (which
    s3fs serves and pyarrow does not know) for the list, the images and the shards alike."""
    pytest.importorskip("s3fs", reason="the fsspec path for s3a:// needs s3fs")
    import pyarrow.fs as pafs

    from stair_es.distributed.shards import open_fs

    keys = put_images(s3, n=3)
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{"path": f"s3a://{BUCKET}/{k}"} for k in keys]), buf)
    s3.put_object(Bucket=BUCKET, Key="lists/l.parquet", Body=buf.getvalue())
    with pytest.raises(pa.ArrowInvalid):
        pafs.FileSystem.from_uri(f"s3a://{BUCKET}/lists/l.parquet")
    assert isinstance(open_fs(f"s3a://{BUCKET}/lists/l.parquet")[0], pafs.PyFileSystem)  # fsspec's, wrapped
    out = f"s3a://{BUCKET}/shards-a"
    rep = encode_catalog(f"s3a://{BUCKET}/lists/l.parquet", out, color_encoder,
                         EncodeCatalogOptions(engine="local", workers=1, shard_size=2, batch_size=2))
    assert {f["id"] for f in rep.failures} == {f"s3a://{BUCKET}/img/notes.png"}
    assert sorted(shard_ids(s3, "shards-a/")) == sorted(f"s3a://{BUCKET}/{k}" for k in keys if "notes" not in k)
    be = get_backend("embedded", home=tmp_path / "home")
    assert ingest_catalog(be, "x", out, None).summary()["ok"] == 3
