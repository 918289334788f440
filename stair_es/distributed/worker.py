"""One encode-catalog worker: what it is given (:class:`WorkerContext`, a :class:`ShardTask` at a
time) and what it runs (:class:`ShardEncoder`: the encoder loaded once per process, each shard
decoded, encoded and written with its failures file and manifest entry).

The engines that start workers and hand them shards (the local process pool, Ray actors) live
in :mod:`.pipeline`; this module must not know about them.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from ..catalog import CatalogEntry, CatalogItem
from ..errors import ModelError, StairError, optional_import
from ..schema import IndexSchema, ItemResult
from .cpu import CpuSplit, rusage, rusage_delta, thread_cpu, thread_cpu_delta
from .shards import (
    MANIFEST_DIR,
    ShardRows,
    open_fs,
    pyarrow_modules,
    remove_failures,
    write_failures,
    write_json_atomic,
    write_shard,
)

log = logging.getLogger(__name__)


class WorkerSetupError(ModelError):
    """A worker could not load the encoder (or loaded another one than the folder holds): every
    shard would fail the same way, so the run stops with this reason."""


@dataclass
class ShardTask:
    k: int
    items: list[CatalogItem]
    digest: str


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

        c0 = time.process_time()
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
        # The decoding threads live as long as the worker: each keeps its malloc arena, grown
        # once. (New threads per shard took arenas that had to grow again: in a Ray actor, whose
        # own threads hold other arenas, 200-450 page faults per image in every shard.)
        self._decoders = ThreadPoolExecutor(max_workers=max(1, ctx.decode_threads), thread_name_prefix="stair-es-decode")
        self.fs, self.folder = open_fs(ctx.out_dir)
        self.schema = IndexSchema()
        self._warm_up()
        # The model's objects live as long as the worker: out of the collector's way (fewer,
        # cheaper full collections while documents are built).
        gc.collect()
        gc.freeze()
        self.startup_cpu_s: float | None = time.process_time() - c0  # reported with the first shard

    def _warm_up(self) -> None:
        """Pay the once-per-process costs now, not in the first shard: models that load on first
        use (ONNX sessions, OCR, heads), Parquet's writer (its first table costs ~0.2 s of CPU).
        Measured before this: with 48 images per worker these made the CPU per image of 2 workers
        look 25 % higher than of one. A failure here is not an error: real inputs will show it."""
        pa, pq, _ = pyarrow_modules()
        pq.write_table(pa.table({"x": pa.array([[1]], pa.large_list(pa.int32()))}), pa.BufferOutputStream(),
                       compression="zstd")
        try:
            from PIL import Image

            modalities = getattr(self.encoder, "modalities", ())
            if "image" in modalities:
                # One image, not a batch: ONNX Runtime's arena and the heap still grow to a batch's
                # size in the first shard (~50k page faults, 0.1-0.2 s of CPU), but a blank batch
                # here cost 1.4 s more start-up CPU (it looks drawn: OCR runs on it) to save that.
                self.encoder.encode_images([Image.new("RGB", (256, 256), (118, 140, 165))])
            if "text" in modalities and self.ctx.encode_captions:
                self.encoder.encode_texts(["a photo"])
        except Exception as e:  # noqa: BLE001
            log.debug("warm-up of the encoder failed (the first shard will show why): %s", e)

    def __call__(self, task: ShardTask) -> dict[str, Any]:
        from ..ingest import IngestOptions, build_documents, safe_load
        from .sources import location_loader

        t0, c0, th0, ru0 = time.perf_counter(), time.process_time(), thread_cpu(), rusage()
        opts = IngestOptions(batch_size=self.ctx.batch_size, encode_captions=self.ctx.encode_captions)
        split = CpuSplit()
        load = split.timed_load(safe_load(location_loader(getattr(self.encoder, "image_min_side", None))))
        rows = ShardRows()
        problems: list[ItemResult] = [i for i in task.items if isinstance(i, ItemResult)]
        fields = self.schema.sparse_fields
        pool = self._decoders
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
            with split.timed("encode"):
                docs, failed = build_documents(batch, self.encoder, self.schema, opts, futures)
            problems += failed
            by_id = {e.id: e for e in batch}
            with split.timed("rows"):
                for d in docs:
                    rows.add(d, by_id[d.id].warning, fields)
        with split.timed("write"):
            size = write_shard(self.fs, self.folder, task.k, rows, self.config, fields)
            if problems:
                write_failures(self.fs, self.folder, task.k, problems)
            else:  # an earlier attempt of this shard that was given up on left one
                remove_failures(self.fs, self.folder, task.k)
        cpu = time.process_time() - c0
        entry = {"shard": task.k, "file": f"part-{task.k:05d}.parquet", "rows": len(rows.ids), "bytes": size,
                 "inputs": len(task.items), "failures": sum(1 for p in problems if not p.ok),
                 "skipped": sum(1 for p in problems if p.ok), "ids_digest": task.digest, "encoder": self.config,
                 "cpu_s": round(cpu, 4), "wall_s": round(time.perf_counter() - t0, 4), "cpu_split": split.result(cpu),
                 "thread_cpu": thread_cpu_delta(th0, thread_cpu(), total=cpu), "rusage": rusage_delta(ru0, rusage()),
                 "worker_startup_cpu_s": round(self.startup_cpu_s, 4) if self.startup_cpu_s is not None else None,
                 "host": socket.gethostname(), "pid": os.getpid(), "written_at": time.time()}
        self.startup_cpu_s = None
        # the manifest entry last: only now is the shard finished
        write_json_atomic(self.fs, f"{self.folder}/{MANIFEST_DIR}/part-{task.k:05d}.json", entry)
        entry["failed_items"] = [{"id": p.id, "origin": p.source, "reason": p.error} for p in problems if not p.ok]
        return entry


def _check_gpu_provider() -> None:
    ort = optional_import("onnxruntime", "--gpus-per-worker", "encoders", "onnxruntime-gpu")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise WorkerSetupError("--gpus-per-worker was given but ONNX Runtime has no CUDA provider here "
                               f"(available: {', '.join(ort.get_available_providers())}): install onnxruntime-gpu "
                               "on the workers, or leave out --gpus-per-worker")


def encoder_factory(name: str, **options: Any) -> Callable[[], Any]:
    """A picklable factory of encoder ``name`` for the workers. An encoder registered in this
    process only (``register_encoder`` with a class, not a ``"module:attr"`` string) travels as
    that class, so a worker process builds it without the registration."""
    from ..encoders import base

    target = base.registered_factory(name)
    if target is not None:
        return partial(target, **options)
    return partial(base.get_encoder, name, **options)


def failed_shard(task: ShardTask, reason: str) -> dict[str, Any]:
    """The result of a shard given up on: its inputs go to the shard's failures file with the reason
    (never dropped), it gets no manifest entry, so the next run encodes it again."""
    items = [{"id": i.id, "origin": i.source if isinstance(i, ItemResult) else i.origin,
              "reason": i.error if isinstance(i, ItemResult) else reason}
             for i in task.items if not (isinstance(i, ItemResult) and i.ok)]
    return {"shard": task.k, "error": reason, "failed_items": items, "task": task}
