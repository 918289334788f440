"""``encode-catalog``: a catalog cut into shards, each shard encoded by a worker into Parquet.

The driver reads SOURCE (paths, captions, metadata: never pixels), cuts it into shards of
``shard_size`` inputs in catalog order, skips shards whose manifest entry says they are done,
and hands the rest to an engine:

* ``local``: a process pool (``spawn``: a forked copy of a driver that already runs ONNX
  Runtime threads is not safe); no Ray import;
* ``ray``: Ray Data ``map_batches`` over an actor pool (``concurrency`` = workers, each actor
  asking for ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs), on a local Ray or an
  existing cluster (``address``).

Both run the same :class:`ShardEncoder` per worker: the encoder loads once per process, with
ONNX Runtime's threads sized to the worker's CPUs, and each shard is decoded and encoded by
the very functions ``stair-es ingest`` uses (:func:`stair_es.ingest.build_documents`), so
the weights are bit-for-bit those of ``ingest``. The worker writes the shard, its failures
file, then its manifest entry (see :mod:`.shards`): a SIGKILL of the driver or a worker at any
moment loses at most the shards in flight, which the next run encodes again under the same
names -- no id is written twice.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..catalog import CatalogEntry, CatalogItem
from ..errors import InvalidInputError, MissingDependencyError, ModelError, StairError
from ..schema import IndexSchema, ItemResult
from .shards import (FORMAT, HEADER, MANIFEST_DIR, ShardRows, ids_digest, list_shards, open_fs, read_json,
                     write_failures, write_json_atomic, write_shard)

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")


class WorkerSetupError(ModelError):
    """A worker could not load the encoder (or loaded another one than the folder holds): every
    shard would fail the same way, so the run stops with this reason."""


@dataclass
class EncodeCatalogOptions:
    engine: str = "local"
    workers: int = 1
    batch_size: int = 32
    shard_size: int = 1024
    address: str | None = None  # ray: an existing cluster ("auto", "ray://host:10001"); None: a local Ray
    cpus_per_worker: int | None = None  # default: this machine's cores / workers (local), 1 (ray)
    gpus_per_worker: float = 0.0
    encode_captions: bool = True
    progress: bool = False
    max_attempts: int = 2  # a shard whose worker dies this many times is reported, not retried forever
    decode_threads: int = 2


@dataclass
class ShardTask:
    k: int
    items: list[CatalogItem]
    digest: str


@dataclass
class EncodeCatalogReport:
    out_dir: str
    engine: str
    workers: int
    shards_total: int = 0
    shards_done_before: int = 0  # finished by an earlier run (resumed past)
    shards: list[dict[str, Any]] = field(default_factory=list)  # manifest entries written by this run
    failed_shards: list[dict[str, Any]] = field(default_factory=list)  # {"shard", "error"}
    wall_s: float = 0.0
    failures: list[dict[str, Any]] = field(default_factory=list)  # inputs not usable (this run's shards)

    def summary(self) -> dict[str, Any]:
        rows = sum(s["rows"] for s in self.shards)
        inputs = sum(s["inputs"] for s in self.shards)
        cpu = sum(s["cpu_s"] for s in self.shards)
        return {
            "out_dir": self.out_dir, "engine": self.engine, "workers": self.workers,
            "shards": self.shards_total, "written": len(self.shards), "resumed": self.shards_done_before,
            "failed_shards": len(self.failed_shards), "documents": rows, "inputs": inputs,
            "failed": sum(s["failures"] for s in self.shards), "skipped": sum(s["skipped"] for s in self.shards),
            "wall_s": round(self.wall_s, 3), "images_per_s": round(inputs / self.wall_s, 2) if self.wall_s > 0 else None,
            "worker_cpu_ms_per_image": round(1000.0 * cpu / inputs, 2) if inputs else None,
        }


# --- the worker ------------------------------------------------------------------------------------

@dataclass
class WorkerContext:
    """What every worker needs (pickled to processes and actors)."""

    encoder_factory: Callable[[], Any]
    out_dir: str
    batch_size: int
    encode_captions: bool
    threads: int | None
    expect_encoder: dict[str, Any] | None
    decode_threads: int = 2
    gpus: float = 0.0


class ShardEncoder:
    """One worker: loads the encoder once, then encodes shards (one per call) into the folder."""

    def __init__(self, ctx: WorkerContext):
        from ..ingest import encoder_signature

        if ctx.threads:  # ONNX Runtime sessions size their intra-op pools from this (encoders/runtime.py)
            os.environ["STAIR_ES_ORT_THREADS"] = str(ctx.threads)
            # and BLAS/OpenMP pools to the worker's CPUs too (Ray sets OMP_NUM_THREADS for its actors;
            # a pool process would otherwise start one BLAS thread per core of the machine in every worker)
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=ctx.threads)
        if ctx.gpus:
            _check_gpu_provider()
        try:
            self.encoder = ctx.encoder_factory()
            self.config = self.encoder.config()
        except StairError as e:
            raise WorkerSetupError(f"a worker could not load the encoder: {e}") from None
        except Exception as e:  # noqa: BLE001 - any loading failure stops the run with its reason
            raise WorkerSetupError(f"a worker could not load the encoder: {type(e).__name__}: {e}") from None
        if ctx.expect_encoder is not None and encoder_signature(ctx.expect_encoder) != encoder_signature(self.config):
            raise WorkerSetupError(
                f"{ctx.out_dir} holds shards of encoder {encoder_signature(ctx.expect_encoder)}, not "
                f"{encoder_signature(self.config)}: finish it with the same --encoder/--model/--encoder-option, "
                "or write to another OUT_DIR")
        self.ctx = ctx
        self.fs, self.folder = open_fs(ctx.out_dir)
        self.schema = IndexSchema()

    def __call__(self, task: ShardTask) -> dict[str, Any]:
        from concurrent.futures import ThreadPoolExecutor

        from ..ingest import IngestOptions, build_documents, safe_load
        from .sources import location_loader

        t0, c0 = time.perf_counter(), time.process_time()
        opts = IngestOptions(batch_size=self.ctx.batch_size, encode_captions=self.ctx.encode_captions)
        load = safe_load(location_loader(getattr(self.encoder, "image_min_side", None)))
        rows = ShardRows()
        problems: list[ItemResult] = [i for i in task.items if isinstance(i, ItemResult)]
        fields = self.schema.sparse_fields
        with ThreadPoolExecutor(max_workers=max(1, self.ctx.decode_threads)) as pool:
            def stage(batch: list[CatalogEntry]) -> tuple[list[CatalogEntry], dict]:
                return batch, {e.id: pool.submit(load, e.path) for e in batch
                               if e.path is not None and "image" not in (e.vectors or {})}

            # Batches cut from the shard's inputs as `ingest` cuts them from the catalog's (unusable
            # inputs included, then left out), so with a shard size that is a multiple of the batch
            # size every image is encoded in the very batch `ingest --batch-size B` would put it in:
            # some encoders' last bits depend on the batch (one image alone takes other kernels).
            # Batch i+1 is decoded while batch i is encoded, as `ingest` does.
            batches = [[e for e in task.items[i:i + opts.batch_size] if isinstance(e, CatalogEntry)]
                       for i in range(0, len(task.items), opts.batch_size)]
            batches = [b for b in batches if b]
            staged = stage(batches[0]) if batches else None
            for nxt in itertools.chain(batches[1:], [None]):
                batch, futures = staged
                staged = stage(nxt) if nxt is not None else None
                docs, failed = build_documents(batch, self.encoder, self.schema, opts, futures)
                problems += failed
                by_id = {e.id: e for e in batch}
                for d in docs:
                    rows.add(d, by_id[d.id].warning, fields)
        size = write_shard(self.fs, self.folder, task.k, rows, self.config, fields)
        if problems:
            write_failures(self.fs, self.folder, task.k, problems)
        entry = {
            "shard": task.k, "file": f"part-{task.k:05d}.parquet", "rows": len(rows.ids), "bytes": size,
            "inputs": len(task.items), "failures": sum(1 for p in problems if not p.ok),
            "skipped": sum(1 for p in problems if p.ok), "ids_digest": task.digest, "encoder": self.config,
            "cpu_s": round(time.process_time() - c0, 4), "wall_s": round(time.perf_counter() - t0, 4),
            "host": socket.gethostname(), "pid": os.getpid(), "written_at": time.time(),
        }
        # the manifest entry last: only now is the shard finished
        write_json_atomic(self.fs, f"{self.folder}/{MANIFEST_DIR}/part-{task.k:05d}.json", entry)
        entry["failed_items"] = [{"id": p.id, "origin": p.source, "reason": p.error} for p in problems if not p.ok]
        return entry


def _check_gpu_provider() -> None:
    try:
        import onnxruntime as ort
    except ImportError:
        raise MissingDependencyError("--gpus-per-worker", "encoders", "onnxruntime-gpu") from None
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise WorkerSetupError("--gpus-per-worker was given but ONNX Runtime has no CUDA provider here "
                               f"(available: {', '.join(ort.get_available_providers())}): install onnxruntime-gpu "
                               "on the workers, or leave out --gpus-per-worker")


_WORKER: ShardEncoder | None = None


def _local_worker(ctx: WorkerContext, task: ShardTask) -> dict[str, Any]:
    """The process-pool entry point: one :class:`ShardEncoder` per process, built on first use
    (an initializer's error would only surface as a broken pool, without its reason)."""
    global _WORKER
    if _WORKER is None:
        _WORKER = ShardEncoder(ctx)
    return _WORKER(task)


def encoder_factory(name: str, **options: Any) -> Callable[[], Any]:
    """A picklable factory of encoder ``name`` for the workers. An encoder registered in this
    process only (``register_encoder`` with a class, not a ``"module:attr"`` string) travels as
    that class, so a worker process builds it without the registration."""
    from functools import partial

    from ..encoders import base

    target = base._BUILTIN.get(name)
    if target is not None and not isinstance(target, str):
        return partial(target, **options)
    return partial(base.get_encoder, name, **options)


# --- the driver ------------------------------------------------------------------------------------

def _item_key(item: CatalogItem) -> str:
    return item.id if item.id is not None else f"@{item.source}"


def _cut(items: Iterable[CatalogItem], size: int) -> Iterator[ShardTask]:
    it = iter(items)
    for k in itertools.count():
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield ShardTask(k, chunk, ids_digest(_item_key(i) for i in chunk))


def encode_catalog(source: str, out_dir: str, encoder_factory: Callable[[], Any],
                   options: EncodeCatalogOptions | None = None,
                   on_shard: Callable[[dict[str, Any]], None] | None = None) -> EncodeCatalogReport:
    """Encode ``source`` into Parquet shards under ``out_dir`` (resuming what an earlier run finished).

    ``encoder_factory`` builds the encoder in each worker; it must pickle (e.g.
    ``functools.partial(get_encoder, "default")``). ``on_shard`` is called with each manifest
    entry as shards finish.
    """
    from .sources import read_source

    opts = options or EncodeCatalogOptions()
    if opts.engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {opts.engine!r}; choose one of: {', '.join(ENGINES)}")
    for name, v in (("--workers", opts.workers), ("--batch-size", opts.batch_size), ("--shard-size", opts.shard_size)):
        if v < 1:
            raise InvalidInputError(f"{name} must be at least 1, got {v}")
    if opts.gpus_per_worker < 0:
        raise InvalidInputError("--gpus-per-worker must be 0 or more")
    if opts.engine == "local" and opts.gpus_per_worker:
        raise InvalidInputError("--gpus-per-worker needs --engine ray (the local pool does not schedule GPUs; "
                                "with one GPU here, pass --encoder-option device=cuda instead)")
    t0 = time.perf_counter()
    fs, folder = open_fs(out_dir)
    fs.create_dir(f"{folder}/{MANIFEST_DIR}", recursive=True)
    header = read_json(fs, f"{folder}/{HEADER}")
    src = str(source)
    if header is not None:
        if header.get("format") != FORMAT:
            raise InvalidInputError(f"{out_dir} holds shards of format {header.get('format')!r}; use another OUT_DIR")
        if header.get("shard_size") != opts.shard_size:
            raise InvalidInputError(f"{out_dir} was cut into shards of {header.get('shard_size')} inputs: resume with "
                                    f"--shard-size {header.get('shard_size')}, or write to another OUT_DIR")
        if header.get("source") != _source_key(src):
            raise InvalidInputError(f"{out_dir} holds shards of {header.get('source')}, not {_source_key(src)}: "
                                    "write to another OUT_DIR")
    else:
        header = {"format": FORMAT, "source": _source_key(src), "shard_size": opts.shard_size, "encoder": None,
                  "created": time.time()}
        write_json_atomic(fs, f"{folder}/{HEADER}", header)

    _remove_leftovers(fs, folder)
    report = EncodeCatalogReport(out_dir, opts.engine, opts.workers)
    finished = {s.k: s for s in list_shards(fs, folder) if s.finished and s.problem() is None}
    for s in list_shards(fs, folder):
        if s.finished and s.problem() is not None:
            log.warning("%s", s.problem())
    if finished:
        # A catalog that changed since would shift inputs between shards: check every finished
        # shard still covers the same inputs before anything is written.
        for task in _cut(read_source(src), opts.shard_size):
            done = finished.get(task.k)
            if done is not None and done.entry.get("ids_digest") != task.digest:
                raise InvalidInputError(
                    f"the catalog changed since shard {task.k} was written (its inputs are no longer the same): "
                    f"shards of {out_dir} would overlap; write to another OUT_DIR")

    total_tasks = 0

    def pending() -> Iterator[ShardTask]:
        nonlocal total_tasks
        for task in _cut(read_source(src), opts.shard_size):
            total_tasks += 1
            if task.k in finished:
                report.shards_done_before += 1
                continue
            yield task

    from ..catalog import count_catalog
    from ..encoders.base import progress_bar

    total = count_catalog(src) if not src.lower().endswith((".parquet", ".pq", ".csv")) else None
    cpus = opts.cpus_per_worker or (max(1, (os.cpu_count() or 1) // opts.workers) if opts.engine == "local" else 1)
    ctx = WorkerContext(encoder_factory, out_dir, opts.batch_size, opts.encode_captions, cpus, header.get("encoder"),
                        opts.decode_threads, opts.gpus_per_worker)
    run = _run_local if opts.engine == "local" else _run_ray
    with progress_bar(total or 0, f"encode {src}", opts.progress, unit="img") as bar:
        for entry in run(pending(), ctx, opts, cpus):
            if "error" in entry:
                report.failed_shards.append(entry)
                continue
            if header.get("encoder") is None:
                header["encoder"] = entry["encoder"]
                write_json_atomic(fs, f"{folder}/{HEADER}", header)
                ctx.expect_encoder = entry["encoder"]
            report.failures += entry.get("failed_items", [])
            if on_shard is not None:
                on_shard(entry)
            entry.pop("failed_items", None)
            report.shards.append(entry)
            bar.update(entry["inputs"])
    report.shards_total = total_tasks
    report.wall_s = time.perf_counter() - t0
    return report


def _remove_leftovers(fs, folder: str) -> None:
    """Temporary files of writes a crash cut short (never read: only renamed files count).
    One run per OUT_DIR at a time: a second run at once would see the first's in-flight files."""
    from pyarrow import fs as pafs

    for sub in (folder, f"{folder}/{MANIFEST_DIR}"):
        for info in fs.get_file_info(pafs.FileSelector(sub, allow_not_found=True)):
            if info.is_file and ".tmp-" in info.base_name:
                try:
                    fs.delete_file(info.path)
                except OSError as e:  # noqa: PERF203 - a leftover that cannot go is harmless
                    log.warning("cannot remove %s: %s", info.path, e)


def _source_key(src: str) -> str:
    from .shards import is_remote

    return src if is_remote(src) else os.path.abspath(os.path.expanduser(src))


def _run_local(tasks: Iterator[ShardTask], ctx: WorkerContext, opts: EncodeCatalogOptions, cpus: int) -> Iterator[dict]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    mp = multiprocessing.get_context("spawn")
    retry: deque[ShardTask] = deque()
    attempts: dict[int, int] = {}
    inflight: dict[Any, ShardTask] = {}
    source_done = False
    pool = ProcessPoolExecutor(max_workers=opts.workers, mp_context=mp)
    try:
        while True:
            while len(inflight) < 2 * opts.workers:  # a bounded queue: a huge catalog is never all in memory
                task = retry.popleft() if retry else None
                if task is None and not source_done:
                    task = next(tasks, None)
                    source_done = task is None
                if task is None:
                    break
                inflight[pool.submit(_local_worker, ctx, task)] = task
            if not inflight:
                return
            done, _ = wait(list(inflight), return_when=FIRST_COMPLETED)
            broken = False
            for fut in done:
                task = inflight.pop(fut)
                try:
                    yield fut.result()
                except BrokenProcessPool:
                    broken = True
                    attempts[task.k] = attempts.get(task.k, 0) + 1
                    if attempts[task.k] >= opts.max_attempts:
                        yield {"shard": task.k, "error": f"a worker process died {attempts[task.k]} times while encoding "
                                                         "this shard; run encode-catalog again to retry it (a worker that "
                                                         "cannot start, e.g. from a script without an `if __name__ == "
                                                         "'__main__':` guard, looks the same: see the error above)"}
                    else:
                        retry.append(task)
                except WorkerSetupError:
                    raise
                except Exception as e:  # noqa: BLE001 - one shard's failure; the others go on
                    yield {"shard": task.k, "error": f"{type(e).__name__}: {e}"}
            if broken:
                # every task still in the pool is lost with it; the others come back untouched
                log.warning("a worker process died; restarting the pool (finished shards are kept)")
                retry.extend(inflight.values())
                inflight.clear()
                pool.shutdown(wait=False, cancel_futures=True)
                pool = ProcessPoolExecutor(max_workers=opts.workers, mp_context=mp)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _RayShardActor:
    """A Ray Data actor: a :class:`ShardEncoder` over batches of task rows."""

    def __init__(self, ctx: WorkerContext):
        self.worker = ShardEncoder(ctx)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import json
        import pickle

        out = []
        for k, blob in zip(batch["k"], batch["task"]):
            try:
                entry = self.worker(pickle.loads(blob))
            except Exception as e:  # noqa: BLE001 - one shard's failure; the others go on
                entry = {"shard": int(k), "error": f"{type(e).__name__}: {e}"}
            out.append(json.dumps(entry))
        return {"entry": out}


#: Ray reads this when it is imported: "0" makes a Ray started here use the loopback address as
#: its node address, so its servers listen on 127.0.0.1 only (by default a local Ray listens on
#: every interface of the machine). Set before the first ``import ray`` of a process.
RAY_LOOPBACK_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def local_ray_on_loopback() -> None:
    """Make a Ray that this process (or its children) starts listen on 127.0.0.1 only."""
    import sys

    if sys.modules.get("ray") is not None and os.environ.get(RAY_LOOPBACK_ENV[0]) != RAY_LOOPBACK_ENV[1]:
        log.warning("ray was imported before stair_es could keep a local Ray on 127.0.0.1; "
                    "set %s=%s before importing ray", *RAY_LOOPBACK_ENV)
    os.environ.setdefault(*RAY_LOOPBACK_ENV)


def ray_module(local: bool = False):
    if local:
        local_ray_on_loopback()
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        raise MissingDependencyError("--engine ray", "distributed", "ray[data]") from None
    return ray


def _run_ray(tasks: Iterator[ShardTask], ctx: WorkerContext, opts: EncodeCatalogOptions, cpus: int) -> Iterator[dict]:
    import json
    import pickle

    ray = ray_module(local=not opts.address and not _ray_initialized())
    if not ray.is_initialized():
        init: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False}
        if opts.address:
            init["address"] = opts.address
        try:
            ray.init(**init)
        except Exception as e:  # noqa: BLE001 - no cluster at that address, a bad address...
            raise InvalidInputError(f"cannot start or reach Ray{' at ' + opts.address if opts.address else ''}: {e}") from None
    if opts.gpus_per_worker:
        have = float(ray.cluster_resources().get("GPU", 0))
        if have < opts.gpus_per_worker:
            raise InvalidInputError(f"--gpus-per-worker {opts.gpus_per_worker:g}: the Ray cluster has {have:g} GPU(s); "
                                    "join a cluster with GPUs (--address) or leave out --gpus-per-worker")
    dctx = ray.data.DataContext.get_current()
    dctx.enable_progress_bars = False
    if hasattr(dctx, "print_on_execution_start"):
        dctx.print_on_execution_start = False
    # Tasks go to Ray in windows: a catalog of 100M inputs never sits in the driver at once, and
    # each window's actors load the model once for many shards.
    window = max(16, 8 * opts.workers)
    # Ray Data restarts a dead actor and retries its shard (its default for actor pools): a
    # SIGKILLed worker costs the shard it was writing, never the run.
    remote_args: dict[str, Any] = {"num_cpus": cpus}
    if opts.gpus_per_worker:
        remote_args["num_gpus"] = opts.gpus_per_worker
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    while True:
        chunk = list(itertools.islice(tasks, window))
        if not chunk:
            return
        rows = [{"k": t.k, "task": pickle.dumps(t)} for t in chunk]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds = ds.map_batches(_RayShardActor, fn_constructor_kwargs={"ctx": ctx}, batch_size=1, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=min(opts.workers, len(rows))), **remote_args)
        seen: set[int] = set()
        try:
            for row in ds.iter_rows():
                entry = json.loads(row["entry"])
                seen.add(int(entry["shard"]))
                yield entry
        except Exception as e:  # noqa: BLE001
            cause = _setup_cause(e)
            if cause is not None:
                raise WorkerSetupError(cause) from None
            raise
        for t in chunk:  # a shard Ray gave up on (its actor died too often) is reported, never silent
            if t.k not in seen:
                yield {"shard": t.k, "error": "Ray returned no result for this shard; run encode-catalog again to retry it"}


def _ray_initialized() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _setup_cause(e: BaseException) -> str | None:
    text = str(e)
    marker = "WorkerSetupError: "
    if marker in text:
        return text.split(marker, 1)[1].strip().splitlines()[0]
    return None
