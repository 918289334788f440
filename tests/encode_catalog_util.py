"""A small real catalog for the encode-catalog tests: photos shipped in installed packages, a
few drawings made with Pillow, captions and metadata sidecars, and inputs that cannot be used."""

from __future__ import annotations

import json
import os
from pathlib import Path

from PIL import Image, ImageDraw


def photos() -> dict[str, Image.Image]:
    out: dict[str, Image.Image] = {}
    try:
        import skimage.data as skd

        for name in ("chelsea", "coffee", "astronaut", "rocket"):
            out[name] = Image.fromarray(getattr(skd, name)())
    except Exception:  # noqa: BLE001 - scikit-image missing: drawings only
        pass
    try:
        import matplotlib

        out["hopper"] = Image.open(os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")).convert("RGB")
    except Exception:  # noqa: BLE001
        pass
    return out


def drawing(i: int) -> Image.Image:
    colours = ["red", "blue", "green", "yellow", "purple", "orange"]
    im = Image.new("RGB", (160, 120), "white")
    d = ImageDraw.Draw(im)
    c = colours[i % len(colours)]
    if i % 2:
        d.ellipse((30, 20, 130, 100), fill=c, outline="black")
    else:
        d.rectangle((30, 20, 130, 100), fill=c, outline="black")
    return im


def make_catalog(root: Path, n_drawings: int = 6, bad: bool = False) -> Path:
    """A folder catalog; with ``bad``, also a text file named .jpg, an empty .png and a truncated JPEG."""
    root.mkdir(parents=True, exist_ok=True)
    for name, im in photos().items():
        im.thumbnail((320, 320))
        im.save(root / f"{name}.jpg", quality=90)
        (root / f"{name}.txt").write_text(f"a photo of {name}")
        (root / f"{name}.json").write_text(json.dumps({"kind": "photo", "n": len(name)}))
    for i in range(n_drawings):
        drawing(i).save(root / f"drawing-{i}.png")
        (root / f"drawing-{i}.txt").write_text(f"a drawing number {i}")
        (root / f"drawing-{i}.json").write_text(json.dumps({"kind": "drawing", "n": i}))
    if bad:
        (root / "notes.jpg").write_text("this is not a picture")
        (root / "empty.png").write_bytes(b"")
        jpg = root / "cut.jpg"
        drawing(3).save(jpg, quality=90)
        jpg.write_bytes(jpg.read_bytes()[:200])
    return root


def _fakes():
    import fakes  # tests/ is on sys.path here and in spawned workers (multiprocessing passes sys.path on)

    return fakes


def slow_color_encoder(delay: float = 0.05, **kw):
    """fakes.ColorEncoder taking ``delay`` seconds per image, so a run can be killed halfway."""
    import time

    enc = _fakes().ColorEncoder(**kw)
    encode = enc.encode_images

    def slow(images, **k):
        time.sleep(delay * len(images))
        return encode(images, **k)

    enc.encode_images = slow
    return enc


def color_encoder(**kw):
    return _fakes().ColorEncoder(**kw)


def other_color_encoder(**kw):
    """Another encoder config (as a different --encoder-option would give)."""
    enc = _fakes().ColorEncoder(**kw)
    enc.config = lambda: {"name": "fake-color", "variant": 2}
    return enc


#: the size of the picture that kills the worker encoding it (see :func:`dying_color_encoder`)
POISON_SIZE = (77, 33)


def add_poison(root: Path, name: str = "poison.png") -> Path:
    """A picture of :data:`POISON_SIZE` in the catalog: the worker that encodes it dies."""
    Image.new("RGB", POISON_SIZE, "grey").save(root / name)
    return root / name


def dying_color_encoder(attempts_file: str | None = None, **kw):
    """fakes.ColorEncoder whose process is SIGKILLed (as the kernel's out-of-memory killer would)
    when it meets a picture of :data:`POISON_SIZE`; each such death first appends a line to
    ``attempts_file``, so a test counts how often the shard was tried."""
    import signal

    enc = _fakes().ColorEncoder(**kw)
    encode = enc.encode_images

    def run(images, **k):
        for im in images:
            if im.size == POISON_SIZE:
                if attempts_file:
                    with open(attempts_file, "a", encoding="utf-8") as fh:
                        fh.write(f"{os.getpid()}\n")
                os.kill(os.getpid(), signal.SIGKILL)
        return encode(images, **k)

    enc.encode_images = run
    return enc


def broken_encoder(**kw):
    """An encoder factory that cannot load (as a missing model file would)."""
    raise FileNotFoundError("model.onnx: no such file (from the tests)")
