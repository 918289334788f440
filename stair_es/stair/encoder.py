"""``StairEncoder``: a trained STAIR checkpoint behind the :class:`Encoder` interface.

Registered as ``stair`` (``get_encoder("stair", model=PATH_OR_HUB_ID)``), so ingest and search
work with ``--encoder stair --model PATH`` on every backend. Output vectors are L2-normalised
by default: the model was trained on cosine similarity, and with unit vectors the backends'
dot product ranks exactly as the model does. ``text_mode="mask"`` is the paper's
text-encoder-free querying (section 7.1): a query's tokens become a 0/1 (or idf) mask and
only the image tower ever runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..encoders.base import Encoder, progress_bar
from ..errors import InvalidInputError, ModelError
from ..sparse import SparseVector


class StairEncoder(Encoder):
    name = "stair"
    modalities = frozenset({"image", "text"})

    def __init__(self, model: str | None = None, device: str | None = None, text_mode: str = "model", normalize: bool = True,
                 min_weight: float = 0.0, name: str | None = None):
        if not model:
            raise InvalidInputError("the stair encoder needs a trained model: --model PATH (a directory written by `stair-es train`) or a hub id")
        if text_mode not in ("model", "mask"):
            raise InvalidInputError(f"text_mode must be 'model' or 'mask', got {text_mode!r}")
        import torch

        from .model import StairModel

        self._torch = torch
        self.model_name = str(model)
        self.model = StairModel.from_pretrained(model, device=device)
        if not self.model.is_sparse:
            raise ModelError(f"{model} is a dense baseline checkpoint; the stair encoder needs a sparse (STAIR) model")
        super().__init__(self.model.vocab, name=name)
        self.device = device
        self.text_mode = text_mode
        self.normalize = normalize
        self.min_weight = float(min_weight)
        from ..encoders.text import BagOfWordsEncoder

        self._bow = BagOfWordsEncoder(vocab=self.model.vocab)

    def _to_vectors(self, enc) -> list[SparseVector]:
        if self.normalize:
            enc = self._torch.nn.functional.normalize(enc, dim=-1, eps=1e-6)
        enc = enc.cpu().numpy()
        out = []
        for row in enc:
            nz = np.flatnonzero(row > self.min_weight)
            out.append(SparseVector.from_arrays(nz, row[nz], self.vocab, drop_special=True))
        return out

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        out: list[SparseVector] = []
        with self._torch.no_grad(), progress_bar(len(images), "encoding images", progress) as bar:
            for i in range(0, len(images), batch_size):
                chunk = images[i : i + batch_size]
                out.extend(self._to_vectors(self.model.encode_image(self.model.preprocess_images(chunk))))
                bar.update(len(chunk))
        return out

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False, idf: np.ndarray | None = None) -> list[SparseVector]:
        if self.text_mode == "mask":
            return [self._mask_vector(t, idf) for t in texts]
        out: list[SparseVector] = []
        with self._torch.no_grad(), progress_bar(len(texts), "encoding texts", progress) as bar:
            for i in range(0, len(texts), batch_size):
                chunk = list(texts[i : i + batch_size])
                ids, mask, _ = self.model.tokenize(chunk)
                out.extend(self._to_vectors(self.model.encode_text(ids, mask)))
                bar.update(len(chunk))
        return out

    def _mask_vector(self, text: str, idf: np.ndarray | None) -> SparseVector:
        # Section 7.1's text-encoder-free query is the bag-of-words encoder: the query's own
        # tokens, stopwords and punctuation dropped, optionally idf-weighted.
        return self._bow.encode_text(text, idf)

    @property
    def uses_idf(self) -> bool:
        return self.text_mode == "mask"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"name": self.name, "model": self.model_name, "text_mode": self.text_mode, "normalize": self.normalize}
        if self.min_weight:
            cfg["min_weight"] = self.min_weight
        return cfg
