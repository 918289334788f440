"""Catalog reading and the ingest pipeline: per-item reports, resume, bad inputs, nothing lost."""

import json

import pytest
from PIL import Image

from fakes import ColorEncoder, MemoryBackend
from stair_es.catalog import CatalogEntry, read_catalog
from stair_es.errors import InvalidInputError
from stair_es.ingest import IngestOptions, ingest_catalog
from stair_es.schema import MAX_CAPTION_CHARS, ItemResult


def _img(path, color=(200, 30, 30), size=(32, 24), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


@pytest.fixture
def catalog(tmp_path):
    root = tmp_path / "photos"
    _img(root / "red.jpg")
    _img(root / "sub" / "blue.png", (10, 20, 230))
    (root / "red.txt").write_text("a red square\n")
    (root / "red.json").write_text(json.dumps({"brand": "acme", "price": 3}))
    (root / "notes.md").write_text("not an image")
    (root / "empty.jpg").write_bytes(b"")
    (root / "fake.png").write_text("this is text")
    return root


def test_folder_catalog_reports_every_file(catalog):
    items = list(read_catalog(catalog))
    by_id = {i.id: i for i in items}
    assert isinstance(by_id["red.jpg"], CatalogEntry) and by_id["red.jpg"].caption == "a red square"
    assert by_id["red.jpg"].metadata == {"brand": "acme", "price": 3}
    assert isinstance(by_id["sub/blue.png"], CatalogEntry)
    skip = by_id["notes.md"]
    assert isinstance(skip, ItemResult) and skip.action == "skip" and "not an image extension" in skip.warning
    assert "red.txt" not in by_id and "red.json" not in by_id  # sidecars are part of red.jpg


def test_a_bad_metadata_sidecar_is_named_in_its_pictures_failure(tmp_path):
    _img(tmp_path / "a.jpg")
    _img(tmp_path / "b.jpg")
    (tmp_path / "a.json").write_text("{bad json")
    (tmp_path / "b.json").write_text("[1, 2]")
    by_id = {i.id: i for i in read_catalog(tmp_path)}
    for name, why in (("a", "Expecting property name"), ("b", "JSON list, not an object")):
        item = by_id[f"{name}.jpg"]
        assert isinstance(item, ItemResult) and not item.ok
        assert f"sidecar file {name}.json unusable" in item.error and why in item.error
        assert "fix or remove it" in item.error


def test_ingest_folder_reports_bad_files_and_keeps_the_rest(catalog):
    be = MemoryBackend()
    report = ingest_catalog(be, "photos", catalog, ColorEncoder, IngestOptions(batch_size=2))
    s = report.summary()
    assert s == {"ok": 2, "skipped": 1, "failed": 2, "warnings": 1, "total": 5}
    errors = {i.id: i.error for i in report.failures}
    assert "empty" in errors["empty.jpg"].lower()
    assert "not an image" in errors["fake.png"].lower() or "identify" in errors["fake.png"].lower()
    doc = be.get("photos", "red.jpg")
    assert doc.metadata == {"brand": "acme", "price": 3.0}
    assert doc.vectors["image"].weight("red") > doc.vectors["image"].weight("blue")
    assert "caption" in doc.vectors and doc.vectors["caption"].weight("square") > 0
    assert be.index_info("photos").schema.encoder == {"name": "fake-color"}


def test_resume_skips_what_is_indexed_and_reindex_encodes_again(catalog):
    be = MemoryBackend()
    ingest_catalog(be, "p", catalog, ColorEncoder)
    enc = ColorEncoder()
    again = ingest_catalog(be, "p", catalog, lambda: enc)
    assert again.summary()["ok"] == 0 and again.summary()["skipped"] == 3
    assert enc.calls == 0  # nothing was decoded or encoded again
    forced = ingest_catalog(be, "p", catalog, lambda: enc, IngestOptions(reindex=True))
    assert forced.summary()["ok"] == 2 and enc.calls == 1
    assert len(be.indices["p"][1]) == 2  # no duplicates


def _manifest(tmp_path, lines):
    m = tmp_path / "m.jsonl"
    m.write_text("\n".join(lines) + "\n")
    return m


def test_manifest_bad_lines_duplicates_and_precomputed_vectors(tmp_path):
    _img(tmp_path / "a.png")
    long_caption = "word " * (MAX_CAPTION_CHARS // 2)
    m = _manifest(tmp_path, [
        json.dumps({"id": "a", "path": "a.png", "caption": long_caption, "metadata": {"tags": ["x", "y"]}}),
        "{not json",
        json.dumps({"id": "a", "path": "a.png"}),
        json.dumps({"id": "v", "vectors": {"image": {"dog": 1.0, "cat": 0.5}}}),
        json.dumps({"id": "bad", "vectors": {"image": {"dog": float("nan")}}}).replace("NaN", "NaN"),
        json.dumps({"id": "meta", "path": "a.png", "metadata": {"x": {"nested": 1}}}),
        json.dumps({"id": "missing", "path": "nope.png"}),
        json.dumps({"id": "neither"}),
        json.dumps(["a list"]),
        json.dumps({"id": "typo", "path": "a.png", "captoin": "x"}),
        json.dumps({"id": "empty-caption", "path": "a.png", "caption": "   "}),
    ])
    be = MemoryBackend()
    report = ingest_catalog(be, "m", m, ColorEncoder)
    errs = {(i.source, i.id): i.error for i in report.failures}
    reasons = " | ".join(str(e) for e in errs.values())
    assert ("m.jsonl:2", None) in errs and "not JSON" in errs[("m.jsonl:2", None)]
    assert "duplicate id 'a' (first seen at m.jsonl:1)" in reasons
    assert "finite" in reasons and "not supported" in reasons
    assert "nope.png" in reasons or "no such file" in reasons.lower()
    assert "needs a 'path'" in reasons and "JSON object" in reasons and "unknown keys" in reasons
    assert report.summary()["total"] == 11  # every line accounted for
    assert set(be.indices["m"][1]) == {"a", "v", "empty-caption"}
    a = [i for i in report.items if i.id == "a" and i.ok][0]
    assert "truncated" in a.warning
    assert be.get("m", "a").metadata["tags"] == ("x", "y")
    assert be.get("m", "empty-caption").caption is None


def test_encoder_failure_in_a_batch_only_fails_the_culprit(tmp_path):
    _img(tmp_path / "ok1.png")
    _img(tmp_path / "boom.png", size=(7, 7))
    _img(tmp_path / "ok2.png")
    be = MemoryBackend()
    report = ingest_catalog(be, "x", tmp_path, lambda: ColorEncoder(fail_on_size=(7, 7)))
    assert [i.id for i in report.failures] == ["boom.png"]
    assert "encoding failed" in report.failures[0].error
    assert set(be.indices["x"][1]) == {"ok1.png", "ok2.png"}


def test_backend_rejections_are_reported_per_document(tmp_path):
    _img(tmp_path / "a.png")
    _img(tmp_path / "b.png")
    be = MemoryBackend(fail_ids={"b.png"})
    report = ingest_catalog(be, "x", tmp_path, ColorEncoder)
    assert [(i.id, i.error) for i in report.failures] == [("b.png", "rejected by fake")]


def test_mixing_encoders_in_one_index_is_refused(tmp_path):
    _img(tmp_path / "a.png")
    be = MemoryBackend()
    ingest_catalog(be, "x", tmp_path, ColorEncoder)

    class Other(ColorEncoder):
        name = "other"

        def config(self):
            return {"name": "other"}

    with pytest.raises(InvalidInputError, match="not comparable"):
        ingest_catalog(be, "x", tmp_path, Other, IngestOptions(reindex=True))


def test_source_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="no such file"):
        list(read_catalog(tmp_path / "nothing"))
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(InvalidInputError, match="JSONL manifest"):
        list(read_catalog(tmp_path / "x.csv"))
    with pytest.raises(InvalidInputError, match="no files match"):
        list(read_catalog(str(tmp_path / "*.jpg")))


def test_glob_catalog_ids_are_relative_to_the_glob_root(tmp_path):
    _img(tmp_path / "a" / "one.jpg")
    _img(tmp_path / "a" / "b" / "two.jpg")
    ids = [i.id for i in read_catalog(str(tmp_path / "a" / "**" / "*.jpg"))]
    assert ids == ["b/two.jpg", "one.jpg"]


def test_count_catalog_matches_what_is_read(catalog, tmp_path):
    from stair_es.catalog import count_catalog

    assert count_catalog(catalog) == len(list(read_catalog(catalog)))
    m = _manifest(tmp_path, [json.dumps({"id": str(i), "vectors": {"image": {"dog": 1.0}}}) for i in range(5)] + ["", "{bad"])
    assert count_catalog(m) == len(list(read_catalog(m))) == 6


def test_precomputed_first_then_images_needing_an_encoder(tmp_path):
    _img(tmp_path / "a.png")
    lines = [json.dumps({"id": "v", "vectors": {"image": {"dog": 1.0}}}), json.dumps({"id": "img", "path": "a.png"})]
    m = _manifest(tmp_path, lines)
    be = MemoryBackend()
    report = ingest_catalog(be, "x", m, None)
    assert {i.id: i.ok for i in report.items} == {"v": True, "img": False}
    assert "needs an encoder" in report.failures[0].error
    be2 = MemoryBackend()
    report = ingest_catalog(be2, "x", m, ColorEncoder, IngestOptions(batch_size=1))
    assert report.summary()["ok"] == 2 and be2.index_info("x").schema.encoder == {"name": "precomputed"}


def test_backend_outcomes_name_the_input_they_came_from(tmp_path):
    m = _manifest(tmp_path, [json.dumps({"id": "a", "vectors": {"image": {"dog": 1.0}}}),
                             json.dumps({"id": "b", "vectors": {"image": {"cat": 1.0}}})])
    report = ingest_catalog(MemoryBackend(fail_ids={"b"}), "x", m, None)
    assert {i.id: i.source for i in report.items} == {"a": "m.jsonl:1", "b": "m.jsonl:2"}


def test_truncated_jpeg_among_good_ones_is_reported_and_the_rest_ingested(tmp_path):
    """Decoding runs one batch ahead in a pool; a file that fails there is one item's failure."""
    import numpy as np
    from PIL import Image

    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.encoders.base import register_encoder
    from stair_es.ingest import IngestOptions, ingest_catalog

    from fakes import ColorEncoder

    register_encoder("fake-color", ColorEncoder)
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(7):
        Image.fromarray(rng.integers(0, 255, (600, 800, 3), dtype=np.uint8)).save(folder / f"p{i}.jpg", quality=85)
    data = (folder / "p3.jpg").read_bytes()
    (folder / "p3.jpg").write_bytes(data[: len(data) // 2])
    backend = EmbeddedBackend(tmp_path / "home")
    report = ingest_catalog(backend, "photos", folder, lambda: ColorEncoder(), IngestOptions(batch_size=2))
    failed = [i for i in report.items if not i.ok]
    assert [i.id for i in failed] == ["p3.jpg"] and "truncated" in failed[0].error
    assert backend.index_info("photos").doc_count == 6
