"""Encoders: images and texts -> sparse vectors over the BERT vocabulary.

Re-exports the registry; concrete encoders are imported lazily (they need torch) via
``get_encoder(name)`` or attribute access (``stair_es.encoders.ImageNetLabelEncoder``).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .base import Encoder, get_encoder, list_encoders, progress_bar, register_encoder

__all__ = [
    "Encoder",
    "get_encoder",
    "list_encoders",
    "register_encoder",
    "progress_bar",
    "ImageNetLabelEncoder",
    "BagOfWordsEncoder",
    "SpladeEncoder",
    "DefaultEncoder",
]

_LAZY = {
    "ImageNetLabelEncoder": ".imagenet",
    "BagOfWordsEncoder": ".text",
    "SpladeEncoder": ".text",
    "DefaultEncoder": ".default",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
