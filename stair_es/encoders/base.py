"""The encoder interface and registry.

An encoder maps images and/or texts to :class:`~stair_es.sparse.SparseVector` over the
BERT vocabulary, in batches, optionally with a progress bar. Encoders are registered by
name with a JSON-serialisable config so an index can record which encoder made it and a
query can be encoded the same way.

This module must not know about any particular model or backend.
"""

from __future__ import annotations

import inspect
import sys
from abc import ABC
from importlib import import_module
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import EncoderVersionError, InvalidInputError, ModelError, UnknownNameError
from ..plugins import entry_points
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .options import refuse_unknown


class Encoder(ABC):
    """Base class. Subclasses implement one or both of ``encode_images`` / ``encode_texts``."""

    name: str = "abstract"
    modalities: frozenset[str] = frozenset()
    #: The shorter image side the encoder needs (e.g. 256 to crop 224); ingest decodes JPEGs at
    #: the smallest scale that still gives it. None: no preference (full-size decoding).
    image_min_side: int | None = None

    @property
    def uses_idf(self) -> bool:
        """Whether ``encode_texts`` weights by the ``idf`` it is given (then callers compute it).

        Document frequencies can be costly on a cluster, so they are only fetched for encoders
        that use them.
        """
        return False

    def __init__(self, vocab: Vocabulary | None = None, *, name: str | None = None):
        # ``name`` is accepted so that ``get_encoder(**encoder.config())`` rebuilds an encoder;
        # a config saved by another encoder is refused rather than silently reinterpreted.
        if name not in (None, self.name):
            raise InvalidInputError(f"config for encoder {name!r} given to the {self.name!r} encoder")
        self.vocab = vocab or default_vocabulary()

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        """``images``: PIL images (RGB). Returns one vector per image, in order."""
        raise InvalidInputError(f"encoder {self.name!r} does not encode images; choose an image encoder (see `stair-es encoders`)")

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                     idf: np.ndarray | None = None) -> list[SparseVector]:
        """``idf``: optional per-token inverse document frequency from the target index."""
        raise InvalidInputError(f"encoder {self.name!r} does not encode texts; choose a text encoder (see `stair-es encoders`)")

    @property
    def uses_index_stats(self) -> bool:
        """Whether :meth:`encode_queries` grounds query words on the index's tokens (then callers
        pass ``index_stats``, see :mod:`stair_es.encoders.grounding`)."""
        return False

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                       idf: np.ndarray | None = None, index_stats: Any = None) -> list[Any]:
        """One :class:`~stair_es.encoders.grounding.EncodedQuery` per text: the vector and what
        each query word became. Encoders that do not ground words return ``encode_texts``'s
        vectors with no steps."""
        from .grounding import EncodedQuery  # lazy: the grounding map is read only by queries that need it

        return [EncodedQuery(v) for v in self.encode_texts(texts, batch_size=batch_size, progress=progress, idf=idf)]

    def config(self) -> dict[str, Any]:
        """JSON-serialisable config; ``get_encoder(**config)`` rebuilds an equivalent encoder."""
        return {"name": self.name}


class GroundingEncoder(Encoder):
    """An encoder whose text path is :meth:`encode_queries` (query words grounded on an index's
    tokens, :mod:`stair_es.encoders.grounding`): :meth:`encode_texts` returns its vectors."""

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                     idf: np.ndarray | None = None, index_stats: Any = None) -> list[SparseVector]:
        return [q.vector for q in self.encode_queries(texts, batch_size=batch_size, progress=progress, idf=idf,
                                                      index_stats=index_stats)]


_BUILTIN: dict[str, str] = {
    "default": "stair_es.encoders.default:DefaultEncoder",
    "imagenet": "stair_es.encoders.imagenet:ImageNetLabelEncoder",
    "bow": "stair_es.encoders.text:BagOfWordsEncoder",
    "grounded": "stair_es.encoders.grounded:GroundedQueryEncoder",
    "splade": "stair_es.encoders.text:SpladeEncoder",
    "stair": "stair_es.stair.encoder:StairEncoder",
    "vdr": "stair_es.encoders.vdr:VdrEncoder",
    "clip-vocab": "stair_es.encoders.clipvocab:ClipVocabEncoder",
}


def register_encoder(name: str, target: str | Callable[..., Encoder]) -> None:
    """Register an encoder factory (``"module:attr"`` or a callable) under ``name``."""
    _BUILTIN[name] = target  # type: ignore[assignment]


def registered_factory(name: str) -> Callable[..., Encoder] | None:
    """The callable registered under ``name`` in this process (``register_encoder`` with a class
    or function), or None: unknown here, a ``"module:attr"`` string, or an entry point."""
    target = _BUILTIN.get(name)
    return None if target is None or isinstance(target, str) else target


def list_encoders() -> list[str]:
    names = set(_BUILTIN)
    names.update(ep.name for ep in entry_points(group="stair_es.encoders"))
    return sorted(names)


def get_encoder(name: str = "default", **options: Any) -> Encoder:
    """Build an encoder by registry name; unknown names list what exists."""
    target: Any = _BUILTIN.get(name)
    if target is None:
        for ep in entry_points(group="stair_es.encoders"):
            if ep.name == name:
                target = ep.load()
                break
        else:
            raise UnknownNameError(f"unknown encoder {name!r}; available: {', '.join(list_encoders())}")
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = getattr(import_module(module), attr)
    _check_option_names(name, target, options)
    return target(**options)


def _check_option_names(name: str, factory: Callable[..., Encoder], options: dict[str, Any]) -> None:
    """Refuse an option the factory's signature does not take, listing the ones it does (a
    factory taking ``**options`` checks its own, see :mod:`stair_es.encoders.options`): a typo in
    ``--encoder-option`` is the user's mistake, not a TypeError from deep inside."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: let it judge its options
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    refuse_unknown(options, [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)], name)


def shares_vector(shares: dict[str, float], vocab: Vocabulary, scale: float = 10.0) -> SparseVector:
    """Token shares in [0, 1] -> the image encoders' ENC-like weights ``log(1 + scale * share)``."""
    if not shares:
        return SparseVector.empty(vocab)
    ids = np.array([vocab.id(t) for t in shares], np.int64)
    w = np.log1p(scale * np.clip(np.array(list(shares.values()), dtype=np.float64), 0.0, 1.0))
    return SparseVector.from_arrays(ids, w, vocab, drop_special=True)


def read_packaged_map(filename: str, what: str) -> Any:
    """A JSON file shipped in ``stair_es/encoders/configs`` (token maps), or a ModelError naming it."""
    import json
    from importlib import resources

    try:
        return json.loads(resources.files("stair_es.encoders").joinpath(f"configs/{filename}").read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{what} {filename} cannot be read ({e}); reinstall stair-es") from None


def check_recorded_version(what: str, recorded: str | None, installed: str, allow_mismatch: bool, why: str) -> None:
    """Refuse an encoder config recorded with another version of a packaged map (``--force`` allows it)."""
    if recorded is not None and recorded != installed and not allow_mismatch:
        raise EncoderVersionError(
            f"the index was built with {what} {recorded!r}, but this stair_es has {installed!r}: {why}. Re-ingest the "
            "catalog into a new index, install the stair_es version that built it, or pass --force to search it anyway")


class _NoBar:
    """What :func:`progress_bar` gives when disabled (a query need not import tqdm)."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        return None

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self) -> None:
        return None


def single_threaded_blas():
    """A context in which numpy's BLAS runs on one thread.

    Image encoding already keeps every core busy (ONNX Runtime slices, a pixel worker, the
    decoding pool); a small matrix product (the clip-art head, colour conversion) that
    OpenBLAS spreads over its own threads then waits for cores that are taken: measured on
    two busy cores, 16 rows through the clip-art head took 92-108 ms with OpenBLAS threads
    against 5-7 ms on one thread. Re-ranking's products after a query's ONNX runs likewise
    (2 ms instead of 27 ms per search in a server). OpenBLAS's setting is process-wide, so the
    contexts of all threads share one limit, lifted when the last of them closes."""
    return _ONE_THREAD


class _OneBlasThread:
    """A re-entrant, thread-safe one-thread BLAS limit (``threadpoolctl``; finding the loaded
    libraries costs 0.3 ms, so it is done once, and entering costs a few microseconds)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._open = 0
        self._controller: Any = None
        self._limit: Any = None

    def __enter__(self) -> None:
        with self._lock:
            if self._open == 0:
                if self._controller is None:
                    from threadpoolctl import ThreadpoolController

                    self._controller = ThreadpoolController()
                self._limit = self._controller.limit(limits=1, user_api="blas")
            self._open += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._open -= 1
            if self._open == 0:
                self._limit.restore_original_limits()
                self._limit = None


_ONE_THREAD = _OneBlasThread()


def tqdm_class() -> type:
    """tqdm's notebook-aware bar inside Jupyter, else the plain terminal bar (``tqdm.auto``
    imports asyncio, about 0.1 s of a command's start-up, to find out what we know already)."""
    if "ipykernel" in sys.modules:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def progress_bar(total: int, desc: str, enabled: bool, *, unit: str = "item", **options: Any):
    """A tqdm bar on stderr when enabled, else a no-op with the same interface. ``options``
    go to tqdm (e.g. ``unit_scale=True, unit_divisor=1024`` with ``unit="B"`` for bytes)."""
    if not enabled:
        return _NoBar()
    tqdm = tqdm_class()
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False, **options)
