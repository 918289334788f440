"""Streaming image-caption sources: Karpathy split files, tar shards, JSONL; resumable order;
bad records counted and reported, never dropped silently."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
from PIL import Image

from stair_es.errors import InvalidInputError
from stair_es.stair.datasets import JsonlSource, KarpathySource, PairStream, TarShardSource, open_source

COLORS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30), "black": (0, 0, 0), "white": (255, 255, 255)}


def _png(color) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (20, 20), color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
def karpathy(tmp_path):
    root = tmp_path / "coco"
    (root / "val2014").mkdir(parents=True)
    images = []
    for i, (name, rgb) in enumerate(COLORS.items()):
        fname = f"COCO_val2014_{i:012d}.png"
        if name != "white":  # listed in the JSON but missing on disk
            (root / "val2014" / fname).write_bytes(_png(rgb))
        sents = [{"raw": f"a {name} square", "tokens": []}, {"raw": f"{name} picture"}]
        if name == "green":
            sents += [{"raw": "   "}, {"raw": "这是一只猫"}]
        images.append({"filepath": "val2014", "filename": fname, "cocoid": i, "split": "test" if i < 4 else "train", "sentences": sents})
    images.append({"filepath": "val2014", "filename": "x.png", "cocoid": 99, "split": "restval", "sentences": [{"raw": "a red x"}]})
    (root / "x.png").write_bytes(b"")
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"dataset": "coco", "images": images}))
    return path, root


def test_karpathy_test_split_streams_only_its_images(karpathy):
    path, root = karpathy
    src = KarpathySource(path, root, ("test",))
    assert len(src) == 4
    stream = PairStream(src, image_size=8, seed=0, buffer=2)
    b = stream.next_batch(3)
    assert b["pixels"].shape == (3, 8, 8, 3) and b["pixels"].dtype == np.uint8
    assert b["ids"].shape[0] == 3 and (b["mask"].sum(1) > 2).all()


def test_missing_files_empty_and_foreign_captions_are_counted(karpathy):
    path, root = karpathy
    stream = PairStream(KarpathySource(path, root, ("train", "restval", "test")), image_size=8, seed=0, buffer=1)
    for _ in range(3):
        stream.next_batch(2)
    rep = stream.report
    reasons = " ".join(r for _, r in rep.skipped_images)
    assert rep.skipped_count >= 1 and "does not exist" in reasons
    assert "images skipped" in rep.summary()


def test_caption_checker_rejects_empty_and_unreadable():
    from stair_es.stair.data import DataReport
    from stair_es.stair.datasets import CaptionChecker
    from stair_es.vocab import default_vocabulary

    check, rep = CaptionChecker(default_vocabulary(), 77), DataReport(source="x")
    assert check("   ", "a:1", rep) is None
    assert check("这是一只猫", "a:2", rep) is None
    assert check("a red square", "a:3", rep) is not None
    assert rep.rejected_captions == 2
    assert "mostly unknown" in rep.rejected[1][1] and "empty" in rep.rejected[0][1]


def test_unknown_split_and_missing_folder_are_clear_errors(karpathy, tmp_path):
    path, root = karpathy
    with pytest.raises(InvalidInputError, match="unknown Karpathy split"):
        KarpathySource(path, root, ("testing",))
    with pytest.raises(InvalidInputError, match="image folder"):
        KarpathySource(path, tmp_path / "nope")
    with pytest.raises(InvalidInputError, match="give the image folder"):
        open_source(str(path))


def _shards(tmp_path, n_shards=3, per=4):
    files = []
    k = 0
    for s in range(n_shards):
        f = tmp_path / f"shard-{s:05d}.tar"
        with tarfile.open(f, "w") as tar:
            for _ in range(per):
                rgb = list(COLORS.values())[k % 4]
                for ext, data in (("jpg", _png(rgb)), ("txt" if k % 2 else "json", f"pair {k}".encode() if k % 2 else json.dumps({"caption": f"pair {k}"}).encode())):
                    info = tarfile.TarInfo(f"{k:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                k += 1
            info = tarfile.TarInfo("orphan.txt")  # a caption with no image: reported
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        files.append(f)
    return files


def test_tar_shards_group_members_by_key(tmp_path):
    _shards(tmp_path)
    src = TarShardSource(str(tmp_path / "*.tar"))
    from stair_es.stair.data import DataReport

    rep = DataReport(source="x")
    pairs = [p for sh in src.shards() for p in src.iter_shard(sh, rep)]
    assert len(pairs) == 12 and {p.captions[0] for p in pairs} == {f"pair {k}" for k in range(12)}
    assert len(rep.rejected) == 3 and "needs an image" in rep.rejected[0][1]
    assert Image.open(pairs[0].open()).size == (20, 20)


def test_stream_resumes_exactly_where_it_stopped(tmp_path):
    _shards(tmp_path)
    src = TarShardSource(tmp_path)
    a = PairStream(src, image_size=8, seed=5, buffer=3)
    for _ in range(2):
        a.next_batch(4)
    saved = a.state()
    rest = [a.next_batch(4) for _ in range(3)]  # crosses into epoch 1
    assert a.state()["epoch"] >= 1
    b = PairStream(TarShardSource(tmp_path), image_size=8, seed=5, buffer=3)
    b.restore(saved)
    for x, y in zip(rest, [b.next_batch(4) for _ in range(3)]):
        assert (x["ids"] == y["ids"]).all() and (x["pixels"] == y["pixels"]).all()


def test_processes_read_disjoint_shares(tmp_path):
    _shards(tmp_path, n_shards=4, per=2)
    seen = []
    for rank in range(2):
        s = PairStream(TarShardSource(tmp_path), image_size=8, seed=0)
        s.shard(rank, 2)
        it = s._epoch_iter(0)
        seen.append({p.key for p in it})
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 8


def test_jsonl_source_streams_lines(tmp_path):
    (tmp_path / "a.png").write_bytes(_png((255, 0, 0)))
    lines = [json.dumps({"image": "a.png", "captions": ["a red square", "red"]}), "not json", json.dumps({"caption": "no image"})]
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    s = PairStream(JsonlSource(tmp_path / "pairs.jsonl"), image_size=8)
    assert s.next_batch(1)["pixels"].shape == (1, 8, 8, 3)
    assert len(s.report.rejected) == 2
    with pytest.raises(InvalidInputError, match="could not fill a batch of 2"):
        s.next_batch(2)  # only one distinct image exists
