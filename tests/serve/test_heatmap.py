"""The STAIR heatmap overlay on demand: /v1/heatmap and the page's link, for stair-encoder indices."""

from __future__ import annotations

import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from stair_es.backends.embedded import EmbeddedBackend
from stair_es.encoders.base import get_encoder
from stair_es.schema import Document, IndexSchema
from stair_es.serve.app import create_app

from .conftest import make_config


@pytest.fixture
def stair_client(tmp_path, home, image_root):
    for module in ("torch", "transformers", "safetensors"):
        pytest.importorskip(module)
    from stair_es.stair.config import load_config
    from stair_es.stair.train import new_model

    model_dir = tmp_path / "stair-model"
    new_model(load_config("tiny"), "cpu", seed=0).save_pretrained(model_dir)  # untrained: mechanics only
    enc = get_encoder("stair", model=str(model_dir), device="cpu")
    backend = EmbeddedBackend(home)
    backend.create_index("scenes", IndexSchema(encoder=enc.config()))
    path = image_root / "red-car.png"
    vec = enc.encode_images([Image.open(path).convert("RGB")])[0]
    backend.ingest("scenes", [Document(id="red-car", vectors={"image": vec}, source=str(path))])
    backend.close()
    with TestClient(create_app(make_config(home, image_root, default_index="scenes"))) as c:
        yield c


@pytest.mark.slow  # imports torch and builds a (tiny, untrained) STAIR model: ~30 s on a busy machine
def test_heatmap_overlay_for_stair_indices(stair_client):
    r = stair_client.get("/v1/heatmap/scenes/red-car", params={"q": "red circle", "size": 128})
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    img = Image.open(io.BytesIO(r.content))
    assert max(img.size) == 128 or max(img.size) <= 128
    page = stair_client.get("/", params={"index": "scenes", "q": "red"}).text
    assert "class='heat'" in page and "/v1/heatmap/scenes/red-car?size=512&amp;q=red" in page
    r = stair_client.get("/v1/heatmap/scenes/red-car", params={"q": "a of the"})
    assert r.status_code == 400 and "no content tokens" in r.json()["error"]["message"]


def test_heatmap_refused_for_other_encoders(client):
    r = client.get("/v1/heatmap/pics/red-car", params={"q": "red"})
    assert r.status_code == 400 and "stair encoder" in r.json()["error"]["message"]
    assert "class='heat'" not in client.get("/", params={"q": "red"}).text
    assert client.get("/v1/heatmap/pics/red-car").status_code == 422  # q is required
