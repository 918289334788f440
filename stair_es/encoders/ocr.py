"""``ocr``: words read from the image (a token source of the ``default`` encoder when RapidOCR is installed).

Product labels, signs, brand names, and the letters and digits of clip art are what a user
types to find a picture, and no image classifier gives them. This source reads them with
RapidOCR (PP-OCR detection + recognition models run by ONNX Runtime; the models ship inside
the ``rapidocr`` wheel, so nothing is downloaded at run time) and turns what it read into
WordPiece tokens:

* every recognised word (split on anything that is not a letter or digit, lowercased) that
  is **one whole token** of the BERT vocabulary gets share = the recogniser's confidence for
  its line; words that would split into pieces are dropped (pieces of a misread word are
  noise that matches unrelated queries);
* a single character read on its own (the letter ``j``, the digit ``7``; ASCII only) is a
  token too, and a number from 0 to 20 also gives its English name (``7`` -> ``seven``: a
  user searches "seven" as often as "7");
* a generic word says what was read: ``letter`` for a lone letter, ``text`` and ``word``
  for words of three letters or more (share 0.6 x confidence). There is no generic
  ``number``: SPLADE expands queries holding dates or counts ("... Aug 25 23:29:46 2004")
  with ``number``, and every playing card then outranked the drawings the query was about
  (Openclipart P@1 0.213 with it, 0.290 without; Tux Paint unchanged).

Reads below ``min_confidence`` (0.8) are dropped, and lone characters need
``char_confidence`` (0.95): round shapes (stars, circles, buttons) are read as ``O`` or
``0`` at 0.8-0.93. Both were chosen by ``benchmarks/encoders/ocr_calibration.py`` on letters
drawn with Pillow and on Openclipart drawings the evaluation never samples, not on an
evaluation set.

Weights follow the other image sources' scale, ``w = log(1 + 10 * share)``; a token read
several times keeps its largest share.

**How a picture is read.** RapidOCR's detector finds text lines and its recogniser reads
each (no angle classifier: upright text only). The detector runs on a copy whose longer side
is ``side`` (256 px; smaller pictures, such as 32 px icons, are enlarged to it) inside a
white margin, so a letter that fills its picture is still found as a line.

**Cost and gating.** Detection + recognition cost about as much CPU as the image classifier
(see docs/encoders.md), so by default (``images="drawings"``) only pictures that are surely
drawn are read: flat-pixel share >= ``DRAWING_FLAT`` = 0.45, where the clipart gate reaches 1.
Photos stay under it (the sample photos' median is 0.11; grey or dark-sky photos such as
``moon``, ``brick`` or ``camera`` reach 0.32-0.38, and read nothing useful), drawings are
over it (Openclipart's median 0.80). ``images="all"`` reads photos too (signs, labels, book
covers). Version 1 of this source read from 0.3; its indexes record ``rapidocr-ppocrv6-1``.

It is one of the ``default`` encoder's sources whenever RapidOCR is installed (the
``encoders`` extra brings it; ``ocr`` alone too); without it, reading pictures with this source fails; a clear one-line
message names it when missing (text queries of an index built with this source do not need it). A picture the engine fails on gets no OCR tokens and a warning naming the
reason (:attr:`OcrSource.failures`); it never stops a batch.

This module must not know about indices, backends or other token sources (it only borrows
the drawing score of :mod:`stair_es.encoders.clipart`).
"""

from __future__ import annotations

import logging
import re
import threading
from importlib.util import find_spec
from typing import Any, Sequence

import numpy as np

from ..errors import InvalidInputError, MissingDependencyError
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from .base import shares_vector
from .clipart import drawing_score

SCALE = 10.0
REC_MIN_WIDTH = 96
VERSION = "rapidocr-ppocrv6-2"  # 2: drawings from a flat-pixel share of 0.45 (1: 0.3)
OCR_IMAGES = ("drawings", "all")
#: flat-pixel share from which a picture is read with images="drawings": where the clipart gate
#: (0 below 0.15, 1 from 0.45) says "surely drawn"
DRAWING_FLAT = 0.45
GENERIC_SHARE = 0.6
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty").split()
#: generic words this source can add besides what it read
GENERIC_TOKENS = ("letter", "text", "word")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def ocr_available() -> bool:
    return find_spec("rapidocr") is not None and find_spec("onnxruntime") is not None


def _missing() -> MissingDependencyError:
    return MissingDependencyError("the ocr token source (words read from the image)", "ocr", "rapidocr")


def read_shares(lines: Sequence[tuple[str, float]], vocab: Vocabulary, min_confidence: float = 0.8,
                char_confidence: float = 0.95) -> dict[str, float]:
    """Recognised lines ``(text, confidence)`` -> token shares in [0, 1] (see the module docstring)."""
    shares: dict[str, float] = {}

    def put(token: str, share: float) -> None:
        if share > shares.get(token, 0.0):
            shares[token] = share

    for text, conf in lines:
        conf = float(np.clip(conf, 0.0, 1.0))
        for word in _WORD.findall(text.lower()):
            if conf < min_confidence or (len(word) == 1 and (conf < char_confidence or not word.isascii())):
                continue
            if word.isascii() and word.isdigit():
                number = int(word)
                if vocab.get(word) is not None:
                    put(word, conf)
                if number <= 20:
                    put(NUMBER_WORDS[number], conf)
            elif len(word) == 1:
                if vocab.get(word) is not None and word.isalpha():
                    put(word, conf)
                    put("letter", GENERIC_SHARE * conf)
            elif vocab.get(word) is not None:
                put(word, conf)
                if len(word) >= 3 and word.isalpha():
                    put("text", GENERIC_SHARE * conf)
                    put("word", GENERIC_SHARE * conf)
    return shares


class OcrSource:
    """Image -> tokens of the words read in it (see the module docstring)."""

    name = "ocr"

    def __init__(self, *, images: str = "drawings", side: int = 256, min_confidence: float = 0.8,
                 char_confidence: float = 0.95, threads: int | None = None, vocab: Vocabulary | None = None):
        if images not in OCR_IMAGES:
            raise InvalidInputError(f"ocr_images must be one of {', '.join(OCR_IMAGES)}; got {images!r}")
        # RapidOCR is needed only to read pictures: an index built with this source can be
        # searched by text on a machine without it (check_available() / engine() say what is missing)
        self.images = images
        self.side = int(side)
        self.min_confidence = float(min_confidence)
        self.char_confidence = float(char_confidence)
        self.threads = threads
        self.vocab = vocab or default_vocabulary()
        self.version = VERSION
        self._local = threading.local()
        self._pool: Any = None
        self._pool_size = 0
        #: per call of :meth:`encode_many`, index of the picture -> why it could not be read
        self.failures: dict[int, str] = {}

    def can_read(self, token: str) -> bool:
        """Whether this source can give ``token``: any whole-word token of letters or digits (for explain)."""
        return token in GENERIC_TOKENS or (not token.startswith("##") and token.isalnum() and self.vocab.get(token) is not None)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "images": self.images, "side": self.side,
                "min_confidence": self.min_confidence, "char_confidence": self.char_confidence}

    def check_available(self) -> None:
        """Raise MissingDependencyError naming the ``ocr`` extra when RapidOCR cannot be imported."""
        if not ocr_available():
            raise _missing()

    def engine(self) -> Any:
        """This thread's RapidOCR engine (one per thread: the engine keeps per-call state)."""
        engine = getattr(self._local, "engine", None)
        if engine is None:
            engine = self._local.engine = self._build_engine()
        return engine

    def _build_engine(self) -> Any:
        try:
            from rapidocr import RapidOCR
        except ImportError:
            raise _missing() from None
        params = {
            "Global.log_level": "error",
            "Global.use_cls": False,  # upright text only: the angle classifier costs time and flips glyphs such as 6/9
            "Det.limit_type": "max", "Det.limit_side_len": self.side,
            # the recogniser's input is 48 px high and at least this wide (wider for longer lines):
            # RapidOCR's 320 costs 1.5x the CPU on the short words and lone glyphs of clip art
            "Rec.rec_img_shape": [3, 48, REC_MIN_WIDTH],
            # pictures are read in parallel, one per thread (as the image tower's batch slices)
            "EngineConfig.onnxruntime.intra_op_num_threads": 1,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
        engine = RapidOCR(params=params)
        logging.getLogger("RapidOCR").setLevel(logging.ERROR)
        return engine

    def wants(self, image: Any, score: float | None = None) -> bool:
        """Whether this picture is read at all (``images="drawings"``: only drawing-like ones;
        ``score``: its drawing score, when the caller has it already)."""
        if self.images == "all":
            return True
        return (drawing_score(image) if score is None else score) >= DRAWING_FLAT

    def _prepared(self, image: Any) -> np.ndarray:
        """The picture for the detector: longer side ``side`` (enlarged if smaller), white margin."""
        from PIL import Image

        im = image if image.mode == "RGB" else image.convert("RGB")
        w, h = im.size
        margin = max(8, self.side // 16)
        scale = (self.side - 2 * margin) / max(w, h, 1)
        im = im.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.BILINEAR)
        canvas = Image.new("RGB", (im.width + 2 * margin, im.height + 2 * margin), (255, 255, 255))
        canvas.paste(im, (margin, margin))
        return np.asarray(canvas)[:, :, ::-1].copy()  # RapidOCR takes OpenCV's BGR order

    def read(self, image: Any) -> list[tuple[str, float]]:
        """``(text, confidence)`` of each line read in the picture (it is read whatever ``images`` says)."""
        arr = self._prepared(image)
        out = self.engine()(arr)
        txts = list(getattr(out, "txts", None) or [])
        scores = [float(s) for s in (getattr(out, "scores", None) or [])]
        return [(t, s) for t, s in zip(txts, scores) if t and t.strip()]

    def shares(self, image: Any, score: float | None = None) -> dict[str, float]:
        if not self.wants(image, score):
            return {}
        return read_shares(self.read(image), self.vocab, self.min_confidence, self.char_confidence)

    def encode(self, image: Any, score: float | None = None) -> SparseVector:
        return shares_vector(self.shares(image, score), self.vocab, SCALE)

    def encode_many(self, images: Sequence[Any], scores: Sequence[float] | None = None) -> list[SparseVector]:
        """One vector per picture, read in parallel (``$STAIR_ES_ORT_THREADS`` or one thread per
        core, each running single-threaded ONNX Runtime); a picture the engine fails on gets an
        empty vector and an entry in :attr:`failures` (index -> reason) instead of failing the batch."""
        from .runtime import first_line, ort_threads

        self.check_available()  # once for the batch: a missing extra is not a per-picture failure

        def one(job: tuple[Any, float | None]) -> SparseVector | str:
            try:
                return self.encode(*job)
            except MissingDependencyError:
                raise
            except Exception as e:  # noqa: BLE001 - one picture's OCR failure is that picture's warning
                return f"ocr: {type(e).__name__}: {first_line(e)}"

        jobs = list(zip(images, scores if scores is not None else [None] * len(images)))
        # only pictures that will be read go to the pool (most photos are not)
        todo = [i for i, (im, sc) in enumerate(jobs) if sc is None or self.wants(im, sc)]
        workers = self.threads or ort_threads()
        empty = SparseVector.empty(self.vocab)
        if workers <= 1 or len(todo) <= 1:
            done = [one(jobs[i]) for i in todo]
        else:
            if self._pool is None or self._pool_size != workers:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="stair-es-ocr")
                self._pool_size = workers
            done = list(self._pool.map(one, [jobs[i] for i in todo]))
        got = dict(zip(todo, done))
        self.failures = {i: r for i, r in got.items() if isinstance(r, str)}
        return [empty if i in self.failures else got.get(i, empty) for i in range(len(jobs))]
