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
from types import SimpleNamespace

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
        self.commit = COMMIT  # what the branch points at

    def add(self, repo_id: str, files: dict[str, bytes]) -> Path:
        folder = self.root / repo_id.replace("/", "--")
        for name, data in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
        return folder

    def model_info(self, repo_id, *, revision=None, **kw):
        if not self.reachable:
            raise OSError("no connection")
        src = self.root / repo_id.replace("/", "--")
        names = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
        return SimpleNamespace(id=repo_id, siblings=[SimpleNamespace(rfilename=n) for n in names])

    def snapshot_download(self, repo_id, *, revision=None, allow_patterns=None, local_files_only=False, **kw):
        self.calls.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns,
                           "local_files_only": local_files_only})
        target = self.cache / repo_id.replace("/", "--") / "snapshots" / self.commit
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
    monkeypatch.setattr(huggingface_hub, "model_info", fake.model_info)
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


def test_an_unreachable_hub_answers_at_once_without_the_clients_retries(home, no_network, monkeypatch, caplog):
    """No DNS (a machine without internet that did not set HF_HUB_OFFLINE): the real client's
    first request fails, and the carry message comes without its retry loop (about 20 s of
    "Retrying in 8s" warnings with the repository-tree listing)."""
    hub = pytest.importorskip("huggingface_hub")
    import huggingface_hub.utils._http as hub_http

    def no_dns(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    # (the no_network fixture's AssertionError is not what a client sees: it never retries on it)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(socket, "create_connection", no_dns)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    sleeps: list[float] = []
    monkeypatch.setattr(hub_http.time, "sleep", sleeps.append)
    with pytest.raises(ModelError, match=r"the hub cannot be reached; .*models pull acme/unseen.*models import DIR"):
        models.resolve_model("acme/unseen")
    assert sleeps == []
    assert not [r for r in caplog.records if "Retry" in r.getMessage()]


def test_a_revision_not_in_the_store_offline_names_it_and_what_the_store_has(hub, monkeypatch):
    """An index built elsewhere with another commit: the answer names the revision asked for,
    the ones installed here, and carries that revision in its pull and export commands."""
    hub.add("acme/tiny", TINY)
    models.pull("acme/tiny")
    shutil.rmtree(hub.cache)  # (the fake cache answers any revision with what it holds)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as e:
        models.resolve_model("acme/tiny@abcdef0")
    message = str(e.value)
    assert message.startswith(f"cannot get model acme/tiny at revision abcdef0 (the store has it at {COMMIT[:12]} only")
    assert "`stair-es models pull acme/tiny --revision abcdef0`" in message
    assert "`stair-es models export acme/tiny@abcdef0 DIR`" in message


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


def test_pickled_weights_are_left_out_when_the_repository_has_safetensors(hub, home):
    hub.add("openai/clip-vit-base-patch32", {"config.json": b"{}", "model.safetensors": b"w", "pytorch_model.bin": b"w",
                                             "flax_model.msgpack": b"w", "tf_model.h5": b"w"})
    entry = models.pull("openai/clip-vit-base-patch32")
    assert entry.kind == "clip-vocab"
    assert sorted(entry.meta["files"]) == ["config.json", "model.safetensors"]
    hub.add("vsearch/vdr-cross-modal", {"config.json": b"{}", "pytorch_model.bin": b"w"})  # .bin only: taken
    assert sorted(models.pull("vsearch/vdr-cross-modal").meta["files"]) == ["config.json", "pytorch_model.bin"]


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


# --- export / import ---------------------------------------------------------------------------------
class ArtifactEncoder:
    """Stands in for vdr/clip-vocab: derives one file per model, keyed by the weights' sha256."""

    def __init__(self, model: str, **kw):
        self.folder = Path(model)

    def key(self) -> str:
        from stair_es.encoders.runtime import weights_digest

        return weights_digest(sorted(self.folder.glob("*.safetensors")))[:20]

    def artifacts(self) -> list[Path]:
        from stair_es.encoders.runtime import model_cache_dir

        path = model_cache_dir() / f"fake-tower-{self.key()}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"onnx graph for " + self.key().encode())
        return [path]


@pytest.fixture
def fake_kind(monkeypatch):
    from stair_es.encoders import base

    monkeypatch.setitem(base._BUILTIN, "fake-artifacts", ArtifactEncoder)
    return "fake-artifacts"


def move_home(monkeypatch, tmp_path, name: str) -> Path:
    """Switch to another, empty data home (the air-gapped machine)."""
    h = tmp_path / name
    monkeypatch.setenv("STAIR_ES_HOME", str(h))
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(h / "_models"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return h


@pytest.mark.parametrize("form", ["folder", "tar.gz", "tar"])
def test_export_then_import_in_an_empty_home_resolves_offline(hub, home, fake_kind, tmp_path, monkeypatch, form):
    hub.add("acme/tiny", TINY)
    entry = models.pull("acme/tiny", kind=fake_kind)
    record = models.model_record(entry.folder)
    dest = tmp_path / "carry" / ("bundle" if form == "folder" else f"bundle.{form}")
    dest.parent.mkdir()
    manifest = models.export("acme/tiny", dest)
    assert Path(manifest["path"]) == dest and dest.exists()
    assert manifest["id"] == "acme/tiny" and manifest["revision"] == COMMIT
    cache_files = [r for r in manifest["files"] if r.startswith("cache/")]
    assert len(cache_files) == 1 and cache_files[0].startswith("cache/fake-tower-")
    assert manifest["files"]["model/model.safetensors"]["sha256"] == sha(TINY["model.safetensors"])

    other = move_home(monkeypatch, tmp_path, "airgapped")
    shutil.rmtree(hub.cache)  # the other machine has no hub cache either
    hub.reachable = False
    with pytest.raises(ModelError, match="models import DIR"):
        models.resolve_model("acme/tiny")
    installed = models.import_bundle(dest)
    assert installed.folder.is_relative_to(other)
    folder = models.resolve_model("acme/tiny")
    assert folder == installed.folder
    assert models.model_record(folder) == record
    assert installed.meta["installed"]["how"] == "import" and installed.meta["pulled"]["how"] == "pull"
    # the derived file is back in the model cache under the same key, where the encoder looks
    enc = ArtifactEncoder(str(folder))
    derived = other / "_models" / cache_files[0][len("cache/"):]
    assert derived.read_bytes() == b"onnx graph for " + enc.key().encode()
    assert enc.artifacts() == [derived]
    assert not list((other / "_models" / "store").glob(".tmp-*"))
    # importing again is harmless
    assert models.import_bundle(dest).folder == folder


def test_export_refuses_an_existing_destination_and_a_model_not_in_the_store(hub, home, tmp_path):
    hub.add("acme/tiny", TINY)
    models.pull("acme/tiny")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(InvalidInputError, match="already exists"):
        models.export("acme/tiny", tmp_path / "full")
    with pytest.raises(ModelError, match="not in the store; run `stair-es models pull acme/other`"):
        models.export("acme/other", tmp_path / "b")


def test_export_refuses_a_damaged_store_entry(hub, home, tmp_path):
    hub.add("acme/tiny", TINY)
    entry = models.pull("acme/tiny")
    data = bytearray((entry.folder / "model.safetensors").read_bytes())
    data[10] ^= 1
    (entry.folder / "model.safetensors").unlink()  # the store's copy may be a hard link to the hub cache
    (entry.folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ModelError, match="model.safetensors of model acme/tiny in the store does not match"):
        models.export("acme/tiny", tmp_path / "b")
    assert not (tmp_path / "b").exists()


def _bundle(hub, home, tmp_path, fake_kind, name="b.tar") -> Path:
    hub.add("acme/tiny", TINY)
    models.pull("acme/tiny", kind=fake_kind)
    return Path(models.export("acme/tiny", tmp_path / name)["path"])


def _nothing_installed(h: Path) -> None:
    store = h / "_models" / "store"
    assert models.entries() == []
    assert not list(store.glob(".tmp-*")) and not list(store.glob("*/*"))
    assert not list((h / "_models").glob("fake-tower-*"))


def test_a_damaged_tarball_gives_a_checksum_error_naming_the_file_and_installs_nothing(hub, home, fake_kind, tmp_path,
                                                                                        monkeypatch):
    import tarfile

    bundle = _bundle(hub, home, tmp_path, fake_kind)
    # flip one byte inside the weights (a plain tar: the member's data sits at a known offset)
    with tarfile.open(bundle) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("model/model.safetensors"))
    raw = bytearray(bundle.read_bytes())
    raw[member.offset_data + 100] ^= 0xFF
    bundle.write_bytes(bytes(raw))
    other = move_home(monkeypatch, tmp_path, "airgapped")
    with pytest.raises(ModelError, match=r"model/model.safetensors in .* does not match its checksum.*nothing was installed"):
        models.import_bundle(bundle)
    _nothing_installed(other)


def test_a_truncated_tarball_installs_nothing(hub, home, fake_kind, tmp_path, monkeypatch):
    bundle = _bundle(hub, home, tmp_path, fake_kind, "b.tar.gz")
    bundle.write_bytes(bundle.read_bytes()[: bundle.stat().st_size // 2])
    other = move_home(monkeypatch, tmp_path, "airgapped")
    with pytest.raises(ModelError):
        models.import_bundle(bundle)
    _nothing_installed(other)


def test_a_damaged_folder_bundle_installs_nothing(hub, home, fake_kind, tmp_path, monkeypatch):
    bundle = _bundle(hub, home, tmp_path, fake_kind, "folder")
    cache_file = next((bundle / "cache").iterdir())
    cache_file.write_bytes(b"tampered")
    other = move_home(monkeypatch, tmp_path, "airgapped")
    with pytest.raises(ModelError, match=f"cache/{cache_file.name} in .* does not match its checksum"):
        models.import_bundle(bundle)
    _nothing_installed(other)


def _tar_with(path: Path, manifest_files: dict, extra) -> Path:
    import io
    import tarfile

    manifest = {"format": models.BUNDLE_FORMAT, "format_version": 1, "id": "acme/tiny", "revision": COMMIT,
                "files": manifest_files}
    with tarfile.open(path, "w") as t:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo("b/MANIFEST.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
        extra(t)
    return path


@pytest.mark.parametrize("evil", ["../escape.txt", "/etc/evil", "b/../../escape.txt", "link", "hardlink"])
def test_a_tarball_with_traversal_absolute_paths_or_links_is_refused(home, no_network, tmp_path, evil):
    import io
    import tarfile

    def extra(t):
        if evil in ("link", "hardlink"):
            info = tarfile.TarInfo("b/model/config.json")
            info.type = tarfile.SYMTYPE if evil == "link" else tarfile.LNKTYPE
            info.linkname = "/etc/passwd"
            t.addfile(info)
        else:
            info = tarfile.TarInfo(evil)
            info.size = 4
            t.addfile(info, io.BytesIO(b"evil"))

    bundle = _tar_with(tmp_path / "evil.tar", {"model/stair-es-model.json": {"sha256": "0" * 64, "size": 1}}, extra)
    with pytest.raises(ModelError, match="unsafe path|link or special file"):
        models.import_bundle(bundle)
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path.parent / "escape.txt").exists()
    assert models.entries() == []


@pytest.mark.parametrize("listed", ["cache/../../x", "cache/store/acme--x/main/config.json", "cache/weights-digests.json",
                                    "cache/.hidden", "other/x", "model"])
def test_a_manifest_listing_an_unsafe_path_is_refused(home, no_network, tmp_path, listed):
    bundle = _tar_with(tmp_path / "evil.tar", {"model/stair-es-model.json": {"sha256": "0" * 64, "size": 1},
                                               listed: {"sha256": "0" * 64, "size": 1}}, lambda t: None)
    with pytest.raises(ModelError, match="unsafe path"):
        models.import_bundle(bundle)


def test_something_that_is_not_a_bundle_is_named(home, no_network, tmp_path):
    (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(ModelError, match="not a readable tarball"):
        models.import_bundle(tmp_path / "junk.tar")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ModelError, match="not a stair-es model bundle"):
        models.import_bundle(tmp_path / "folder")
    with pytest.raises(InvalidInputError, match="does not exist"):
        models.import_bundle(tmp_path / "missing")


def test_list_shows_the_catalog_and_what_is_in_the_store(hub, home):
    rows = {r["id"]: r for r in models.listing()}
    assert {"vsearch/vdr-cross-modal", "openai/clip-vit-base-patch32", "google/siglip-base-patch16-224"} <= set(rows)
    assert rows["vsearch/vdr-cross-modal"]["kind"] == "vdr"
    assert rows["google/siglip-base-patch16-224"]["kind"] == "clip-vocab"
    assert all(r["download_size"] and r["licence"] and r["revision"] for r in rows.values())
    assert not any(r["in_store"] for r in rows.values())
    hub.add("acme/tiny", TINY)
    models.pull("acme/tiny", kind="vdr")
    rows = {r["id"]: r for r in models.listing()}
    assert rows["acme/tiny"]["in_store"] and rows["acme/tiny"]["installed"][0]["revision"] == COMMIT


def test_rm_removes_an_entry(hub, home):
    hub.add("acme/tiny", TINY)
    models.pull("acme/tiny")
    assert [e.id for e in models.remove("acme/tiny")] == ["acme/tiny"]
    assert models.find_entry("acme/tiny") is None
    with pytest.raises(ModelError, match="not in the store"):
        models.remove("acme/tiny")


def test_two_concurrent_pulls_install_one_entry(hub, home):
    import threading

    hub.add("acme/tiny", TINY)
    results, errors = [], []

    def go():
        try:
            results.append(models.pull("acme/tiny").folder)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    assert len(models.entries("acme/tiny")) == 1
    assert not list((home / "_models" / "store").glob(".tmp-*"))


def _hf_cache(root: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """A Hugging Face hub cache as the real client lays it out (refs, snapshots linking to blobs)."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, data in files.items():
        blob = repo / "blobs" / sha(data)
        blob.write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / sha(data))
    return root


def test_offline_a_model_in_the_hugging_face_cache_is_taken_by_the_real_client(home, no_network, tmp_path, monkeypatch):
    hf = pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    files = {k: v for k, v in TINY.items() if k != "tf_model.h5"}
    files["photo.png"] = b"an earlier full download left this"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_hf_cache(tmp_path / "hf", "acme/tiny", files)))
    assert hf.snapshot_download.__module__.startswith("huggingface_hub")  # the real client, not a fake
    folder = models.resolve_model("acme/tiny", kind="vdr")
    entry = models.find_entry("acme/tiny")
    assert entry.folder == folder and entry.revision == COMMIT and entry.meta["pulled"]["from"] == "huggingface-cache"
    assert (folder / "model.safetensors").read_bytes() == TINY["model.safetensors"]
    assert not (folder / "model.safetensors").is_symlink()
    assert sorted(entry.meta["files"]) == ["config.json", "model.safetensors", "vocab.txt"]  # not photo.png


def test_a_damaged_blob_in_the_hugging_face_cache_is_not_installed(home, no_network, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    files = {k: v for k, v in TINY.items() if k != "tf_model.h5"}
    root = _hf_cache(tmp_path / "hf", "acme/tiny", files)
    (root / "models--acme--tiny" / "blobs" / sha(TINY["model.safetensors"])).write_bytes(b"truncated")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    with pytest.raises(ModelError, match="model.safetensors of acme/tiny in the Hugging Face cache does not match"):
        models.resolve_model("acme/tiny")
    assert models.entries() == []


def test_refresh_installs_a_new_commit_beside_the_old_one(hub, home, monkeypatch):
    hub.add("acme/tiny", TINY)
    old = models.pull("acme/tiny")
    hub.commit = "f" * 40  # the branch moved on the hub
    assert models.pull("acme/tiny").folder == old.folder  # without --refresh: what the store has
    new = models.pull("acme/tiny", refresh=True)
    assert new.revision == "f" * 40 and new.folder != old.folder
    assert models.resolve_model("acme/tiny") == new.folder  # the newest install by default
    assert models.resolve_model(f"acme/tiny@{COMMIT}") == old.folder  # an index pinned to the old one finds it
    assert models.resolve_model("ACME/Tiny") == new.folder  # ids are case-insensitive


def test_a_member_larger_than_its_manifest_size_is_not_extracted(home, no_network, tmp_path):
    import io
    import tarfile

    def extra(t):
        info = tarfile.TarInfo("b/model/stair-es-model.json")
        info.size = 1 << 20
        t.addfile(info, io.BytesIO(b"\0" * (1 << 20)))

    bundle = _tar_with(tmp_path / "big.tar", {"model/stair-es-model.json": {"sha256": "0" * 64, "size": 1}}, extra)
    with pytest.raises(ModelError, match="does not match its checksum"):
        models.import_bundle(bundle)
    assert not list((home / "_models" / "store").glob(".tmp-*"))


def test_a_full_disk_is_one_line_and_leaves_nothing(hub, home, monkeypatch):
    import errno

    hub.add("acme/tiny", TINY)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "model.safetensors")

    monkeypatch.setattr(models.download, "_link_or_copy", full)
    with pytest.raises(ModelError, match="pulling the model failed: No space left on device"):
        models.pull("acme/tiny")
    assert models.entries() == [] and not list((home / "_models" / "store").glob(".tmp-*"))
