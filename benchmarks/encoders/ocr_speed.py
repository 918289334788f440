"""What the ``ocr`` token source costs at ingest: ``stair-es ingest`` with and without it.

    python -m benchmarks.encoders.ocr_speed [--images 60] [--runs 2]

Two folders, each ingested end to end (start-up, model load, decoding, encoding, commits)
into a fresh embedded index by this checkout's ``stair-es``:

* ``photos``: camera-size JPEGs (1600x1200 and 4000x3000) of the sample photos, as
  ``benchmarks/ingest_bench.py`` makes them;
* ``drawings``: Openclipart drawings the encoder evaluation never samples (the clipart
  head's held-out ids are skipped), rasterised at 320 px as the evaluation does, as PNG.

Encoder variants (``--encoder-option sources=...``): the base sources (imagenet, colour,
clipart: the default before ``ocr`` joined it, and the default without RapidOCR); the base
sources + ``ocr`` (drawings only: today's default); + ``ocr`` with ``ocr_images=all``.
Runs alternate between variants so the machine's load hits all alike; the figures are
medians of ``--runs``: wall-clock images/s and CPU ms per image (user + sys of the command,
which a busy shared machine disturbs far less). A warm-up ingest per variant keeps the
one-time ONNX export and model checks out of the timing.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = "imagenet,colour,clipart"
VARIANTS = {
    "base sources": [f"sources={BASE}"],
    "+ ocr (drawings)": [f"sources={BASE},ocr"],  # the default
    "+ ocr (all images)": [f"sources={BASE},ocr", "ocr_images=all"],
}


def drawings_folder(folder: Path, n: int) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "benchmarks" / "encoders"))
    from build_clipart_head import held_out_ids  # type: ignore[import-not-found]
    from sets import openclipart_set  # type: ignore[import-not-found]

    held = held_out_ids()
    pool = [it for it in openclipart_set(limit=None) if it.id not in held]
    random.Random(11).shuffle(pool)
    made = 0
    for it in pool:
        if made == n:
            break
        try:
            image = it.load()
        except Exception as e:  # noqa: BLE001 - an SVG cairosvg cannot draw: the next drawing takes its place
            print(f"# skipped drawing {it.id}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        image.save(folder / f"d{made:04d}.png")
        made += 1


def photos_folder(folder: Path, n: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ingest_bench import make_folder  # type: ignore[import-not-found]

    make_folder(folder, n)


def time_ingest(cli: str, folder: Path, options: list[str], model_cache: Path) -> tuple[float, float]:
    home = Path(tempfile.mkdtemp(prefix="stair-es-ocr-bench-"))
    env = dict(os.environ, STAIR_ES_HOME=str(home), STAIR_ES_MODEL_CACHE=str(model_cache))
    cmd = [cli, "ingest", "bench", str(folder), "--home", str(home / "indices")]
    for opt in options:
        cmd += ["--encoder-option", opt]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"ingest failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args(argv)
    cli = str(Path(sys.executable).with_name("stair-es"))
    with tempfile.TemporaryDirectory(prefix="stair-es-ocr-speed-") as tmp:
        cache = Path(tmp) / "models"
        folders = {"photos": Path(tmp) / "photos", "drawings": Path(tmp) / "drawings"}
        for f in folders.values():
            f.mkdir()
        photos_folder(folders["photos"], args.images)
        drawings_folder(folders["drawings"], args.images)
        print(f"# {args.images} images per folder, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.2f}")
        for name, options in VARIANTS.items():
            time_ingest(cli, folders["drawings"], options, cache)  # warm-up: exports, model checks
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.runs):
            for fname, folder in folders.items():
                for name, options in VARIANTS.items():
                    runs.setdefault((fname, name), []).append(time_ingest(cli, folder, options, cache))
        print(f"{'folder':<9} {'encoder sources':<20} {'img/s':>7} {'CPU ms/img':>11}")
        for (fname, name), rs in runs.items():
            wall = statistics.median(w for w, _ in rs)
            cpu = statistics.median(c for _, c in rs)
            print(f"{fname:<9} {name:<20} {args.images / wall:>7.1f} {1000 * cpu / args.images:>11.1f}")
        print(f"# load avg at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
