"""The ``vdr`` encoder against the reference implementation (jzhoubu/VDR @ 12c3e7a).

``tests/fixtures/vdr_tiny`` holds a tiny random checkpoint of the released architecture and
the token weights the reference computed on it (see its README). stair_es must give the same
tokens with the same weights (max abs diff <= 1e-5) on both towers, in PyTorch and in ONNX
Runtime; load the state dict strictly; and encode queries without importing torch once the
towers are exported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("torch")
pytest.importorskip("transformers")

from stair_es.encoders import get_encoder  # noqa: E402
from stair_es.encoders.vdr import RESTRICTED_SIZE, VdrEncoder, restricted_ids  # noqa: E402
from stair_es.errors import EncoderVersionError, ModelError  # noqa: E402
from stair_es.vocab import default_vocabulary  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vdr_tiny"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text("utf-8"))
TOL = 1e-5
RUNTIMES = ["torch", pytest.param("onnx", marks=pytest.mark.skipif(
    __import__("importlib").util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed"))]


def _images() -> list[Image.Image]:
    return [Image.open(FIXTURE / item["file"]).convert("RGB") for item in EXPECTED["images"]]


def _max_diff(expected: dict, vec) -> tuple[set, set, float]:
    ref = dict(zip(expected["ids"], expected["weights"]))
    got = dict(zip(vec.ids.tolist(), vec.weights.tolist()))
    keys = set(ref) | set(got)
    return set(ref), set(got), max(abs(ref.get(k, 0.0) - got.get(k, 0.0)) for k in keys)


@pytest.fixture(scope="module")
def encoders() -> dict[str, VdrEncoder]:
    return {rt: VdrEncoder(str(FIXTURE), runtime=rt) for rt in ("torch", "onnx")}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_tower_parity_with_reference(encoders, runtime):
    enc = encoders[runtime]
    vectors = enc.encode_images(_images(), batch_size=3)  # batches of 3 and 1: batching changes nothing
    assert enc.runtime_in_use == runtime
    for expected, vec in zip(EXPECTED["images"], vectors):
        ref, got, diff = _max_diff(expected, vec)
        assert got == ref, f"{expected['file']}: tokens differ from the reference"
        assert len(got) == EXPECTED["topk"]
        assert diff <= TOL, f"{expected['file']}: max |stair_es - reference| = {diff:.3g}"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_text_tower_parity_with_reference(encoders, runtime):
    enc = encoders[runtime]
    texts = [item["text"] for item in EXPECTED["texts"]]
    vectors = enc.encode_texts(texts, batch_size=4)
    for expected, vec in zip(EXPECTED["texts"], vectors):
        ref, got, diff = _max_diff(expected, vec)
        assert got == ref, f"{expected['text'][:40]!r}: tokens differ from the reference"
        assert diff <= TOL, f"{expected['text'][:40]!r}: max |stair_es - reference| = {diff:.3g}"


def test_parity_fixture_is_unambiguous():
    """Top-k membership cannot flip under float error: the k-th and (k+1)-th weights are far apart."""
    assert min(EXPECTED["topk_gap_images"] + EXPECTED["topk_gap_texts"]) > 100 * 3e-8


def test_text_keeps_its_own_words_beyond_top_k(encoders):
    """The reference's bag-of-words mask: every word of a text is a token of its vector."""
    vocab = default_vocabulary()
    [vec] = encoders["torch"].encode_texts(["zebra umbrella"])
    tokens = {vocab.token(i) for i in vec.ids.tolist()}
    assert {"zebra", "umbrella"} <= tokens
    assert len(tokens) >= EXPECTED["topk"]


def test_restricted_vocabulary_is_the_references():
    vocab = default_vocabulary()
    valid = restricted_ids(vocab)
    assert len(valid) == RESTRICTED_SIZE == 27623
    kept = {vocab.token(i) for i in valid.tolist()}
    assert {"the", "dog", "!", "##s", "##~"} <= kept
    assert not {"[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]", "[unused0]", "##¡", "##é", "é", "°c"} & kept
    # every id the fixture's reference outputs use lies in it
    used = {i for item in EXPECTED["images"] + EXPECTED["texts"] for i in item["ids"]}
    assert used <= set(valid.tolist())


def test_top_k_and_min_weight_options():
    enc = VdrEncoder(str(FIXTURE), runtime="torch", top_k=5)
    [img] = enc.encode_images(_images()[:1])
    assert img.nnz == 5
    ref = EXPECTED["images"][0]
    best = sorted(zip(ref["weights"], ref["ids"]), reverse=True)[:5]
    assert set(img.ids.tolist()) == {i for _, i in best}
    floor = sorted(ref["weights"])[-10]
    enc = VdrEncoder(str(FIXTURE), runtime="torch", min_weight=floor)
    [img] = enc.encode_images(_images()[:1])
    assert img.nnz == 10 and float(img.weights.min()) >= floor
    assert enc.config()["min_weight"] == floor


# --- strict loading -------------------------------------------------------------------------
def _copy_with_state(tmp_path: Path, edit) -> Path:
    import torch

    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    edit(state)
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def test_strict_loading_names_a_renamed_key(tmp_path):
    def rename(state):
        state["encoder_p.ln_post.scale"] = state.pop("encoder_p.ln_post.weight")

    enc = VdrEncoder(str(_copy_with_state(tmp_path, rename)), runtime="torch")
    with pytest.raises(ModelError) as e:
        enc.encode_images(_images()[:1])
    msg = str(e.value)
    assert "missing 1 keys (encoder_p.ln_post.weight)" in msg
    assert "unexpected 1 keys (encoder_p.ln_post.scale)" in msg
    assert "\n" not in msg


def test_strict_loading_names_an_unexpected_key(tmp_path):
    import torch

    def add(state):
        state["encoder_q.pooler.dense.weight"] = torch.zeros(16, 16)

    enc = VdrEncoder(str(_copy_with_state(tmp_path, add)), runtime="torch")
    with pytest.raises(ModelError, match=r"unexpected 1 keys \(encoder_q\.pooler\.dense\.weight\)"):
        enc.encode_texts(["a red square"])


def test_buffers_saved_by_older_transformers_are_not_mismatches(tmp_path):
    import torch

    def add(state):  # transformers < 4.31 saved BERT's position ids with the weights
        state["encoder_q.bert_model.embeddings.position_ids"] = torch.arange(64).unsqueeze(0)

    [vec] = VdrEncoder(str(_copy_with_state(tmp_path, add)), runtime="torch").encode_texts([EXPECTED["texts"][0]["text"]])
    assert _max_diff(EXPECTED["texts"][0], vec)[2] <= TOL


def test_strict_loading_names_wrong_shapes(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(FIXTURE, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["encoder_p"]["width"] = 32  # the weights are 16 wide
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=r"wrong shapes \(encoder_p\.conv1\.weight \(16, 3, 32, 32\) != \(32, 3, 32, 32\)"):
        VdrEncoder(str(folder), runtime="torch").encode_images(_images()[:1])


def test_folder_of_another_architecture_is_refused(tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    bert = tmp_path / "bert"
    BertForMaskedLM(BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32)).save_pretrained(bert)
    with pytest.raises(ModelError, match="not a VDR cross-modal checkpoint"):
        VdrEncoder(str(bert)).encode_texts(["a dog"])
    # the VDR config beside another model's weights: the mismatched keys are named
    shutil.copy(FIXTURE / "config.json", bert / "config.json")
    with pytest.raises(ModelError) as e:
        VdrEncoder(str(bert), runtime="torch").encode_texts(["a dog"])
    msg = str(e.value)
    assert "missing" in msg and "encoder_p.conv1.weight" in msg
    assert "unexpected" in msg and "bert.embeddings.word_embeddings.weight" in msg


def test_missing_folder_and_missing_weights(tmp_path):
    with pytest.raises(ModelError, match="model folder not found"):
        VdrEncoder(str(tmp_path / "nope")).encode_texts(["a"])
    folder = tmp_path / "noweights"
    folder.mkdir()
    shutil.copy(FIXTURE / "config.json", folder / "config.json")
    with pytest.raises(ModelError, match="no pytorch_model.bin or model.safetensors"):
        VdrEncoder(str(folder)).encode_texts(["a"])


def test_safetensors_layout_loads_the_same(tmp_path):
    import torch
    from safetensors.torch import save_file

    folder = tmp_path / "st"
    shutil.copytree(FIXTURE, folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    (folder / "pytorch_model.bin").unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    [vec] = VdrEncoder(str(folder), runtime="torch").encode_texts([EXPECTED["texts"][0]["text"]])
    assert _max_diff(EXPECTED["texts"][0], vec)[2] <= TOL


# --- what an index records ------------------------------------------------------------------
def test_config_records_the_weights_and_rebuilds(encoders):
    cfg = encoders["torch"].config()
    assert cfg["name"] == "vdr" and cfg["model"] == str(FIXTURE)
    assert len(cfg["weights"]) == 16 and cfg["model_record"]
    again = get_encoder(**json.loads(json.dumps(cfg)))
    assert again.config() == cfg


def test_other_weights_are_refused_unless_forced(tmp_path, encoders):
    recorded = encoders["torch"].config()

    def nudge(state):
        state["encoder_q.ln.bias"] = state["encoder_q.ln.bias"] + 0.01

    other = str(_copy_with_state(tmp_path, nudge))
    options = {**recorded, "model": other}
    with pytest.raises(EncoderVersionError, match="--force"):
        get_encoder(**options).encode_texts(["a red square"])
    assert get_encoder(**options, allow_version_mismatch=True).encode_texts(["a red square"])[0].nnz > 0


# --- the query side without torch -----------------------------------------------------------
@pytest.mark.skipif(__import__("importlib").util.find_spec("onnxruntime") is None, reason="onnxruntime is not installed")
def test_queries_run_without_torch_once_exported(encoders):
    enc = encoders["onnx"]
    paths = enc.artifacts()
    assert len(paths) == 4 and all(p.is_file() for p in paths)
    assert {p.suffix for p in paths} == {".onnx", ".json"}
    expected = EXPECTED["texts"][1]
    code = f"""
import json, sys
from PIL import Image
from stair_es.encoders import get_encoder
enc = get_encoder("vdr", model={str(FIXTURE)!r}, runtime="onnx")
[vec] = enc.encode_texts([{expected['text']!r}])
[img] = enc.encode_images([Image.open({str(FIXTURE / 'red_square.png')!r}).convert("RGB")])
print(json.dumps({{"ids": vec.ids.tolist(), "weights": vec.weights.tolist(), "img": img.nnz,
                  "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}}))
"""
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"] is False and got["transformers"] is False
    assert got["img"] == EXPECTED["topk"]
    ref = dict(zip(expected["ids"], expected["weights"]))
    assert set(got["ids"]) == set(ref)
    assert max(abs(ref[i] - w) for i, w in zip(got["ids"], got["weights"])) <= TOL


def test_tokenizer_json_in_the_folder_is_used(tmp_path):
    from stair_es.vocab import hf_tokenizer

    folder = tmp_path / "withjson"
    shutil.copytree(FIXTURE, folder)
    hf_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").unlink()
    texts = [item["text"] for item in EXPECTED["texts"]]
    for expected, vec in zip(EXPECTED["texts"], VdrEncoder(str(folder), runtime="torch").encode_texts(texts)):
        assert _max_diff(expected, vec)[2] <= TOL


def test_preprocessing_matches_the_reference_geometry():
    """Shorter side to 224 (bicubic), centre crop: a 300x200 picture keeps its middle 224 columns."""
    from stair_es.encoders.vdr import CLIP_MEAN, CLIP_STD, preprocess_image

    img = Image.new("RGB", (300, 200), "white")
    x = preprocess_image(img, 224)
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    white = (1.0 - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)
    assert np.allclose(x.reshape(3, -1).mean(axis=1), white, atol=1e-5)
