"""Throughput of ``stair-es encode-catalog`` (local process pool vs Ray, 1 and 2 workers) and of
``stair-es ingest`` of shards into the embedded engine.

    python benchmarks/encode_catalog_bench.py                      # 128 photos, default encoder
    python benchmarks/encode_catalog_bench.py --images 256 --ingest-docs 500000 --json out.json

The catalog is real photos from installed packages (scikit-image, matplotlib, scikit-learn),
each saved as several camera-sized JPEGs (longer side 1024-1600 px, different crops), with
captions. Each configuration encodes the whole catalog into a fresh folder, every worker on one
core (ONNX Runtime on one thread), so 2 workers against 1 is 2 cores against 1:

* ``images/s``: inputs / wall time of the run, worker start-up and model loading included;
* ``steady images/s``: inputs / (end of the last shard - start of the first), start-up excluded;
* ``all busy images/s``: images done while every worker was inside a shard (from the last
  worker's first shard to the first worker's last one, shards counted for their part inside
  that window) / that window: the rate a long run keeps, without start-up skew or the tail;
* ``CPU ms/image``: CPU seconds of the workers (all their threads) per image.

Also printed per configuration: the workers' timeline (busy, waiting between shards, before
their first / after their last shard), their ``getrusage`` per image (user and kernel CPU, page
faults, context switches), CPU by thread name (workers, driver) and by process (Ray's raylet,
GCS, agents, idle workers). ``ray:2:nice15`` runs Ray's workers at Ray's default niceness (15
above the driver's) and ``ray:2:arenas2`` with ``MALLOC_ARENA_MAX=2`` in the actors (A/B of two
settings measured for docs/distributed.md).

``--configs local:1:pin,local:2:pin`` holds each worker to its own core (``--pin-workers``), so
2 workers against 1 is 2 cores against 1. Where the CPU goes is printed per image from the
manifests' per-thread split (decode, encode on the main thread, the threads beside it, rows,
Parquet write, gc), with the driver's CPU, its reading of SOURCE and Ray's own processes,
and what that accounting bounds 2 workers at on 2 idle cores. ``--ceiling`` measures, once per
round, what 2 cores give over 1 right now for the same work without any pipeline (independent
processes pinned one per core): on a shared machine, the yardstick for the wall-clock ratios.

Ray runs on a local Ray with 2 CPUs started once before its configurations as encode-catalog
starts one (``start_ray``; that start is timed separately). The encoder split (decode / ONNX network / the rest, one worker, in
process) feeds the sizing table of docs/distributed.md. Shards -> embedded: synthetic shards
(``--ingest-docs`` documents, ~40 image + ~10 caption tokens each) ingested through
``add_arrays``; documents/s of the ingest call. Every report carries the git commit, the
machine and its load average (other work on a shared machine shows there).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))


def make_photos(root: Path, n: int) -> Path:
    from PIL import Image

    sys.path.insert(0, str(HERE / "tests"))
    from encode_catalog_util import photos

    base = list(photos().items())
    try:
        from sklearn.datasets import load_sample_images

        base += [(f"sk{i}", Image.fromarray(a)) for i, a in enumerate(load_sample_images().images)]
    except Exception:  # noqa: BLE001
        pass
    if not base:
        raise SystemExit("no sample photos installed (scikit-image, matplotlib or scikit-learn)")
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        name, im = base[i % len(base)]
        w, h = im.size
        side = 1024 + (i * 97) % 577  # camera-like sizes, each image a little different
        crop = im.crop((i % 7, i % 5, w - (i % 3), h - (i % 4)))
        scale = side / max(crop.size)
        crop = crop.resize((max(1, int(crop.size[0] * scale)), max(1, int(crop.size[1] * scale))), Image.BICUBIC)
        crop.save(root / f"{i:05d}-{name}.jpg", quality=88)
        (root / f"{i:05d}-{name}.txt").write_text(f"a photo of {name} number {i}")
    return root


def cpu_split_ms_per_image(rep) -> dict[str, float]:
    """Per input of a run's report, in CPU ms: the workers' parts (``CpuSplit``), their total, the
    driver and its reader."""
    inputs = sum(s["inputs"] for s in rep.shards)
    if not inputs:
        return {}
    out: dict[str, float] = {}
    for s in rep.shards:
        for k, v in (s.get("cpu_split") or {}).items():
            out[k] = out.get(k, 0.0) + v
    out = {k: round(1000.0 * v / inputs, 2) for k, v in out.items()}
    out["worker_total"] = round(1000.0 * sum(s["cpu_s"] for s in rep.shards) / inputs, 2)
    out["driver"] = round(1000.0 * rep.driver_cpu_s / inputs, 2)
    out["reader"] = round(1000.0 * rep.reader_cpu_s / inputs, 2)
    return out


def encode_run(src: Path, out: Path, engine: str, workers: int, batch: int, shard: int, **extra) -> dict:
    from stair_es.distributed.cpu import thread_cpu, thread_cpu_delta
    from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog
    from stair_es.encoders.base import get_encoder

    from stair_es.distributed import pipeline

    shutil.rmtree(out, ignore_errors=True)
    label = engine
    label += extra.pop("ray_label", "")
    arenas = extra.pop("ray_arenas", None)
    actor_options = pipeline.ray_actor_options
    if arenas:  # ray:2:arenas2: MALLOC_ARENA_MAX=2 in the actors (measured, then dropped: docs/distributed.md)
        pipeline.ray_actor_options = lambda opts, cpus: {**actor_options(opts, cpus),
                                                         "runtime_env": {"env_vars": {"MALLOC_ARENA_MAX": str(arenas)}}}
        label += f":arenas{arenas}"
    infra0 = ray_infra_cpu() if engine == "ray" else {}
    t0, th0 = time.time(), thread_cpu()
    rep = encode_catalog(str(src), str(out), functools.partial(get_encoder, "default"),
                         EncodeCatalogOptions(engine=engine, workers=workers, batch_size=batch, shard_size=shard,
                                              cpus_per_worker=1, **extra))  # a worker is one core: 1 vs 2 workers is 1 vs 2 cores
    driver_threads = thread_cpu_delta(th0, thread_cpu())  # the driver's CPU by thread name (Linux)
    pipeline.ray_actor_options = actor_options
    s = rep.summary()
    split = cpu_split_ms_per_image(rep)
    n_in = max(1, s["inputs"])
    by_proc = {}
    if engine == "ray":  # Ray's own processes (raylet, GCS, agents): CPU they took during the run
        infra1 = ray_infra_cpu()
        workers_pids = {e["pid"] for e in rep.shards}  # the actors: their CPU is the workers' own
        for p, (name, c) in infra1.items():
            if p not in workers_pids:
                c -= infra0[p][1] if p in infra0 else 0.0  # a process started during the run: all of it
                by_proc[name] = round(by_proc.get(name, 0.0) + 1000 * c / n_in, 2)
        split["ray_processes"] = round(sum(by_proc.values()), 2)
    worker_threads: dict = {}
    for e in rep.shards:
        for name, c in (e.get("thread_cpu") or {}).items():
            worker_threads[name] = worker_threads.get(name, 0.0) + c
    worker_threads = {k: round(1000 * v / n_in, 2) for k, v in sorted(worker_threads.items(), key=lambda kv: -kv[1])}
    driver_threads = {k: round(1000 * v / n_in, 2) for k, v in driver_threads.items()}
    ru: dict = {}
    for e in rep.shards:
        for k, v in (e.get("rusage") or {}).items():
            ru[k] = ru.get(k, 0.0) + v
    # per image: user and kernel CPU ms, page faults, context switches (voluntary, preempted)
    ru = {k: round((1000 if k.endswith("time") else 1) * v / n_in, 2) for k, v in ru.items()}
    # Each worker's first shard also pays the growth of its heap and ONNX Runtime's arena to a
    # batch's size (a fixed cost per worker, ~0.1-0.2 s of CPU): CPU per image without those shards
    # is what a long run pays, and does not depend on how many workers share a short one.
    firsts = {}
    for e in sorted(rep.shards, key=lambda e: e["written_at"]):
        firsts.setdefault(e["pid"], e["shard"])
    later = [e for e in rep.shards if firsts.get(e["pid"]) != e["shard"]]
    split["later_shards"] = (round(1000 * sum(e["cpu_s"] for e in later) / sum(e["inputs"] for e in later), 2)
                                         if later else None)
    first_start = min(e["written_at"] - e["wall_s"] for e in rep.shards)
    last_end = max(e["written_at"] for e in rep.shards)
    return {"engine": label, "workers": workers, "images": s["inputs"], "failed": s["failed"] + len(rep.failed_shards),
            "wall_s": round(s["wall_s"], 2), "images_per_s": s["images_per_s"],
            "steady_images_per_s": round(s["inputs"] / (last_end - first_start), 2),
            "cpu_ms_per_image": s["worker_cpu_ms_per_image"], "driver_start_s": round(first_start - t0, 2),
            "cpu_split_ms": split, **{k: v for k, v in extra.items()}, "timeline": timeline(rep.shards, workers),
            "worker_threads_ms": worker_threads, "driver_threads_ms": driver_threads, "worker_rusage": ru, "ray_processes_ms": by_proc,
            # share of a core the driver (and Ray's own processes) kept busy over the run: their cost
            # is per second of the run (polling, scheduling), not per image
            "overhead_cores": round((split.get("driver", 0.0) + split.get("ray_processes", 0.0)) * s["inputs"] / 1000
                                    / max(1e-9, s["wall_s"]), 3)}


def timeline(entries: list[dict], workers: int) -> dict:
    """How the workers' time went between the first shard's start and the last one's end: busy
    (inside a shard), waiting between two shards of the same worker (the driver handing out the
    next one), and idle before a worker's first shard or after its last (start-up skew, the tail)."""
    by_pid: dict = {}
    for e in entries:
        by_pid.setdefault(e["pid"], []).append((e["written_at"] - e["wall_s"], e["written_at"], e["inputs"]))
    if not by_pid:
        return {}
    t0 = min(a for v in by_pid.values() for a, _, _ in v)
    t1 = max(b for v in by_pid.values() for _, b, _ in v)
    span = t1 - t0
    busy = gaps = head = tail = 0.0
    n_gaps = 0
    for v in by_pid.values():
        v.sort()
        busy += sum(b - a for a, b, _ in v)
        head += v[0][0] - t0
        tail += t1 - v[-1][1]
        for (_, b, _), (a, _, _) in zip(v, v[1:]):
            gaps += a - b
            n_gaps += 1
    slots = workers * span
    # While every worker is at work (from the last one's first shard to the first one's last):
    # images done in that window (each shard counted for its part inside it) per second.
    w0 = max(v[0][0] for v in by_pid.values())
    w1 = min(v[-1][1] for v in by_pid.values())
    all_busy = None
    if len(by_pid) == workers and w1 - w0 > 0:
        done = sum(n * max(0.0, min(b, w1) - max(a, w0)) / max(1e-9, b - a) for v in by_pid.values() for a, b, n in v)
        all_busy = round(done / (w1 - w0), 2)
    return {"span_s": round(span, 3), "processes": len(by_pid), "all_busy_images_per_s": all_busy,
            "all_busy_window_s": round(max(0.0, w1 - w0), 3), "busy": round(busy / slots, 3),
            "between_shards": round(gaps / slots, 3), "gap_ms": round(1000 * gaps / max(1, n_gaps), 1),
            "before_first": round(head / slots, 3), "after_last": round(tail / slots, 3),
            "shard_s": round(busy / max(1, len(entries)), 3)}


def ray_infra_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of the local Ray's processes (every child of this one: raylet, GCS server,
    agents, monitors, idle and actor worker processes), by pid, with their names."""
    try:
        import psutil
    except ImportError:
        return {}
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            name = p.name()
            t = p.cpu_times()
            out[p.pid] = (name, t.user + t.system)
        except psutil.Error:
            continue
    return out


def _ceiling_proc(kind: str, files: list[str], core: int | None, barrier, results) -> None:
    """One process of :func:`ceiling`: pinned to one core, the same work as a worker's, no pipeline."""
    os.environ["STAIR_ES_ORT_THREADS"] = "1"
    if core is not None:
        os.sched_setaffinity(0, {core})
    if kind == "encode":
        from threadpoolctl import threadpool_limits

        from stair_es.encoders.base import get_encoder
        from stair_es.images import load_image

        threadpool_limits(1)
        enc = get_encoder("default")
        enc.encode_images([load_image(files[0], min_side=enc.image_min_side)] * 2)  # models loaded, untimed
    barrier.wait()  # every process starts its timed work at the same moment
    t0, c0 = time.perf_counter(), time.process_time()
    if kind == "spin":
        x = 0
        for i in range(30_000_000):
            x += i * i
    else:
        for i in range(0, len(files), 16):
            enc.encode_images([load_image(f, min_side=enc.image_min_side) for f in files[i:i + 16]], batch_size=16)
    results.put((time.perf_counter() - t0, time.process_time() - c0))


def ceiling(src: Path, n: int = 48) -> dict:
    """What 2 cores give over 1 for the same work with no pipeline at all: k independent processes,
    each pinned to its own core, each decoding and encoding the same n images (batches of 16,
    ONNX on one thread) -- and the same for a pure-Python loop (no memory traffic). Throughput of
    2 processes / 1 process is the most 2 workers can give over 1 on this machine, now (other
    jobs on the machine lower it)."""
    import multiprocessing

    files = [str(f) for f in sorted(src.glob("*.jpg"))[:n]]
    cores = sorted(os.sched_getaffinity(0))
    mp = multiprocessing.get_context("spawn")
    out: dict = {}
    for kind in ("spin", "encode"):
        rates = {}
        for k in (1, 2):
            if k > len(cores):
                continue
            barrier, results = mp.Barrier(k), mp.Queue()
            procs = [mp.Process(target=_ceiling_proc, args=(kind, files, cores[i], barrier, results)) for i in range(k)]
            for p in procs:
                p.start()
            res = [results.get(timeout=600) for _ in procs]
            for p in procs:
                p.join()
            wall = max(w for w, _ in res)
            rates[k] = k / wall  # jobs per second
            out[f"{kind}_{k}_wall_s"] = [round(w, 3) for w, _ in res]
            out[f"{kind}_{k}_cpu_s"] = [round(c, 3) for _, c in res]
            if kind == "encode":
                out[f"encode_{k}_images_per_s"] = round(k * len(files) / wall, 2)
        if 2 in rates:
            out[f"{kind}_ratio"] = round(rates[2] / rates[1], 3)
    return out


def encoder_split(src: Path, n: int = 48) -> dict:
    """Per-image ms of decoding, the ONNX network and everything else of the default encoder, in
    this process with ONNX Runtime on one thread (the cost a core pays per image)."""
    os.environ["STAIR_ES_ORT_THREADS"] = "1"
    import numpy as np

    from stair_es.encoders.base import get_encoder
    from stair_es.images import load_image

    enc = get_encoder("default")
    files = sorted(src.glob("*.jpg"))[:n]
    enc.encode_images([load_image(files[0], min_side=enc.image_min_side)])  # load the model, untimed
    c0 = time.process_time()
    ims = [load_image(f, min_side=enc.image_min_side) for f in files]
    decode = time.process_time() - c0
    c0 = time.process_time()
    enc.encode_images(ims, batch_size=16)
    encode = time.process_time() - c0
    ie = enc.image_encoder
    net = ie.load()
    pixels = np.stack([ie.preprocess(im) for im in ims])
    c0 = time.process_time()
    for i in range(0, len(ims), 16):
        ie.probabilities_from_pixels(pixels[i:i + 16], net)
    network = time.process_time() - c0
    k = len(files)
    out = {"images": k, "decode_ms": round(1000 * decode / k, 2), "encode_ms": round(1000 * encode / k, 2),
           "network_ms": round(1000 * network / k, 2), "rest_ms": round(1000 * (encode - network) / k, 2)}
    out.update({f"{name}_ms": round(1000 * cpu / k, 2) for name, cpu in source_costs(enc, ims).items()})
    return out


def source_costs(enc, ims: list) -> dict[str, float]:
    """CPU seconds of each pixel source of the default encoder over ``ims``, one at a time, as its
    pixel worker runs them: the classifier's resampling, the drawing score and gate, colour names,
    scene words, people, OCR (on the pictures that look drawn). Timing only: the 64 px copy the
    colour and scene sources share is made here with Pillow's thumbnail."""
    from PIL import Image

    out: dict[str, float] = {}

    def timed(name, fn):
        c0 = time.process_time()
        r = fn()
        out[name] = out.get(name, 0.0) + time.process_time() - c0
        return r

    timed("resample", lambda: [enc.image_encoder.preprocess(im) for im in ims])
    try:
        from stair_es.encoders.clipart import drawing_gate, drawing_score
    except ImportError:
        return out
    scores = timed("drawing_score", lambda: [drawing_score(im) for im in ims])
    if getattr(enc, "clipart", None) is not None:
        timed("drawing_gate", lambda: [drawing_gate(im, sc) for im, sc in zip(ims, scores)])

    def small(im):
        im = im.copy()
        im.thumbnail((64, 64), Image.BOX)
        return im

    smalls = timed("small_copy", lambda: [small(im) for im in ims])
    if getattr(enc, "colour", None) is not None:
        timed("colour", lambda: [enc.colour.encode(sm) for sm in smalls])
    if getattr(enc, "scene", None) is not None:
        timed("scene", lambda: [enc.scene.encode(sm, sc) for sm, sc in zip(smalls, scores)])
    if getattr(enc, "people", None) is not None:
        timed("people", lambda: [enc.people.encode(im, sc) for im, sc in zip(ims, scores)])
    if getattr(enc, "ocr", None) is not None:
        timed("ocr", lambda: enc.ocr.encode_many(ims, scores))
    return out


def ingest_run(tmp: Path, docs: int, shard: int = 50_000, warm: bool = True) -> dict:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stair_es import get_backend
    from stair_es.ingest import ingest_catalog
    from stair_es.distributed.shards import FORMAT, HEADER, META_KEY, MANIFEST_DIR, write_json_atomic
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    allowed = np.flatnonzero(~vocab.special_mask)
    rng = np.random.default_rng(0)
    out = tmp / "shards"
    (out / MANIFEST_DIR).mkdir(parents=True)
    from pyarrow import fs as pafs

    lfs = pafs.LocalFileSystem()
    enc = {"name": "bench-synthetic"}
    (out / HEADER).write_text(json.dumps({"format": FORMAT, "source": "synthetic", "shard_size": shard, "encoder": enc}))

    def lists(n, mean):
        lens = rng.poisson(mean, n).clip(1, 200)
        offs = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offs[1:])
        toks = np.concatenate([np.sort(rng.choice(allowed, size=int(k), replace=False)) for k in lens]).astype(np.int32)
        w = rng.gamma(2.0, 0.5, toks.size).astype(np.float32) + 0.01
        return pa.LargeListArray.from_arrays(pa.array(offs), pa.array(toks)), pa.LargeListArray.from_arrays(pa.array(offs), pa.array(w))

    for k, lo in enumerate(range(0, docs, shard)):
        n = min(shard, docs - lo)
        ii, iw = lists(n, 40)
        ci, cw = lists(n, 10)
        t = pa.table({"id": pa.array([f"doc-{i}" for i in range(lo, lo + n)]), "source": pa.array([f"img/{i}.jpg" for i in range(lo, lo + n)]),
                      "caption": pa.array([f"caption {i}" for i in range(lo, lo + n)]),
                      "metadata": pa.array([json.dumps({"bucket": i % 10}) for i in range(lo, lo + n)]),
                      "warning": pa.array([None] * n, pa.string()), "image_ids": ii, "image_weights": iw,
                      "caption_ids": ci, "caption_weights": cw})
        meta = {"format": FORMAT, "encoder": enc, "sparse_fields": ["image", "caption"], "shard": k, "rows": n}
        t = t.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
        path = out / f"part-{k:05d}.parquet"
        pq.write_table(t, path, compression="zstd")
        write_json_atomic(lfs, str(out / MANIFEST_DIR / f"part-{k:05d}.json"),
                          {"shard": k, "rows": n, "inputs": n, "bytes": path.stat().st_size})
    if warm:  # the engine's compiled kernels load on first use: once, untimed, on a tiny folder
        ingest_run(tmp / "warm", 64, warm=False)
    be = get_backend("embedded", home=tmp / "home")
    c0, t0 = time.process_time(), time.perf_counter()
    rep = ingest_catalog(be, "bench", str(out), None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = rep.summary()
    assert s["ok"] == docs and be.index_info("bench").doc_count == docs, s
    return {"docs": docs, "wall_s": round(wall, 2), "docs_per_s": round(docs / wall), "cpu_s": round(cpu, 2),
            "docs_per_cpu_s": round(docs / cpu)}


def sizing(result: dict) -> str:
    """Projected hours for 1M and 100M images from the measured CPU cost per image (a markdown table).

    CPU nodes: every core runs one worker at the median worker CPU ms/image of the runs (decode,
    classifier, colour, drawing gate, OCR, writing shards), scaling linearly with cores (each
    shard is independent; the driver only reads the list). GPU nodes: the ONNX network moves to
    the GPU, the rest of the per-image work (decode + pixel work, from the one-core split) stays
    on the node's CPU cores; the GPU is assumed to keep up (EfficientNet-Lite0 forward on a data
    centre GPU is thousands of images/s: not measured here, no GPU on this machine).
    """
    import statistics

    cpu_ms = statistics.median(r["cpu_ms_per_image"] for r in result["runs"])
    sp = result["split"]
    gpu_cpu_ms = cpu_ms * (sp["decode_ms"] + sp["rest_ms"]) / (sp["decode_ms"] + sp["encode_ms"])
    lines = [f"measured: {cpu_ms:.1f} CPU ms per image per worker core ({1000 / cpu_ms:.1f} images/s per core); "
             f"with the network on a GPU, {gpu_cpu_ms:.1f} CPU ms per image stay on the CPU",
             "", "| nodes | images/s | 1M images | 100M images |", "|---|---:|---:|---:|"]

    def row(label: str, rate: float) -> str:
        h1, h100 = 1e6 / rate / 3600, 1e8 / rate / 3600
        fmt = lambda h: (f"{h * 3600:.0f} s" if h < 1 / 60 else f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h" if h < 48  # noqa: E731
                         else f"{h:.0f} h ({h / 24:.0f} days)")
        return f"| {label} | {rate:,.0f} | {fmt(h1)} | {fmt(h100)} |"

    for cores in (2, 16, 64, 256, 1024):
        lines.append(row(f"{cores} CPU cores", cores * 1000 / cpu_ms))
    for gpus, cores in ((1, 8), (8, 64), (32, 256)):
        lines.append(row(f"{gpus} GPU node(s), {cores} cores in all", cores * 1000 / gpu_cpu_ms))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--shard-size", type=int, default=16)
    ap.add_argument("--configs", default="local:1,local:2,ray:1,ray:2",
                    help="engine:workers[:pin] (pin: local workers each on its own core, --pin-workers)")
    ap.add_argument("--runs", type=int, default=1, help="rounds over all configurations (alternating, so load hits "
                                                        "all alike); the table gives medians")
    ap.add_argument("--pin", action="store_true", help="local runs: pin the driver and its workers to `workers` cores "
                                                      "(a worker also decodes on other threads: unpinned, one worker "
                                                      "spreads over every core and 1 vs 2 workers is not 1 vs 2 cores)")
    ap.add_argument("--decode-threads", type=int, help="decoding threads per worker (default: the pipeline's)")
    ap.add_argument("--ceiling", action="store_true", help="also measure what 2 cores give over 1 for the same work "
                                                          "with no pipeline (independent pinned processes)")
    ap.add_argument("--ingest-docs", type=int, default=300_000)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--sizing-from", type=Path, help="print the sizing table of a saved --json report and stop")
    args = ap.parse_args(argv)
    if args.sizing_from:
        print(sizing(json.loads(args.sizing_from.read_text())))
        return 0
    from benchmarks.common import git_commit, machine_info

    tmp = Path(tempfile.mkdtemp(prefix="stair-es-encode-bench-"))
    result: dict = {"commit": git_commit(), "machine": machine_info(), "load_before": os.getloadavg(), "runs": []}
    try:
        src = make_photos(tmp / "photos", args.images)
        from stair_es.encoders.base import get_encoder

        get_encoder("default").encode_images([])  # export the ONNX towers once, outside the timings
        ray_up = False
        for rnd in range(args.runs):
            if args.ceiling:  # once per round: the machine's load changes from round to round
                result.setdefault("ceilings", []).append(ceiling(src))
                print(json.dumps({"ceiling": result["ceilings"][-1]}), flush=True)
            for cfg in args.configs.split(","):
                engine, workers, *flags = cfg.split(":")  # e.g. local:2:pin (each worker on its own core)
                mode = engine + (":nice15" if "nice15" in flags else "")
                if engine == "ray" and ray_up != mode:  # a Ray of its own for each worker niceness
                    from stair_es.distributed.pipeline import start_ray

                    if ray_up:
                        import ray

                        ray.shutdown()
                    t0 = time.perf_counter()
                    # as encode-catalog starts a local Ray (on 127.0.0.1, workers at this process's
                    # niceness), with 2 CPUs; ray:2:nice15 keeps Ray's default worker niceness (15)
                    start_ray(num_cpus=2, **({"_system_config": {"worker_niceness": 15}} if "nice15" in flags else {}))
                    result.setdefault("ray_init_s", round(time.perf_counter() - t0, 2))
                    ray_up = mode
                allowed = os.sched_getaffinity(0)
                if args.pin and engine == "local":
                    os.sched_setaffinity(0, set(sorted(allowed)[:int(workers)]))  # spawned workers inherit it
                try:
                    extra = {"decode_threads": args.decode_threads} if args.decode_threads is not None else {}
                    if "pin" in flags:
                        extra["pin_workers"] = True
                    for f in flags:
                        if f.startswith("arenas"):
                            extra["ray_arenas"] = int(f[6:])
                    if "nice15" in flags:
                        extra["ray_label"] = ":nice15"
                    run = encode_run(src, tmp / f"out-{engine}-{workers}", engine, int(workers), args.batch_size,
                                     args.shard_size, **extra)
                finally:
                    os.sched_setaffinity(0, allowed)
                run["pinned_cores"] = int(workers) if args.pin and engine == "local" else None
                run["round"] = rnd
                result["runs"].append(run)
                print(json.dumps(run), flush=True)
        if ray_up:
            import ray

            ray.shutdown()
        result["split"] = encoder_split(src)
        print(json.dumps({"split": result["split"]}), flush=True)
        if args.ingest_docs:
            result["ingest"] = ingest_run(tmp, args.ingest_docs)
            print(json.dumps({"ingest": result["ingest"]}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["load_after"] = os.getloadavg()
    print()
    print(f"commit {result['commit']}  load average before {result['load_before'][0]:.2f}, after {result['load_after'][0]:.2f}"
          + (f"  ray.init {result['ray_init_s']} s" if "ray_init_s" in result else ""))
    import statistics

    groups: dict = {}
    for r in result["runs"]:
        groups.setdefault((r["engine"] + (":pin" if r.get("pin_workers") else ""), r["workers"]), []).append(r)
    for v in groups.values():
        for x in v:
            x["all_busy_images_per_s"] = (x.get("timeline") or {}).get("all_busy_images_per_s") or x["steady_images_per_s"]
    by = {k: {f: statistics.median(x[f] for x in v) for f in ("images", "wall_s", "images_per_s", "steady_images_per_s",
                                                               "all_busy_images_per_s", "cpu_ms_per_image")}
          | {"engine": k[0], "workers": k[1], "n": len(v)} for k, v in groups.items()}
    result["medians"] = [dict(v) for v in by.values()]
    print(f"medians of {args.runs} run(s)")
    print(f"{'engine':10} {'workers':>7} {'images':>6} {'wall s':>7} {'images/s':>9} {'steady/s':>9} {'all busy/s':>10} "
          f"{'CPU ms/img':>10}")
    for r in by.values():
        print(f"{r['engine']:10} {r['workers']:>7} {r['images']:>6.0f} {r['wall_s']:>7.2f} {r['images_per_s']:>9.2f} "
              f"{r['steady_images_per_s']:>9.2f} {r['all_busy_images_per_s']:>10.2f} {r['cpu_ms_per_image']:>10.2f}")
    parts = ("decode", "encode", "other_threads", "rows", "write", "gc", "worker_total", "later_shards",
             "driver", "reader", "ray_processes")
    print()
    print("where the CPU goes, ms per image (medians; workers' threads: decode, encode = main thread, other threads = "
          "pixel worker/OCR/ORT; gc is wall time; driver = the driver process, reader = its reading of SOURCE; "
          "later_shards = workers' CPU per image without each worker's first shard; ray_processes = raylet, GCS, agents)")
    print(f"{'engine':10} {'workers':>7} " + " ".join(f"{p:>13}" for p in parts))
    for (e, w), v in groups.items():
        med = {p: statistics.median((x["cpu_split_ms"].get(p) or 0.0) for x in v) for p in parts}
        print(f"{e:10} {w:>7} " + " ".join(f"{med[p]:>13.2f}" for p in parts))
    # What the CPU accounting says 2 idle cores can give (per-thread CPU clocks: other jobs on the
    # machine barely move these figures, unlike wall-clock rates).
    meds = {k: {p: statistics.median((x["cpu_split_ms"].get(p) or 0.0) for x in v) for p in parts} for k, v in groups.items()}
    result["cpu_bounds"] = {}
    for e in ("local", "local:pin", "ray"):
        if (e, 1) not in meds or (e, 2) not in meds:
            continue
        one, two = meds[(e, 1)], meds[(e, 2)]
        main1 = one["encode"] + one["rows"] + one["write"]
        # a long run's CPU per image: without each worker's first shard (see encode_run)
        tot1, tot2 = one["later_shards"] or one["worker_total"], two["later_shards"] or two["worker_total"]
        ovh2 = statistics.median(x.get("overhead_cores", 0.0) for x in groups[(e, 2)])
        rate2 = (2 - ovh2) * 1000 / tot2
        b = {"main_thread_ms": round(main1, 2), "side_threads_ms": round(tot1 - main1, 2),
             "lone_worker_cores": round(tot1 / main1, 2), "two_workers_images_per_s": round(rate2, 1),
             "vs_one_core": round(rate2 / (1000 / tot1), 2), "vs_lone_worker": round(rate2 / (1000 / main1), 2)}
        result["cpu_bounds"][e] = b
        print(f"{e}: CPU accounting: one worker {tot1:.1f} ms/img = {main1:.1f} on its main thread + {tot1 - main1:.1f} on "
              f"threads beside it (a lone worker on idle cores uses up to {b['lone_worker_cores']} cores); 2 workers on "
              f"2 idle cores less {ovh2:.2f} core for the driver/Ray: {2 - ovh2:.2f} x 1000 / {tot2:.1f} = {rate2:.0f} images/s = "
              f"{b['vs_one_core']}x a worker held to one core, {b['vs_lone_worker']}x a lone worker on idle cores")
    cs = result.get("ceilings")
    if cs:
        med = {k: statistics.median(c[k] for c in cs) for k in ("spin_ratio", "encode_ratio", "encode_1_images_per_s",
                                                               "encode_2_images_per_s") if all(k in c for c in cs)}
        result["ceiling_medians"] = med
        print(f"ceiling (independent processes pinned one per core, no pipeline; medians of {len(cs)}): pure-Python "
              f"loop 2/1 = {med.get('spin_ratio', 0):.2f}x (each: {[c.get('spin_ratio') for c in cs]}), decode+encode "
              f"2/1 = {med.get('encode_ratio', 0):.2f}x (each: {[c.get('encode_ratio') for c in cs]}; "
              f"{med.get('encode_1_images_per_s', 0):.1f} -> {med.get('encode_2_images_per_s', 0):.1f} images/s)")
    if cs:  # each round's 2-vs-1 ratio against the ceiling measured just before it
        for e in ("local", "local:pin", "ray"):
            effs = []
            for rnd, c in enumerate(cs):
                one = [x for x in groups.get((e, 1), []) if x.get("round") == rnd]
                two = [x for x in groups.get((e, 2), []) if x.get("round") == rnd]
                if one and two and c.get("encode_ratio"):
                    effs.append((two[0]["steady_images_per_s"] / one[0]["steady_images_per_s"], c["encode_ratio"]))
            if effs:
                rel = statistics.median(r / c for r, c in effs)
                result.setdefault("against_ceiling", {})[e] = rel
                print(f"{e}: per round, 2 workers / 1 against the ceiling of that round: "
                      + ", ".join(f"{r:.2f}x / {c:.2f}x" for r, c in effs) + f" -> median {rel:.2f} of the ceiling")
    for e in ("local", "local:pin", "ray"):
        if (e, 1) in by and (e, 2) in by:
            print(f"{e}: 2 workers / 1 worker = {by[(e, 2)]['steady_images_per_s'] / by[(e, 1)]['steady_images_per_s']:.2f}x "
                  f"(steady), {by[(e, 2)]['all_busy_images_per_s'] / by[(e, 1)]['all_busy_images_per_s']:.2f}x (all busy); "
                  "per round (all busy): " + ", ".join(
                      f"{t['all_busy_images_per_s'] / o['all_busy_images_per_s']:.2f}x"
                      for o in groups[(e, 1)] for t in groups[(e, 2)] if o.get("round") == t.get("round")))
    print()
    print("where the workers' time goes between the first shard's start and the last one's end (medians; shares of "
          "workers x span): busy in a shard, between two shards, before the first, after the last")
    for (e, w), v in groups.items():
        tl = [x["timeline"] for x in v if x.get("timeline")]
        if tl:
            med = {k: statistics.median(t[k] for t in tl) for k in ("busy", "between_shards", "gap_ms", "before_first",
                                                                     "after_last", "shard_s")}
            print(f"{e:10} {w:>7} busy {med['busy']:.3f}  between {med['between_shards']:.3f} ({med['gap_ms']:.1f} ms "
                  f"per gap)  before first {med['before_first']:.3f}  after last {med['after_last']:.3f}  "
                  f"shard {med['shard_s']:.2f} s")
    print("workers' rusage per image, medians: user and kernel CPU ms, minor page faults, context switches "
          "(voluntary / preempted)")
    for (e, w), v in groups.items():
        rus = [x["worker_rusage"] for x in v if x.get("worker_rusage")]
        if rus:
            med = {k: statistics.median(r.get(k, 0.0) for r in rus) for k in rus[0]}
            print(f"{e:10} {w:>7} user {med.get('utime', 0):.2f}  kernel {med.get('stime', 0):.2f}  faults "
                  f"{med.get('minflt', 0):.0f}  switches {med.get('nvcsw', 0):.1f} / {med.get('nivcsw', 0):.1f}")
    print("CPU ms per image by thread (workers, driver) and by process (Ray's own), medians:")
    for (e, w), v in groups.items():
        for key in ("worker_threads_ms", "driver_threads_ms", "ray_processes_ms"):
            names = {n for x in v for n in (x.get(key) or {})}
            med = {n: statistics.median((x.get(key) or {}).get(n, 0.0) for x in v) for n in names}
            top = sorted(((n, m) for n, m in med.items() if m >= 0.05), key=lambda kv: -kv[1])
            if top:
                print(f"{e:10} {w:>7} {key[:-3]:15} " + ", ".join(f"{n} {m:.2f}" for n, m in top))
    print()
    for e in ("ray", "ray:nice15", "ray:arenas2", "ray:arenas4"):
        if ("local", 2) in by and (e, 2) in by:
            print(f"{e} overhead at 2 workers: {100 * (1 - by[(e, 2)]['steady_images_per_s'] / by[('local', 2)]['steady_images_per_s']):.1f} % "
                  f"(steady), {100 * (1 - by[(e, 2)]['all_busy_images_per_s'] / by[('local', 2)]['all_busy_images_per_s']):.1f} % "
                  f"(all busy), {100 * (1 - by[(e, 2)]['images_per_s'] / by[('local', 2)]['images_per_s']):.1f} % (wall); "
                  "per round (steady): " + ", ".join(
                      f"{100 * (1 - t['steady_images_per_s'] / o['steady_images_per_s']):.1f} %"
                      for o in groups[("local", 2)] for t in groups[(e, 2)] if o.get("round") == t.get("round")))
    sp = result.get("split")
    if sp:
        print(f"one core, per image: decode {sp['decode_ms']} ms, encode {sp['encode_ms']} ms "
              f"(ONNX network {sp['network_ms']} ms, the rest {sp['rest_ms']} ms)")
        srcs = [k[:-3] for k in sp if k.endswith("_ms") and k[:-3] not in ("decode", "encode", "network", "rest")]
        if srcs:
            print("  the pixel sources, each alone, per image: " + ", ".join(f"{k} {sp[k + '_ms']} ms" for k in srcs))
    if "ingest" in result:
        i = result["ingest"]
        print(f"shards -> embedded ingest: {i['docs']} docs in {i['wall_s']} s = {i['docs_per_s']} docs/s "
              f"({i['docs_per_cpu_s']} docs per CPU second of the process)")
    if result.get("split") and result["runs"]:
        print()
        print(sizing(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
