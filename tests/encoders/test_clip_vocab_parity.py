"""clip-vocab against transformers: the same pixels, token ids, embeddings and token weights.

Tiny random CLIPModel and SiglipModel checkpoints are made offline (benchmarks/clip_models.py:
2 layers, width 32, 32 px images) with tokenizers made by hand; the reference is transformers'
own image processor, tokenizer and ``get_image_features`` / ``get_text_features``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

import torch  # noqa: E402

from benchmarks.clip_models import make_clip, make_siglip  # noqa: E402
from stair_es.encoders import clipvocab  # noqa: E402
from stair_es.encoders.base import get_encoder  # noqa: E402
from stair_es.errors import EncoderVersionError, InvalidInputError, ModelError  # noqa: E402

TOL = 1e-5
TEXTS = ["a photo of a dog.", "A red cat, on the sofa", "the", "dog " * 40]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("clip-models")
    return {"clip": make_clip(root / "clip"), "siglip": make_siglip(root / "siglip")}


@pytest.fixture(scope="module")
def siglip_spm(tmp_path_factory) -> Path:
    pytest.importorskip("sentencepiece", reason="SigLIP's SentencePiece tokenizer needs sentencepiece")
    return make_siglip(tmp_path_factory.mktemp("siglip-spm") / "siglip", tokenizer="spm", seed=1)


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    rng = np.random.default_rng(7)
    sizes = [(40, 64), (64, 40), (32, 32), (20, 90), (300, 200)]  # wide, tall, exact, smaller than the crop, large
    out = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    out.append(out[0].convert("L"))  # a grey picture is converted to RGB
    return out


def test_sentencepiece_siglip_parity(siglip_spm, images):
    """A SigLIP checkpoint with only spiece.model (as on the hub) is tokenised by transformers'
    SiglipTokenizer: same ids, and the same embeddings through ONNX Runtime."""
    assert not (siglip_spm / "tokenizer.json").exists() and (siglip_spm / "spiece.model").exists()
    model, processor, tokenizer = _reference(siglip_spm, "siglip")
    enc = get_encoder("clip-vocab", model=str(siglip_spm), runtime="onnx")
    texts = ["A red Dog, on the beach!", "photo"]
    inputs = _ref_text_inputs(tokenizer, "siglip", texts, model.config.text_config.max_position_embeddings)
    assert np.array_equal(enc._text_tokenizer()(texts)["input_ids"], inputs["input_ids"].numpy())
    with torch.no_grad():
        ref_txt = _features(model.get_text_features(**inputs))
        ref_img = _features(model.get_image_features(pixel_values=torch.from_numpy(_ref_pixels(processor, images))))
    assert float(np.abs(enc.text_embeddings(texts) - ref_txt).max()) <= TOL
    assert float(np.abs(enc.image_embeddings(images) - ref_img).max()) <= TOL


def _reference(folder: Path, family: str):
    import transformers

    cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
    model = cls.from_pretrained(str(folder)).eval()
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    return model, processor, tokenizer


def _ref_pixels(processor, images) -> np.ndarray:
    return np.asarray(processor(images=images, return_tensors="np")["pixel_values"], np.float32)


def _ref_text_inputs(tokenizer, family: str, texts, max_length: int) -> dict[str, torch.Tensor]:
    if family == "siglip":  # SigLIP is used padded to its maximum length, without an attention mask
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"]}
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def _features(out) -> np.ndarray:
    return (out if isinstance(out, torch.Tensor) else out.pooler_output).detach().float().numpy()


def _ref_weights(features: np.ndarray, matrix: np.ndarray, threshold: float, top_k: int) -> list[dict[int, float]]:
    """The documented calibration, written again here: unit embedding, cosine to every word,
    z-score per row, log1p(max(z - threshold, 0)), the top_k largest."""
    e = features / np.linalg.norm(features, axis=1, keepdims=True)
    s = e.astype(np.float64) @ matrix.T.astype(np.float64)
    z = (s - s.mean(1, keepdims=True)) / s.std(1, keepdims=True)
    w = np.log1p(np.clip(z - threshold, 0, None))
    out = []
    for row in w:
        order = np.argsort(-row)[:top_k]
        out.append({int(i): float(row[i]) for i in order if row[i] > 0})
    return out


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_image_preprocessing_parity(models, images, family):
    _, processor, _ = _reference(models[family], family)
    enc = get_encoder("clip-vocab", model=str(models[family]))
    ours = np.stack([enc._image_preprocess()(im) for im in images])
    ref = _ref_pixels(processor, images)
    assert ours.shape == ref.shape
    assert float(np.abs(ours - ref).max()) <= TOL


@pytest.mark.parametrize("runtime", ["onnx", "torch"])
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_embedding_parity(models, images, family, runtime):
    model, processor, tokenizer = _reference(models[family], family)
    enc = get_encoder("clip-vocab", model=str(models[family]), runtime=runtime)
    with torch.no_grad():
        ref_img = _features(model.get_image_features(pixel_values=torch.from_numpy(_ref_pixels(processor, images))))
        max_length = model.config.text_config.max_position_embeddings
        inputs = _ref_text_inputs(tokenizer, family, TEXTS, max_length)
        ref_txt = _features(model.get_text_features(**inputs))
    ours_ids = enc._text_tokenizer()(TEXTS)["input_ids"]
    assert np.array_equal(ours_ids, inputs["input_ids"].numpy())  # the same token ids, truncation and padding
    got_img = enc.image_embeddings(images)
    got_txt = enc.text_embeddings(TEXTS)
    if runtime == "onnx":
        assert enc._tower("image") and enc._tower("text")  # really ONNX Runtime, not the fallback
    assert float(np.abs(got_img - ref_img).max()) <= TOL
    assert float(np.abs(got_txt - ref_txt).max()) <= TOL


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_vocabulary_matrix_and_token_weight_parity(models, images, family):
    model, processor, tokenizer = _reference(models[family], family)
    # random towers give flat, skewed similarity profiles: a threshold of 0 keeps words to compare
    enc = get_encoder("clip-vocab", model=str(models[family]), threshold=0.0, top_k=12)
    matrix = enc.vocabulary_matrix()
    assert matrix.shape[0] == len(enc.word_list) == 10979
    rng = np.random.default_rng(0)
    rows = sorted(rng.choice(len(enc.word_list), 24, replace=False).tolist())
    max_length = model.config.text_config.max_position_embeddings
    with torch.no_grad():
        for r in rows:
            prompts = [t.format(enc.word_list[r]) for t in clipvocab.DEFAULT_TEMPLATES]
            f = _features(model.get_text_features(**_ref_text_inputs(tokenizer, family, prompts, max_length)))
            f = f / np.linalg.norm(f, axis=1, keepdims=True)
            ref_row = f.mean(0) / np.linalg.norm(f.mean(0))
            assert float(np.abs(matrix[r] - ref_row).max()) <= TOL
        ref_img = _features(model.get_image_features(pixel_values=torch.from_numpy(_ref_pixels(processor, images))))
        ref_txt = _features(model.get_text_features(**_ref_text_inputs(tokenizer, family, TEXTS[:2], max_length)))
    vocab = enc.vocab
    for got, ref in zip(enc.encode_images(images), _ref_weights(ref_img, matrix, 0.0, 12)):
        ref_tokens = {vocab.token(int(enc.word_ids[i])): w for i, w in ref.items()}
        assert ref_tokens and set(got.to_token_map()) == set(ref_tokens)
        assert max(abs(got.to_token_map()[t] - w) for t, w in ref_tokens.items()) <= TOL
    for text, ref in zip(TEXTS[:2], _ref_weights(ref_txt, matrix, 0.0, 12)):
        projection = enc.explain_text(text)["projection"]
        ref_tokens = {vocab.token(int(enc.word_ids[i])): w for i, w in ref.items()}
        assert set(projection) == set(ref_tokens)
        assert max(abs(projection[t] - w) for t, w in ref_tokens.items()) <= TOL


def test_vocabulary_matrix_is_computed_once_per_model(models):
    enc = get_encoder("clip-vocab", model=str(models["clip"]))
    first = enc.vocabulary_matrix()
    before = clipvocab.MATRIX_COMPUTATIONS
    clipvocab._MATRICES.clear()  # forget the in-process copy: the next encoder must read the cached file
    again = get_encoder("clip-vocab", model=str(models["clip"])).vocabulary_matrix()
    assert clipvocab.MATRIX_COMPUTATIONS == before
    assert np.array_equal(first, again)
    assert enc.matrix_path().is_file() and json.loads(enc.matrix_path().with_suffix(".json").read_text())["shape"] == list(first.shape)
    # other templates are another matrix
    other = get_encoder("clip-vocab", model=str(models["clip"]), templates=["{}"])
    assert other.matrix_path() != enc.matrix_path()


def test_damaged_matrix_is_computed_again(models, tmp_path, monkeypatch):
    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "cache"))
    enc = get_encoder("clip-vocab", model=str(models["clip"]), templates=["a {}"])
    enc.vocabulary_matrix()
    path = enc.matrix_path()
    clipvocab._MATRICES.clear()
    data = bytearray(path.read_bytes())
    data[-4:] = b"\x00\x00\x80\x7f"
    path.write_bytes(bytes(data))
    before = clipvocab.MATRIX_COMPUTATIONS
    matrix = get_encoder("clip-vocab", model=str(models["clip"]), templates=["a {}"]).vocabulary_matrix()
    assert clipvocab.MATRIX_COMPUTATIONS == before + 1 and np.all(np.isfinite(matrix))


def test_text_query_has_its_words_and_its_projection(models):
    enc = get_encoder("clip-vocab", model=str(models["siglip"]), threshold=0.0)
    parts = enc.explain_text("a red dog")
    assert set(parts["words"]) == {"red", "dog"}
    assert parts["projection"] and all(t in enc.word_list for t in parts["projection"])
    [vec] = enc.encode_texts(["a red dog"])
    merged = vec.to_token_map()
    for t in set(parts["words"]) | set(parts["projection"]):
        assert merged[t] == pytest.approx(max(parts["words"].get(t, 0), parts["projection"].get(t, 0)), abs=1e-6)
    words_only = get_encoder("clip-vocab", model=str(models["siglip"]), projection=0)
    assert set(words_only.encode_texts(["a red dog"])[0].to_token_map()) == {"red", "dog"}
    idf = np.ones(len(enc.vocab), np.float32)
    idf[enc.vocab.id("dog")] = 3.0
    assert words_only.encode_texts(["a red dog"], idf=idf)[0].to_token_map()["dog"] == pytest.approx(3.0)


def test_top_k_and_min_weight(models, images):
    enc = get_encoder("clip-vocab", model=str(models["clip"]), threshold=-1.0, top_k=5)
    vecs = enc.encode_images(images[:3])
    assert all(v.nnz == 5 for v in vecs)
    cut = get_encoder("clip-vocab", model=str(models["clip"]), threshold=-1.0, top_k=5, min_weight=float(vecs[0].weights.max()))
    assert cut.encode_images(images[:1])[0].nnz == 1


def test_recorded_model_is_checked(models):
    cfg = get_encoder("clip-vocab", model=str(models["clip"])).config()
    assert cfg["weights"] and cfg["model_record"]["id"] == str(models["clip"]) and cfg["vocabulary"]
    again = get_encoder(**cfg)  # the same model: accepted
    assert again.config() == cfg
    other = dict(cfg, model=str(models["siglip"]))
    with pytest.raises(EncoderVersionError, match="--force"):
        get_encoder(**other).encode_texts(["dog"])
    assert get_encoder(**other, allow_version_mismatch=True).encode_texts(["dog"])[0].nnz
    with pytest.raises(EncoderVersionError, match="word list"):
        get_encoder(**dict(cfg, vocabulary="bert-wordnet3.0-v0-000000000000"))


def test_bad_models_and_options(models, tmp_path):
    with pytest.raises(InvalidInputError, match="needs a CLIP or SigLIP model"):
        get_encoder("clip-vocab")
    with pytest.raises(InvalidInputError, match="templates"):
        get_encoder("clip-vocab", model=str(models["clip"]), templates=["no placeholder"])
    with pytest.raises(ModelError, match="folder not found"):
        get_encoder("clip-vocab", model=str(tmp_path / "missing")).config()
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (bert / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ModelError, match="'bert' model"):
        get_encoder("clip-vocab", model=str(bert)).config()


def test_renamed_key_is_named(models, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    for p in models["clip"].iterdir():
        if p.is_file():
            (broken / p.name).write_bytes(p.read_bytes())
    state = load_file(str(broken / "model.safetensors"))
    state["visual_projection.weight_renamed"] = state.pop("visual_projection.weight")
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    enc = get_encoder("clip-vocab", model=str(broken), runtime="torch")
    with pytest.raises(ModelError, match="visual_projection.weight"):
        enc.image_embeddings([Image.new("RGB", (40, 40))])


def test_query_side_needs_neither_torch_nor_transformers(models):
    enc = get_encoder("clip-vocab", model=str(models["clip"]))
    enc.load()  # export both towers, compute the matrix
    code = (
        "import sys, json\n"
        "from stair_es.encoders.base import get_encoder\n"
        f"enc = get_encoder('clip-vocab', model={str(models['clip'])!r})\n"
        "v = enc.encode_texts(['a red dog'])[0]\n"
        "print(json.dumps({'nnz': v.nnz, 'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"nnz": got["nnz"], "torch": False, "transformers": False} and got["nnz"] > 0
