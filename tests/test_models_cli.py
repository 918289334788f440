"""`stair-es models ...` through the CLI: tables, --json, one-line errors and exit codes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from stair_es import models
from test_models import COMMIT, TINY, fake_kind, hub, home, no_network, move_home  # noqa: F401 - fixtures


def cli(*args):
    from stair_es.cli.main import cli as main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_list_table_and_json(hub, home):
    r = cli("models", "list")
    assert r.exit_code == 0
    for model in ("vsearch/vdr-cross-modal", "openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"):
        assert model in r.output
    assert "licence" in r.output and str(models.store_dir()) in r.output
    data = json.loads(cli("models", "list", "--json").output)
    assert data["store"] == str(models.store_dir())
    assert {m["id"]: m["in_store"] for m in data["models"]}["vsearch/vdr-cross-modal"] is False


def test_pull_export_import_rm_round_trip(hub, home, fake_kind, tmp_path, monkeypatch):
    hub.add("acme/tiny", TINY)
    r = cli("models", "pull", "acme/tiny", "--encoder", fake_kind)
    assert r.exit_code == 0, r.output
    assert f"acme/tiny at revision {COMMIT} is in the store" in r.output
    pulled = json.loads(cli("models", "pull", "acme/tiny", "--json").output)
    assert pulled["kind"] == fake_kind and pulled["files"] == 3
    r = cli("models", "verify", "acme/tiny")
    assert r.exit_code == 0 and "all 3 files match" in r.output
    r = cli("models", "export", "acme/tiny", str(tmp_path / "bundle"), "--tar")
    assert r.exit_code == 0, r.output
    assert "1 derived" in r.output and "stair-es models import bundle.tar" in r.output

    move_home(monkeypatch, tmp_path, "airgapped")
    r = cli("models", "import", str(tmp_path / "bundle.tar"), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["installed"]["how"] == "import"
    listed = {m["id"]: m for m in json.loads(cli("models", "list", "--json").output)["models"]}
    assert listed["acme/tiny"]["in_store"] and listed["acme/tiny"]["installed"][0]["how"] == "import"
    r = cli("models", "rm", "acme/tiny")
    assert r.exit_code == 0 and f"removed acme/tiny at revision {COMMIT}" in r.output
    assert models.entries() == []


def test_errors_are_one_line_with_an_exit_code(home, no_network, tmp_path):
    r = cli("models", "pull", "acme/unseen")
    assert r.exit_code == 6
    assert r.output.count("\n") == 1 and r.output.startswith("Error: cannot get model acme/unseen")
    assert "stair-es models import DIR" in r.output
    r = cli("models", "export", "acme/unseen", str(tmp_path / "b"))
    assert r.exit_code == 6 and "not in the store" in r.output
    (tmp_path / "bad.tar").write_bytes(b"x" * 2000)
    r = cli("models", "import", str(tmp_path / "bad.tar"))
    assert r.exit_code == 6 and "not a readable tarball" in r.output and not models.entries()
    r = cli("models", "pull", "../etc")
    assert r.exit_code == 2 and "not a model id" in r.output
