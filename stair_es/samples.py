"""The sample catalog: real photos that ship inside installed Python packages.

``write_sample_catalog(folder)`` writes the images plus a ``manifest.jsonl`` (id, path,
caption, metadata) so a fresh machine can run the whole stair_es pipeline with no
download. The photos come from scikit-image (``skimage.data``), scikit-learn
(``load_sample_images``) and matplotlib (``grace_hopper.jpg``): the ``samples`` extra.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .errors import MissingDependencyError


@dataclass(frozen=True)
class Sample:
    id: str
    caption: str
    metadata: dict[str, Any]
    loader: str  # "skimage:<name>", "sklearn:<index>", "matplotlib:grace_hopper.jpg"


def _m(source: str, kind: str, color: bool, year: int | None, added: str, **extra: Any) -> dict[str, Any]:
    dated = {"year": year} if year is not None else {}
    return {"source": source, "kind": kind, "color": color, "added": added, **dated, **extra}


SAMPLES: tuple[Sample, ...] = (
    Sample("chelsea", "a tabby cat named Chelsea looking at the camera", _m("scikit-image", "photo", True, 2000, "2024-01-05", tags=["animal", "pet"]), "skimage:chelsea"),
    Sample("coffee", "a cup of coffee on a saucer with a spoon", _m("scikit-image", "photo", True, 2012, "2024-01-05", tags=["food", "drink"]), "skimage:coffee"),
    Sample("astronaut", "astronaut Eileen Collins in her orange space suit with the flag", _m("scikit-image", "photo", True, 1998, "2024-01-06", tags=["person", "space"]), "skimage:astronaut"),
    Sample("rocket", "a rocket on the launch pad before lift-off", _m("scikit-image", "photo", True, 2014, "2024-01-06", tags=["space", "vehicle"]), "skimage:rocket"),
    Sample("hubble", "the Hubble deep field: thousands of distant galaxies", _m("scikit-image", "scientific", True, 1995, "2024-01-07", tags=["space"]), "skimage:hubble_deep_field"),
    Sample("moon", "the surface of the moon with craters", _m("scikit-image", "scientific", False, None, "2024-01-07", tags=["space"]), "skimage:moon"),
    Sample("camera", "a man with a camera on a tripod in a park", _m("scikit-image", "photo", False, 1978, "2024-01-08", tags=["person"]), "skimage:camera"),
    Sample("coins", "old greek coins on a dark background", _m("scikit-image", "photo", False, None, "2024-01-08", tags=["object"]), "skimage:coins"),
    Sample("clock", "a wall clock photographed at an angle", _m("scikit-image", "photo", False, None, "2024-01-09", tags=["object"]), "skimage:clock"),
    Sample("page", "a scanned page of printed text", _m("scikit-image", "document", False, None, "2024-01-09", tags=["text"]), "skimage:page"),
    Sample("retina", "a fundus photograph of a human retina", _m("scikit-image", "scientific", True, None, "2024-01-10", tags=["medical"]), "skimage:retina"),
    Sample("cells", "cells under a microscope, stained tissue", _m("scikit-image", "scientific", True, None, "2024-01-10", tags=["medical"]), "skimage:immunohistochemistry"),
    Sample("brick", "a brick wall texture", _m("scikit-image", "texture", False, None, "2024-01-11", tags=["texture"]), "skimage:brick"),
    Sample("grass", "a patch of grass", _m("scikit-image", "texture", False, None, "2024-01-11", tags=["texture", "nature"]), "skimage:grass"),
    Sample("gravel", "gravel stones on the ground", _m("scikit-image", "texture", False, None, "2024-01-11", tags=["texture", "nature"]), "skimage:gravel"),
    Sample("china", "a chinese temple with a pagoda roof among trees", _m("scikit-learn", "photo", True, None, "2024-01-12", tags=["building"]), "sklearn:0"),
    Sample("flower", "a close-up of a pink flower", _m("scikit-learn", "photo", True, None, "2024-01-12", tags=["nature"]), "sklearn:1"),
    Sample("grace-hopper", "a portrait of Rear Admiral Grace Hopper in navy uniform", _m("matplotlib", "photo", True, 1984, "2024-01-13", tags=["person"]), "matplotlib:grace_hopper.jpg"),
)


def _load(loader: str):
    """Return a PIL image for a sample; raises MissingDependencyError naming the extra."""
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image

    kind, _, name = loader.partition(":")
    try:
        if kind == "skimage":
            # lazy: image libraries load only when images are read or drawn
            import numpy as np
            import skimage.data

            arr = getattr(skimage.data, name)()
            if arr.dtype == bool:
                arr = arr.astype(np.uint8) * 255
            return Image.fromarray(arr)
        if kind == "sklearn":
            # lazy: image libraries load only when images are read or drawn
            from sklearn.datasets import load_sample_images

            return Image.fromarray(load_sample_images().images[int(name)])
        if kind == "matplotlib":
            # lazy: image libraries load only when images are read or drawn
            import matplotlib

            return Image.open(os.path.join(matplotlib.get_data_path(), "sample_data", name))
    except ImportError as e:
        raise MissingDependencyError("the sample catalog", "samples", "scikit-image scikit-learn matplotlib") from e
    raise ValueError(f"unknown sample loader {loader!r}")


def write_sample_catalog(folder: str | Path, *, on_error: Callable[[Sample, Exception], None] | None = None) -> Path:
    """Write the sample photos (JPEG) and ``manifest.jsonl`` into ``folder``; returns the manifest path.

    Samples whose package is missing are passed to ``on_error`` (or raise when it is None).
    """
    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for s in SAMPLES:
        rel = f"images/{s.id}.jpg"
        target = folder / rel
        if not target.exists():
            try:
                img = _load(s.loader)
            except Exception as e:  # noqa: BLE001 - reported per sample
                if on_error is None:
                    raise
                on_error(s, e)
                continue
            img.convert("RGB").save(target, quality=92)
        lines.append(json.dumps({"id": s.id, "path": rel, "caption": s.caption, "metadata": s.metadata}))
    manifest = folder / "manifest.jsonl"
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest
