"""The model store: pull, resolve, export/import across homes, with the network disabled.

A tiny local "hub" stands in for huggingface.co: ``snapshot_download`` is replaced by a
function that copies a repository folder into a Hugging Face-like cache
(``snapshots/<commit>/``), honouring ``allow_patterns`` and ``local_files_only``. The real
client is what users run; what is tested here is everything stair_es does around it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import socket
from pathlib import Path

import pytest

from stair_es import models
from stair_es.errors import InvalidInputError, ModelError

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Repositories in ``root/<org>--<name>/``; downloads land in ``cache/<org>--<name>/snapshots/<commit>/``."""

    def __init__(self, root: Path, cache: Path):
        self.root, self.cache = root, cache
        self.reachable = True
        self.calls: list[dict] = []
        self.fail_after: int | None = None  # raise after copying this many files (an interrupted download)

    def add(self, repo_id: str, files: dict[str, bytes]) -> Path:
        folder = self.root / repo_id.replace("/", "--")
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        return folder

    def snapshot_download(self, repo_id, *, revision=None, allow_patterns=None, local_files_only=False, **kw):
        self.calls.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns,
                           "local_files_only": local_files_only})
        target = self.cache / repo_id.replace("/", "--") / "snapshots" / COMMIT
        if local_files_only or not self.reachable:
            if target.is_dir():
                return str(target)
            raise OSError("We have no connection or you passed local_files_only=True")
        src = self.root / repo_id.replace("/", "--")
        if not src.is_dir():
            raise type("RepositoryNotFoundError", (Exception,), {})(f"404 Client Error: {repo_id}")
        target.mkdir(parents=True, exist_ok=True)
        copied = 0
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src).as_posix()
            if path.is_file() and (not allow_patterns or any(fnmatch.fnmatch(rel, p) for p in allow_patterns)):
                if self.fail_after is not None and copied >= self.fail_after:
                    raise ConnectionError("connection reset by peer")
                (target / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target / rel)
                copied += 1
        return str(target)


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A data home of the test's own (store and model cache inside it)."""
    h = tmp_path / "home"
    monkeypatch.setenv("STAIR_ES_HOME", str(h))
    monkeypatch.delenv("STAIR_ES_MODEL_STORE", raising=False)
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(h / "_models"))
    monkeypatch.delenv("STAIR_ES_OFFLINE", raising=False)
    return h


@pytest.fixture
def hub(tmp_path, monkeypatch, no_network, home):
    import huggingface_hub

    fake = FakeHub(tmp_path / "hub", tmp_path / "hf-cache")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake.snapshot_download)
    # pulls are what a user with internet runs: online for the fake hub, the sockets stay guarded
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return fake


TINY = {
    "config.json": b'{"model_type": "tiny", "hidden_size": 4}',
    "model.safetensors": bytes(range(256)) * 64,
    "vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    "tf_model.h5": b"not wanted",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- resolve_model / model_record (the contract the encoders call) ---------------------------------
def test_a_local_folder_resolves_to_itself_and_records_its_weights(tmp_path, home, no_network):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    assert models.resolve_model(str(folder)) == folder
    record = models.model_record(folder)
    assert record["id"] == str(folder)
    assert set(record) == {"id", "weights"} and len(record["weights"]) == 16
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert models.model_record(folder)["weights"] != record["weights"]


def test_a_missing_folder_is_named(tmp_path, home, no_network):
    with pytest.raises(ModelError, match="model folder not found"):
        models.resolve_model(str(tmp_path / "nope"))


def test_an_unknown_id_offline_gives_the_one_line_carry_message(home, no_network, tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeHub(tmp_path / "h", tmp_path / "c").snapshot_download)
    with pytest.raises(ModelError) as e:
        models.resolve_model("someone/some-model", kind="vdr")
    message = str(e.value)
    assert "\n" not in message
    assert "stair-es models pull someone/some-model" in message
    assert "stair-es models export someone/some-model DIR" in message
    assert "stair-es models import DIR" in message


def test_the_real_hub_client_offline_gives_the_same_message(home, no_network):
    pytest.importorskip("huggingface_hub")
    with pytest.raises(ModelError, match=r"models pull acme/unseen.*models import DIR"):
        models.resolve_model("acme/unseen")


def test_bad_ids_are_refused(home, no_network):
    for bad in ("a/b/c", "../x", "a--b/c"):
        with pytest.raises((InvalidInputError, ModelError)):
            models.resolve_model(bad)


# --- pull ---------------------------------------------------------------------------------------------
def test_pull_makes_a_store_entry_with_checksums(hub, home):
    hub.add("acme/tiny", TINY)
    entry = models.pull("acme/tiny", kind="vdr")
    assert entry.folder.parent.parent == home / "_models" / "store"
    meta = json.loads((entry.folder / models.ENTRY_FILE).read_text())
    assert meta["id"] == "acme/tiny" and meta["revision"] == COMMIT and meta["requested_revision"] == "main"
    assert meta["kind"] == "vdr" and meta["pulled"]["how"] == "pull"
    assert meta["files"]["model.safetensors"] == {"sha256": sha(TINY["model.safetensors"]), "size": 16384}
    assert "tf_model.h5" not in meta["files"]  # other frameworks' weights are not pulled
    assert not (entry.folder / "tf_model.h5").exists()
    # resolve_model now finds it with no network and records id, revision and a checksum
    folder = models.resolve_model("acme/tiny")
    assert folder == entry.folder
    assert models.model_record(folder) == {"id": "acme/tiny", "revision": COMMIT, "sha256": meta["sha256"]}
    assert models.resolve_model(f"acme/tiny@{COMMIT[:8]}") == folder
    # a second pull is a no-op
    calls = len(hub.calls)
    models.pull("acme/tiny")
    assert len(hub.calls) == calls


def test_resolve_model_pulls_once_when_online(hub, home):
    hub.add("acme/tiny", TINY)
    folder = models.resolve_model("acme/tiny", kind="clip-vocab")
    assert json.loads((folder / models.ENTRY_FILE).read_text())["kind"] == "clip-vocab"
    models.resolve_model("acme/tiny")
    assert len(hub.calls) == 1


def test_catalog_models_pull_their_own_file_patterns(hub, home):
    hub.add("openai/clip-vit-base-patch32", {"config.json": b"{}", "model.safetensors": b"w", "pytorch_model.bin": b"w"})
    entry = models.pull("openai/clip-vit-base-patch32")
    assert entry.kind == "clip-vocab"
    assert sorted(entry.meta["files"]) == ["config.json", "model.safetensors"]


def test_an_interrupted_pull_leaves_no_usable_entry_and_a_rerun_completes(hub, home, monkeypatch):
    hub.add("acme/tiny", TINY)
    hub.fail_after = 1  # the connection drops after config.json: the hub cache holds a partial snapshot
    with pytest.raises(ModelError, match="cannot get model acme/tiny: the hub cannot be reached"):
        models.pull("acme/tiny")
    assert models.find_entry("acme/tiny") is None
    # offline, the partial snapshot in the hub cache is not installed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="no weight files"):
        models.resolve_model("acme/tiny")
    # a process killed while copying into the store leaves a temporary folder: never used
    store = home / "_models" / "store"
    half = store / ".tmp-pull-acme--tiny-999-deadbeef"
    half.mkdir(parents=True)
    (half / "config.json").write_bytes(b"half")
    assert models.find_entry("acme/tiny") is None and models.entries() == []
    monkeypatch.delenv("HF_HUB_OFFLINE")
    hub.fail_after = None
    entry = models.pull("acme/tiny")
    assert entry.meta["files"]["config.json"]["sha256"] == sha(TINY["config.json"])
    assert entry.meta["files"]["model.safetensors"]["sha256"] == sha(TINY["model.safetensors"])
    assert not list(store.glob(".tmp-*"))  # the next pull cleared the leftover


def test_a_damaged_store_entry_is_not_used(hub, home):
    hub.add("acme/tiny", TINY)
    entry = models.pull("acme/tiny")
    (entry.folder / "model.safetensors").write_bytes(b"short")
    with pytest.raises(ModelError, match="damaged"):
        models.resolve_model("acme/tiny")
