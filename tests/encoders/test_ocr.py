"""The ``ocr`` token source: words read from a picture become searchable tokens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from stair_es.encoders.ocr import OcrSource, ocr_available, read_shares
from stair_es.errors import MissingDependencyError
from stair_es.vocab import default_vocabulary

FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")
needs_engine = pytest.mark.skipif(not ocr_available(), reason="needs the 'ocr' extra (rapidocr)")


def _text_picture(text: str, size: int = 80, fill=(20, 20, 120)) -> Image.Image:
    if not FONT.exists():
        pytest.skip(f"needs a real font ({FONT}: Debian fonts-dejavu-core)")
    font = ImageFont.truetype(str(FONT), size)
    left, top, right, bottom = font.getbbox(text)
    im = Image.new("RGB", (right - left + 40, bottom - top + 40), "white")
    ImageDraw.Draw(im).text((20 - left, 20 - top), text, font=font, fill=fill)
    return im


def test_words_become_whole_tokens_weighted_by_confidence():
    vocab = default_vocabulary()
    shares = read_shares([("COFFEE Shop", 0.97), ("xqzvbnt", 0.99), ("blurry", 0.5)], vocab)
    assert shares["coffee"] == pytest.approx(0.97) and shares["shop"] == pytest.approx(0.97)
    assert "blurry" not in shares  # below min_confidence
    assert not any(t.startswith("##") or t == "xq" for t in shares)  # a word that is no whole token adds nothing
    assert shares["text"] == pytest.approx(0.6 * 0.97) and shares["word"] == pytest.approx(0.6 * 0.97)


def test_lone_characters_and_numbers_get_their_generic_words():
    vocab = default_vocabulary()
    shares = read_shares([("J", 0.99), ("7", 0.98)], vocab)
    assert shares["j"] == pytest.approx(0.99) and shares["letter"] == pytest.approx(0.6 * 0.99)
    assert shares["7"] == pytest.approx(0.98) and shares["seven"] == pytest.approx(0.98)
    assert "number" not in shares  # queries with dates expand to "number": it would match every digit
    # a round shape read as "O" at 0.9 (what stars and buttons give) is not a letter
    assert read_shares([("O", 0.9)], vocab) == {}
    assert read_shares([("福", 0.99)], vocab) == {}  # lone non-ASCII characters are recogniser noise here
    assert read_shares([("50", 0.97)], vocab)["50"] == pytest.approx(0.97)
    assert read_shares([("٣ ² x²", 0.99)], vocab) == {}  # non-ASCII digits are neither numbers nor a crash


def test_missing_engine_names_the_extra_and_text_queries_still_work(monkeypatch):
    import stair_es.encoders.ocr as ocr
    from stair_es.encoders.default import DefaultEncoder

    monkeypatch.setattr(ocr, "ocr_available", lambda: False)
    enc = DefaultEncoder(text="bow", sources="imagenet,ocr")  # e.g. searching an index built with OCR elsewhere
    assert enc.encode_texts(["stop sign"])[0].weight("stop") > 0
    with pytest.raises(MissingDependencyError, match=r"ocr token source.*pip install 'stair-es\[ocr\]'"):
        enc.encode_images([Image.new("RGB", (64, 64), "white")])
    with pytest.raises(MissingDependencyError, match=r"stair-es\[ocr\]"):
        OcrSource().encode_many([Image.new("RGB", (64, 64), "white")])


def test_bad_ocr_images_choice_is_a_clear_error():
    from stair_es.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="ocr_images must be one of drawings, all"):
        OcrSource(images="some")


class _FlakyEngine:
    """Reads 'STOP' from every picture, but fails on red ones (as an engine error on one picture would)."""

    def __call__(self, arr, **kwargs):
        h, w = arr.shape[:2]
        if tuple(arr[h // 2, w // 2]) == (0, 0, 255):  # BGR red
            raise RuntimeError("onnxruntime: bad allocation\nmore detail")

        class Out:
            txts = ("STOP",)
            scores = (0.99,)
        return Out()


def _flaky(src):
    src._build_engine = lambda: _FlakyEngine()
    return src


@needs_engine
def test_a_picture_the_engine_fails_on_keeps_its_other_tokens_and_is_reported():
    src = _flaky(OcrSource(images="all", threads=2))
    white, red = Image.new("RGB", (64, 64), "white"), Image.new("RGB", (64, 64), (255, 0, 0))
    vecs = src.encode_many([white, red, white, white])
    assert [v.weight("stop") > 0 for v in vecs] == [True, False, True, True]
    assert src.failures == {1: "ocr: RuntimeError: onnxruntime: bad allocation"}


@needs_engine
def test_ingest_reports_the_ocr_failure_per_image_and_indexes_the_picture(tmp_path):
    from fakes import ColorEncoder, MemoryBackend
    from stair_es.encoders.default import merge_max
    from stair_es.ingest import IngestOptions, ingest_catalog

    class ColourAndOcr(ColorEncoder):
        """The default encoder's contract (image_warnings after encode_images) with a fast tower."""

        def __init__(self):
            super().__init__()
            self.ocr = _flaky(OcrSource(images="all"))

        def encode_images(self, images, **kw):
            base = super().encode_images(images, **kw)
            read = self.ocr.encode_many(images)
            self.image_warnings = dict(self.ocr.failures)
            return [merge_max([b, r], self.vocab) for b, r in zip(base, read)]

    folder = tmp_path / "art"
    folder.mkdir()
    for name, colour in (("a", "white"), ("b", (255, 0, 0)), ("c", "white")):
        Image.new("RGB", (120, 90), colour).save(folder / f"{name}.png")
    backend = MemoryBackend()
    report = ingest_catalog(backend, "art", folder, ColourAndOcr, IngestOptions(batch_size=8))
    assert all(i.ok for i in report.items)
    assert {i.id: i.warning for i in report.items if i.warning} == {"b.png": "ocr: RuntimeError: onnxruntime: bad allocation"}
    docs = backend.indices["art"][1]
    assert sorted(docs) == ["a.png", "b.png", "c.png"]
    assert docs["a.png"].vectors["image"].weight("stop") > 0 and docs["b.png"].vectors["image"].weight("red") > 0


@needs_engine
def test_rendered_text_is_read_into_tokens():
    src = OcrSource(images="all")
    shares = src.shares(_text_picture("PIZZA"))
    assert shares.get("pizza", 0) >= 0.8 and "text" in shares
    letter = src.shares(_text_picture("K", size=120))
    assert letter.get("k", 0) >= 0.95 and "letter" in letter
    # 32 px icons are enlarged before reading
    small = _text_picture("5", size=24).resize((32, 32))
    assert src.shares(small).get("five", 0) > 0


@needs_engine
def test_default_encoder_shows_ocr_as_a_source_and_gates_photos(imagenet_encoder, photos):
    from stair_es.encoders.default import DefaultEncoder

    enc = DefaultEncoder(text="bow", sources="imagenet,colour,clipart,ocr")
    assert enc.config()["ocr"] == enc.ocr.version and enc.config()["ocr_images"] == "drawings"
    sign = _text_picture("HOTEL", size=90)
    detail_sign, detail_cat = enc.encode_images_detailed([sign, photos["chelsea"]])
    assert detail_sign["ocr"].weight("hotel") > 0
    assert detail_cat["ocr"].nnz == 0  # a photo is not read unless ocr_images="all"
    [vec] = enc.encode_images([sign])
    assert vec.weight("hotel") == pytest.approx(detail_sign["ocr"].weight("hotel"))
    assert "ocr" in enc.token_sources("hotel") and "ocr" in enc.token_sources("letter")
    assert "ocr" not in enc.token_sources("##ing")
    assert np.all(vec.weights > 0)
    _flaky(enc.ocr)
    enc.ocr._local = type(enc.ocr._local)()  # forget the engines already built
    red = Image.new("RGB", (90, 90), (255, 0, 0))
    vecs = enc.encode_images([sign, red])
    assert enc.image_warnings == {1: "ocr: RuntimeError: onnxruntime: bad allocation"}
    assert vecs[1].weight("red") > 0  # its other sources' tokens are kept


def test_an_index_read_by_another_ocr_version_is_searched_by_text_but_not_extended(monkeypatch):
    """Indexes built with version 1 of the source (which read pictures from a flat-pixel share
    of 0.3) still answer text queries, which never read pictures; encoding an image for them
    (ingest, search --image) is refused with the reason, unless forced."""
    from stair_es.encoders.default import DefaultEncoder
    from stair_es.encoders.ocr import DRAWING_FLAT, VERSION
    from stair_es.errors import EncoderVersionError

    assert VERSION != "rapidocr-ppocrv6-1" and DRAWING_FLAT == 0.45
    enc = DefaultEncoder(text="bow", sources="imagenet,ocr", ocr="rapidocr-ppocrv6-1")
    assert enc.encode_texts(["stop sign"])[0].weight("stop") > 0
    with pytest.raises(EncoderVersionError, match="rapidocr-ppocrv6-1.*--force"):
        enc.encode_images([Image.new("RGB", (64, 64), "white")])
    forced = DefaultEncoder(text="bow", sources="imagenet,ocr", ocr="rapidocr-ppocrv6-1", allow_version_mismatch=True)
    assert forced._ocr_version_error is None


@needs_engine
def test_the_ocr_engine_is_loaded_once_for_many_batches(imagenet_encoder, photos):
    """Ingest calls encode_images once per batch; a batch with one drawing reads it on the pixel
    worker thread, and RapidOCR's engine (seconds of CPU to load) must not be built again for
    every batch."""
    from stair_es.encoders.default import DefaultEncoder

    enc = DefaultEncoder(text="bow", sources="imagenet,colour,clipart,ocr")
    built = []

    def build():
        built.append(1)
        return _FlakyEngine()

    enc.ocr._build_engine = build
    sign = _text_picture("HOTEL", size=90)
    for _ in range(4):  # four "batches", one drawing each
        [vec, _cat] = enc.encode_images([sign, photos["chelsea"]])
        assert vec.weight("stop") > 0
    assert len(built) == 1
