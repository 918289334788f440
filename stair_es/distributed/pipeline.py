"""``encode-catalog``: a catalog cut into shards, each shard encoded by a worker into Parquet.

The driver reads SOURCE (paths, captions, metadata: never pixels), cuts it into shards of
``shard_size`` inputs in catalog order, skips shards whose manifest entry says they are done,
and hands the rest to an engine:

* ``local``: a process pool (``spawn``: a forked copy of a driver that already runs ONNX
  Runtime threads is not safe); no Ray import;
* ``ray``: ``workers`` long-lived Ray actors for the whole run (each asking for
  ``cpus_per_worker`` CPUs and ``gpus_per_worker`` GPUs), fed one shard description at a time,
  on a local Ray or an existing cluster (``address``). Not Ray Data: its ``map_batches`` made a
  new actor pool per window of shards (the models loaded again each time), left workers idle
  ~170 ms between shards and ran helper actors that cost ~14 CPU ms per image on 2 cores
  (measured with ``benchmarks/encode_catalog_bench.py``; see docs/distributed.md).

Both run the same :class:`ShardEncoder` per worker: the encoder loads once per process, with
ONNX Runtime's threads sized to the worker's CPUs, and each shard is decoded and encoded by
the very functions ``stair-es ingest`` uses (:func:`stair_es.ingest.build_documents`), so
the weights are bit-for-bit those of ``ingest``. The worker writes the shard, its failures
file, then its manifest entry (see :mod:`.shards`): a SIGKILL of the driver or a worker at any
moment loses at most the shards in flight, which the next run encodes again under the same
names -- no id is written twice.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from ..catalog import CatalogItem, count_catalog
from ..errors import InvalidInputError, optional_import
from ..schema import ItemResult
from .shards import (
    FORMAT,
    HEADER,
    MANIFEST_DIR,
    ids_digest,
    is_remote,
    list_shards,
    open_fs,
    read_json,
    write_failures,
    write_json_atomic,
)
from .worker import (  # noqa: F401 - public here too
    ShardEncoder,
    ShardTask,
    WorkerContext,
    WorkerSetupError,
    encoder_factory,
    failed_shard,
)

log = logging.getLogger(__name__)

ENGINES = ("local", "ray")
STALL_WARNING_S = 60
MAX_PROBE_FAILURES = 20  # a Ray actor that fails this many "are you up?" calls in a row is given up on


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
    max_retries: int = 2  # a shard whose worker dies is tried again this many times, then reported as failed
    decode_threads: int = 2
    pin_workers: bool = False  # local: worker i runs on core i only (when there are at least as many cores)


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
    driver_cpu_s: float = 0.0  # CPU of the driver process over the run (all its threads; not the workers)
    reader_cpu_s: float = 0.0  # of which reading SOURCE and cutting it into shards

    def summary(self) -> dict[str, Any]:
        rows = sum(s["rows"] for s in self.shards)
        inputs = sum(s["inputs"] for s in self.shards)
        cpu = sum(s["cpu_s"] for s in self.shards)
        return {
            "out_dir": self.out_dir, "engine": self.engine, "workers": self.workers,
            "shards": self.shards_total, "written": len(self.shards), "resumed": self.shards_done_before,
            "failed_shards": len(self.failed_shards), "documents": rows, "inputs": inputs,
            "failed": sum(s["failures"] for s in self.shards) + sum(s.get("failed_inputs", 0) for s in self.failed_shards),
            "skipped": sum(s["skipped"] for s in self.shards),
            "wall_s": round(self.wall_s, 3), "images_per_s": round(inputs / self.wall_s, 2) if self.wall_s > 0 else None,
            "worker_cpu_ms_per_image": round(1000.0 * cpu / inputs, 2) if inputs else None,
            "driver_cpu_s": round(self.driver_cpu_s, 3), "reader_cpu_s": round(self.reader_cpu_s, 3),
            "worker_startup_cpu_s": round(sum(s.get("worker_startup_cpu_s") or 0.0 for s in self.shards), 3),
        }


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
    entry as shards finish, and with ``{"shard", "error", "failed_items"}`` for a shard given up
    on (its worker died ``1 + max_retries`` times, or it could not be written).
    """
    from .sources import read_source

    opts = options or EncodeCatalogOptions()
    if opts.engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {opts.engine!r}; choose one of: {', '.join(ENGINES)}")
    for name, v in (("--workers", opts.workers), ("--batch-size", opts.batch_size), ("--shard-size", opts.shard_size)):
        if v < 1:
            raise InvalidInputError(f"{name} must be at least 1, got {v}")
    if opts.max_retries < 0:
        raise InvalidInputError(f"--max-retries must be 0 or more, got {opts.max_retries}")
    if opts.pin_workers and opts.engine != "local":
        raise InvalidInputError("--pin-workers is for --engine local (Ray places its actors itself)")
    if opts.gpus_per_worker < 0:
        raise InvalidInputError("--gpus-per-worker must be 0 or more")
    if opts.engine == "local" and opts.gpus_per_worker:
        raise InvalidInputError("--gpus-per-worker needs --engine ray (the local pool does not schedule GPUs; "
                                "with one GPU here, pass --encoder-option device=cuda instead)")
    t0, c0 = time.perf_counter(), time.process_time()
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
        tasks = _cut(read_source(src), opts.shard_size)
        while True:
            c = time.thread_time()
            task = next(tasks, None)
            report.reader_cpu_s += time.thread_time() - c
            if task is None:
                return
            total_tasks += 1
            if task.k in finished:
                report.shards_done_before += 1
                continue
            yield task

    from ..encoders.base import progress_bar
    from .sources import JSONL_SUFFIXES, LIST_SUFFIXES, jsonl_has_urls

    lists = not is_remote(src) and src.lower().endswith(JSONL_SUFFIXES) and jsonl_has_urls(src)
    total = None if is_remote(src) or src.lower().endswith(LIST_SUFFIXES) or lists else count_catalog(src)
    cpus = opts.cpus_per_worker or (max(1, (os.cpu_count() or 1) // opts.workers) if opts.engine == "local" else 1)
    ctx = WorkerContext(encoder_factory, out_dir, opts.batch_size, opts.encode_captions, cpus, header.get("encoder"),
                        opts.decode_threads, opts.gpus_per_worker)
    run = _run_local if opts.engine == "local" else _run_ray
    with progress_bar(total or 0, f"encode {src}", opts.progress, unit="img") as bar:
        for entry in run(pending(), ctx, opts, cpus):
            failed, task = "error" in entry, entry.pop("task", None)
            if failed:
                if task is not None:
                    _write_failed_shard(fs, folder, task, entry["error"])
                entry["failed_inputs"] = len(entry.get("failed_items", []))
            elif header.get("encoder") is None:
                header["encoder"] = entry["encoder"]
                write_json_atomic(fs, f"{folder}/{HEADER}", header)
                ctx.expect_encoder = entry["encoder"]
            report.failures += entry.get("failed_items", [])
            if on_shard is not None:
                on_shard(entry)
            entry.pop("failed_items", None)
            (report.failed_shards if failed else report.shards).append(entry)
            bar.update(entry["inputs"] if not failed else len(task.items) if task is not None else 0)
    report.shards_total = total_tasks
    report.wall_s = time.perf_counter() - t0
    report.driver_cpu_s = time.process_time() - c0
    return report


def _write_failed_shard(fs, folder: str, task: ShardTask, reason: str) -> None:
    """The failures file of a shard given up on: every input of it, with the reason."""
    rows = [i if isinstance(i, ItemResult) else ItemResult(i.id, False, reason, i.origin) for i in task.items]
    try:
        write_failures(fs, folder, task.k, rows)
    except Exception as e:  # noqa: BLE001 - the run's report still has every input of the shard
        log.warning("cannot write the failures file of shard %d: %s", task.k, e)


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
    return src if is_remote(src) else os.path.abspath(os.path.expanduser(src))


def _local_worker_main(ctx: WorkerContext, conn, core: int | None) -> None:
    """A worker process of the local engine: shards in through ``conn``, manifest entries out.
    One :class:`ShardEncoder`, built on the first shard (an error there reaches the driver with
    its reason). The process ends when the driver closes the pipe or dies."""
    if core is not None:
        with contextlib.suppress(AttributeError, OSError):  # not Linux, or the core went away: run unpinned
            os.sched_setaffinity(0, {core})
    parent = os.getppid()

    def orphaned() -> None:  # a SIGKILLed driver must not leave workers writing into OUT_DIR
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=orphaned, daemon=True, name="stair-es-orphan-check").start()
    conn.send(("ready", os.getpid()))  # the process started: a death from now on is a shard's
    worker = RayShardWorker(ctx)  # a Ray actor's code, run in this process: the same answers
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        conn.send(worker.run(task))


class _Slot:
    """One worker process of the local engine and the shard it is encoding."""

    def __init__(self, mp, ctx: WorkerContext, core: int | None):
        self.core = core
        self.conn, child = mp.Pipe()
        # not a daemon: an encoder may start processes of its own; the driver stops its workers
        # when it ends, and a worker whose driver is killed exits by itself
        self.proc = mp.Process(target=_local_worker_main, args=(ctx, child, core), name="stair-es-encode-worker")
        self.proc.start()
        child.close()
        self.task: ShardTask | None = None
        self.ready = False  # the process got as far as running the worker's code

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def worker_cores(workers: int) -> list[int | None]:
    """The core each local worker is pinned to: worker i on the i-th core this process may use,
    when there are at least as many cores as workers (else no pinning)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return [None] * workers
    return cores[:workers] if workers <= len(cores) else [None] * workers


def _next_shard(retry: deque[ShardTask], tasks: Iterator[ShardTask], source_done: bool) -> tuple[ShardTask | None, bool]:
    """The next shard to hand out -- one to try again first, else the source's next -- and whether
    the source is used up (None: nothing to hand out now)."""
    if retry:
        return retry.popleft(), source_done
    if source_done:
        return None, True
    task = next(tasks, None)
    return task, task is None


def _lost(task: ShardTask, attempts: dict[int, int], retry: deque[ShardTask], max_retries: int, who: str,
          how: str = "") -> Iterator[dict]:
    """``who`` died holding ``task``: the shard goes back in ``retry``, or, once it has been tried
    ``1 + max_retries`` times, is given up on (``how`` the worker died, if known)."""
    n = attempts[task.k] = attempts.get(task.k, 0) + 1
    log.warning("%s died while encoding shard %d (attempt %d of %d)", who, task.k, n, 1 + max_retries)
    if n <= max_retries:
        retry.append(task)
        return
    yield failed_shard(task, f"the {who.removeprefix('a ')} encoding shard {task.k} died {n} time(s) ({how}killed, "
                             "out of memory, or a crash in native code); run encode-catalog again to retry this shard")


def _shard_answer(ctx: WorkerContext, task: ShardTask, kind: str, payload: Any) -> dict:
    """A worker's answer for ``task`` as the run reports it; a worker that cannot load the encoder stops the run."""
    if kind == "setup":
        raise WorkerSetupError(payload)
    if kind == "error":
        return failed_shard(task, f"shard {task.k} could not be written: {payload}")
    if ctx.expect_encoder is None:
        ctx.expect_encoder = payload.get("encoder")  # workers started (or restarted) later check it
    return payload


def _run_local(tasks: Iterator[ShardTask], ctx: WorkerContext, opts: EncodeCatalogOptions, cpus: int) -> Iterator[dict]:
    """The process pool: one pipe per worker process, so the driver knows which shard each one
    holds. A worker that dies costs only its own shard, which goes back in the queue until it
    has been tried ``1 + max_retries`` times; then it is reported as failed (its inputs too) and
    the run goes on. The dead worker alone is replaced (the others keep their loaded models)."""
    import multiprocessing
    from multiprocessing.connection import wait

    mp = multiprocessing.get_context("spawn")
    cores = worker_cores(opts.workers) if opts.pin_workers else [None] * opts.workers
    retry: deque[ShardTask] = deque()
    attempts: dict[int, int] = {}
    source_done = False
    slots = [_Slot(mp, ctx, cores[i]) for i in range(opts.workers)]
    try:
        while True:
            for i, slot in enumerate(slots):  # every idle worker gets the next shard
                if slot.task is not None:
                    continue
                task, source_done = _next_shard(retry, tasks, source_done)
                if task is None:
                    break
                try:
                    slot.conn.send(task)
                    slot.task = task
                except (OSError, ValueError):  # the process died while idle: a new one takes the shard
                    retry.appendleft(task)
                    slot.stop()
                    slots[i] = _Slot(mp, ctx, slot.core)
            busy = [s for s in slots if s.task is not None]
            if not busy:
                return
            ready = wait([s.conn for s in busy] + [s.proc.sentinel for s in busy])
            for i, slot in enumerate(slots):
                if slot.task is None or not (slot.conn in ready or slot.proc.sentinel in ready):
                    continue
                task, msg = slot.task, None
                try:
                    if slot.conn.poll():
                        msg = slot.conn.recv()
                except (EOFError, OSError):
                    msg = None
                if msg is None:  # the process is gone without an answer: this shard's attempt is lost
                    slot.proc.join(timeout=5)
                    code = slot.proc.exitcode
                    if not slot.ready and code is not None and code > 0:
                        raise WorkerSetupError(
                            f"a worker process could not start (exit status {code}; its error is above). From a script, "
                            "call encode_catalog under `if __name__ == '__main__':` (workers are spawned and import "
                            "the main module), and keep the encoder factory importable (a module-level function or "
                            "functools.partial)")
                    how = (f"killed by signal {-code}" if code is not None and code < 0
                           else f"exit status {code}" if code is not None else "it stopped answering")
                    yield from _lost(task, attempts, retry, opts.max_retries, "a worker process", f"{how}: ")
                    slot.task = None
                    slot.stop()
                    slots[i] = _Slot(mp, ctx, slot.core)
                    continue
                if msg[0] == "ready":
                    slot.ready = True
                    continue  # the shard's answer comes next
                slot.task = None
                yield _shard_answer(ctx, task, *msg)
    finally:
        for slot in slots:
            slot.stop()


#: Ray reads this when it is imported: "0" makes a Ray started here use the loopback address as
#: its node address, so its servers listen on 127.0.0.1 only (by default a local Ray listens on
#: every interface of the machine). Set before the first ``import ray`` of a process.
RAY_LOOPBACK_ENV = ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def local_ray_on_loopback() -> None:
    """Make a Ray that this process (or its children) starts listen on 127.0.0.1 only."""
    if sys.modules.get("ray") is not None and os.environ.get(RAY_LOOPBACK_ENV[0]) != RAY_LOOPBACK_ENV[1]:
        log.warning("ray was imported before stair_es could keep a local Ray on 127.0.0.1; "
                    "set %s=%s before importing ray", *RAY_LOOPBACK_ENV)
    os.environ.setdefault(*RAY_LOOPBACK_ENV)


def ray_module(local: bool = False):
    if local:
        local_ray_on_loopback()
    return optional_import("ray", "--engine ray", "distributed", "ray")


class RayShardWorker:
    """A Ray actor: one :class:`ShardEncoder`, built on its first shard (so a loading error comes
    back as the answer of that call, with its reason), then one shard per call."""

    def __init__(self, ctx: WorkerContext):
        self.ctx = ctx
        self.worker: ShardEncoder | None = None

    def ready(self) -> int:
        return os.getpid()

    def run(self, task: ShardTask) -> tuple[str, Any]:
        try:
            if self.worker is None:
                self.worker = ShardEncoder(self.ctx)
            return "ok", self.worker(task)
        except WorkerSetupError as e:
            return "setup", str(e)
        except Exception as e:  # noqa: BLE001 - one shard's failure; the actor goes on with the next
            return "error", f"{type(e).__name__}: {e}"


def ray_actor_options(opts: EncodeCatalogOptions, cpus: int) -> dict[str, Any]:
    """Resources and fault handling of each actor: ``cpus`` CPUs (and ``--gpus-per-worker`` GPUs);
    an actor that dies is restarted by Ray (``max_restarts=-1``: it loads the model again), but
    the call it was running is not retried by Ray (``max_task_retries=0``): the driver retries that
    shard itself, so it can count the attempts and charge a death to that shard alone."""
    out: dict[str, Any] = {"num_cpus": cpus, "max_restarts": -1, "max_task_retries": 0, "max_concurrency": 1}
    if opts.gpus_per_worker:
        out["num_gpus"] = opts.gpus_per_worker
    return out


def start_ray(address: str | None = None, **init: Any):
    """``ray.init`` as encode-catalog wants it (unless this process already joined a Ray): on
    ``address``, or a local Ray on 127.0.0.1 without the dashboard, without workers' logs sent
    to the driver, and with Ray's own logging at warnings."""
    ray = ray_module(local=not address and not _ray_initialized())
    if not ray.is_initialized():
        args: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
                                **init}
        if address:
            args["address"] = address
        else:
            # Ray starts its worker processes at nice 15 by default; a local Ray's actors then lose
            # the CPU to any other job of the machine (measured here: the same CPU per image, shards
            # taking 1.7x the wall time of the process pool's, whose workers run at this process's
            # niceness). Ray adds worker_niceness to the raylet's, which is this process's: with 0
            # the actors of a Ray started here run at this process's niceness too.
            args["_system_config"] = {"worker_niceness": 0, **args.get("_system_config", {})}
        try:
            ray.init(**args)
        except Exception as e:  # noqa: BLE001 - no cluster at that address, a bad address...
            raise InvalidInputError(f"cannot start or reach Ray{' at ' + address if address else ''}: {e}") from None
    return ray


def _run_ray(tasks: Iterator[ShardTask], ctx: WorkerContext, opts: EncodeCatalogOptions, cpus: int) -> Iterator[dict]:
    """Ray: ``workers`` long-lived actors for the whole run, each loading the encoder once, each
    given the next shard (a small description: ids, paths, captions) the moment it answers the
    last; the actor reads and decodes the images, encodes them and writes the shard itself, and
    answers with the manifest entry. The catalog is read lazily, one shard ahead per actor.
    Only actors that have started get shards (on a cluster short of CPUs the others wait, idle).
    An actor that dies (SIGKILL, out of memory) costs only the shard it held: Ray restarts it and
    that shard goes back in the queue until it has been tried ``1 + max_retries`` times."""
    ray = start_ray(opts.address)
    if opts.gpus_per_worker:
        have = float(ray.cluster_resources().get("GPU", 0))
        if have < opts.gpus_per_worker:
            raise InvalidInputError(f"--gpus-per-worker {opts.gpus_per_worker:g}: the Ray cluster has {have:g} GPU(s); "
                                    "join a cluster with GPUs (--address) or leave out --gpus-per-worker")
    from ray.exceptions import RayActorError

    first = list(itertools.islice(tasks, opts.workers))  # no more actors than shards
    if not first:
        return
    tasks = itertools.chain(first, tasks)
    actor_cls = ray.remote(RayShardWorker).options(**ray_actor_options(opts, cpus))
    actors = [actor_cls.remote(ctx) for _ in range(len(first))]
    waiting: dict[Any, tuple[int, ShardTask | None]] = {a.ready.remote(): (i, None) for i, a in enumerate(actors)}
    idle: deque[int] = deque()
    retry: deque[ShardTask] = deque()
    attempts: dict[int, int] = {}
    probe_failures: dict[int, int] = {}
    lost = 0
    source_done = started = False
    try:
        while True:
            while idle:  # every started, idle actor gets the next shard
                task, source_done = _next_shard(retry, tasks, source_done)
                if task is None:
                    break
                i = idle.popleft()
                waiting[actors[i].run.remote(task)] = (i, task)
            if not any(t is not None for _, t in waiting.values()) and (source_done and not retry):
                return
            ready, _ = ray.wait(list(waiting), num_returns=1, timeout=STALL_WARNING_S)
            if not ready and not started:
                log.warning("no Ray actor has started after %d s: the cluster may lack the resources each one asks "
                            "for (%s); waiting", STALL_WARNING_S, ray_actor_options(opts, cpus))
            for ref in ready:
                i, task = waiting.pop(ref)
                try:
                    answer = ray.get(ref)
                except RayActorError:  # the actor died (SIGKILL, out of memory): Ray restarts it
                    # It gets no shard before it answers again: a call sent right after a death
                    # may reach the dead process and fail without running, which must not count
                    # as an attempt of a shard.
                    probe_failures[i] = probe_failures.get(i, 0) + 1 if task is None else 0
                    if probe_failures[i] > MAX_PROBE_FAILURES:
                        log.warning("a Ray actor could not be restarted; going on with the others")
                        lost += 1
                        if lost == len(actors):
                            raise WorkerSetupError("every Ray actor died and could not be restarted; see the Ray "
                                                   "logs of the cluster") from None
                    else:
                        if probe_failures[i]:
                            time.sleep(0.1)
                        waiting[actors[i].ready.remote()] = (i, None)
                    if task is None:
                        continue
                    yield from _lost(task, attempts, retry, opts.max_retries, "a Ray actor")
                    continue
                idle.append(i)
                if task is None:  # the actor started (or restarted)
                    started = True
                    probe_failures.pop(i, None)
                    continue
                yield _shard_answer(ctx, task, *answer)
    finally:
        for a in actors:
            with contextlib.suppress(Exception):  # already gone
                ray.kill(a)


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())
