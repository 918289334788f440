"""``vdr``: the VDR authors' released cross-modal model (``vsearch/vdr-cross-modal``).

VDR (Zhou et al., "Retrieval-based Disentangled Representation Learning with Natural
Language Supervision", ICLR 2024) trained an image tower and a text tower whose outputs are
weights over the BERT uncased vocabulary, i.e. already stair_es's space. This module runs
that checkpoint, re-implemented from the reference code (github.com/jzhoubu/VDR, MIT,
commit 12c3e7a: ``src/ir/encoder/vdr_crossmodal_{image,text}.py``), and is checked against
the reference on tiny random weights (``tests/fixtures/vdr_tiny``, max abs diff <= 1e-5).

The checkpoint
    A folder or hub repository holding the reference ``Retriever``'s ``config.json``
    (``encoder_q``: the text tower, ``encoder_p``: the image tower) and one state dict,
    ``pytorch_model.bin`` (what the hub repository holds) or ``model.safetensors``; optional
    tokenizer files (``tokenizer.json`` or ``vocab.txt``; else the shipped bert-base-uncased
    vocabulary, which is what the released model uses). Geometry comes from the config with
    the reference's defaults (ViT-B/32 at 224 pixels, bert-base). The state dict is loaded
    **strictly**: a missing, unexpected or misshapen key is a :class:`ModelError` naming it.

The towers (both end in the same head)
    image: a CLIP-style ViT without a class token (patch conv, positional embedding,
    ``ln_pre``, pre-LN blocks with QuickGELU, ``ln_post``), every patch projected onto the
    vocabulary by ``proj``; text: BERT then a LayerNorm, every position scored against BERT's
    own word embeddings. Then max over positions, ``elu1p(x) = elu(x) + 1``, L2 normalisation,
    and the ``topk`` largest weights (768 in the released config). A text also keeps every
    vocabulary token it contains (the reference's bag-of-words mask), so a query's own words
    always count. Texts are padded to the config's ``max_len`` and the max runs over padding
    positions too, exactly as the reference does (the model was trained that way).

The restricted vocabulary
    The towers score 27,623 of the 30,522 BERT tokens (the reference's ``VALID_TOKEN_IDS``):
    not ids below 999 (padding, ``[unused]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``) and
    no token with a non-ASCII character. :func:`restricted_ids` derives that set by this rule;
    :data:`RESTRICTED_SHA256` pins it to the reference's list.

Runtime
    Both towers are exported to ONNX through :mod:`stair_es.encoders.runtime` (checked
    against PyTorch, cached by the weights' sha256); images are preprocessed with PIL and
    numpy exactly as the reference's torchvision pipeline (bicubic resize of the shorter side
    to 224, centre crop, CLIP mean and std) and texts tokenised with HF ``tokenizers``. Once
    both towers are cached, queries import neither torch nor transformers.

This module must not know about indices or backends.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import EncoderVersionError, InvalidInputError, MissingDependencyError, ModelError, optional_import
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary, hf_tokenizer
from .base import Encoder
from .runtime import TwoTowers, first_line, in_batches, runtime_choice, weights_digest

log = logging.getLogger(__name__)

DEFAULT_MODEL = "vsearch/vdr-cross-modal"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: sha256 of the comma-joined sorted ids the reference leaves out (its INVALID_TOKEN_IDS).
RESTRICTED_SHA256 = "1696edb6abd04373aaad512ab257440d155d02383cc5e2f7856ca7055b382d17"
RESTRICTED_SIZE = 27623
_FIRST_WORD_ID = 999  # "!": everything before it is padding, [unused*] and the special tokens
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")
#: Index buffers of BERT's embeddings that older transformers saved with the weights (persistent
#: buffers before 4.31): constants, not weights, so their presence is not a mismatch.
_IGNORED_KEYS = ("encoder_q.bert_model.embeddings.position_ids", "encoder_q.bert_model.embeddings.token_type_ids")


def restricted_ids(vocab: Vocabulary | None = None) -> np.ndarray:
    """The BERT ids the VDR towers score, ascending (27,623 for the BERT uncased vocabulary)."""
    vocab = vocab or default_vocabulary()
    return np.array([i for i, t in enumerate(vocab.tokens) if i >= _FIRST_WORD_ID and t.isascii()], np.int64)


def restricted_digest(ids: np.ndarray, size: int) -> str:
    """sha256 of the ids left out, in the reference's form (to compare with :data:`RESTRICTED_SHA256`)."""
    left_out = np.setdiff1d(np.arange(size), ids)
    return hashlib.sha256(",".join(map(str, left_out.tolist())).encode()).hexdigest()


# --- the checkpoint's configuration ------------------------------------------------------------
@dataclass(frozen=True)
class VdrConfig:
    """What the two towers are, read from the reference's ``config.json`` (its defaults filled in)."""

    # image tower (VDRImageEncoderConfig)
    resolution: int = 224
    patch_size: int = 32
    width: int = 768
    layers: int = 12
    heads: int = 12
    image_topk: int = 768
    # text tower (VDRTextEncoderConfig, a BertConfig)
    bert: dict[str, Any] = field(default_factory=dict)
    max_len: int = 256
    text_topk: int = 768

    @classmethod
    def from_json(cls, cfg: dict[str, Any], where: str) -> "VdrConfig":
        q, p = cfg.get("encoder_q"), cfg.get("encoder_p")
        if not isinstance(q, dict) or not isinstance(p, dict):
            raise ModelError(f"{where}: config.json has no encoder_q/encoder_p sections: not a VDR cross-modal checkpoint "
                             f"(its architectures: {cfg.get('architectures') or cfg.get('model_type') or 'unknown'})")
        if q.get("type", "vdr_crossmodal_text") != "vdr_crossmodal_text" or p.get("type", "vdr_crossmodal_image") != "vdr_crossmodal_image":
            raise ModelError(f"{where}: encoder types {q.get('type')!r} and {p.get('type')!r}; the vdr encoder runs "
                             "the cross-modal model (vdr_crossmodal_text + vdr_crossmodal_image)")
        # BertConfig's defaults are bert-base-uncased's, which the released model's text tower is.
        bert = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                "intermediate_size": 3072, "hidden_act": "gelu", "max_position_embeddings": 512,
                "type_vocab_size": 2, "layer_norm_eps": 1e-12, "pad_token_id": 0}
        bert.update({key: q[key] for key in bert if key in q})
        try:
            out = cls(resolution=int(p.get("resolution", 224)), patch_size=int(p.get("patch_size", 32)),
                      width=int(p.get("width", 768)), layers=int(p.get("layers", 12)), heads=int(p.get("heads", 12)),
                      image_topk=int(p.get("topk") or 768), bert=bert, max_len=int(q.get("max_len", 256)),
                      text_topk=int(q.get("topk") or 768))
        except (TypeError, ValueError) as e:
            raise ModelError(f"{where}: config.json has a malformed tower setting ({e})") from None
        if out.resolution % out.patch_size or out.width % out.heads or bert["hidden_size"] % bert["num_attention_heads"]:
            raise ModelError(f"{where}: config.json describes impossible towers (resolution {out.resolution}, patch "
                             f"{out.patch_size}, width {out.width}/{out.heads} heads, text {bert['hidden_size']}/"
                             f"{bert['num_attention_heads']} heads)")
        if out.max_len > int(bert["max_position_embeddings"]):
            raise ModelError(f"{where}: max_len {out.max_len} exceeds the text tower's {bert['max_position_embeddings']} positions")
        return out


# --- resolving and reading a checkpoint --------------------------------------------------------
def weight_file(folder: Path, model: str) -> Path:
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise ModelError(f"model {model!r}: no {' or '.join(WEIGHT_FILES)} in {folder}; a VDR cross-modal checkpoint "
                     "holds config.json and one of them")


def read_state_dict(path: Path) -> dict[str, Any]:
    """The checkpoint's tensors (torch), from a pickle (read with ``weights_only``) or safetensors."""
    import torch

    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # torch / safetensors raise many types for a damaged or foreign file
        raise ModelError(f"cannot read the weights {path}: {first_line(e)}") from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ModelError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return state


def check_keys(expected: dict[str, tuple[int, ...]], state: dict[str, Any], model: str) -> None:
    """Strict loading: every key present, none extra, every shape right; else one ModelError naming them."""
    have = {k: tuple(v.shape) for k, v in state.items() if k not in _IGNORED_KEYS}
    missing = sorted(set(expected) - set(have))
    unexpected = sorted(set(have) - set(expected))
    shapes = sorted(k for k in set(expected) & set(have) if expected[k] != have[k])
    if not (missing or unexpected or shapes):
        return

    def names(keys: list[str], n: int = 6) -> str:
        shown = ", ".join(keys[:n])
        return shown + (f" and {len(keys) - n} more" if len(keys) > n else "")

    parts = []
    if missing:
        parts.append(f"missing {len(missing)} keys ({names(missing)})")
    if unexpected:
        parts.append(f"unexpected {len(unexpected)} keys ({names(unexpected)})")
    if shapes:
        parts.append("wrong shapes (" + names([f"{k} {have[k]} != {expected[k]}" for k in shapes], 4) + ")")
    raise ModelError(f"model {model!r} is not the VDR cross-modal architecture its config.json describes: "
                     + "; ".join(parts))


# --- the towers in PyTorch ---------------------------------------------------------------------
def build_towers(cfg: VdrConfig, valid: np.ndarray) -> tuple[Any, Any]:
    """(image tower, text tower) with uninitialised weights; each maps its inputs to the dense
    L2-normalised ``elu1p`` weights over the restricted vocabulary, shape (batch, len(valid)).
    Submodule names follow the reference's state dict (``encoder_p.*``, ``encoder_q.*``)."""
    import torch
    from torch import nn

    class Attention(nn.Module):
        """Multi-head self-attention stored as nn.MultiheadAttention stores it (one in_proj)."""

        def __init__(self, width: int, heads: int):
            super().__init__()
            self.heads = heads
            self.in_proj_weight = nn.Parameter(torch.empty(3 * width, width))
            self.in_proj_bias = nn.Parameter(torch.empty(3 * width))
            self.out_proj = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, length, width)
            b, n, w = x.shape
            q, k, v = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
            split = lambda t: t.reshape(b, n, self.heads, w // self.heads).transpose(1, 2)  # noqa: E731
            q, k, v = split(q), split(k), split(v)
            att = torch.softmax((q * (w // self.heads) ** -0.5) @ k.transpose(-1, -2), dim=-1)
            return self.out_proj((att @ v).transpose(1, 2).reshape(b, n, w))

    class QuickGELU(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * torch.sigmoid(1.702 * x)

    class Block(nn.Module):
        def __init__(self, width: int, heads: int):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attn = Attention(width, heads)
            self.mlp = nn.Sequential()
            self.mlp.add_module("c_fc", nn.Linear(width, 4 * width))
            self.mlp.add_module("gelu", QuickGELU())
            self.mlp.add_module("c_proj", nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    def head(scores: torch.Tensor) -> torch.Tensor:
        """(batch, positions, vocabulary) -> max over positions, elu + 1, unit length."""
        pooled = scores.max(dim=1).values
        return nn.functional.normalize(nn.functional.elu(pooled) + 1.0, dim=-1)

    class ImageTower(nn.Module):
        def __init__(self):
            super().__init__()
            grid = cfg.resolution // cfg.patch_size
            self.conv1 = nn.Conv2d(3, cfg.width, cfg.patch_size, stride=cfg.patch_size, bias=False)
            self.positional_embedding = nn.Parameter(torch.empty(grid * grid, cfg.width))
            self.ln_pre, self.ln_post = nn.LayerNorm(cfg.width), nn.LayerNorm(cfg.width)
            self.transformer = nn.Module()
            self.transformer.resblocks = nn.ModuleList(Block(cfg.width, cfg.heads) for _ in range(cfg.layers))
            self.proj = nn.Parameter(torch.empty(len(valid), cfg.width))

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            x = self.conv1(pixel_values).flatten(2).transpose(1, 2)  # (batch, patches, width)
            x = self.ln_pre(x + self.positional_embedding)
            for block in self.transformer.resblocks:
                x = block(x)
            return head(self.ln_post(x) @ self.proj.t())

    class TextTower(nn.Module):
        def __init__(self):
            super().__init__()
            transformers = optional_import("transformers", "the vdr text tower", "encoders", "transformers")
            bert_cfg = transformers.BertConfig(**cfg.bert, attn_implementation="eager")
            self.bert_model = transformers.BertModel(bert_cfg, add_pooling_layer=False)
            self.ln = nn.LayerNorm(int(cfg.bert["hidden_size"]))
            self.register_buffer("valid", torch.from_numpy(valid), persistent=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.bert_model(input_ids=input_ids, attention_mask=attention_mask,
                                     token_type_ids=torch.zeros_like(input_ids)).last_hidden_state
            table = self.bert_model.embeddings.word_embeddings.weight[self.valid]
            # every position, padding included: the reference pools over the whole padded length
            return head(self.ln(hidden) @ table.t())

    return ImageTower().eval(), TextTower().eval()


_LOADED: dict[tuple[str, str], tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def load_towers(folder: Path, model: str, cfg: VdrConfig, valid: np.ndarray, digest: str) -> tuple[Any, Any]:
    """Both towers with the checkpoint's weights, loaded strictly (cached per weights)."""
    key = (str(folder), digest)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
    torch = optional_import("torch", "running the vdr towers in PyTorch (or exporting them to ONNX)", "encoders",
                            "torch")
    image, text = build_towers(cfg, valid)
    expected = {f"encoder_p.{k}": tuple(v.shape) for k, v in image.state_dict().items()}
    expected.update({f"encoder_q.{k}": tuple(v.shape) for k, v in text.state_dict().items()})
    state = read_state_dict(weight_file(folder, model))
    check_keys(expected, state, model)
    with torch.no_grad():
        for prefix, tower in (("encoder_p.", image), ("encoder_q.", text)):
            part = {k[len(prefix):]: v.float() for k, v in state.items() if k.startswith(prefix) and k not in _IGNORED_KEYS}
            tower.load_state_dict(part, strict=True)
    with _LOCK:
        _LOADED[key] = (image, text)
    return image, text


# --- preprocessing and tokenisation without torch ----------------------------------------------
def preprocess_image(image: Any, resolution: int) -> np.ndarray:
    """One PIL image -> (3, resolution, resolution) float32, as the reference's torchvision
    ``Resize(resolution, BICUBIC)``, ``CenterCrop``, ``ToTensor``, ``Normalize(CLIP mean, std)``."""
    from PIL import Image

    img = image.convert("RGB") if image.mode != "RGB" else image
    w, h = img.size
    size = (resolution, int(resolution * h / w)) if w <= h else (int(resolution * w / h), resolution)
    if size != (w, h):
        img = img.resize(size, Image.BICUBIC)
    w, h = img.size
    top, left = int(round((h - resolution) / 2.0)), int(round((w - resolution) / 2.0))
    img = img.crop((left, top, left + resolution, top + resolution))
    x = np.asarray(img, dtype=np.uint8).astype(np.float32) / np.float32(255.0)
    x = (x - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)


def load_tokenizer(folder: Path, vocab: Vocabulary, model: str, max_len: int) -> Any:
    """An HF ``tokenizers`` BERT tokenizer padding and truncating to ``max_len`` (as the reference's
    ``padding="max_length"``): the folder's ``tokenizer.json``, else its ``vocab.txt``, else the
    shipped bert-base-uncased vocabulary. Its ids must be the BERT uncased ids."""
    file = folder / "tokenizer.json"
    try:
        from tokenizers import Tokenizer

        if file.is_file():
            tok = Tokenizer.from_file(str(file))
        else:  # the folder's vocab.txt must be the shipped vocabulary, whose tokenizer is used
            if (folder / "vocab.txt").is_file():
                own = Vocabulary.from_file(folder / "vocab.txt")
                if not vocab.same_ids({t: i for i, t in enumerate(own.tokens)}):
                    raise ModelError(
                        f"model {model!r}: its vocab.txt is not the {vocab.name} vocabulary the VDR towers score")
            tok = Tokenizer.from_str(hf_tokenizer(vocab).to_str())
    except ModelError:
        raise
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ModelError(f"cannot read the tokenizer of {model!r} in {folder}: {first_line(e)}") from None
    table = tok.get_vocab(with_added_tokens=True)
    if not vocab.same_ids(table):
        n_bad, examples = vocab.mismatches(table)
        raise ModelError(f"model {model!r}: its tokenizer is not the {vocab.name} vocabulary ({n_bad} tokens differ, e.g. {examples})")
    tok.enable_truncation(max_length=max_len)
    tok.enable_padding(length=max_len, pad_id=vocab.get("[PAD]") or 0, pad_token="[PAD]")
    return tok


# --- the encoder -------------------------------------------------------------------------------
class VdrEncoder(TwoTowers, Encoder):
    """VDR cross-modal: both towers of ``vsearch/vdr-cross-modal`` (or a folder of the same layout)."""

    name = "vdr"
    modalities = frozenset({"image", "text"})

    def __init__(self, model: str = DEFAULT_MODEL, *, top_k: int | None = None, min_weight: float = 0.0,
                 runtime: str | None = None, weights: str | None = None, model_record: dict[str, Any] | None = None,
                 allow_version_mismatch: bool = False, vocab: Vocabulary | None = None, name: str | None = None):
        super().__init__(vocab, name=name)
        if not isinstance(model, str) or not model.strip():
            raise InvalidInputError(f"the vdr encoder needs a model: --model {DEFAULT_MODEL} (a hub id) or a checkpoint folder")
        if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
            raise InvalidInputError(f"top_k must be a whole number >= 1 (or unset: the checkpoint's topk), got {top_k!r}")
        if not (isinstance(min_weight, (int, float)) and np.isfinite(min_weight) and min_weight >= 0):
            raise InvalidInputError(f"min_weight must be a number >= 0, got {min_weight!r}")
        if len(self.vocab) != 30522:
            raise InvalidInputError("the vdr encoder scores the 30,522-token BERT uncased vocabulary only")
        self.model = model.strip()
        self.top_k = top_k
        self.min_weight = float(min_weight)
        self.runtime = runtime_choice(runtime)
        self.allow_version_mismatch = bool(allow_version_mismatch)
        self._recorded_weights = weights
        self._recorded_record = model_record
        self._info: dict[str, Any] | None = None
        self._towers: dict[str, Any] = {}
        self._tokenizer: Any = None
        self._valid: np.ndarray | None = None

    # --- the model --------------------------------------------------------------------------
    @property
    def valid_ids(self) -> np.ndarray:
        if self._valid is None:
            valid = restricted_ids(self.vocab)
            if len(valid) != RESTRICTED_SIZE or restricted_digest(valid, len(self.vocab)) != RESTRICTED_SHA256:
                raise ModelError("the restricted VDR vocabulary does not match the reference's; reinstall stair-es")
            self._valid = valid
        return self._valid

    def model_info(self) -> dict[str, Any]:
        """Folder, config, weight files and digest, record; checks the recorded weights once."""
        if self._info is not None:
            return self._info
        from ..models import model_config, model_record

        folder, raw = model_config(self.model, kind="vdr", expected="a VDR cross-modal checkpoint folder or hub id")
        cfg = VdrConfig.from_json(raw, f"model {self.model!r}")
        files = [weight_file(folder, self.model), folder / "config.json"]
        digest = weights_digest(files)
        info = {"folder": folder, "config": cfg, "files": files, "digest": digest, "weights": digest[:16],
                "record": model_record(folder)}
        self._check_recorded_weights("vdr", info["weights"], "their token weights are not comparable")
        self._info = info
        return info

    @property
    def config_of_model(self) -> VdrConfig:
        return self.model_info()["config"]

    @property
    def image_min_side(self) -> int | None:  # type: ignore[override]
        try:
            return self.config_of_model.resolution
        except (ModelError, EncoderVersionError, MissingDependencyError):
            return None

    def torch_towers(self) -> tuple[Any, Any]:
        """(image, text) PyTorch towers with the checkpoint's weights (strictly loaded)."""
        info = self.model_info()
        return load_towers(info["folder"], self.model, info["config"], self.valid_ids, info["digest"])

    def tower_specs(self) -> dict[str, Any]:
        """How the two towers are exported to ONNX (see :mod:`stair_es.encoders.runtime`)."""
        from .runtime import TowerSpec

        info = self.model_info()
        cfg: VdrConfig = info["config"]
        tag = hashlib.sha256(info["digest"].encode()).hexdigest()[:8]

        def image_sample() -> dict[str, np.ndarray]:
            rng = np.random.default_rng(0)
            return {"pixel_values": rng.standard_normal((2, 3, cfg.resolution, cfg.resolution)).astype(np.float32)}

        def text_sample() -> dict[str, np.ndarray]:
            rng = np.random.default_rng(0)
            ids = rng.integers(_FIRST_WORD_ID, int(cfg.bert["vocab_size"]), (2, cfg.max_len)).astype(np.int64)
            mask = np.ones_like(ids)
            ids[:, 0], ids[0, 5], mask[0, 6:], ids[0, 6:] = 101, 102, 0, 0
            ids[1, -1] = 102
            return {"input_ids": ids, "attention_mask": mask}

        return {
            "image": TowerSpec(kind=f"vdr-image-{tag}", weight_files=info["files"], build=lambda: self.torch_towers()[0],
                               sample=image_sample, input_names=["pixel_values"], output_names=["weights"],
                               dynamic_axes={"pixel_values": {0: "batch"}, "weights": {0: "batch"}}, tolerance=1e-5,
                               parallel=True),
            "text": TowerSpec(kind=f"vdr-text-{tag}", weight_files=info["files"], build=lambda: self.torch_towers()[1],
                              sample=text_sample, input_names=["input_ids", "attention_mask"], output_names=["weights"],
                              dynamic_axes={"input_ids": {0: "batch"}, "attention_mask": {0: "batch"}, "weights": {0: "batch"}},
                              tolerance=1e-5),
        }

    @property
    def runtime_in_use(self) -> str:
        return "onnx" if self._tower("text") else "torch"

    def artifacts(self) -> list[Path]:
        """Export both towers when needed and return the cached files (``.onnx`` + sidecar each)
        that ``stair-es models export`` bundles: with them and the model folder, queries and
        images run in ONNX Runtime with no torch and no network."""
        return self._tower_files()

    def load(self) -> "VdrEncoder":
        """Resolve the model and load both towers and the tokenizer now (otherwise on first use)."""
        self._tower("image")
        self._tower("text")
        self._text_tokenizer()
        return self

    def _text_tokenizer(self) -> Any:
        if self._tokenizer is None:
            info = self.model_info()
            self._tokenizer = load_tokenizer(info["folder"], self.vocab, self.model, info["config"].max_len)
        return self._tokenizer

    # --- encoding ---------------------------------------------------------------------------
    def _sparse(self, dense: np.ndarray, k: int, keep: np.ndarray | None = None) -> SparseVector:
        """Top-``k`` of one dense row over the restricted vocabulary (plus the columns in ``keep``)."""
        w = np.asarray(dense, np.float32)
        top = np.argpartition(-w, k - 1)[:k] if k < w.size else np.arange(w.size)
        cols = np.union1d(top, keep) if keep is not None and keep.size else top
        vals = w[cols]
        sel = vals > 0
        if self.min_weight:
            sel &= vals >= self.min_weight
        return SparseVector.from_arrays(self.valid_ids[cols[sel]], vals[sel], self.vocab, drop_special=True)

    def dense_images(self, images: Sequence[Any]) -> np.ndarray:
        """(batch, 27,623) weights of the image tower before top-k (for tests and tools)."""
        cfg = self.config_of_model
        return self._run("image", {"pixel_values": np.stack([preprocess_image(im, cfg.resolution) for im in images])})

    def _run(self, which: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """One tower on ``feeds``: in ONNX Runtime (images as parallel slices of the batch), or PyTorch."""
        tower = self._tower(which)
        if tower:
            return (tower.run_parallel if which == "image" else tower.run)(feeds)[0]
        import torch

        with torch.no_grad():
            tower = self.torch_towers()[0 if which == "image" else 1]
            return tower(*(torch.from_numpy(v) for v in feeds.values())).numpy()

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        images = list(images)
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        k = self.top_k or self.config_of_model.image_topk
        return in_batches(images, batch_size, "images", progress,
                          lambda chunk: [self._sparse(row, k) for row in self.dense_images(chunk)])

    def _tokenize(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        encs = self._text_tokenizer().encode_batch(texts)
        cut = sum(1 for e in encs if e.overflowing)
        if cut:
            log.info("vdr: %d of %d texts are longer than %d tokens and were truncated", cut, len(texts),
                     self.config_of_model.max_len)
        ids = np.array([e.ids for e in encs], np.int64)
        mask = np.array([e.attention_mask for e in encs], np.int64)
        return ids, mask

    def dense_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """((batch, 27,623) text weights before masking, the padded token ids)."""
        ids, mask = self._tokenize(list(texts))
        return self._run("text", {"input_ids": ids, "attention_mask": mask}), ids

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                     idf: np.ndarray | None = None) -> list[SparseVector]:
        """``idf`` is ignored: the model weights tokens itself."""
        from .text import _check_texts

        texts = _check_texts(texts)
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        k = self.top_k or self.config_of_model.text_topk
        column = np.full(len(self.vocab), -1, np.int64)
        column[self.valid_ids] = np.arange(len(self.valid_ids))

        def encode(chunk: list[str]) -> list[SparseVector]:
            dense, ids = self.dense_texts(chunk)  # a text keeps its own words (their restricted columns)
            return [self._sparse(row, k, np.unique(own[own >= 0])) for row, own in zip(dense, column[ids])]

        return in_batches(texts, batch_size, "texts", progress, encode)

    def config(self) -> dict[str, Any]:
        info = self.model_info()
        # a folder is recorded as an absolute path: the index is searched from any directory
        local = Path(self.model).expanduser()
        model = str(local.resolve()) if local.is_dir() else self.model
        cfg: dict[str, Any] = {"name": self.name, "model": model, "weights": info["weights"],
                               "model_record": info["record"]}
        if self.top_k:
            cfg["top_k"] = self.top_k
        if self.min_weight:
            cfg["min_weight"] = self.min_weight
        return cfg
