"""End-to-end ingest speed: ``stair-es ingest`` of a folder of camera-size JPEG files.

    python benchmarks/ingest_bench.py                                    # this checkout only
    python benchmarks/ingest_bench.py --baseline /path/to/old/.venv/bin/stair-es --images 120 --runs 3
    python benchmarks/ingest_bench.py --baseline OLD/.venv/bin/stair-es --compare MAIN/.venv/bin/stair-es
    python benchmarks/ingest_bench.py --encoder-option sources=imagenet,colour,clipart,ocr,scene,objects

The folder holds real sample photos (scikit-image, scikit-learn, matplotlib) re-encoded as
JPEG at 1600x1200 and 4000x3000 (typical phone and camera sizes), cycled to ``--images``
files; no captions, so only the image path is measured. Each run ingests into a fresh
embedded index with the default encoder and times the whole command (start-up, model
load, decoding, encoding, commits), so the figure is what a user waits for. The one-time
ONNX export is not in it: every executable first runs ``stair-es encoders export`` (as
``scripts/setup.sh`` does: it also installs the detector of the default encoder's ``objects``
source) and one untimed warm-up ingest, with a model cache (``$STAIR_ES_MODEL_CACHE``) kept
for the whole benchmark, and Python's bytecode cached as in a user's shell (the warm-up writes
it; ``PYTHONDONTWRITEBYTECODE`` in this shell is ignored for the runs). Runs of this checkout and the baseline alternate, so a change
in the machine's load hits both alike. Besides wall-clock images/s it prints the CPU time
per image (user + sys of the command), which a busy shared machine disturbs far less.
Also prints the decode-only speed of ``load_image`` as ingest called it before (long side
<= 1024) and now (``min_side`` = the encoder's need). Medians of ``--runs``; ratios are
measured in the same run (load average printed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import provenance_line, user_shell_env  # noqa: E402

from PIL import Image


def make_folder(folder: Path, n: int) -> list[Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from stair_es.samples import SAMPLES, _load

    photos = []
    for s in SAMPLES:
        try:
            photos.append(_load(s.loader).convert("RGB"))
        except Exception:
            continue
    sizes = [(1600, 1200), (4000, 3000)]
    paths = []
    for i in range(n):
        p = folder / f"img{i:05d}.jpg"
        photos[i % len(photos)].resize(sizes[i % 2], Image.Resampling.BICUBIC).save(p, quality=88)
        paths.append(p)
    return paths


def time_ingest(cli: str, folder: Path | list[Path], model_cache: Path, options: tuple[str, ...] = ()) -> tuple[float, float]:
    """One ``stair-es ingest`` into a fresh index: (wall seconds, CPU seconds)."""
    home = Path(tempfile.mkdtemp(prefix="stair-es-ingest-bench-"))
    env = user_env(model_cache, STAIR_ES_HOME=str(home))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    if isinstance(folder, list):  # these files only: a JSONL manifest of their paths
        manifest = home / "one.jsonl"
        manifest.write_text("".join(json.dumps({"id": p.stem, "path": str(p)}) + "\n" for p in folder))
        folder = manifest
    extra = [a for opt in options for a in ("--encoder-option", opt)]
    done = subprocess.run([cli, "ingest", "bench", str(folder), "--home", str(home / "indices"), *extra],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{cli} ingest failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def user_env(model_cache: Path, **extra: str) -> dict[str, str]:
    """A user's shell (:func:`benchmarks.common.user_shell_env`) with this model cache; the
    bytecode is cached beside it."""
    return user_shell_env(f"{model_cache}-pycache", STAIR_ES_MODEL_CACHE=str(model_cache), **extra)


def decode_speed(paths: list[Path], **kwargs) -> float:
    from stair_es.images import load_image

    t = time.perf_counter()
    for p in paths:
        load_image(p, **kwargs)
    return len(paths) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=120)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", help="another stair-es executable to measure in the same run (e.g. the previous release)")
    ap.add_argument("--compare", action="append", default=[], metavar="STAIR_ES",
                    help="more stair-es executables to measure in the same run (e.g. the main branch); repeatable")
    ap.add_argument("--encoder-option", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to every `stair-es ingest` (e.g. sources=...,objects); repeatable")
    ap.add_argument("--no-export", action="store_true",
                    help="skip `stair-es encoders export` before the runs (then the default encoder runs without "
                         "the objects source unless $STAIR_ES_OBJECTS_MODEL names its detector)")
    args = ap.parse_args()
    opts = tuple(args.encoder_option)
    here = str(Path(sys.executable).with_name("stair-es"))
    with tempfile.TemporaryDirectory(prefix="stair-es-jpegs-") as tmp:
        folder = Path(tmp)
        paths = make_folder(folder, args.images)
        size_mb = sum(p.stat().st_size for p in paths) / 1e6
        print(f"# {args.images} JPEG files ({size_mb:.0f} MB; 1600x1200 and 4000x3000), {os.cpu_count()} cpus, "
              f"load avg {os.getloadavg()[0]:.2f}\n# {provenance_line()}"
              + (f"\n# encoder options: {' '.join(opts)}" if opts else ""))
        old = decode_speed(paths[:40], target_max_side=1024)
        new = decode_speed(paths[:40], min_side=256)
        print(f"decode only: long side <= 1024 {old:6.1f} img/s | min_side 256 {new:6.1f} img/s | x{new / old:.2f}")
        rows = [("this checkout", here)] + ([("baseline", args.baseline)] if args.baseline else [])
        rows += [(f"compare {i + 1}", cli) for i, cli in enumerate(args.compare)]
        for label, cli in rows[1:]:
            print(f"# {label}: {cli}")
        caches = {label: Path(tmp + "-models-" + str(i)) for i, (label, _) in enumerate(rows)}
        for label, cli in rows:
            if not args.no_export:  # as scripts/setup.sh does: the towers exported, the objects detector installed
                env = user_env(caches[label])
                done = subprocess.run([cli, "encoders", "export"], capture_output=True, text=True, env=env, check=False)
                print(f"{label:<14} `stair-es encoders export` (as scripts/setup.sh): "
                      + ("done" if done.returncode == 0 else f"failed: {done.stderr.strip()[-300:]}"))
            wall, _ = time_ingest(cli, folder, caches[label], opts)
            print(f"{label:<14} warm-up run (may include a one-time model export): {wall:.1f} s")
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in rows}
        starts: dict[str, list[float]] = {label: [] for label, _ in rows}
        for _ in range(args.runs):
            for label, cli in rows:
                runs[label].append(time_ingest(cli, folder, caches[label], opts))
                starts[label].append(time_ingest(cli, paths[:1], caches[label], opts)[0])
        for cache in caches.values():
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(f"{cache}-pycache", ignore_errors=True)
        results, cpu = {}, {}
        for label, _ in rows:
            walls = [w for w, _ in runs[label]]
            med = statistics.median(walls)
            results[label] = args.images / med
            cpu[label] = statistics.median(c for _, c in runs[label]) / args.images * 1000
            print(f"{label:<14} end-to-end {args.images / med:6.1f} img/s (median of {args.runs}: {med:.1f} s; runs "
                  + ", ".join(f"{t:.1f}" for t in walls) + f") | CPU {cpu[label]:.1f} ms/img")
            one = statistics.median(starts[label])
            if med > one:  # a catalog's speed once the fixed cost (start-up, model load, index creation) is paid
                print(f"{'':<14} one-image ingest {one:.2f} s; beyond it {(args.images - 1) / (med - one):6.1f} img/s")
        for label, _ in rows[1:]:
            print(f"speed-up against {label}: x{results['this checkout'] / results[label]:.2f} wall-clock, "
                  f"x{cpu[label] / cpu['this checkout']:.2f} in CPU time per image")
        print(f"# load avg at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
