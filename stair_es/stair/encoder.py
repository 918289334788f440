"""``StairEncoder``: a trained STAIR checkpoint behind the :class:`Encoder` interface.

Registered as ``stair`` (``get_encoder("stair", model=PATH_OR_HUB_ID)``), so ingest and search
work with ``--encoder stair --model PATH`` on every backend. Output vectors are L2-normalised
by default: the model was trained on cosine similarity, and with unit vectors the backends'
dot product ranks exactly as the model does. ``text_mode="mask"`` is the paper's
text-encoder-free querying (section 7.1): a query's tokens become a 0/1 (or idf) mask and
only the image tower ever runs.

The checkpoint's head decides the vectors (``head=`` only checks it): stair and vdr are
L2-normalised; a VisualSparta model's image vectors keep their raw eq. 15 scores (its queries,
bags of words, need no network).

Both towers run in ONNX Runtime (exported separately at first use and checked against
PyTorch, see :mod:`stair_es.encoders.runtime`) unless ``runtime="torch"``; the checkpoint is
still loaded with PyTorch for preprocessing and tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..encoders.base import Encoder, progress_bar
from ..errors import InvalidInputError, ModelError
from ..sparse import SparseVector


class StairEncoder(Encoder):
    name = "stair"
    modalities = frozenset({"image", "text"})

    def __init__(self, model: str | None = None, device: str | None = None, text_mode: str = "model", normalize: bool = True,
                 min_weight: float = 0.0, name: str | None = None, runtime: str | None = None, head: str | None = None):
        if not model:
            raise InvalidInputError("the stair encoder needs a trained model: --model PATH (a directory written by `stair-es train`) or a hub id")
        if text_mode not in ("model", "mask"):
            raise InvalidInputError(f"text_mode must be 'model' or 'mask', got {text_mode!r}")
        # lazy: torch takes seconds to import; loaded only when a model runs
        import torch

        from .model import StairModel

        self._torch = torch
        self.model_name = str(model)
        self.model = StairModel.from_pretrained(model, device=device, head=head)
        if not self.model.is_sparse:
            raise ModelError(f"{model} is a dense baseline checkpoint; the stair encoder needs a sparse head (stair, visualsparta or vdr)")
        super().__init__(self.model.vocab, name=name)
        self.head = self.model.head
        self.device = device
        self.text_mode = text_mode
        self.normalize = normalize
        # VisualSparta ranks by the raw sum of eq. 15: unit-length images would change its order
        # (queries may still be scaled: that changes no ranking)
        self.normalize_images = normalize and self.model.uses_cosine
        self.min_weight = float(min_weight)
        # lazy: the encoders bring onnxruntime and image code; only this path needs them
        from ..encoders.runtime import runtime_choice
        from ..encoders.text import BagOfWordsEncoder

        self._bow = BagOfWordsEncoder(vocab=self.model.vocab)
        self.runtime = runtime_choice(runtime)
        self._towers: dict[str, Any] = {}  # "image"/"text" -> OnnxTower, or False for PyTorch

    # --- ONNX Runtime ---------------------------------------------------------------------
    def tower_specs(self) -> dict[str, Any]:
        """How the image and text towers are exported to ONNX (separately; see stair_es.encoders.runtime)."""
        # lazy: the encoders bring onnxruntime and image code; only this path needs them
        from ..encoders.runtime import TowerSpec
        from .model import resolve_checkpoint

        torch = self._torch
        folder = Path(resolve_checkpoint(self.model_name))
        files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in (".safetensors", ".json", ".txt")]
        model, size = self.model, self.model.config.image_size

        class Tower(torch.nn.Module):
            def __init__(self, image: bool):
                super().__init__()
                self.m, self.image = model, image

            def forward(self, first, attention_mask=None):  # pixel values, or input ids
                return self.m.encode_image(first) if self.image else self.m.encode_text(first, attention_mask)

        def image_sample() -> dict[str, np.ndarray]:
            return {"pixel_values": np.random.default_rng(0).standard_normal((2, 3, size, size)).astype(np.float32)}

        def text_sample() -> dict[str, np.ndarray]:
            ids, mask, _ = model.tokenize(["a red car on a street", "two dogs"])
            return {"input_ids": ids.cpu().numpy().astype(np.int64), "attention_mask": mask.cpu().numpy().astype(np.int64)}

        key = f"stair-{folder.name}"
        return {
            "image": TowerSpec(kind=f"{key}-image", weight_files=files, build=lambda: Tower(True).eval(), sample=image_sample,
                               input_names=["pixel_values"], output_names=["weights"],
                               dynamic_axes={"pixel_values": {0: "batch"}, "weights": {0: "batch"}}, tolerance=1e-3),
            "text": TowerSpec(kind=f"{key}-text", weight_files=files, build=lambda: Tower(False).eval(), sample=text_sample,
                              input_names=["input_ids", "attention_mask"], output_names=["weights"],
                              dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                                            "weights": {0: "batch"}}, tolerance=1e-3),
        }

    def _tower(self, which: str) -> Any:
        if which == "text" and self.head == "visualsparta":
            return False  # a bag of words: no network to export
        if which not in self._towers:
            # lazy: the encoders bring onnxruntime and image code; only this path needs them
            from ..encoders.runtime import resolve_tower

            on_cpu = str(self.model.device) == "cpu"
            tower = resolve_tower(self.tower_specs()[which], self.runtime) if (on_cpu or self.runtime == "onnx") else None
            self._towers[which] = tower if tower is not None else False
        return self._towers[which]

    def onnx_spec(self):
        """The image tower's export spec (``stair-es encoders export --encoder stair``)."""
        return self.tower_specs()["image"]

    def _to_vectors(self, enc, normalize: bool | None = None) -> list[SparseVector]:
        if self.normalize if normalize is None else normalize:
            enc = self._torch.nn.functional.normalize(enc, dim=-1, eps=1e-6)
        rows = enc.cpu().numpy()
        kept = [np.flatnonzero(row > self.min_weight) for row in rows]
        return [SparseVector.from_arrays(nz, row[nz], self.vocab, drop_special=True) for row, nz in zip(rows, kept)]

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        out: list[SparseVector] = []
        with self._torch.no_grad(), progress_bar(len(images), "encoding images", progress) as bar:
            for i in range(0, len(images), batch_size):
                chunk = images[i : i + batch_size]
                pixels = self.model.preprocess_images(chunk)
                tower = self._tower("image")
                if tower:
                    enc = self._torch.from_numpy(tower.run({"pixel_values": pixels.cpu().numpy()})[0])
                else:
                    enc = self.model.encode_image(pixels)
                out.extend(self._to_vectors(enc, self.normalize_images))
                bar.update(len(chunk))
        return out

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False, idf: np.ndarray | None = None) -> list[SparseVector]:
        if self.text_mode == "mask":
            # Section 7.1's text-encoder-free query is the bag-of-words encoder: the query's own
            # tokens, stopwords and punctuation dropped, optionally idf-weighted.
            return [self._bow.encode_text(t, idf) for t in texts]
        out: list[SparseVector] = []
        with self._torch.no_grad(), progress_bar(len(texts), "encoding texts", progress) as bar:
            for i in range(0, len(texts), batch_size):
                chunk = list(texts[i : i + batch_size])
                ids, mask, _ = self.model.tokenize(chunk)
                tower = self._tower("text")
                if tower:
                    feeds = {"input_ids": ids.cpu().numpy().astype(np.int64), "attention_mask": mask.cpu().numpy().astype(np.int64)}
                    enc = self._torch.from_numpy(tower.run(feeds)[0])
                else:
                    enc = self.model.encode_text(ids, mask)
                out.extend(self._to_vectors(enc))
                bar.update(len(chunk))
        return out

    @property
    def uses_idf(self) -> bool:
        return self.text_mode == "mask"

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"name": self.name, "model": self.model_name, "head": self.head, "text_mode": self.text_mode, "normalize": self.normalize}
        if self.min_weight:
            cfg["min_weight"] = self.min_weight
        return cfg
