"""STAIR model configurations: one dataclass, one JSON file per named size.

Owns the architecture hyper-parameters (tower sizes, image size, head type) and the named
configs shipped in ``configs/*.json``. Knows nothing about torch, training or data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..errors import ModelError, UnknownNameError
from ..vocab import VOCAB_SIZE

_CONFIG_DIR = Path(__file__).parent / "configs"
FORMAT = "stair_es.stair/1"
# The heads a model can have over the shared towers (see docs/stair.md "Heads").
HEADS = ("stair", "visualsparta", "vdr", "dense")
_HEAD_ALIASES = {"sparse": "stair"}  # checkpoints written before the other heads existed


def normalize_head(name: str) -> str:
    """The canonical head name; an unknown one is an error listing the choices."""
    head = _HEAD_ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if head not in HEADS:
        raise UnknownNameError(f"unknown head {name!r}; choose one of: {', '.join(HEADS)}")
    return head


@dataclass
class StairConfig:
    """Architecture of a STAIR dual encoder (or of its dense CLIP-style baseline).

    ``head="stair"`` (alias ``"sparse"``): token projection heads onto the vocabulary (eq. 4-5).
    ``head="visualsparta"``: image fragments scored against the text tower's input word
    embeddings, max over fragments, log(1 + ReLU(. + b)); queries are bags of words; the top
    ``top_n`` terms are kept per image.
    ``head="vdr"``: LayerNorm + vocabulary projection + elu1p, max-pooled, gated to the top
    ``vdr_k`` tokens (text: plus its own tokens).
    ``head="dense"`` is the baseline: the same towers, a linear projection to ``dense_dim``.
    """

    vocab_size: int = VOCAB_SIZE
    text_layers: int = 2
    text_width: int = 128
    text_heads: int = 2
    text_max_length: int = 77
    image_size: int = 64
    patch_size: int = 16
    image_layers: int = 2
    image_width: int = 128
    image_heads: int = 2
    mlp_ratio: int = 4
    head: str = "stair"
    dense_dim: int = 256
    init_temperature: float = 0.07
    dropout: float = 0.0
    # Pretrained towers (see stair_es.stair.towers): where they came from, and their own configs
    # so a saved STAIR checkpoint rebuilds the same architecture without fetching them again.
    text_tower: str = ""
    text_tower_config: dict[str, Any] | None = None
    image_tower: str = ""
    image_tower_config: dict[str, Any] | None = None
    head_act: str = "gelu"
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # VisualSparta: terms kept per image at index time (the paper's n: 1000, 500, 100...)
    top_n: int = 1000
    # VDR: k of the top-k gate (the paper sets k = the dense baseline's width, 512)
    vdr_k: int = 256

    def __post_init__(self) -> None:
        self.image_mean = tuple(float(x) for x in self.image_mean)  # type: ignore[assignment]
        self.image_std = tuple(float(x) for x in self.image_std)  # type: ignore[assignment]
        if len(self.image_mean) != 3 or len(self.image_std) != 3 or min(self.image_std) <= 0:
            raise ModelError(f"image_mean/image_std need 3 values (std > 0), got {self.image_mean} / {self.image_std}")
        self.head = normalize_head(self.head)
        if self.top_n < 1 or self.vdr_k < 1:
            raise ModelError(f"top_n and vdr_k must be >= 1, got top_n={self.top_n}, vdr_k={self.vdr_k}")
        if self.image_size % self.patch_size:
            raise ModelError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        for tower, width, heads in (("text", self.text_width, self.text_heads), ("image", self.image_width, self.image_heads)):
            if width % heads:
                raise ModelError(f"{tower}_width {width} is not divisible by {tower}_heads {heads}")
        if not 2 < self.text_max_length <= 512:
            raise ModelError(f"text_max_length must be in (2, 512], got {self.text_max_length}")

    @property
    def grid(self) -> int:
        """Patches per image side."""
        return self.image_size // self.patch_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_mean"], d["image_std"] = list(self.image_mean), list(self.image_std)
        return {"format": FORMAT, **d}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StairConfig:
        data = dict(data)
        fmt = data.pop("format", FORMAT)
        if fmt != FORMAT:
            raise ModelError(f"config format {fmt!r} is not {FORMAT!r}; this checkpoint was not written by stair_es.stair")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelError(f"unknown config keys {unknown}; known keys: {sorted(known)}")
        try:
            return cls(**data)
        except TypeError as e:
            raise ModelError(f"bad STAIR config: {e}") from e

    def replace(self, **changes: Any) -> StairConfig:
        return StairConfig.from_dict({**self.to_dict(), **changes})


def list_configs() -> list[str]:
    """Names of the shipped configs (``tiny``, ``small``, ``paper``...)."""
    return sorted(p.stem for p in _CONFIG_DIR.glob("*.json"))


def load_config(name_or_path: str | Path) -> StairConfig:
    """A shipped config by name, or a JSON file by path; unknown names list what exists."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = _CONFIG_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise UnknownNameError(f"unknown STAIR config {str(name_or_path)!r}; available: {', '.join(list_configs())} (or a path to a JSON file)")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelError(f"cannot read STAIR config {path}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise ModelError(f"STAIR config {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ModelError(f"STAIR config {path} must be a JSON object")
    return StairConfig.from_dict(data)
