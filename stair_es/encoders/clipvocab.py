"""``clip-vocab``: grounded sparse words from any CLIP or SigLIP model, zero-shot.

A CLIP-style model puts images and texts in one embedding space. Embed a fixed vocabulary
of words once ("a photo of a {word}." and a few more templates), and an image's cosine
similarity to every word says which words describe it (SpLiCE, Bhalla et al., NeurIPS 2024:
a few dozen concept words keep much of CLIP's zero-shot accuracy). The words are whole
BERT uncased tokens, so each is one token id and the result is an ordinary
:class:`~stair_es.sparse.SparseVector` that any backend indexes.

The vocabulary
    ``configs/clip_vocab.json`` (``scripts/build_clip_vocab.py``): the 10,979 whole-word BERT
    tokens (ASCII letters, >= 3 long, not stopwords) that are lower-case WordNet 3.0 noun or
    adjective lemmas. A word's text embedding is the normalised mean of its templates'
    normalised embeddings (:data:`DEFAULT_TEMPLATES`). The ``V x d`` matrix is computed once per
    model (batched, with a progress bar) and cached in ``model_cache_dir()`` as
    ``clipvocab-matrix-KEY.npy`` (+ ``.json``), the key hashing the weights' sha256, the
    vocabulary version and the templates.

Calibration (images and the projection of a query)
    ``s = T e`` (cosine of the unit embedding ``e`` with every word), ``z = (s - mean(s)) /
    std(s)`` over the vocabulary *for that input*, then ``w = log1p(max(z - threshold, 0))``
    (``threshold`` 2.0: only words more than two standard deviations above the image's own
    mean similarity count; ``log1p`` keeps the rare very high z from dominating a dot
    product), the ``top_k`` (32) largest, and ``min_weight``. Z-scoring per input makes the
    weights comparable across models with very different cosine ranges (CLIP's sit near
    0.2-0.3, SigLIP's near 0), so no per-model temperature is needed.

Texts
    A query gets its own whole-word tokens (the ``bow`` encoder: count saturation, the
    index's IDF when given) *and* the projection of its text embedding onto the vocabulary
    (same calibration; ``projection`` scales it, 0 turns it off); a token in both keeps the
    larger weight. :meth:`ClipVocabEncoder.explain_text` says which token came from which.

Runtime
    Both towers are exported to ONNX through :mod:`stair_es.encoders.runtime` (checked against
    PyTorch at export, cached by the weights' sha256); images are preprocessed with PIL and
    numpy as the model's ``preprocessor_config.json`` says (the same steps as transformers'
    PIL image processors) and texts tokenised with the model's ``tokenizer.json`` through HF
    ``tokenizers``. Once the towers and the matrix are cached, neither torch nor
    transformers is imported.

This module must not know about indices or backends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import EmptyQueryError, InvalidInputError, MissingDependencyError, ModelError, optional_import
from ..sparse import SparseVector
from ..vocab import Vocabulary
from .base import Encoder, check_recorded_version, progress_bar, read_packaged_map
from .options import EncoderOptions
from .runtime import (TowerSpec, TwoTowers, file_sha256, first_line, in_batches, model_cache_dir, publish,
                      quiet_model_libraries, runtime_choice, verified_sidecar, weights_digest)

log = logging.getLogger(__name__)

DEFAULT_TEMPLATES: tuple[str, ...] = ("a photo of a {}.", "a photo of the {}.", "a close-up photo of a {}.", "{}")
DEFAULT_TOP_K = 32
DEFAULT_THRESHOLD = 2.0
FAMILIES = ("clip", "siglip")
#: Bump when the way the vocabulary matrix is computed changes (same inputs, other numbers).
MATRIX_VERSION = 1
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: How many vocabulary matrices this process computed (a cache hit computes none); tests read it.
MATRIX_COMPUTATIONS = 0
_LOCK = threading.Lock()
_MATRICES: dict[str, np.ndarray] = {}


def load_word_list() -> tuple[str, list[str]]:
    """(version, words) of the shipped vocabulary."""
    data = read_packaged_map("clip_vocab.json", "the clip-vocab word list")
    return str(data["version"]), list(data["words"])


class _Preprocess:
    """The image steps of transformers' PIL image processors for CLIP and SigLIP, in numpy:
    RGB, resize (shortest edge, or to height x width) with the configured PIL filter, centre
    crop, rescale in float64 then float32, normalise in float32; CHW."""

    def __init__(self, cfg: dict[str, Any], family: str, image_size: int):
        clip = family == "clip"
        size = cfg.get("size", {"shortest_edge": image_size} if clip else {"height": image_size, "width": image_size})
        if isinstance(size, int):
            size = {"shortest_edge": size} if clip else {"height": size, "width": size}
        self.size = dict(size)
        self.do_resize = bool(cfg.get("do_resize", True))
        self.resample = int(cfg.get("resample", 3))  # PIL.Image.BICUBIC
        self.do_center_crop = bool(cfg.get("do_center_crop", clip))
        crop = cfg.get("crop_size", {"height": image_size, "width": image_size})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        self.crop = (int(crop["height"]), int(crop["width"]))
        self.do_rescale = bool(cfg.get("do_rescale", True))
        self.rescale_factor = float(cfg.get("rescale_factor", 1 / 255))
        self.do_normalize = bool(cfg.get("do_normalize", True))
        self.mean = np.array(cfg.get("image_mean", _CLIP_MEAN if clip else (0.5, 0.5, 0.5)), np.float32)
        self.std = np.array(cfg.get("image_std", _CLIP_STD if clip else (0.5, 0.5, 0.5)), np.float32)
        if "shortest_edge" not in self.size and not ("height" in self.size and "width" in self.size):
            raise ModelError(f"unsupported image size in preprocessor_config.json: {size}")

    @property
    def min_side(self) -> int:
        return int(self.size.get("shortest_edge") or min(self.size["height"], self.size["width"]))

    def __call__(self, image: Any) -> np.ndarray:
        if image.mode != "RGB":
            image = image.convert("RGB")
        if self.do_resize:
            w, h = image.size
            if "shortest_edge" in self.size:
                s = int(self.size["shortest_edge"])
                short, long = (w, h) if w <= h else (h, w)
                new_long = int(s * long / short)
                new_h, new_w = (new_long, s) if w <= h else (s, new_long)
            else:
                new_h, new_w = int(self.size["height"]), int(self.size["width"])
            image = image.resize((new_w, new_h), resample=self.resample)
        arr = np.asarray(image).transpose(2, 0, 1)
        if self.do_center_crop:
            ch, cw = self.crop
            h, w = arr.shape[1:]
            if ch > h or cw > w:  # as transformers: pad with zeros to the crop size, centred
                big = np.zeros((3, max(h, ch), max(w, cw)), arr.dtype)
                top, left = -(-(big.shape[1] - h) // 2), -(-(big.shape[2] - w) // 2)
                big[:, top : top + h, left : left + w] = arr
                arr, h, w = big, big.shape[1], big.shape[2]
            top, left = (h - ch) // 2, (w - cw) // 2
            arr = arr[:, top : top + ch, left : left + cw]
        x = (arr.astype(np.float64) * self.rescale_factor).astype(np.float32) if self.do_rescale else arr.astype(np.float32)
        if self.do_normalize:
            x = ((x.T - self.mean) / self.std).T
        return np.ascontiguousarray(x, dtype=np.float32)


class _TextTokenizer:
    """The model's ``tokenizer.json`` through HF ``tokenizers``, padded as the family needs:
    CLIP to the longest text of a batch (with an attention mask; its causal text tower pools at
    the first end-of-text token, so padding changes nothing), SigLIP always to its maximum
    length (it was trained so and pools the last position).

    A checkpoint with no ``tokenizer.json`` (SigLIP's hub checkpoints ship only a SentencePiece
    ``spiece.model``) is tokenised by transformers' own tokenizer for it (``AutoTokenizer``;
    needs ``sentencepiece``): then a query imports transformers, though still not torch.
    """

    def __init__(self, folder: Path, family: str, max_length: int, model: str):
        self.family = family
        self.max_length = int(max_length)
        self.slow: Any = None
        file = folder / "tokenizer.json"
        if not file.is_file():
            self.slow = self._load_slow(folder, model)
            return
        tokenizers = optional_import("tokenizers", "the clip-vocab encoder", "encoders", "tokenizers")
        try:
            self.tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise ModelError(f"cannot read the tokenizer of {model!r} ({file}): {first_line(e)}") from None
        self.tok.no_padding()
        self.tok.enable_truncation(max_length=self.max_length)
        self.pad_id = self._pad_id(folder)

    def _load_slow(self, folder: Path, model: str) -> Any:
        if not any((folder / n).is_file() for n in ("spiece.model", "tokenizer_config.json", "vocab.json")):
            raise ModelError(f"model {model!r} has no tokenizer (tokenizer.json, or spiece.model / vocab.json with "
                             f"tokenizer_config.json) in {folder}; give the checkpoint folder with its tokenizer files")
        transformers = optional_import("transformers", f"the tokenizer of {model!r} (no tokenizer.json)", "encoders",
                                       "transformers")
        try:
            return transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except ImportError as e:  # transformers names the missing package (sentencepiece, protobuf)
            raise MissingDependencyError(f"the tokenizer of {model!r} ({first_line(e)})", "encoders", "sentencepiece protobuf") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"cannot load the tokenizer of {model!r} from {folder}: {first_line(e)}") from None

    def _pad_id(self, folder: Path) -> int:
        pad = None
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            try:
                data = json.loads((folder / name).read_text("utf-8"))
            except (OSError, ValueError):
                continue
            value = data.get("pad_token")
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                pad = value
                break
        for candidate in (pad, "<pad>", "<|endoftext|>", "</s>"):
            if candidate is not None and self.tok.token_to_id(candidate) is not None:
                return int(self.tok.token_to_id(candidate))
        return 0

    def __call__(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        if self.slow is not None:
            padding = "max_length" if self.family == "siglip" else True
            enc = self.slow(list(texts), padding=padding, truncation=True, max_length=self.max_length, return_tensors="np")
            ids, mask = np.asarray(enc["input_ids"], np.int64), enc.get("attention_mask")
        else:
            seqs = [e.ids for e in self.tok.encode_batch(list(texts))]
            width = self.max_length if self.family == "siglip" else max(len(s) for s in seqs)
            ids = np.full((len(seqs), width), self.pad_id, np.int64)
            mask = np.zeros((len(seqs), width), np.int64)
            for r, s in enumerate(seqs):
                ids[r, : len(s)] = s
                mask[r, : len(s)] = 1
        if self.family == "siglip":
            return {"input_ids": ids}
        return {"input_ids": ids, "attention_mask": np.asarray(mask, np.int64)}


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float32)
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def calibrate(sims: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> np.ndarray:
    """Cosine similarities to every vocabulary word (one row per input) -> word weights:
    z-scored per row, ``log1p(max(z - threshold, 0))`` (see the module docstring)."""
    s = np.asarray(sims, np.float64)
    mean = s.mean(axis=-1, keepdims=True)
    std = s.std(axis=-1, keepdims=True)
    z = (s - mean) / np.maximum(std, 1e-12)
    return np.log1p(np.maximum(z - threshold, 0.0))


@dataclass
class ClipVocabOptions(EncoderOptions):
    """The ``clip-vocab`` encoder's options besides ``model`` (``--encoder-option KEY=VALUE``; calibration in
    the module docstring). ``weights``, ``model_record`` and ``vocabulary`` are what ``config()`` records of
    the model and word list an index was built with: others are refused unless ``allow_version_mismatch``."""

    positional = ("model",)
    top_k: int = DEFAULT_TOP_K  # the largest words kept per input
    min_weight: float = 0.0  # word weights below are dropped
    threshold: float = DEFAULT_THRESHOLD  # standard deviations above the mean a word's similarity must reach
    templates: Sequence[str] | None = None  # prompts holding one "{}" for the word; None: DEFAULT_TEMPLATES
    projection: float = 1.0  # weight of the query's projection on the word list (0: off)
    words: bool = True  # a query keeps its own words
    k1: float = 1.2  # the query words' count saturation (BagOfWordsEncoder)
    runtime: str | None = None  # onnx or torch; None: ONNX Runtime when installed
    weights: str | None = None
    model_record: dict[str, Any] | None = None
    vocabulary: str | None = None
    allow_version_mismatch: bool = False


class ClipVocabEncoder(TwoTowers, Encoder):
    """Zero-shot sparse words from a CLIP or SigLIP checkpoint (see the module docstring)."""

    name = "clip-vocab"
    modalities = frozenset({"image", "text"})

    def __init__(self, model: str | None = None, *, vocab: Vocabulary | None = None, name: str | None = None,
                 **options: Any):
        super().__init__(vocab, name=name)
        from .text import BagOfWordsEncoder

        o = ClipVocabOptions.from_kwargs(options, self.name)
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(
                "the clip-vocab encoder needs a CLIP or SigLIP model: --model ID (e.g. openai/clip-vit-base-patch32, "
                "see `stair-es models list`) or a local folder")
        if not (isinstance(o.top_k, int) and o.top_k >= 1):
            raise InvalidInputError(f"top_k must be a whole number >= 1, got {o.top_k!r}")
        if not (o.min_weight >= 0 and np.isfinite(o.min_weight)):
            raise InvalidInputError(f"min_weight must be >= 0, got {o.min_weight!r}")
        if not np.isfinite(o.threshold):
            raise InvalidInputError(f"threshold must be a number (standard deviations), got {o.threshold!r}")
        if not (o.projection >= 0 and np.isfinite(o.projection)):
            raise InvalidInputError(f"projection must be >= 0 (0 turns the query's projection off), got {o.projection!r}")
        templates = o.templates
        tpl = tuple(templates) if templates is not None else DEFAULT_TEMPLATES
        if isinstance(templates, str) or not tpl or any(not isinstance(t, str) or t.count("{}") != 1 for t in tpl):
            raise InvalidInputError('templates must be a list of prompts each holding one "{}" for the word, e.g. "a photo of a {}."')
        if not (o.words or o.projection > 0):
            raise InvalidInputError("a query needs its own words (words=true) or the projection (projection > 0)")
        self.model = model.strip()
        self.top_k = o.top_k
        self.min_weight = float(o.min_weight)
        self.threshold = float(o.threshold)
        self.templates = tpl
        self.projection = float(o.projection)
        self.words = bool(o.words)
        self.runtime = runtime_choice(o.runtime)
        self.allow_version_mismatch = bool(o.allow_version_mismatch)
        self._recorded_weights = o.weights
        self._recorded_record = o.model_record
        self.vocabulary_version, self.word_list = load_word_list()
        check_recorded_version("the clip-vocab word list", o.vocabulary, self.vocabulary_version,
                               o.allow_version_mismatch, "image words from the two differ")
        ids = [self.vocab.get(w) for w in self.word_list]
        if any(i is None for i in ids):
            raise ModelError("the clip-vocab word list holds words outside the BERT vocabulary; reinstall stair-es")
        self.word_ids = np.array(ids, np.int64)
        self._bow = BagOfWordsEncoder(vocab=self.vocab, k1=o.k1)
        self.k1 = float(o.k1)
        self._info: dict[str, Any] | None = None
        self._torch_model: Any = None
        self._towers: dict[str, Any] = {}
        self._tokenizer: _TextTokenizer | None = None
        self._preprocess: _Preprocess | None = None
        self._matrix: np.ndarray | None = None

    # --- the model --------------------------------------------------------------------------
    def _model_info(self) -> dict[str, Any]:
        """Folder, family, weight files and digest, record; checks the recorded model once."""
        if self._info is not None:
            return self._info
        from ..models import model_config, model_record

        folder, cfg = model_config(self.model, kind="clip-vocab", expected="a CLIP or SigLIP checkpoint folder")
        family = cfg.get("model_type")
        if family not in FAMILIES:
            raise ModelError(f"model {self.model!r} is a {family!r} model; the clip-vocab encoder takes a full CLIP or "
                             f"SigLIP checkpoint (model_type {' or '.join(FAMILIES)}) with both towers")
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin")
                       and not p.name.startswith(("tf_", "flax_")))
        if not files:
            raise ModelError(f"model {self.model!r}: no weights (.safetensors or .bin) in {folder}")
        weight_files = files + [folder / "config.json"]
        digest = weights_digest(weight_files)
        text_cfg, vision_cfg = cfg.get("text_config") or {}, cfg.get("vision_config") or {}
        info = {"folder": folder, "family": family, "weight_files": weight_files, "digest": digest,
                "weights": digest[:16], "record": model_record(folder),
                "image_size": int(vision_cfg.get("image_size", 224)),
                "max_length": int(text_cfg.get("max_position_embeddings", 77 if family == "clip" else 64))}
        self._check_recorded_weights("clip-vocab", info["weights"], "its words are not comparable")
        self._info = info
        return info

    @property
    def image_min_side(self) -> int | None:  # type: ignore[override]
        try:
            return self._image_preprocess().min_side
        except ModelError:
            return None

    def _image_preprocess(self) -> _Preprocess:
        if self._preprocess is None:
            info = self._model_info()
            try:
                cfg = json.loads((info["folder"] / "preprocessor_config.json").read_text("utf-8"))
            except OSError:
                cfg = {}
            except ValueError as e:
                raise ModelError(f"model {self.model!r}: preprocessor_config.json is not valid JSON ({e})") from None
            self._preprocess = _Preprocess(cfg, info["family"], info["image_size"])
        return self._preprocess

    def _text_tokenizer(self) -> _TextTokenizer:
        if self._tokenizer is None:
            info = self._model_info()
            self._tokenizer = _TextTokenizer(info["folder"], info["family"], info["max_length"], self.model)
        return self._tokenizer

    def torch_model(self) -> Any:
        """The transformers ``CLIPModel`` / ``SiglipModel`` (only for export and runtime='torch')."""
        if self._torch_model is None:
            info = self._model_info()
            what = "exporting a CLIP/SigLIP model (first use)"
            optional_import("torch", what, "encoders", "transformers torch")
            transformers = optional_import("transformers", what, "encoders", "transformers torch")
            cls = transformers.CLIPModel if info["family"] == "clip" else transformers.SiglipModel
            try:
                with quiet_model_libraries():
                    model, loading = cls.from_pretrained(str(info["folder"]), output_loading_info=True)
            except (OSError, ValueError, KeyError, RuntimeError) as e:
                raise ModelError(f"cannot load {info['family']} model {self.model!r}: {first_line(e)}") from None
            bad = {k: v for k, v in loading.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
            if bad:
                parts = [f"{k.replace('_', ' ')}: {', '.join(map(str, list(v)[:5]))}{' ...' if len(v) > 5 else ''}"
                         for k, v in bad.items()]
                raise ModelError(f"model {self.model!r} does not match the {info['family']} architecture of its config "
                                 f"({'; '.join(parts)}); give an unmodified CLIP or SigLIP checkpoint")
            self._torch_model = model.eval()
        return self._torch_model

    # --- ONNX towers ------------------------------------------------------------------------
    def tower_specs(self) -> dict[str, Any]:
        info = self._model_info()
        family, size = info["family"], info["image_size"]
        enc = self

        def module(image: bool) -> Any:
            import torch

            model = enc.torch_model()

            class Tower(torch.nn.Module):
                def __init__(self) -> None:
                    super().__init__()
                    self.m = model

                def forward(self, first: Any, attention_mask: Any = None) -> Any:  # pixel values, or input ids
                    if image:
                        return _features(self.m.get_image_features(pixel_values=first))
                    return _features(self.m.get_text_features(input_ids=first, attention_mask=attention_mask))

            return Tower().eval()

        def image_sample() -> dict[str, np.ndarray]:
            return {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)}

        def text_sample() -> dict[str, np.ndarray]:
            return enc._text_tokenizer()(["a photo of a dog.", "red"])

        text_inputs = ["input_ids"] if family == "siglip" else ["input_ids", "attention_mask"]
        axes = {"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"}, "embeddings": {0: "batch"}}
        kind = f"clipvocab-{family}"
        return {
            "image": TowerSpec(kind=f"{kind}-image", weight_files=info["weight_files"], build=lambda: module(True),
                               sample=image_sample, input_names=["pixel_values"], output_names=["embeddings"],
                               dynamic_axes={"pixel_values": {0: "batch"}, "embeddings": {0: "batch"}}, tolerance=1e-4,
                               parallel=True),
            "text": TowerSpec(kind=f"{kind}-text", weight_files=info["weight_files"], build=lambda: module(False),
                              sample=text_sample, input_names=text_inputs, output_names=["embeddings"],
                              dynamic_axes={k: v for k, v in axes.items() if k in text_inputs or k == "embeddings"},
                              tolerance=1e-4),
        }

    # --- embeddings -------------------------------------------------------------------------
    def image_embeddings(self, images: Sequence[Any], *, batch_size: int = 16) -> np.ndarray:
        """Raw (unnormalised) image features, as transformers' ``get_image_features`` gives them."""
        prep = self._image_preprocess()
        out = []
        for i in range(0, len(images), batch_size):
            pixels = np.stack([prep(im) for im in images[i : i + batch_size]])
            out.append(self._run("image", {"pixel_values": pixels}))
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    def text_embeddings(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """Raw (unnormalised) text features, as transformers' ``get_text_features`` gives them."""
        tok = self._text_tokenizer()
        out = []
        for i in range(0, len(texts), batch_size):
            out.append(self._run("text", tok(texts[i : i + batch_size])))
        return np.concatenate(out) if out else np.zeros((0, 0), np.float32)

    def _run(self, which: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        tower = self._tower(which)
        if tower:
            run = tower.run_parallel if which == "image" else tower.run
            return np.asarray(run(feeds)[0], np.float32)
        import torch

        model = self.torch_model()
        with torch.no_grad():
            if which == "image":
                got = model.get_image_features(pixel_values=torch.from_numpy(feeds["pixel_values"]))
            else:
                got = model.get_text_features(**{k: torch.from_numpy(v) for k, v in feeds.items()})
        return _features(got).float().numpy()

    # --- the vocabulary matrix --------------------------------------------------------------
    def matrix_key(self) -> str:
        info = self._model_info()
        parts = [info["digest"], self.vocabulary_version, json.dumps(list(self.templates)), f"matrix{MATRIX_VERSION}"]
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]

    def matrix_path(self) -> Path:
        return model_cache_dir() / f"clipvocab-matrix-{self.matrix_key()}.npy"

    def vocabulary_matrix(self, *, progress: bool = False) -> np.ndarray:
        """The ``V x d`` unit text embeddings of the word list, computed once per model and cached."""
        if self._matrix is not None:
            return self._matrix
        path = self.matrix_path()
        with _LOCK:
            cached = _MATRICES.get(str(path))
        if cached is None:
            cached = _read_matrix(path, len(self.word_list))
        if cached is None:
            cached = self._compute_matrix(path, progress)
        with _LOCK:
            _MATRICES[str(path)] = cached
        self._matrix = cached
        return cached

    def _compute_matrix(self, path: Path, progress: bool) -> np.ndarray:
        global MATRIX_COMPUTATIONS
        started = time.perf_counter()
        words, templates = self.word_list, self.templates
        prompts = [t.format(w) for w in words for t in templates]
        # similar lengths batch together (less padding); results go back to their rows
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        emb: np.ndarray | None = None
        batch = 128
        # Minutes to an hour on a few CPU cores: say so when no progress bar does (e.g. the first
        # query of a search on a machine the matrix was not carried to).
        (log.info if progress else log.warning)(
            "clip-vocab: embedding the %d-word vocabulary (%d prompts) with %s, once per model; this takes a while on a "
            "CPU (stair-es models export carries the result)", len(words), len(prompts), self.model)
        with progress_bar(len(prompts), "clip-vocab: embedding the vocabulary (once per model)", progress) as bar:
            for i in range(0, len(order), batch):
                idx = order[i : i + batch]
                got = _unit(self.text_embeddings([prompts[j] for j in idx], batch_size=batch))
                if emb is None:
                    emb = np.zeros((len(prompts), got.shape[1]), np.float32)
                emb[idx] = got
                bar.update(len(idx))
        assert emb is not None
        matrix = _unit(emb.reshape(len(words), len(templates), -1).mean(axis=1)).astype(np.float32)
        with _LOCK:
            MATRIX_COMPUTATIONS += 1
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".clipvocab-matrix-", suffix=".npy", dir=path.parent)
            tmp = Path(name)
            with os.fdopen(fd, "wb") as f:  # a file object: np.save would add ".npy" to a name
                np.save(f, matrix, allow_pickle=False)
            meta = {"kind": "clipvocab-matrix", "npy_sha256": file_sha256(tmp), "model": self.model,
                    "weights_sha256": self._model_info()["digest"], "vocabulary": self.vocabulary_version,
                    "templates": list(templates), "shape": list(matrix.shape), "matrix_version": MATRIX_VERSION,
                    "seconds": round(time.perf_counter() - started, 3)}
            publish(tmp, meta, path)
        except OSError as e:  # a read-only cache only costs computing it again next time
            log.warning("clip-vocab: cannot cache the vocabulary matrix in %s (%s); it will be computed again next time",
                        path.parent, e.strerror or e)
        return matrix

    # --- artifacts (models export) ----------------------------------------------------------
    def artifacts(self) -> list[Path]:
        """Make sure every file the encoder needs at run time without torch is in the model
        cache (both ONNX towers with their sidecars, the vocabulary matrix with its sidecar)
        and return their paths (``stair-es models export`` bundles them)."""
        paths = self._tower_files()

        # a bar only on a terminal: `models export` piped to a log gets the one log line instead
        self.vocabulary_matrix(progress=sys.stderr.isatty())
        paths += [self.matrix_path(), self.matrix_path().with_suffix(".json")]
        return paths

    def load(self) -> "ClipVocabEncoder":
        """Load the towers and the vocabulary matrix now (otherwise on first use)."""
        self._model_info()
        self._tower("image")
        self._tower("text")
        self.vocabulary_matrix()
        return self

    # --- encoding ---------------------------------------------------------------------------
    def _word_vector(self, weights: np.ndarray) -> SparseVector:
        w = np.asarray(weights, np.float64)
        keep = np.argpartition(-w, self.top_k - 1)[: self.top_k] if self.top_k < w.size else np.arange(w.size)
        keep = keep[(w[keep] > 0) & (w[keep] >= self.min_weight)]
        return SparseVector.from_arrays(self.word_ids[keep], w[keep], self.vocab)

    def project(self, embeddings: np.ndarray) -> list[SparseVector]:
        """Raw embeddings (image or text) -> calibrated top-k word vectors."""
        sims = _unit(embeddings) @ self.vocabulary_matrix().T
        return [self._word_vector(row) for row in calibrate(sims, self.threshold)]

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        if isinstance(images, (str, bytes)) or not hasattr(images, "__len__"):
            raise InvalidInputError("encode_images takes a list of PIL images")
        self.vocabulary_matrix(progress=progress)
        return in_batches(images, batch_size, "images", progress,
                          lambda chunk: self.project(self.image_embeddings(list(chunk), batch_size=batch_size)))

    @property
    def uses_idf(self) -> bool:
        return self.words

    def explain_text(self, text: str, idf: np.ndarray | None = None) -> dict[str, dict[str, float]]:
        """Which query tokens come from the text's own words and which from the projection of
        its embedding onto the vocabulary: ``{"words": {token: w}, "projection": {token: w}}``
        (a token in both keeps the larger weight in the query vector)."""
        parts = self._text_parts([text], idf)[0]
        return {k: {self.vocab.token(int(i)): float(w) for i, w in zip(v.ids, v.weights)} for k, v in parts.items()}

    def _text_parts(self, texts: list[str], idf: np.ndarray | None, batch_size: int = 32,
                    progress: bool = False) -> list[dict[str, SparseVector]]:
        from .text import _check_idf, _check_texts

        texts = _check_texts(texts)
        idf_arr = _check_idf(idf, self.vocab)
        projected: list[SparseVector] = [SparseVector.empty(self.vocab)] * len(texts)
        if self.projection > 0 and texts:
            self.vocabulary_matrix(progress=progress)
            projected = []
            for i in range(0, len(texts), batch_size):
                for v in self.project(self.text_embeddings(texts[i : i + batch_size], batch_size=batch_size)):
                    projected.append(SparseVector.from_arrays(v.ids, v.weights * self.projection, self.vocab))
        out = []
        for text, proj in zip(texts, projected):
            own = SparseVector.empty(self.vocab)
            if self.words:
                with contextlib.suppress(EmptyQueryError):  # a text of no known words keeps the projection alone
                    own = self._bow.encode_text(text, idf_arr)
            out.append({"words": own, "projection": proj})
        return out

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                     idf: np.ndarray | None = None) -> list[SparseVector]:
        parts = self._text_parts(list(texts) if not isinstance(texts, str) else texts, idf, batch_size, progress)  # type: ignore[arg-type]
        out = []
        with progress_bar(len(parts), "encoding texts", progress) as bar:
            for text, p in zip(texts, parts):
                own, proj = p["words"], p["projection"]
                vec = SparseVector.from_arrays(np.concatenate([own.ids, proj.ids]), np.concatenate([own.weights, proj.weights]),
                                               self.vocab)
                if vec.nnz == 0:
                    raise EmptyQueryError(f"the text {text[:60]!r} has no searchable tokens")
                out.append(vec)
                bar.update(1)
        return out

    def config(self) -> dict[str, Any]:
        info = self._model_info()
        cfg: dict[str, Any] = {"name": self.name, "model": self.model, "weights": info["weights"],
                               "model_record": info["record"], "vocabulary": self.vocabulary_version,
                               "top_k": self.top_k, "threshold": self.threshold}
        # the options a user changed (the defaults are not recorded)
        defaults = {"min_weight": 0.0, "templates": DEFAULT_TEMPLATES, "projection": 1.0, "words": True, "k1": 1.2}
        cfg.update({k: list(v) if k == "templates" else v for k, d in defaults.items() if (v := getattr(self, k)) != d})
        return cfg


def _features(out: Any) -> Any:
    """transformers 5 returns a model output whose ``pooler_output`` holds the projected
    features; older versions return the tensor itself."""
    return out if hasattr(out, "shape") else out.pooler_output


def _read_matrix(path: Path, rows: int) -> np.ndarray | None:
    """A cached vocabulary matrix whose sha256 matches its sidecar, or None."""
    try:
        if verified_sidecar(path, "npy_sha256", "vocabulary matrix", "computing it again") is None:
            return None
        matrix = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if matrix.ndim != 2 or matrix.shape[0] != rows:
        return None
    return matrix.astype(np.float32, copy=False)
