"""The ``clipart`` token source: a learned head on the ImageNet classifier's output for drawings."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from stair_es.encoders.clipart import ClipartSource, _load_head, drawing_gate
from stair_es.errors import EncoderVersionError
from stair_es.vocab import default_vocabulary


def test_head_is_shipped_with_provenance_and_a_version():
    head = _load_head()
    prov = head["provenance"]
    assert prov["version"].startswith("clipart-v1-")
    assert "public domain" in prov["data"]
    assert prov["drawings_held_out"] > 0  # the evaluation's drawings were not trained on
    vocab = default_vocabulary()
    assert all(not vocab.is_special(int(t)) for t in head["tokens"])


def test_probabilities_and_weights_are_bounded_and_pruned():
    src = ClipartSource(top_tokens=10)
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(1000, 0.05), size=4).astype(np.float32)
    p = src.probabilities(probs)
    assert p.shape == (4, len(src.tokens)) and np.all((p >= 0) & (p <= 1))
    for v in src.encode_probabilities(probs):
        assert v.nnz <= 10
        assert np.all(v.weights >= src.min_weight) and np.all(v.weights <= np.log1p(10.0) + 1e-6)
        assert {src.vocab.token(int(i)) for i in v.ids} <= src.tokens


def _drawing() -> Image.Image:
    """A flat drawing on white: a red five-pointed star with a black outline."""
    img = Image.new("RGB", (320, 320), "white")
    d = ImageDraw.Draw(img)
    pts = []
    for k in range(10):
        r = 140 if k % 2 == 0 else 56
        a = np.pi / 2 + k * np.pi / 5
        pts.append((160 + r * np.cos(a), 160 - r * np.sin(a)))
    d.polygon(pts, fill=(220, 20, 30), outline="black", width=4)
    return img


@pytest.fixture(scope="module")
def clipart_encoder(imagenet_encoder):
    from stair_es.encoders import get_encoder

    return get_encoder("default", text="bow", sources="imagenet,colour,clipart")


def test_default_encoder_shows_the_clipart_source_and_records_its_version(clipart_encoder):
    parts = clipart_encoder.encode_images_detailed([_drawing()])[0]
    assert set(parts) == {"imagenet", "colour", "clipart"}
    assert parts["clipart"].nnz > 0
    merged = clipart_encoder.encode_images([_drawing()])[0].to_token_map()
    for name, vec in parts.items():  # merged = per-token max over the sources
        for tok, w in vec.to_token_map().items():
            assert merged[tok] >= w - 1e-3, (name, tok)
    cfg = clipart_encoder.config()
    assert cfg["clipart_head"] == f"{_load_head()['version']}+flatgate1"
    tok = next(iter(parts["clipart"].to_token_map()))
    assert "clipart" in clipart_encoder.token_sources(tok)


def test_an_index_built_with_another_head_is_refused_unless_forced(imagenet_encoder):
    from stair_es.encoders import get_encoder

    with pytest.raises(EncoderVersionError, match="clipart token head"):
        get_encoder("default", text="bow", sources="imagenet,clipart", clipart_head="clipart-v1-000000000000")
    enc = get_encoder("default", text="bow", sources="imagenet,clipart", clipart_head="clipart-v1-000000000000",
                      allow_version_mismatch=True)
    assert enc.clipart is not None


def test_photos_keep_their_photo_words(clipart_encoder, photos):
    """The head is trained on drawings; on a photo the classifier's own words must stay on top."""
    vec = clipart_encoder.encode_images([photos["chelsea"]])[0].to_token_map()
    top = sorted(vec, key=vec.get, reverse=True)[:5]
    assert "cat" in top, top


def test_the_drawing_gate_keeps_the_head_off_photos(clipart_encoder, photos):
    """Trained on drawings only, the head would guess on photos ("computer", "symbols" on a cat):
    the flat-fill gate is 0 on real photos and 1 on a flat drawing."""
    assert drawing_gate(_drawing()) == 1.0
    for name in ("chelsea", "coffee", "astronaut"):
        assert drawing_gate(photos[name]) == 0.0, name
    parts = clipart_encoder.encode_images_detailed([photos["chelsea"]])[0]
    assert parts["clipart"].nnz == 0
