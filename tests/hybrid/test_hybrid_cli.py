"""`stair-es search --hybrid` on the embedded engine: fused ranking, each retriever's rank and
score in the table and the JSON, clear errors for bad fusion parameters."""

import json

import pytest
from PIL import Image


@pytest.fixture
def shop(tmp_path, run):
    root = tmp_path / "shop"
    root.mkdir()
    rows = [
        ("red-shoe", (250, 20, 20), "a red running shoe", {"brand": "acme"}),
        ("blue-shoe", (20, 20, 250), "a blue running shoe", {"brand": "acme"}),
        ("green-hat", (20, 250, 20), "a green hat for gardening", {"brand": "globex"}),
        ("red-hat", (240, 30, 30), "a woollen hat", {"brand": "globex", "tags": ["winter"]}),
    ]
    lines = []
    for id_, color, caption, meta in rows:
        Image.new("RGB", (16, 16), color).save(root / f"{id_}.png")
        lines.append(json.dumps({"id": id_, "path": f"{id_}.png", "caption": caption, "metadata": meta}))
    (root / "catalog.jsonl").write_text("\n".join(lines) + "\n")
    assert run("ingest", "shop", str(root / "catalog.jsonl"), "--encoder", "fake-color").exit_code == 0
    return "shop"


def test_hybrid_search_fuses_and_shows_each_retrievers_rank(run, shop):
    r = run("search", shop, "gardening", "--hybrid", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["hits"][0]["id"] == "green-hat"  # only BM25 knows the word; the colour encoder ranks it too
    top = data["hits"][0]["retrievers"]
    assert top["bm25"]["rank"] == 1 and top["bm25"]["score"] > 0
    assert any("fused by RRF (k=60)" in n for n in data["notes"])

    r = run("search", shop, "winter", "--hybrid", "--fusion", "linear", "--weights", "0,1", "--json")
    assert json.loads(r.output)["hits"][0]["id"] == "red-hat"  # keyword metadata is BM25 text too

    r = run("search", shop, "red", "--hybrid", "--explain", "-k", "2")
    assert r.exit_code == 0, r.output
    assert "sparse #" in r.output and "bm25 #" in r.output and "contribution" in r.output


@pytest.mark.parametrize("args, message", [
    (["--weights", "-1,2"], "not negative"),
    (["--weights", "0,0"], "sum to 0"),
    (["--weights", "1"], "needs 2 numbers"),
    (["--rrf-k", "0"], "rrf-k"),
    (["--window", "3", "-k", "5"], "window"),
])
def test_bad_fusion_parameters_are_one_line_errors(run, shop, args, message):
    r = run("search", shop, "red", "--hybrid", *args)
    assert r.exit_code != 0
    assert message in r.output
    assert "Traceback" not in r.output


def test_hybrid_needs_text(run, shop):
    r = run("search", shop, "--tokens", '{"red": 1}', "--hybrid")
    assert r.exit_code != 0 and "--hybrid needs a query TEXT" in r.output


def test_explain_hybrid_shows_each_retrievers_rank(run, shop):
    r = run("explain", shop, "green-hat", "gardening", "--hybrid")
    assert r.exit_code == 0, r.output
    assert "hybrid: fused rank 1" in r.output and "bm25: rank 1" in r.output
    data = json.loads(run("explain", shop, "red-shoe", "red gardening", "--hybrid", "--json").output)
    assert data["hybrid"]["retrievers"]["sparse"]["rank"] == 1  # the reddest image
    assert data["hybrid"]["retrievers"]["bm25"]["rank"] in (1, 2)  # "red" in its caption; ties with the gardening hat
    assert data["score"] > 0 and data["contributions"]
