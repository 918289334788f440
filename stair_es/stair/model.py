"""The STAIR dual encoder (paper sections 2.2, 3, 7.2) and its save/load format.

Owns: the two towers (BERT-style text transformer, ViT image transformer), the token
projection heads (eq. 4-5), the stage-1 text mask (eq. 8), the dense CLIP-style baseline head,
per-patch token activations for localisation, text/image preprocessing, and the checkpoint
format (``config.json`` + ``model.safetensors`` + ``vocab.txt``).
Must not know about training loops, data files, search backends or the CLI.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MissingDependencyError, ModelError, optional_import
from ..vocab import Vocabulary, default_vocabulary
from .config import StairConfig, normalize_head
from .data import pad_tokens

try:
    # lazy: torch takes seconds to import; loaded only when a model runs
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError("the STAIR model", "encoders", "torch==2.13.0") from e

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
VOCAB_NAME = "vocab.txt"


def _transformers():
    return optional_import("transformers", "the STAIR model", "encoders", "transformers")


class TokenProjectionHead(nn.Module):
    """TRANSFORM (dense, GELU, LayerNorm) then a projection onto the vocabulary (eq. 4).

    The projection matrix ``e`` is not owned here: it is the text tower's token-embedding
    table, passed in at call time, so both towers score the same rows the text tower reads.
    """

    def __init__(self, in_width: int, emb_width: int, vocab_size: int, act: str = "gelu"):
        super().__init__()
        self.dense = nn.Linear(in_width, emb_width)
        self.norm = nn.LayerNorm(emb_width, eps=1e-12)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        # the text head copies a pretrained MLM head, whose TRANSFORM uses that model's activation
        self.act = F.gelu if act == "gelu" else _transformers().activations.get_activation(act)

    def transform(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(h)))

    def forward(self, h: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``h``: (B, L, in_width) -> per-position vocabulary logits (B, L, V)."""
        return F.linear(self.transform(h), embedding, self.bias)


class VdrHead(nn.Module):
    """VDR's disentanglement head: LayerNorm, a linear projection onto the vocabulary, elu1p (eq. 3)."""

    def __init__(self, in_width: int, vocab_size: int):
        super().__init__()
        self.norm = nn.LayerNorm(in_width, eps=1e-12)
        self.proj = nn.Linear(in_width, vocab_size)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return elu1p(self.proj(self.norm(h)))


class SpartaHead(nn.Module):
    """VisualSparta's fragment scoring (eq. 10-11): every vocabulary token's input word embedding
    against every image fragment, max over fragments, ReLU(y + b).

    ``proj`` maps fragments into the word-embedding space (the identity when the towers already
    share a width, as in the paper; a learned linear map here so any image tower fits).
    """

    def __init__(self, in_width: int, emb_width: int):
        super().__init__()
        self.proj = nn.Linear(in_width, emb_width)
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, h: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """``h``: (B, L, in_width) -> CACHE(w, v) of eq. 14 for every token w: (B, V)."""
        return torch.relu(F.linear(self.proj(h), embedding).amax(dim=1) + self.bias)


def elu1p(x: torch.Tensor) -> torch.Tensor:
    """x + 1 for x >= 0, exp(x) otherwise (VDR eq. 3): always positive, so sparsity comes from the gate."""
    return F.elu(x) + 1.0


def top_k_gate(weights: torch.Tensor, k: int) -> torch.Tensor:
    """0/1 (B, V): the ``k`` largest entries of each row (VDR's top_k in eq. 4)."""
    k = min(int(k), weights.shape[-1])
    return torch.zeros_like(weights).scatter_(1, weights.topk(k, dim=1).indices, 1.0)


def keep_top_n(weights: torch.Tensor, n: int) -> torch.Tensor:
    """Zero all but the ``n`` largest entries of each row (VisualSparta's top-n term pruning)."""
    return weights if n >= weights.shape[-1] else weights * top_k_gate(weights, n)


def pool_enc(logits: torch.Tensor, position_mask: torch.Tensor | None = None) -> torch.Tensor:
    """ENC = log(1 + ReLU(max over positions)) (eq. 5); padded positions never win the max."""
    if position_mask is not None:
        logits = logits.masked_fill(~position_mask.bool()[..., None], float("-inf"))
    return torch.log1p(torch.relu(logits.amax(dim=1)))


def token_presence_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """MASK(y) of eq. 8: 1 for every vocabulary entry that occurs in the (unpadded) input."""
    mask = torch.zeros(input_ids.shape[0], vocab_size, device=input_ids.device)
    return mask.scatter_(1, input_ids.long(), attention_mask.to(mask.dtype)).clamp_(max=1.0)


class StairModel(nn.Module):
    """Image and text towers with one of the heads of ``config.HEADS`` over them.

    ``encode_text`` / ``encode_image`` return (B, V) non-negative token weights for the sparse
    heads (stair, visualsparta, vdr; special tokens always zero) and (B, dense_dim) unnormalised
    vectors for the dense one -- in the form that is indexed and searched. ``prune=False`` gives
    the training form: VDR before its top-k gate, VisualSparta before its top-n pruning.
    Scores are cosine similarities except for VisualSparta, whose score is the raw dot product
    of eq. 15 (``uses_cosine``).
    """

    def __init__(self, config: StairConfig, vocab: Vocabulary | None = None):
        super().__init__()
        tf = _transformers()
        self.config = config
        self.vocab = vocab or default_vocabulary()
        if len(self.vocab) != config.vocab_size:
            raise ModelError(f"config vocab_size {config.vocab_size} does not match the vocabulary ({len(self.vocab)} tokens)")
        # lazy: the towers bring torch and transformers; loaded only when a model is built
        from . import towers

        tcfg = tf.BertConfig(vocab_size=config.vocab_size, hidden_size=config.text_width,
                             num_hidden_layers=config.text_layers, num_attention_heads=config.text_heads,
                             intermediate_size=config.text_width * config.mlp_ratio,
                             max_position_embeddings=config.text_max_length, hidden_dropout_prob=config.dropout,
                             attention_probs_dropout_prob=config.dropout, pad_token_id=self.vocab.get("[PAD]", 0))
        icfg = tf.ViTConfig(image_size=config.image_size, patch_size=config.patch_size, num_channels=3,
                            hidden_size=config.image_width, num_hidden_layers=config.image_layers,
                            num_attention_heads=config.image_heads,
                            intermediate_size=config.image_width * config.mlp_ratio, hidden_dropout_prob=config.dropout,
                            attention_probs_dropout_prob=config.dropout)
        if config.text_tower_config:
            self.text = towers.build_text_backbone(config.text_tower_config)
        else:
            self.text = tf.BertModel(tcfg, add_pooling_layer=False)
        if config.image_tower_config:
            self.image = towers.build_image_backbone(config.image_tower_config)
            self.image_prefix = towers.image_prefix_tokens(config.image_tower_config)
        else:
            self.image = tf.ViTModel(icfg, add_pooling_layer=False)
            self.image_prefix = 1
        emb_width = self.text.get_input_embeddings().weight.shape[1]
        if emb_width != config.text_width:
            raise ModelError(f"text tower token embeddings are {emb_width} wide but config text_width is {config.text_width}")
        if config.head == "stair":
            self.text_head = TokenProjectionHead(config.text_width, config.text_width, config.vocab_size, config.head_act)
            self.image_head = TokenProjectionHead(config.image_width, config.text_width, config.vocab_size)
        elif config.head == "vdr":
            self.text_head = VdrHead(config.text_width, config.vocab_size)
            self.image_head = VdrHead(config.image_width, config.vocab_size)
        elif config.head == "visualsparta":
            # the query side has no network: its tokens' input word embeddings are scored by the image head
            self.text_head = nn.Identity()
            self.image_head = SpartaHead(config.image_width, config.text_width)
        else:
            self.text_head = nn.Linear(config.text_width, config.dense_dim, bias=False)
            self.image_head = nn.Linear(config.image_width, config.dense_dim, bias=False)
        # CLIP's learnable temperature, stored as log(1/T)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / config.init_temperature)))
        self.register_buffer("keep_mask", torch.from_numpy((~self.vocab.special_mask).copy()).float(), persistent=False)

    # --- parameter groups ---------------------------------------------------------------
    @property
    def head(self) -> str:
        return self.config.head

    @property
    def is_sparse(self) -> bool:
        """Vectors over the vocabulary (every head but ``dense``)."""
        return self.config.head != "dense"

    @property
    def uses_cosine(self) -> bool:
        """Rank by cosine (stair, vdr, dense) or by the raw dot product (visualsparta, eq. 15)."""
        return self.config.head != "visualsparta"

    @property
    def token_embedding(self) -> torch.Tensor:
        """The vocabulary projection ``e`` shared by both heads (tied to the text embeddings)."""
        return self.text.get_input_embeddings().weight

    def image_parameters(self) -> list[nn.Parameter]:
        return list(self.image.parameters()) + list(self.image_head.parameters())

    @property
    def device(self) -> torch.device:
        return self.logit_scale.device

    # --- towers -------------------------------------------------------------------------
    def text_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.text(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.text_head(h, self.token_embedding)

    def image_hidden(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, prefix + patches, width): ``image_prefix`` class/register tokens, then patches row-major."""
        out = self.image(pixel_values=pixel_values)
        return out if isinstance(out, torch.Tensor) else out.last_hidden_state

    def bag_of_words(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, counts: bool = False) -> torch.Tensor:
        """(B, V) 0/1 presence (or counts) of the input's own tokens, special tokens dropped."""
        if counts:
            bow = torch.zeros(input_ids.shape[0], self.config.vocab_size, device=input_ids.device)
            bow.scatter_add_(1, input_ids.long(), attention_mask.to(bow.dtype))
        else:
            bow = token_presence_mask(input_ids, attention_mask, self.config.vocab_size)
        return bow * self.keep_mask

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, mask_to_input: bool = False, prune: bool = True) -> torch.Tensor:
        if self.head == "dense":
            h = self.text(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            return self.text_head(h[:, 0])
        if self.head == "visualsparta":  # eq. 15: the query is its tokens, each counted
            return self.bag_of_words(input_ids, attention_mask, counts=True)
        if self.head == "vdr":
            h = self.text(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            logits = self.text_head(h).masked_fill(~attention_mask.bool()[..., None], float("-inf"))
            weights = logits.amax(dim=1) * self.keep_mask
            if not prune:
                return weights
            # eq. 4: the top-k tokens and the text's own tokens
            return weights * torch.maximum(top_k_gate(weights, self.config.vdr_k), self.bag_of_words(input_ids, attention_mask))
        enc = pool_enc(self.text_logits(input_ids, attention_mask), attention_mask) * self.keep_mask
        if mask_to_input:
            enc = enc * token_presence_mask(input_ids, attention_mask, self.config.vocab_size)
        return enc

    def encode_image(self, pixel_values: torch.Tensor, *, prune: bool = True) -> torch.Tensor:
        return self.encode_image_hidden(self.image_hidden(pixel_values), prune=prune)

    def encode_image_hidden(self, h: torch.Tensor, *, prune: bool = True) -> torch.Tensor:
        """The image embedding from the tower's hidden states (cached when the tower is frozen)."""
        if self.head == "dense":
            return self.image_head(h[:, 0] if self.image_prefix else h.mean(1))
        if self.head == "visualsparta":  # log(CACHE(w, v) + 1) of eq. 15, for every token w
            weights = torch.log1p(self.image_head(h, self.token_embedding)) * self.keep_mask
            return keep_top_n(weights, self.config.top_n) if prune else weights
        if self.head == "vdr":
            weights = self.image_head(h).amax(dim=1) * self.keep_mask
            return weights * top_k_gate(weights, self.config.vdr_k) if prune else weights
        return pool_enc(self.image_head(h, self.token_embedding)) * self.keep_mask

    def image_backbone_parameters(self) -> list[nn.Parameter]:
        return list(self.image.parameters())

    def patch_activations(self, pixel_values: torch.Tensor, token_ids: Sequence[int]) -> torch.Tensor:
        """log(1+ReLU(p(h_patch)[token])) per patch for the given tokens: (B, T, grid, grid)."""
        if self.head != "stair":
            raise ModelError(f"localisation needs a model with the stair head; this checkpoint has the {self.head!r} head")
        h = self.image_hidden(pixel_values)[:, self.image_prefix :]
        ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=h.device)
        head = self.image_head
        logits = F.linear(head.transform(h), self.token_embedding[ids], head.bias[ids])  # (B, P, T)
        g = math.isqrt(h.shape[1])
        return torch.log1p(torch.relu(logits)).permute(0, 2, 1).reshape(h.shape[0], len(ids), g, g)

    # --- preprocessing ------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """[CLS] wordpieces [SEP], padded; returns (ids, mask, number of texts truncated)."""
        ids, mask, truncated = tokenize_batch(self.vocab, texts, self.config.text_max_length)
        return ids.to(self.device), mask.to(self.device), truncated

    def preprocess_images(self, images: Sequence[Any]) -> torch.Tensor:
        return self.pixels(np.stack([image_to_array(im, self.config.image_size) for im in images])) if len(images) else \
            torch.zeros(0, 3, self.config.image_size, self.config.image_size, device=self.device)

    def pixels(self, arrays: np.ndarray) -> torch.Tensor:
        """uint8 (B, H, W, 3) -> the normalised float tensor this model's image tower expects."""
        return arrays_to_tensor(arrays, self.config.image_mean, self.config.image_std).to(self.device)

    # --- save / load --------------------------------------------------------------------
    def save_pretrained(self, path: str | Path, *, dtype: str = "float32") -> Path:
        """Write ``config.json``, ``model.safetensors`` and ``vocab.txt`` into ``path``."""
        # lazy: loaded only when weights are saved or loaded
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        tdtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
        state = {k: v.detach().to("cpu", tdtype).contiguous() for k, v in self.state_dict().items()}
        tmp = path / (WEIGHTS_NAME + ".tmp")
        save_file(state, str(tmp), metadata={"format": "pt", "stair_es": "stair/1", "vocab_md5": self.vocab.digest})
        os.replace(tmp, path / WEIGHTS_NAME)
        (path / CONFIG_NAME).write_text(json.dumps(self.config.to_dict(), indent=2) + "\n", encoding="utf-8")
        (path / VOCAB_NAME).write_text("\n".join(self.vocab.tokens) + "\n", encoding="utf-8")
        return path

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, *, device: str | torch.device | None = None, head: str | None = None) -> StairModel:
        """Load from a local directory, or from a Hugging Face hub id (``org/name`` or ``hf-hub:org/name``).

        ``head``, when given, must be the head the checkpoint was trained with (config.json records it).
        """
        path = resolve_checkpoint(name_or_path)
        config = _read_config(path)
        if head is not None:
            want = normalize_head(head)
            if want != config.head:
                raise ModelError(f"checkpoint {path} was trained with the {config.head!r} head and cannot be loaded as the {want!r} head; "
                                 f"use head {config.head!r} (or leave the head out to take the checkpoint's)")
        vocab = _read_vocab(path, config)
        model = cls(config, vocab)
        state = _read_weights(path / WEIGHTS_NAME)
        _load_state(model, state, path)
        model.to(resolve_device(device))
        model.eval()
        return model


# --- helpers ------------------------------------------------------------------------------
def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """CUDA when present and not told otherwise, else CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise ModelError(f"unknown device {device!r}: use 'cpu', 'cuda' or 'cuda:N'") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} asked for but CUDA is not available here; use 'cpu'")
    return dev


def tokenize_batch(vocab: Vocabulary, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    cls_id, sep_id = vocab.id("[CLS]"), vocab.id("[SEP]")
    rows, truncated = [], 0
    for text in texts:
        ids = vocab.encode(text)
        if len(ids) > max_length - 2:
            ids = ids[: max_length - 2]
            truncated += 1
        rows.append([cls_id, *ids, sep_id])
    out, mask = pad_tokens(rows, vocab.id("[PAD]"))
    return torch.from_numpy(out), torch.from_numpy(mask), truncated


def image_to_array(image: Any, size: int) -> np.ndarray:
    """RGB PIL image -> uint8 (size, size, 3), resized with bilinear filtering."""
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise ModelError(f"expected a PIL image, got {type(image).__name__}")
    if image.mode != "RGB":
        image = image.convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    return np.asarray(image, dtype=np.uint8)


def arrays_to_tensor(arrays: np.ndarray, mean: Sequence[float] = (0.5, 0.5, 0.5), std: Sequence[float] = (0.5, 0.5, 0.5)) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W), (x/255 - mean) / std per channel ([-1, 1] by default)."""
    x = torch.from_numpy(np.ascontiguousarray(arrays)).permute(0, 3, 1, 2).float() / 255.0
    m = torch.tensor(mean, dtype=x.dtype).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, 3, 1, 1)
    return (x - m) / s


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local directory as is; ``hf-hub:org/name`` or ``org/name`` via ``snapshot_download``."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelError(f"{path} is a file; a STAIR checkpoint is a directory with {CONFIG_NAME}, {WEIGHTS_NAME} and {VOCAB_NAME}")
    repo_id = text.removeprefix("hf-hub:")
    if text.startswith(("/", ".", "~")) or repo_id.count("/") != 1:
        raise ModelError(f"no STAIR checkpoint directory at {text!r} (and it is not a hub id like 'org/name')")
    hub = optional_import("huggingface_hub", "loading a STAIR model from the hub", "encoders", "huggingface_hub")
    try:
        local = hub.snapshot_download(repo_id=repo_id, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME, VOCAB_NAME])
    except Exception as e:  # the hub client raises many types (offline, 404, auth)
        raise ModelError(f"cannot download STAIR checkpoint {repo_id!r} from the Hugging Face hub: {type(e).__name__}: {e}") from e
    return Path(local)


def _read_config(path: Path) -> StairConfig:
    cfg_path = path / CONFIG_NAME
    if not cfg_path.exists():
        raise ModelError(f"{path} has no {CONFIG_NAME}; is it a STAIR checkpoint (see `stair-es stair train`)?")
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {cfg_path}: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"{cfg_path} must hold a JSON object")
    return StairConfig.from_dict(data)


def _read_vocab(path: Path, config: StairConfig) -> Vocabulary:
    vocab_path = path / VOCAB_NAME
    default = default_vocabulary()
    vocab = Vocabulary.from_file(vocab_path, name=f"{path.name}/{VOCAB_NAME}") if vocab_path.exists() else default
    if vocab.digest == default.digest:
        vocab = default
    if len(vocab) != config.vocab_size:
        raise ModelError(f"checkpoint {path} is inconsistent: config.json says vocab_size {config.vocab_size} "
                         f"but its vocabulary has {len(vocab)} tokens")
    if vocab.digest != default.digest:
        raise ModelError(f"checkpoint {path} uses another vocabulary ({len(vocab)} tokens, md5 {vocab.digest}); "
                         f"stair_es indexes over the {len(default)}-token {default.name} WordPiece vocabulary")
    return vocab


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    if not file.exists():
        raise ModelError(f"checkpoint weights {file} are missing")
    st = optional_import("safetensors.torch", "loading STAIR weights", "encoders", "safetensors")
    try:
        return st.load_file(str(file))
    except Exception as e:  # safetensors raises SafetensorError / OSError / ValueError for damaged files
        raise ModelError(f"checkpoint weights {file} are corrupt or truncated ({type(e).__name__}: {e}); re-download or re-train") from e


def _load_state(model: StairModel, state: dict[str, torch.Tensor], path: Path) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        parts = []
        if wrong:
            parts.append("shape mismatch for " + ", ".join(f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in wrong[:3]))
        if missing:
            parts.append(f"missing {len(missing)} tensors (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} tensors (e.g. {unexpected[0]})")
        raise ModelError(f"checkpoint {path} does not match its config.json: " + "; ".join(parts))
    model.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})
