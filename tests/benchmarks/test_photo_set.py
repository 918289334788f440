"""The public real-photo evaluation set (benchmarks/encoders/photos.json), its loader and the
runner's graded metrics.

The integrity tests read only the JSON, so they run on any machine; the test that loads the
real photos skips unless their packages are already installed."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks.encoders import sets as sets_mod
from benchmarks.encoders.run import evaluate_set, graded_ranking, query_set_metrics
from benchmarks.encoders.sets import (
    PHOTO_MAX_SIDE,
    PHOTOS_JSON,
    Item,
    QuerySet,
    SetUnavailable,
    export_ratings,
    photos_set,
    query_set_of_items,
)

FORBIDDEN = ("lomiri-wallpapers", "mate-backgrounds", "opencv-doc", "darknet")
CATEGORIES = {"object", "scene", "place", "people", "activity", "colour", "count", "material", "weather-time"}


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(PHOTOS_JSON.read_text("utf-8"))


# --------------------------------------------------------------------------------------------
# The JSON itself (no photo needed)
# --------------------------------------------------------------------------------------------


def test_enough_photos_and_queries_with_unique_ids(manifest):
    photos, queries = manifest["photos"], manifest["queries"]
    assert len(photos) >= 150 and len(queries) >= 200
    assert len({p["id"] for p in photos}) == len(photos)
    assert len({q["id"] for q in queries}) == len(queries)
    assert len({q["query"].lower() for q in queries}) == len(queries), "a query text is written twice"


def test_every_photo_names_its_package_path_licence_and_hash(manifest):
    for p in manifest["photos"]:
        assert p["package"] in manifest["sources"], p["id"]
        src = manifest["sources"][p["package"]]
        assert src["kind"] in ("debian", "wheel") and src["version"] and src["licence"]
        assert p["licence"].strip(), p["id"]
        assert re.fullmatch(r"[0-9a-f]{64}", p["sha256"]), p["id"]
        if src["kind"] == "wheel":
            assert p["path"].startswith("wheel:") and "/" in p["path"], p["id"]
        else:
            assert p["path"].startswith("/usr/share/"), p["id"]


def test_one_file_per_distinct_photo(manifest):
    hashes = [p["sha256"] for p in manifest["photos"]]
    paths = [p["path"] for p in manifest["photos"]]
    assert len(set(hashes)) == len(hashes) and len(set(paths)) == len(paths)


def test_no_package_kept_for_the_independent_check(manifest):
    for p in manifest["photos"]:
        text = f"{p['package']} {p['path']}".lower()
        assert not any(f in text for f in FORBIDDEN), p
    assert not any(f in name.lower() for name in manifest["sources"] for f in FORBIDDEN)


def test_every_query_has_a_judged_relevant_photo_that_exists(manifest):
    ids = {p["id"] for p in manifest["photos"]}
    for q in manifest["queries"]:
        assert q["query"].strip() and q["category"] in CATEGORIES, q["id"]
        assert q["relevant"], q["id"]
        assert set(q["relevant"]) <= ids, (q["id"], set(q["relevant"]) - ids)
        assert set(q["relevant"].values()) <= {1, 2}, q["id"]
        assert max(q["relevant"].values()) >= 1


def test_nearly_every_photo_is_a_target_of_some_query(manifest):
    judged = {k for q in manifest["queries"] for k in q["relevant"]}
    assert len(judged) >= 0.95 * len(manifest["photos"])


def test_the_sample_photos_are_never_a_querys_only_targets(manifest):
    from stair_es.samples import SAMPLES

    sklearn = {"0": "china", "1": "flower"}
    stems = {Path(sklearn.get(s.loader.split(":", 1)[1], s.loader.split(":", 1)[1])).stem.lower() for s in SAMPLES}
    sample_ids = {p["id"] for p in manifest["photos"]
                  if p["path"].startswith(("wheel:skimage/", "wheel:sklearn/", "wheel:matplotlib/"))
                  and Path(p["path"]).stem.lower() in stems}
    assert len(sample_ids) >= 10  # the mapping above still finds them
    assert [q["query"] for q in manifest["queries"] if set(q["relevant"]) <= sample_ids] == []


# --------------------------------------------------------------------------------------------
# The loader, on photos made here
# --------------------------------------------------------------------------------------------


def _photo(path: Path, size: tuple[int, int], colour: str) -> str:
    Image.new("RGB", size, colour).save(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tiny_manifest(tmp_path: Path) -> Path:
    a, b = tmp_path / "red.png", tmp_path / "blue.png"
    sha_a = _photo(a, (2000, 1000), "red")
    _photo(b, (40, 30), "blue")
    doc = {
        "version": 1, "about": "test",
        "sources": {"made-here": {"kind": "debian", "version": "1", "licence": "CC0"}},
        "photos": [
            {"id": "red", "package": "made-here", "path": str(a), "licence": "CC0", "sha256": sha_a},
            {"id": "blue", "package": "made-here", "path": str(b), "licence": "CC0", "sha256": "0" * 64},
        ],
        "queries": [
            {"id": "q1", "query": "red", "category": "colour", "relevant": {"red": 2}},
            {"id": "q2", "query": "blue", "category": "colour", "relevant": {"blue": 2}},
            {"id": "q3", "query": "anything", "category": "colour", "relevant": {"red": 1, "blue": 2}},
        ],
    }
    path = tmp_path / "photos.json"
    path.write_text(json.dumps(doc))
    return path


def test_a_changed_photo_is_reported_and_left_out_never_used(tmp_path):
    qs = photos_set(manifest_path=_tiny_manifest(tmp_path))
    assert [it.id for it in qs.items] == ["red"]
    assert any("blue" in n and "differs from the judged file" in n for n in qs.notes)
    # the query whose only relevant photo is gone is dropped and said so; the other keeps its red photo
    assert [q.id for q in qs.queries] == ["q1", "q3"]
    assert qs.queries[1].relevant == {"red": 1}
    assert any("q2" in n and "dropped" in n for n in qs.notes)


def test_huge_photos_are_downsized_on_load(tmp_path):
    qs = photos_set(manifest_path=_tiny_manifest(tmp_path))
    img = qs.items[0].load()
    assert img.mode == "RGB" and max(img.size) == PHOTO_MAX_SIDE and img.size == (1600, 800)
    assert any("downsized" in n for n in qs.notes)


def test_a_set_with_no_usable_photo_is_unavailable_with_the_reason(tmp_path):
    path = _tiny_manifest(tmp_path)
    doc = json.loads(path.read_text())
    doc["photos"] = doc["photos"][1:]
    path.write_text(json.dumps(doc))
    with pytest.raises(SetUnavailable, match="blue"):
        photos_set(manifest_path=path)


def test_a_missing_debian_package_without_root_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(sets_mod.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sets_mod, "CACHE", tmp_path / "cache")
    path = _tiny_manifest(tmp_path)
    doc = json.loads(path.read_text())
    for i, p in enumerate(doc["photos"]):
        p["path"] = f"/usr/share/no-such-package-here/photo{i}.jpg"
    path.write_text(json.dumps(doc))
    with pytest.raises(SetUnavailable, match="apt-get install made-here"):
        photos_set(manifest_path=path)


def test_item_sets_become_one_query_per_item_sharing_descriptions():
    items = [Item(i, t, lambda: None) for i, t in [("a", "A dog."), ("b", "a  dog."), ("c", "A cat.")]]
    qs = query_set_of_items("x", items)
    assert [(q.id, q.relevant) for q in qs.queries] == [("a", {"a": 1, "b": 1}), ("b", {"a": 1, "b": 1}),
                                                         ("c", {"c": 1})]


def test_export_ratings_writes_a_folder_catalog_and_ratings(tmp_path):
    qs = photos_set(manifest_path=_tiny_manifest(tmp_path))
    out = tmp_path / "export"
    ratings, n_photos, n_queries = export_ratings(qs, out)
    assert (n_photos, n_queries) == (1, 2)
    assert (out / "red.png").is_symlink() and (out / "red.png").resolve() == (tmp_path / "red.png").resolve()
    lines = [json.loads(line) for line in ratings.read_text().splitlines()]
    assert lines == [{"id": "q1", "query": "red", "relevant": {"red.png": 2}},
                     {"id": "q3", "query": "anything", "relevant": {"red.png": 1}}]
    with pytest.raises(ValueError, match="not empty"):
        export_ratings(qs, out)
    with pytest.raises(ValueError, match="inside the repository"):
        export_ratings(qs, Path(sets_mod.__file__).parent / "exported")


def test_an_item_without_a_file_is_exported_as_png(tmp_path):
    qs = QuerySet("x", [Item("arr", "", lambda: Image.new("RGB", (8, 8), "green"))],
                  [sets_mod.Query("q", "green", {"arr": 2})])
    ratings, _, _ = export_ratings(qs, tmp_path / "e")
    assert Image.open(tmp_path / "e" / "arr.png").size == (8, 8)
    assert json.loads(ratings.read_text())["relevant"] == {"arr.png": 2}


def test_a_photo_missing_from_an_installed_package_is_reported_not_fatal(tmp_path):
    path = _tiny_manifest(tmp_path)
    doc = json.loads(path.read_text())
    doc["photos"][1]["path"] = str(tmp_path / "gone.png")  # the package is there (red.png), this photo is not
    path.write_text(json.dumps(doc))
    qs = photos_set(manifest_path=path)
    assert [it.id for it in qs.items] == ["red"]
    assert any("blue" in n and "cannot be read" in n for n in qs.notes)


# --------------------------------------------------------------------------------------------
# Graded metrics and the runner on a query set
# --------------------------------------------------------------------------------------------


def test_ties_count_against_the_query_in_the_graded_ranking():
    row = np.array([0.5, 0.5, 0.5, 0.9])
    assert graded_ranking(row, {1: 2, 2: 1}).tolist() == [3, 0, 2, 1]


def test_graded_metrics_by_hand():
    pytest.importorskip("ir_measures")
    scores = np.array([[0.9, 0.5, 0.5, 0.1], [0.2, 0.2, 0.2, 0.2], [0.0, 1.0, 0.0, 0.0]])
    grades = [{0: 2}, {3: 1}, {2: 2, 1: 1}]
    m = query_set_metrics(scores, grades)
    assert m["p1"] == pytest.approx(2 / 3) and m["mrr"] == pytest.approx((1 + 1 / 4 + 1) / 3)
    # trec_eval's nDCG (linear gains): 1; tied last 1/log2(5); (1 + 2/log2(5)) / (2 + 1/log2(3))
    q2 = (1 + 2 / np.log2(5)) / (2 + 1 / np.log2(3))
    assert m["ndcg10"] == pytest.approx((1 + 1 / np.log2(5) + q2) / 3, abs=1e-4)


def test_without_ir_measures_ndcg_is_none_and_the_rest_is_measured(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ir_measures", None)  # import fails as if not installed
    m = query_set_metrics(np.array([[1.0, 0.0]]), [{0: 2}])
    assert m["ndcg10"] is None and m["p1"] == 1.0


class _ColourEncoder:
    """Image -> the token of its dominant colour; text -> its own words' tokens."""

    uses_idf = False

    def __init__(self):
        from stair_es.vocab import default_vocabulary

        self.vocab = default_vocabulary()

    def _vec(self, words):
        from stair_es.sparse import SparseVector

        ids = sorted({self.vocab.get(w) for w in words if self.vocab.get(w) is not None})
        return SparseVector.from_arrays(ids, [1.0] * len(ids), self.vocab)

    def encode_images(self, images, batch_size=16, progress=False):
        names = {(255, 0, 0): "red", (0, 0, 255): "blue", (0, 128, 0): "green"}
        return [self._vec([names.get(im.getpixel((0, 0)), "grey")]) for im in images]

    def encode_texts(self, texts, idf=None):
        return [self._vec(t.lower().split()) for t in texts]


def test_the_runner_measures_a_query_set_with_categories():
    pytest.importorskip("ir_measures")
    colours = {"r": "red", "b": "blue", "g": "green"}
    items = [Item(k, "", (lambda c=c: Image.new("RGB", (4, 4), c))) for k, c in colours.items()]
    queries = [sets_mod.Query("q1", "red", {"r": 2}, "colour"), sets_mod.Query("q2", "blue thing", {"b": 2, "g": 1}, "colour"),
               sets_mod.Query("q3", "yellow", {"g": 1}, "object")]
    enc = _ColourEncoder()
    [row] = evaluate_set("t", QuerySet("t", items, queries), enc, ["default"], enc)
    assert (row["n"], row["n_queries"]) == (3, 3)
    assert row["p1"] == pytest.approx(2 / 3, abs=1e-3)  # 'yellow' matches nothing: all tied, ranked last
    assert row["p1_by_category"] == {"colour": {"n": 2, "p1": 1.0}, "object": {"n": 1, "p1": 0.0}}
    assert row["misses"] == [{"query": "yellow", "rank": 3}]


# --------------------------------------------------------------------------------------------
# The real photos, when their packages are installed here
# --------------------------------------------------------------------------------------------


def _missing_sources(manifest) -> list[str]:
    missing = []
    for name, src in manifest["sources"].items():
        paths = [p["path"] for p in manifest["photos"] if p["package"] == name]
        if src["kind"] == "wheel":
            stem = re.sub(r"[-_.]+", "_", name).lower()
            cached = any(w.name.lower().startswith(f"{stem}-{src['version']}-")
                         for w in (sets_mod.CACHE / "wheels").glob("*.whl"))
            try:
                installed = importlib.metadata.version(name) == src["version"]
            except importlib.metadata.PackageNotFoundError:
                installed = False
            if not (installed or cached):
                missing.append(f"{name}=={src['version']}")
        elif src.get("extract_only"):
            unpacked = sets_mod.CACHE / "debs" / name
            if not any(Path(p).exists() or (unpacked / p.lstrip("/")).exists() for p in paths[:1]):
                missing.append(name)
        elif not Path(paths[0]).exists():
            missing.append(name)
    return missing


@pytest.mark.slow
def test_the_real_photo_set_loads_when_its_packages_are_here(manifest):
    missing = _missing_sources(manifest)
    if missing:
        pytest.skip(f"photo sources not installed here: {', '.join(missing)} "
                    "(python -m benchmarks.encoders.run --sets photos installs them as root)")
    qs = photos_set()
    assert len(qs.items) == len(manifest["photos"]) and len(qs.queries) == len(manifest["queries"])
    assert not [n for n in qs.notes if "left out" in n or "dropped" in n]
    for it in qs.items[::17]:
        img = it.load()
        assert img.mode == "RGB" and max(img.size) <= PHOTO_MAX_SIDE
