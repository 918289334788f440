"""The default encoder: imagenet for images, splade-tiny or bow for texts, recorded in config()."""

from __future__ import annotations

import numpy as np
import pytest

from stair_es.encoders import BagOfWordsEncoder, DefaultEncoder, SpladeEncoder, get_encoder, list_encoders
from stair_es.errors import InvalidInputError


def test_registry_names():
    assert {"default", "imagenet", "bow", "splade"} <= set(list_encoders())


def test_auto_falls_back_to_bow_without_splade(monkeypatch):
    import stair_es.encoders.default as mod
    import stair_es.encoders.ocr as ocr_mod

    monkeypatch.setattr(mod, "splade_available", lambda model="splade-tiny": False)
    monkeypatch.setattr(ocr_mod, "ocr_available", lambda: False)  # an install without RapidOCR: no ocr source
    monkeypatch.setattr("stair_es.encoders.objects.installed", lambda model=None: False)  # nor the objects detector
    enc = DefaultEncoder()
    assert isinstance(enc.text_encoder, BagOfWordsEncoder)
    from stair_es.encoders.clipart import head_provenance
    from stair_es.encoders.imagenet import wordnet_token_map

    cfg = enc.config()
    assert len(cfg.pop("image_weights")) == 16  # the sha256 of the classifier's weights, recorded in the index
    cfg.pop("grounding", None)  # query-side (tests/encoders/test_grounding.py)
    assert cfg.pop("similar_words").endswith("@0.2")  # query-side too: the table's version and the share
    assert cfg == {"name": "default", "text": "bow", "image_model": "lite0", "top_classes": 20, "min_weight": 0.05,
                   "temperature": 1.0, "class_mass": 0.99, "label_scale": 10.0,
                   "token_map": wordnet_token_map()["version"], "sources": ["imagenet", "colour", "clipart", "scene"],
                   "scene": "scene-v1",
                   "clipart_head": head_provenance()["version"] + "+flatgate1"}
    (vec,) = enc.encode_texts(["a dog"])
    assert vec.to_token_map() == {"dog": 1.0}


def test_default_sources_read_words_when_rapidocr_is_installed(monkeypatch):
    import stair_es.encoders.ocr as ocr_mod
    from stair_es.encoders.ocr import VERSION

    monkeypatch.setattr(ocr_mod, "ocr_available", lambda: True)
    monkeypatch.setattr("stair_es.encoders.objects.installed", lambda model=None: False)  # tests/encoders/test_objects.py
    cfg = DefaultEncoder().config()
    assert cfg["sources"] == ["imagenet", "colour", "clipart", "scene", "ocr"]
    assert (cfg["ocr"], cfg["ocr_images"]) == (VERSION, "drawings")  # recorded: an index says what it was read with
    monkeypatch.setattr(ocr_mod, "ocr_available", lambda: False)
    assert DefaultEncoder().config()["sources"] == ["imagenet", "colour", "clipart", "scene"]
    # sources named explicitly are used as given, whatever is installed
    assert DefaultEncoder(sources="imagenet,colour").config()["sources"] == ["imagenet", "colour"]


def test_auto_uses_splade_when_available(monkeypatch):
    import stair_es.encoders.default as mod

    monkeypatch.setattr(mod, "splade_available", lambda model="splade-tiny": True)
    enc = DefaultEncoder()
    assert isinstance(enc.text_encoder, SpladeEncoder)
    cfg = enc.config()
    assert cfg["text"] == "splade" and cfg["text_model"] == "splade-tiny"
    rebuilt = get_encoder(**cfg)  # an index's recorded config rebuilds the same choice
    assert rebuilt.config() == cfg and isinstance(rebuilt.text_encoder, SpladeEncoder)


def test_forced_choices_and_bad_choice():
    assert DefaultEncoder(text="bow").config()["text"] == "bow"
    enc = DefaultEncoder(text="splade", text_model="/some/folder")
    assert enc.config()["text_model"] == "/some/folder"
    with pytest.raises(InvalidInputError, match="auto, bow, splade"):
        DefaultEncoder(text="clip")


def test_an_unknown_option_is_refused_with_the_valid_names():
    """A typo in ``--encoder-option`` names the option and lists the valid ones (not a Python TypeError),
    in the library and on the command line."""
    with pytest.raises(InvalidInputError, match=r"'default' encoder does not take the option colour; its options are "
                                                r"text, text_model, .*label_scale, .*grounding, similar_words$"):
        get_encoder("default", text="bow", colour="blue")
    with pytest.raises(InvalidInputError, match="does not take the options colour, top_k;"):
        DefaultEncoder(colour="blue", top_k=3)
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    r = CliRunner().invoke(cli, ["encode", "--text", "a dog", "--encoder-option", "text=bow", "--encoder-option", "colur=red"])
    assert r.exit_code == 2 and "does not take the option colur; its options are text," in r.output
    assert "Traceback" not in r.output


def test_idf_passes_through_to_bow():
    from stair_es.vocab import VOCAB_SIZE, default_vocabulary

    idf = np.ones(VOCAB_SIZE)
    idf[default_vocabulary().id("dog")] = 2.5
    (vec,) = DefaultEncoder(text="bow").encode_texts(["dog"], idf=idf)
    assert vec.weight("dog") == pytest.approx(2.5)


def test_images_use_the_imagenet_encoder(imagenet_encoder, photos):
    enc = DefaultEncoder(text="bow", sources=["imagenet"])
    (vec,) = enc.encode_images([photos["chelsea"]])
    (ref,) = imagenet_encoder.encode_images([photos["chelsea"]])
    np.testing.assert_allclose(vec.to_dense(), ref.to_dense(), atol=1e-5)
    # an image found by a text query through the same vocabulary
    (q,) = enc.encode_texts(["cat"])
    (q2,) = enc.encode_texts(["coffee"])
    assert vec.dot(q) > vec.dot(q2)


def test_colour_source_adds_colour_words_and_shows_each_source(imagenet_encoder, photos):
    from PIL import Image

    enc = DefaultEncoder(text="bow")
    red = Image.new("RGB", (120, 80), (210, 25, 30))
    (vec,) = enc.encode_images([red])
    (detail,) = enc.encode_images_detailed([red])
    from stair_es.encoders.default import default_sources

    assert set(detail) == set(default_sources())  # imagenet, colour, clipart (+ ocr with RapidOCR installed)
    assert detail["colour"].top(1)[0][0] == "red"
    assert "ocr" not in detail or detail["ocr"].nnz == 0  # a flat red picture holds no text to read
    assert vec.weight("red") == pytest.approx(max(p.weight("red") for p in detail.values()), rel=1e-6)
    # the merged vector holds every source's tokens, each at its largest weight
    for part in detail.values():
        for tok, w in part.to_token_map().items():
            assert vec.weight(tok) >= w - 1e-6
    (q,) = enc.encode_texts(["red"])
    (cat,) = enc.encode_images([photos["chelsea"]])
    assert vec.dot(q) > cat.dot(q)
    assert enc.token_sources("red")[:2] == ["imagenet", "colour"]
    assert "imagenet" in enc.token_sources("cat") and "colour" not in enc.token_sources("cat")


def test_other_model_weights_are_a_clear_version_error():
    from stair_es.errors import EncoderVersionError

    cfg = DefaultEncoder(text="bow").config()
    cfg.pop("name")
    with pytest.raises(EncoderVersionError, match="other image model weights.*--force"):
        DefaultEncoder(**{**cfg, "image_weights": "0" * 16})
    assert DefaultEncoder(**{**cfg, "image_weights": "0" * 16}, allow_version_mismatch=True).config()["image_weights"] == cfg["image_weights"]


def test_sources_are_checked_and_recorded():
    assert get_encoder("default", text="bow", sources=["imagenet"]).config()["sources"] == ["imagenet"]
    with pytest.raises(InvalidInputError, match="sources"):
        DefaultEncoder(sources=["colour"])


def test_people_source_finds_faces_in_portraits_and_not_in_objects(photos):
    pytest.importorskip("cv2", reason="needs the 'people' extra")
    from stair_es.encoders.people import opencv_available

    if not opencv_available():
        pytest.skip("this OpenCV has no CascadeClassifier (install opencv-python-headless<5)")
    enc = DefaultEncoder(text="bow", sources="imagenet,colour,people")
    assert enc.config()["sources"] == ["imagenet", "colour", "people"]
    detail = dict(zip(photos, enc.encode_images_detailed(list(photos.values()))))
    assert detail["astronaut"]["people"].weight("face") > 0 and detail["astronaut"]["people"].weight("person") > 0
    if "hopper" in detail:
        assert detail["hopper"]["people"].weight("portrait") > 0
    assert detail["coffee"]["people"].nnz == 0 and detail["chelsea"]["people"].nnz == 0
    assert enc.token_sources("person") == ["imagenet", "people"]
    assert enc.config()["people"] == "people-v2"


def _needs_opencv():
    pytest.importorskip("cv2", reason="needs the 'people' extra")
    from stair_es.encoders.people import opencv_available

    if not opencv_available():
        pytest.skip("this OpenCV has no CascadeClassifier (install opencv-python-headless<5)")


def test_people_source_finds_no_faces_in_drawings(photos):
    _needs_opencv()
    from stair_es.encoders.clipart import drawing_score
    from stair_es.encoders.people import PeopleSource

    # the astronaut in 4 flat colours: the cascade still finds her face, but the picture looks
    # drawn (as cartoon stamps do, whose eyes and mouths the cascade takes for faces)
    poster = photos["astronaut"].quantize(4).convert("RGB")
    src = PeopleSource()
    assert drawing_score(poster) >= src.max_flat
    assert src.shares(poster, flat=0.0)["face"] > 0  # the cascade alone
    assert src.shares(poster) == {}  # the drawing gate
    assert src.shares(photos["astronaut"], flat=0.9) == {}  # a drawing score given by the caller is used as is
    assert src.shares(photos["astronaut"])["face"] > 0
    enc = DefaultEncoder(text="bow", sources="imagenet,colour,people")
    assert [d["people"].nnz > 0 for d in enc.encode_images_detailed([poster, photos["astronaut"]])] == [False, True]


def test_people_source_version_is_recorded_and_checked(photos):
    _needs_opencv()
    from stair_es.errors import EncoderVersionError

    cfg = DefaultEncoder(text="bow", sources="imagenet,colour,people").config()
    cfg.pop("name")
    assert DefaultEncoder(**cfg).config() == {**cfg, "name": "default"}
    # an index built with people-v1 (320 px cascade, recorded no version) keeps answering text queries,
    # while encoding an image for it is refused with the reason
    old = {k: v for k, v in cfg.items() if k != "people"}
    enc = DefaultEncoder(**old)
    assert enc.encode_texts(["a face"])[0].weight("face") > 0
    with pytest.raises(EncoderVersionError, match="people token source 'people-v1'.*people-v2.*--force"):
        enc.encode_images([photos["astronaut"]])
    forced = DefaultEncoder(**old, allow_version_mismatch=True)
    assert forced.encode_images([photos["astronaut"]])[0].weight("face") > 0
    with pytest.raises(EncoderVersionError, match="people-v0"):
        DefaultEncoder(**{**cfg, "people": "people-v0"}).encode_images([photos["astronaut"]])


def test_people_source_without_opencv_names_the_extra(monkeypatch):
    import stair_es.encoders.people as people
    from stair_es.errors import MissingDependencyError

    monkeypatch.setattr(people, "opencv_available", lambda: False)
    with pytest.raises(MissingDependencyError, match=r"stair-es\[people\]"):
        DefaultEncoder(text="bow", sources=["imagenet", "people"])


def test_grounded_text_side_builds_and_round_trips():
    """``text="grounded"`` used to fail at construction (the default encoder passes ``grounding``)."""
    from stair_es.encoders import get_encoder

    enc = get_encoder("default", text="grounded")
    vec = enc.encode_texts(["a drake on a pond"])[0].to_token_map()
    assert {"drake", "duck", "pond"} <= set(vec)
    assert get_encoder(**enc.config()).config() == enc.config()
