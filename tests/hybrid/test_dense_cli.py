"""The dense retriever from the command line: vectors from the catalog (a "dense" array per JSONL
line, bad ones reported per item) or from a `--head dense` model (images at ingest, the query
text at search), `--retrievers`, `--vector-file`, explain showing each retriever's rank."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image


ROWS = [
    ("red-shoe", (250, 20, 20), "a red running shoe", [1, 0, 0, 0]),
    ("blue-shoe", (20, 20, 250), "a blue running shoe", [0, 1, 0, 0]),
    ("green-hat", (20, 250, 20), "a green hat for gardening", [0, 0, 1, 0]),
    ("red-hat", (240, 30, 30), "a woollen hat", [0.6, 0, 0, 0.8]),
]


@pytest.fixture
def catalog(tmp_path):
    root = tmp_path / "shop"
    root.mkdir()
    lines = []
    for id_, color, caption, vec in ROWS:
        Image.new("RGB", (16, 16), color).save(root / f"{id_}.png")
        lines.append(json.dumps({"id": id_, "path": f"{id_}.png", "caption": caption, "dense": vec}))
    lines.append(json.dumps({"id": "broken", "path": "red-shoe.png", "dense": [0.1, "NaN", 0, 0]}))
    lines.append(json.dumps({"id": "inf", "path": "red-shoe.png", "dense": [1e999, 0, 0, 0]}))
    lines.append(json.dumps({"id": "short", "path": "red-shoe.png", "dense": [1, 0]}))
    (root / "catalog.jsonl").write_text("\n".join(lines) + "\n")
    return root / "catalog.jsonl"


def test_catalog_vectors_are_ingested_bad_ones_reported_per_item_and_searched(run, catalog, tmp_path):
    r = run("ingest", "shop", str(catalog), "--encoder", "fake-color", "--json")
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["summary"]["ok"] == 4 and out["summary"]["failed"] == 3
    errors = {f["id"]: f["error"] for f in out["failures"]}
    assert "non-finite value (nan) at position 1" in errors["broken"]
    assert "non-finite value (inf) at position 0" in errors["inf"]
    assert "has 2 dimensions but the index's dense field has 4" in errors["short"]

    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps([0, 0, 1, 0]))
    r = run("search", "shop", "--tokens", '{"red": 1}', "--retrievers", "dense", "--vector-file", str(qfile), "--json")
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)["hits"]
    assert hits[0]["id"] == "green-hat" and hits[0]["retrievers"]["dense"]["score"] == pytest.approx(1.0, abs=1e-3)

    r = run("search", "shop", "woollen", "--retrievers", "sparse,bm25,dense", "--vector-file", str(qfile), "--explain")
    assert r.exit_code == 0, r.output
    assert "dense #" in r.output and "bm25 #" in r.output and "sparse #" in r.output

    r = run("explain", "shop", "red-hat", "woollen", "--retrievers", "bm25,dense", "--vector-file", str(qfile))
    assert r.exit_code == 0, r.output
    assert "bm25: rank 1" in r.output and "dense: rank" in r.output


@pytest.mark.parametrize("args, message", [
    (["--retrievers", "sparse,splade"], "unknown retriever 'splade'"),
    (["--retrievers", "sparse,dense", "--fusion", "linear", "--weights", "1,1,1"], "needs 2 numbers (sparse,dense), got 3"),
    (["--vector-file", "VEC"], "add dense to --retrievers"),
])
def test_bad_dense_options_give_one_line_errors(run, catalog, tmp_path, args, message):
    run("ingest", "shop", str(catalog), "--encoder", "fake-color", "--allow-failures")
    vec = tmp_path / "v.json"
    vec.write_text("[1, 0, 0, 0]")
    r = run("search", "shop", "red", *[str(vec) if a == "VEC" else a for a in args])
    assert r.exit_code != 0 and message in r.output, r.output
    assert "Traceback" not in r.output


def test_dense_requested_on_an_index_without_vectors_says_how_to_add_them(run, tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(root / "a.png")
    (root / "a.txt").write_text("a red square")
    assert run("ingest", "plain", str(root), "--encoder", "fake-color").exit_code == 0
    r = run("search", "plain", "red", "--retrievers", "sparse,dense")
    assert r.exit_code != 0
    assert "has no dense vectors (no 'dense' field)" in r.output and "--dense-dims" in r.output and "--dense-model" in r.output


def test_a_nan_query_vector_is_refused(run, catalog, tmp_path):
    run("ingest", "shop", str(catalog), "--encoder", "fake-color", "--allow-failures")
    q = tmp_path / "q.npy"
    np.save(q, np.array([0.0, np.nan, 0.0, 0.0]))
    r = run("search", "shop", "red", "--retrievers", "dense", "--vector-file", str(q))
    assert r.exit_code != 0 and "non-finite value (nan) at position 1" in r.output


@pytest.fixture(scope="module")
def dense_model(tmp_path_factory):
    """An untrained tiny `--head dense` checkpoint: the plumbing, not the quality."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from stair_es.stair.config import load_config
    from stair_es.stair.train import new_model

    out = tmp_path_factory.mktemp("dense-model")
    new_model(load_config("tiny").replace(head="dense", dense_dim=8), "cpu", seed=0).save_pretrained(out)
    return out


def test_a_dense_model_encodes_images_at_ingest_and_the_query_text_at_search(run, tmp_path, dense_model):
    from stair_es.dense import DenseEncoder

    root = tmp_path / "pics"
    root.mkdir()
    colours = {"red": (250, 10, 10), "green": (10, 250, 10), "blue": (10, 10, 250), "grey": (128, 128, 128)}
    for name, c in colours.items():
        Image.new("RGB", (32, 32), c).save(root / f"{name}.png")
        (root / f"{name}.txt").write_text(f"a {name} square")
    r = run("ingest", "pics", str(root), "--encoder", "fake-color", "--dense-model", str(dense_model), "--dense-dtype", "float32")
    assert r.exit_code == 0, r.output
    from stair_es.backends.embedded import EmbeddedBackend

    dense = EmbeddedBackend(tmp_path / "home").index_info("pics").schema.dense
    assert dense["dims"] == 8 and dense["encoder"] == {"name": "stair-dense", "model": str(dense_model)}

    r = run("search", "pics", "a blue square", "--retrievers", "dense", "--json", "-k", "4")
    assert r.exit_code == 0, r.output
    got = [(h["id"], h["retrievers"]["dense"]["score"]) for h in json.loads(r.output)["hits"]]
    # the same model, here: the ranking is its cosine between the text and each image
    enc = DenseEncoder(str(dense_model))
    q = enc.encode_texts(["a blue square"])[0]
    imgs = enc.encode_images([Image.open(root / f"{n}.png").convert("RGB") for n in colours])
    cos = {f"{n}.png": float(v @ q / np.linalg.norm(v) / np.linalg.norm(q)) for n, v in zip(colours, imgs)}
    assert [i for i, _ in got] == sorted(cos, key=lambda i: -cos[i])
    for i, s in got:
        assert s == pytest.approx(cos[i], abs=1e-4)

    # a missing model, or a dense width other than the index's, is a one-line error
    r = run("ingest", "pics", str(root), "--encoder", "fake-color", "--dense-model", str(tmp_path / "nope"))
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert run("index", "create", "four", "--dense-dims", "4", "--encoder", "fake-color").exit_code == 0
    r = run("ingest", "four", str(root), "--encoder", "fake-color", "--dense-model", str(dense_model))
    assert r.exit_code != 0 and "holds 4-dimensional dense vectors but the dense model makes 8" in r.output
    r = run("index", "create", "m", "--dense-model", str(dense_model), "--dense-dims", "16", "--encoder", "fake-color")
    assert r.exit_code != 0 and "--dense-dims 16 does not match the dense model, which makes 8-dimensional vectors" in r.output
    assert run("index", "create", "m", "--dense-model", str(dense_model), "--encoder", "fake-color").exit_code == 0
    r = run("ingest", "m", str(root), "--encoder", "fake-color", "--dense-model", str(dense_model))
    assert r.exit_code == 0, r.output


def test_index_check_verifies_the_dense_files_and_repair_lists_the_documents_that_lost_their_vector(run, catalog, tmp_path):
    run("ingest", "shop", str(catalog), "--encoder", "fake-color", "--allow-failures")
    r = run("index", "check", "shop")
    assert r.exit_code == 0 and "dense vector file" in r.output and "ok: no damage found" in r.output
    part = next((tmp_path / "home" / "shop" / "dense").glob("part-*.stair"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    r = run("index", "check", "shop")
    assert r.exit_code == 1 and "DAMAGED" in r.output
    r = run("index", "check", "shop", "--repair", "--json")
    assert r.exit_code == 0, r.output
    dense = json.loads(r.output)["dense"]
    assert dense["repaired"] and sorted(dense["docs_without_vector"]) == sorted(row[0] for row in ROWS)
    assert run("index", "check", "shop").exit_code == 0
