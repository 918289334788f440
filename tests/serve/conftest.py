"""Fixtures for `stair-es serve`: an image root with a few coloured pictures (and files outside
it that must stay unreachable), an embedded index of them, the app under TestClient, and a
real uvicorn server on 127.0.0.1 in a thread for the cluster and browser tests."""

from __future__ import annotations

import base64
import io
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install 'stair-es[serve]'")
pytest.importorskip("httpx", reason="FastAPI's TestClient needs httpx: pip install 'stair-es[serve-test]'")

from fastapi.testclient import TestClient  # noqa: E402

from fakes import ColorEncoder  # noqa: E402
from stair_es.backends.embedded import EmbeddedBackend  # noqa: E402
from stair_es.schema import Document, IndexSchema  # noqa: E402
from stair_es.serve.app import create_app  # noqa: E402
from stair_es.serve.service import ServeConfig  # noqa: E402

COLOURS = {
    "red-car": ((220, 30, 30), "a red car", {"kind": "vehicle", "year": 2001}),
    "green-tree": ((30, 200, 40), "a green tree", {"kind": "plant", "year": 2010}),
    "blue-sea": ((20, 40, 220), "the blue sea", {"kind": "landscape", "year": 2015}),
    "white-snow": ((245, 245, 245), "white snow", {"kind": "landscape", "year": 2020}),
    "night-sky": ((10, 10, 30), "a dark night sky", {"kind": "landscape", "year": 1999}),
}
API_KEY = "test-key-0123456789-abcdefghij"


def png_bytes(rgb, size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, "PNG")
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def image_root(tmp_path) -> Path:
    root = tmp_path / "images"
    (root / "sub").mkdir(parents=True)
    for name, (rgb, _, _) in COLOURS.items():
        (root / f"{name}.png").write_bytes(png_bytes(rgb))
    (root / "sub" / "red-again.png").write_bytes(png_bytes((200, 20, 20)))
    (root / "broken.png").write_bytes(png_bytes((1, 2, 3))[:40])  # truncated
    (root / "notes.txt").write_text("not an image")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.png").write_bytes(png_bytes((9, 9, 9)))
    os.symlink(outside / "secret.png", root / "escape.png")  # a symlink that leaves the root
    os.symlink(outside, root / "escape-dir")
    return root


@pytest.fixture
def home(tmp_path, image_root) -> Path:
    """An embedded index ``pics`` of the coloured pictures, encoded by the fake colour encoder."""
    home = tmp_path / "home"
    backend = EmbeddedBackend(home)
    backend.create_index("pics", IndexSchema(fields={"kind": "keyword", "year": "number"},
                                             encoder={"name": "fake-color"}))
    enc = ColorEncoder()
    docs = []
    for name, (rgb, caption, meta) in COLOURS.items():
        path = image_root / f"{name}.png"
        img = Image.open(path).convert("RGB")
        docs.append(Document(id=name, vectors={"image": enc.encode_images([img])[0],
                                               "caption": enc.encode_texts([caption])[0]},
                             metadata=meta, caption=caption, source=str(path)))
    docs.append(Document(id="no-picture", vectors={"image": enc.encode_texts(["red"])[0]}, caption="no file",
                         source=str(image_root.parent / "outside" / "secret.png")))
    report = backend.ingest("pics", docs)
    assert not report.failures
    backend.close()
    return home


def make_config(home, image_root, **kw) -> ServeConfig:
    base = dict(backend="embedded", backend_options={"home": str(home)}, encoder="fake-color",
                image_roots=[str(image_root)], default_index="pics",
                allowed_hosts=["testserver"])  # the Host TestClient sends
    base.update(kw)
    return ServeConfig(**base)


@pytest.fixture
def config(home, image_root) -> ServeConfig:
    return make_config(home, image_root)


@pytest.fixture
def client(config):
    with TestClient(create_app(config)) as c:
        yield c


class ThreadServer:
    """A real uvicorn server on 127.0.0.1 (random port) in a background thread."""

    def __init__(self, app, **config):
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on", **config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # a loaded 2-core machine may take seconds to start it
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)

    def close(self):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def live_server(config):
    srv = ThreadServer(create_app(config))
    yield srv
    srv.close()
