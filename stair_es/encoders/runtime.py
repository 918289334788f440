"""ONNX Runtime inference for stair_es's neural towers, with PyTorch as the fallback.

Every shipped tower (the EfficientNet-Lite image classifier, SPLADE masked-LM text towers,
the STAIR image and text towers) is a PyTorch module. Eager PyTorch is slow on a CPU and
importing it costs seconds, so at first use each tower is exported once with
``torch.onnx.export``, checked against PyTorch on fixed inputs, cached, and from then on run
with ``onnxruntime`` -- which a query never needs torch for.

The cache
---------
``$STAIR_ES_MODEL_CACHE`` or ``<data home>/_models`` (data home: ``$STAIR_ES_HOME`` or
``~/.local/share/stair-es``; index names cannot start with ``_``). A cached tower is two
files, ``KIND-KEY.onnx`` and ``KIND-KEY.json``; ``KEY`` hashes the tower kind, the sha256 of
the weight files, the ONNX opset and :data:`EXPORT_VERSION` (bumped whenever the exported
graph changes), so new weights or a new stair_es give a new file, never a stale one. The JSON
records the sha256 of the ``.onnx`` file and the largest absolute difference from PyTorch
measured at export; a file whose sha256 does not match (damaged, half-written by another
tool) is exported again. Files are written to a temporary name and renamed, so concurrent
processes never read a partial model.

int8 towers
-----------
A spec with a :class:`Quantization` describes a static int8 version of the tower
(``onnxruntime.quantization.quantize_static``, per-channel weights, activation ranges
calibrated on fixed inputs the encoder supplies). It is made from the cached float tower
on first use and cached beside it as ``KIND-int8-KEY.onnx``; its key adds the quantisation
settings, the calibration set's name and :data:`QUANT_VERSION`. Its JSON records the
largest difference from the float tower on the calibration inputs. Unlike the float
runtime choice, int8 changes the vectors, so encoders record it in their config.

Choosing the runtime
--------------------
``runtime="auto"`` (default; or ``$STAIR_ES_RUNTIME``) uses ONNX Runtime when it is installed
and the export works, else PyTorch with one warning line in the log. ``"onnx"`` makes those
failures errors; ``"torch"`` never touches ONNX. Outputs agree within float error (the
tolerance checked at export), so the runtime is not part of an encoder's config: an index
built with one runtime is searched with the other.

ONNX Runtime uses the CUDA provider when ``onnxruntime-gpu`` offers it, else the CPU
provider. A tower uses as many cores as the machine has (``$STAIR_ES_ORT_THREADS``
overrides) in one of two ways, chosen by its spec: *intra-op* threads inside one call (text
towers: one short query should use every core), or *batch-parallel* (``TowerSpec.parallel``;
the image towers): one thread per call, and :meth:`OnnxTower.run_parallel` runs a batch as
per-core slices at the same time. For EfficientNet-Lite0 on 2 cores the second way costs 26
instead of 35 ms of CPU per image (no spinning or per-layer synchronisation of intra-op
threads), which leaves more CPU to the decoding that ingest overlaps with inference.

This module knows how to export, cache and run a module, and holds what encoders with an
image and a text tower share (:class:`TwoTowers`, :func:`in_batches`); it must not know what
any tower means (the encoders give it the module, the inputs and the names).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import warnings
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import EncoderVersionError, InvalidInputError, ModelError
from .base import progress_bar

log = logging.getLogger(__name__)

#: Bump when the graph an encoder exports changes (inputs, outputs, pooling inside the graph).
EXPORT_VERSION = 1
#: Bump when the way int8 towers are made changes (pre-processing, quantiser settings).
QUANT_VERSION = 1
OPSET = 17
RUNTIMES = ("auto", "onnx", "torch")

_WARNED: set[str] = set()
_LOCK = threading.Lock()
_SESSIONS: dict[tuple[str, bool], "OnnxTower"] = {}
_DIGESTS: dict[tuple[str, int, int], str] = {}


def runtime_choice(runtime: str | None) -> str:
    """Validate a ``runtime`` option; ``None`` reads ``$STAIR_ES_RUNTIME`` (default ``auto``)."""
    value = runtime if runtime is not None else os.environ.get("STAIR_ES_RUNTIME", "auto")
    value = (value or "auto").strip().lower()
    if value not in RUNTIMES:
        raise InvalidInputError(f"runtime must be one of {', '.join(RUNTIMES)}; got {value!r}")
    return value


def model_cache_dir() -> Path:
    env = os.environ.get("STAIR_ES_MODEL_CACHE")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("STAIR_ES_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".local" / "share" / "stair-es"
    return base / "_models"


def ort_threads() -> int:
    """How many cores ONNX Runtime may use: ``$STAIR_ES_ORT_THREADS`` or all of them."""
    env = os.environ.get("STAIR_ES_ORT_THREADS", "").strip()
    try:
        n = int(env) if env else 0
    except ValueError:
        raise InvalidInputError(f"STAIR_ES_ORT_THREADS must be a whole number of threads; got {env!r}") from None
    return n if n > 0 else (os.cpu_count() or 1)


def onnxruntime_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def warn_once(key: str, message: str) -> None:
    """One log line per process and cause (a fallback must be visible, not noisy)."""
    with _LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    log.warning(message)


class _QuantiserAdvice(logging.Filter):
    """Drops ONNX Runtime's quantiser advice, which it logs on the root logger at every call."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Please consider to run pre-processing before quantization")


@contextmanager
def quiet_model_libraries() -> Iterator[None]:
    """While a model is loaded, exported or quantised, keep the libraries' own output off the user's
    terminal (transformers' progress bars, the quantiser's advice): stair_es says what it does itself."""
    hf_logging = None
    if "transformers" in sys.modules:  # never imported just to be silenced
        with suppress(ImportError, AttributeError):
            from transformers.utils import logging as hf_logging
    bar_was_on = bool(hf_logging and hf_logging.is_progress_bar_enabled())
    if bar_was_on:
        hf_logging.disable_progress_bar()
    advice = _QuantiserAdvice()
    logging.getLogger().addFilter(advice)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(advice)
        if bar_was_on:
            hf_logging.enable_progress_bar()


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for one-line errors."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) within the process."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    cached = _DIGESTS.get(key)
    if cached:
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    _DIGESTS[key] = digest
    return digest


def weights_digest(paths: Sequence[Path]) -> str:
    """One sha256 over the contents of the given weight/config files (order-independent).

    Used as the *identity* of a model (cache keys, the weights recorded in an index), so each
    file's digest is remembered on disk per (path, inode, size, mtime): a cold query does not
    re-read tens of MB of weights. (The integrity of cached ONNX files is always checked in full.)
    """
    parts = sorted(f"{Path(p).name}:{_remembered_sha256(Path(p))}" for p in paths)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _remembered_sha256(path: Path) -> str:
    st = path.stat()
    key = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    book = model_cache_dir() / "weights-digests.json"
    try:
        known = json.loads(book.read_text("utf-8"))
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    digest = known.get(key)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    digest = file_sha256(path)
    known[key] = digest
    with suppress(OSError):  # best effort: a read-only cache folder only costs the hashing next time
        book.parent.mkdir(parents=True, exist_ok=True)
        tmp = book.with_name(f".{book.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=0, sort_keys=True), "utf-8")
        os.replace(tmp, book)
    return digest


@dataclass(frozen=True)
class Quantization:
    """How to make a static int8 version of a tower (see the module docstring).

    ``calibration`` yields batches of inputs (dicts keyed like the tower's inputs) drawn from
    a fixed, named set (``calibration_id``, part of the cache key): never evaluation data.
    ``fmt`` is ``"QOperator"`` (QLinearConv etc.) or ``"QDQ"``; ``method`` an
    ``onnxruntime.quantization.CalibrationMethod`` name.
    """

    calibration: Callable[[], Iterable[Mapping[str, np.ndarray]]]
    calibration_id: str
    fmt: str = "QOperator"
    per_channel: bool = True
    activation_type: str = "QUInt8"
    weight_type: str = "QInt8"
    method: str = "MinMax"

    def key(self) -> str:
        return ":".join(["int8", self.fmt, "pc" if self.per_channel else "pt", self.activation_type, self.weight_type,
                         self.method, self.calibration_id, f"quant{QUANT_VERSION}"])


@dataclass
class TowerSpec:
    """What an encoder hands over to export one tower.

    ``build`` returns the eval-mode torch module (only called when an export is needed);
    ``sample`` returns fixed example inputs (numpy, keyed by ``input_names``) used both to
    trace the graph and to compare ONNX Runtime with PyTorch; ``dynamic_axes`` as in
    ``torch.onnx.export``; ``tolerance`` is the largest absolute output difference accepted.
    """

    kind: str
    weight_files: Sequence[Path]
    build: Callable[[], Any]
    sample: Callable[[], dict[str, np.ndarray]]
    input_names: Sequence[str]
    output_names: Sequence[str]
    dynamic_axes: Mapping[str, Mapping[int, str]]
    tolerance: float = 1e-3
    extra_key: str = ""
    #: Run batches as concurrent one-thread slices (see the module docstring) instead of one
    #: call with intra-op threads. For towers whose every input has the batch on axis 0.
    parallel: bool = False
    #: Set for the int8 version of the tower (made from the float one), None for float.
    quantization: Quantization | None = None

    def cache_key(self) -> str:
        parts = [self.kind, weights_digest(self.weight_files), f"opset{OPSET}", f"export{EXPORT_VERSION}", self.extra_key]
        if self.quantization is not None:
            parts.append(self.quantization.key())
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]

    def file_name(self) -> str:
        return f"{self.kind}{'-int8' if self.quantization is not None else ''}-{self.cache_key()}.onnx"


class OnnxTower:
    """An ``onnxruntime.InferenceSession`` over one cached tower; ``run`` is thread-safe.

    ``parallel``: the session runs each call on one thread and :meth:`run_parallel` spreads
    a batch over :func:`ort_threads` concurrent calls; otherwise one call uses that many
    intra-op threads.
    """

    def __init__(self, path: Path, meta: dict[str, Any], *, parallel: bool = False):
        import onnxruntime as ort

        self.path = path
        self.meta = meta
        opts = ort.SessionOptions()
        self.threads = ort_threads()
        available = ort.get_available_providers()
        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        # On a GPU the batch goes in whole; slicing only pays on CPU cores.
        self.parallel = parallel and self.threads > 1 and providers[0] == "CPUExecutionProvider"
        opts.intra_op_num_threads = 1 if self.parallel else self.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types
            raise ModelError(f"ONNX Runtime cannot load {path}: {e}") from None
        self.providers = self.session.get_providers()
        self.input_names = [i.name for i in self.session.get_inputs()]
        self._pool: Any = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, dict(feeds))

    def run_parallel(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Like :meth:`run`, for inputs and outputs with the batch on axis 0: the batch is cut
        into one slice per core and the slices run concurrently (same result as one call)."""
        n = min(len(next(iter(feeds.values()))), self.threads) if feeds else 0
        if not self.parallel or n < 2:
            return self.run(feeds)
        bounds = np.linspace(0, len(next(iter(feeds.values()))), n + 1).astype(int)
        slices = [{k: v[a:b] for k, v in feeds.items()} for a, b in zip(bounds[:-1], bounds[1:])]
        with _LOCK:
            if self._pool is None:
                from concurrent.futures import ThreadPoolExecutor

                self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="stair-es-ort")
        parts = list(self._pool.map(self.run, slices))
        return [np.concatenate([p[i] for p in parts], axis=0) for i in range(len(parts[0]))]


def _sidecar(path: Path, key: str = "onnx_sha256") -> dict[str, Any] | None:
    """The ``.json`` sidecar of a cached tower (or other cached file: its digest is ``key``), not
    yet checked against the file, or None."""
    meta_path = path.with_suffix(".json")
    if not path.is_file() or not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get(key), str) else None


def has_sidecar(path: Path, key: str = "onnx_sha256") -> bool:
    """Whether a cached file and its sidecar are there (not checked against each other: loading does
    that), for a cheap "is it made?" before deciding to use it."""
    return _sidecar(path, key) is not None


def verified_sidecar(path: Path, key: str = "onnx_sha256", what: str = "ONNX model", redo: str = "exporting it again"
                     ) -> dict[str, Any] | None:
    """The sidecar of a cached file whose sha256 (``key``) matches it, or None (a mismatch is logged)."""
    meta = _sidecar(path, key)
    if meta is None:
        return None
    if meta[key] != file_sha256(path):
        log.warning("cached %s %s does not match its checksum; %s", what, path, redo)
        return None
    return meta


def load_tower(spec: TowerSpec, cache_dir: Path | None = None) -> OnnxTower:
    """The cached ONNX tower for ``spec``, exporting and verifying it first when needed.

    Raises :class:`ModelError` when the export or the check against PyTorch fails.
    """
    folder = cache_dir or model_cache_dir()
    path = folder / spec.file_name()
    with _LOCK:
        tower = _SESSIONS.get((str(path), spec.parallel))
    if tower is not None and path.is_file():
        return tower
    tower = _open_verified(path, spec.parallel)
    if tower is None:
        meta = quantize_tower(spec, path) if spec.quantization is not None else export_tower(spec, path)
        tower = OnnxTower(path, meta, parallel=spec.parallel)
    with _LOCK:
        _SESSIONS[(str(path), spec.parallel)] = tower
    return tower


def _open_verified(path: Path, parallel: bool) -> OnnxTower | None:
    """Open a cached tower while its sha256 is checked in another thread (hashlib and ONNX
    Runtime both release the GIL, so a cold query pays for the slower of the two, not both);
    None when there is no valid cached file (missing, or the checksum does not match)."""
    meta = _sidecar(path)
    if meta is None:
        return None
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stair-es-sha256") as pool:
        digest = pool.submit(file_sha256, path)
        failed: ModelError | None = None
        try:
            tower = OnnxTower(path, meta, parallel=parallel)
        except ModelError as e:
            tower, failed = None, e
        try:
            ok = digest.result() == meta["onnx_sha256"]
        except OSError:
            ok = False
    if not ok:
        log.warning("cached ONNX model %s does not match its checksum; exporting it again", path)
        return None
    if failed is not None:  # an intact file ONNX Runtime cannot load: exporting again would not help
        raise failed
    return tower


@contextmanager
def _staged(path: Path, failed: str) -> Iterator[Path]:
    """A temporary folder beside ``path`` to make it in, removed afterwards whatever happens; an
    error inside (other than a ModelError) becomes a ModelError saying ``failed``."""
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=path.parent))
    try:
        yield tmp_dir
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{failed} failed: {first_line(e)}") from None
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def publish(tmp: Path, meta: dict[str, Any], path: Path) -> None:
    """Rename a made file ``tmp`` to ``path``, with ``meta`` as its ``.json`` sidecar (written first)."""
    meta_tmp = tmp.with_suffix(".json")
    meta_tmp.write_text(json.dumps(meta, indent=2) + "\n", "utf-8")
    os.replace(tmp, path)
    os.replace(meta_tmp, path.with_suffix(".json"))


def export_tower(spec: TowerSpec, path: Path) -> dict[str, Any]:
    """Export ``spec`` to ``path`` (atomically), check it against PyTorch, write the sidecar."""
    try:
        import torch
    except ImportError:
        raise ModelError(f"exporting the {spec.kind} tower to ONNX needs PyTorch (pip install 'stair-es[encoders]')") from None
    try:
        import onnxruntime as ort
    except ImportError:
        raise ModelError("ONNX Runtime is not installed (pip install onnxruntime)") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelError(f"cannot create the model cache folder {path.parent}: {e.strerror or e}") from None
    started = time.perf_counter()
    module = spec.build()
    sample = spec.sample()
    args = tuple(torch.from_numpy(np.ascontiguousarray(sample[name])) for name in spec.input_names)
    with _staged(path, f"exporting the {spec.kind} tower to ONNX") as tmp_dir:
        tmp = tmp_dir / "model.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notices
            reference = module(*args)
            if isinstance(reference, torch.Tensor):
                reference = (reference,)
            reference = [r.detach().float().cpu().numpy() for r in reference]
            # The TorchScript-based exporter: works offline, no onnxscript needed, and handles
            # the dynamic batch / sequence axes these towers need.
            torch.onnx.export(module, args, str(tmp), input_names=list(spec.input_names),
                              output_names=list(spec.output_names),
                              dynamic_axes={k: dict(v) for k, v in spec.dynamic_axes.items()}, opset_version=OPSET,
                              do_constant_folding=True, dynamo=False)
        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        got = session.run(None, {name: sample[name] for name in spec.input_names})
        diff = max(float(np.max(np.abs(g.astype(np.float64) - r))) if r.size else 0.0 for g, r in zip(got, reference))
        if not np.isfinite(diff) or diff > spec.tolerance:
            raise ModelError(
                f"the ONNX export of {spec.kind} differs from PyTorch by {diff:.3g} (tolerance {spec.tolerance:g})")
        meta = {
            "kind": spec.kind,
            "onnx_sha256": file_sha256(tmp),
            "weights_sha256": weights_digest(spec.weight_files),
            "opset": OPSET,
            "export_version": EXPORT_VERSION,
            "max_abs_diff_vs_torch": diff,
            "tolerance": spec.tolerance,
            "torch": torch.__version__,
            "onnxruntime": ort.__version__,
            "export_seconds": round(time.perf_counter() - started, 3),
        }
        publish(tmp, meta, path)
    log.info("exported %s to %s (max |onnx - torch| = %.2g)", spec.kind, path, meta["max_abs_diff_vs_torch"])
    return meta


def quantize_tower(spec: TowerSpec, path: Path) -> dict[str, Any]:
    """Make the int8 tower of ``spec`` at ``path`` (atomically) from its float tower, exporting
    that first when needed; returns the sidecar written beside it."""
    quant = spec.quantization
    assert quant is not None
    float_spec = replace(spec, quantization=None)
    float_path = path.parent / float_spec.file_name()
    float_meta = verified_sidecar(float_path) or export_tower(float_spec, float_path)
    try:
        import onnxruntime as ort
        from onnxruntime import quantization as q
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError:
        raise ModelError("int8 towers need ONNX Runtime with its quantization tools (pip install onnxruntime onnx)") from None
    started = time.perf_counter()
    batches = [{k: np.ascontiguousarray(v) for k, v in b.items()} for b in quant.calibration()]
    if not batches:
        raise ModelError(f"no calibration inputs for the int8 {spec.kind} tower ({quant.calibration_id})")

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self._it = iter(batches)

        def get_next(self):
            return next(self._it, None)

    with _staged(path, f"making the int8 {spec.kind} tower") as tmp_dir:
        tmp, pre = tmp_dir / "model.onnx", tmp_dir / "pre.onnx"
        # The quantiser reports every bias it clips on the root logger (dozens of lines for a
        # conv net); that is expected for depthwise layers and measured below as a whole.
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            quant_pre_process(str(float_path), str(pre), skip_symbolic_shape=True)
            q.quantize_static(
                str(pre), str(tmp), Reader(), quant_format=getattr(q.QuantFormat, quant.fmt),
                per_channel=quant.per_channel, activation_type=getattr(q.QuantType, quant.activation_type),
                weight_type=getattr(q.QuantType, quant.weight_type), calibrate_method=getattr(q.CalibrationMethod, quant.method),
            )
        finally:
            logging.disable(previous)
        ref = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
        got = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        diff = 0.0
        for b in batches:
            for r, g in zip(ref.run(None, dict(b)), got.run(None, dict(b))):
                diff = max(diff, float(np.max(np.abs(g.astype(np.float64) - r))) if r.size else 0.0)
        meta = {
            "kind": f"{spec.kind}-int8",
            "onnx_sha256": file_sha256(tmp),
            "float_onnx_sha256": float_meta["onnx_sha256"],
            "weights_sha256": weights_digest(spec.weight_files),
            "quantization": quant.key(),
            "calibration_inputs": int(sum(len(next(iter(b.values()))) for b in batches)),
            "max_abs_diff_vs_float_on_calibration": diff,
            # what `stair-es encoders export` shows; the float tower is within its own
            # tolerance of PyTorch, so the int8 error dominates
            "max_abs_diff_vs_torch": diff + float(float_meta.get("max_abs_diff_vs_torch", 0.0)),
            "onnxruntime": ort.__version__,
            "quantize_seconds": round(time.perf_counter() - started, 3),
        }
        publish(tmp, meta, path)
    log.info("made int8 %s at %s (max |int8 - float| on calibration = %.3g)", spec.kind, path, diff)
    return meta


def in_batches(items: Sequence[Any], batch_size: int, what: str, progress: bool,
               encode: Callable[[Sequence[Any]], Iterable[Any]]) -> list[Any]:
    """``encode`` over ``items``, ``batch_size`` at a time, its results in one list; a progress bar
    ("encoding ``what``") when ``progress``."""
    out: list[Any] = []
    with progress_bar(len(items), f"encoding {what}", progress) as bar:
        for i in range(0, len(items), batch_size):
            chunk = items[i : i + batch_size]
            out.extend(encode(chunk))
            bar.update(len(chunk))
    return out


class TwoTowers:
    """What an encoder with an image and a text tower shares (``clip-vocab``, ``vdr``): it gives
    ``tower_specs()`` (``{"image": spec, "text": spec}``), a ``runtime``, a ``_towers`` dict, its
    ``model`` and what the index recorded of it (``_recorded_weights``, ``_recorded_record``,
    ``allow_version_mismatch``)."""

    def _check_recorded_weights(self, kind: str, weights: str, why: str) -> None:
        """Refuse a model whose weights are not those the index was built with (``--force`` allows it)."""
        if self._recorded_weights is not None and self._recorded_weights != weights and not self.allow_version_mismatch:
            was = (self._recorded_record or {}).get("id", "another model")
            raise EncoderVersionError(
                f"the index was built with the {kind} model {was!r} (weights {self._recorded_weights}), but "
                f"{self.model!r} has weights {weights}: {why}. Search with the model the index was built with, "
                "re-ingest into a new index, or pass --force to search it anyway")

    def onnx_spec(self):
        """The image tower's export spec (``stair-es encoders export``)."""
        return self.tower_specs()["image"]

    def _tower(self, which: str) -> Any:
        """The ONNX tower for ``which``, or False to run PyTorch."""
        return memo_tower(self._towers, which, lambda: self.tower_specs()[which], self.runtime)

    def _tower_files(self) -> list[Path]:
        """Both towers exported when needed: their cached ``.onnx`` files and sidecars."""
        paths: list[Path] = []
        for spec in self.tower_specs().values():
            path = load_tower(spec).path
            paths += [path, path.with_suffix(".json")]
        return paths


def memo_tower(towers: dict[str, Any], which: str, spec: Callable[[], TowerSpec], runtime: str) -> Any:
    """``towers[which]``, resolved once with :func:`resolve_tower` (``spec()`` builds its spec):
    the ONNX tower, or False to run PyTorch (encoders with several towers keep one dict)."""
    if which not in towers:
        tower = resolve_tower(spec(), runtime)
        towers[which] = tower if tower is not None else False
    return towers[which]


def resolve_tower(spec: TowerSpec, runtime: str) -> OnnxTower | None:
    """The ONNX tower to use under ``runtime``, or None to run PyTorch.

    ``auto`` falls back to PyTorch with one warning line when ONNX Runtime is missing or the
    export fails; ``onnx`` raises instead; ``torch`` returns None.
    """
    if runtime == "torch":
        return None
    if not onnxruntime_available():
        if runtime == "onnx":
            raise ModelError("runtime='onnx' needs ONNX Runtime: pip install onnxruntime")
        warn_once("no-ort", "onnxruntime is not installed: running the encoders in PyTorch (slower); "
                            "pip install onnxruntime to speed them up")
        return None
    try:
        return load_tower(spec)
    except ModelError as e:
        if runtime == "onnx":
            raise
        warn_once(f"export-{spec.kind}", f"{e}; running {spec.kind} in PyTorch instead")
        return None
