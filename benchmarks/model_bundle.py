"""How long the model store takes to take in, check, export and import a model of a given size.

    python benchmarks/model_bundle.py                 # 605 MB of weights (CLIP ViT-B/32's model.safetensors)
    python benchmarks/model_bundle.py --mb 100 --runs 3 --out report.json

The hub cannot be reached from the machines that build stair_es, so the "download" is a
Hugging Face cache laid out as the client writes it (``refs/main``, ``snapshots/<commit>/``
linking to ``blobs/<sha256>``) with random float32 weights, and the pull runs the real
``huggingface_hub.snapshot_download`` offline: what is timed is everything stair_es adds to
a download (linking into the store, the sha256 of every file, the atomic install), then
``models verify``, ``models export`` as a folder, a ``.tar`` and a ``.tar.gz``, and
``models import`` of each into an empty home. ``--weights-only`` bundles (no encoder is run:
the derived files' cost is the encoder's, see benchmarks/pretrained_bench.py).

Each figure is the median of ``--runs`` runs (min and max beside it). The report carries the
git commit, the machine and its load average (a shared machine: the figures move with what
else runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import machine_info, provenance_line  # noqa: E402

COMMIT = "b" * 40


def hf_cache(root: Path, repo_id: str, mb: int) -> None:
    import numpy as np

    repo = root / f"models--{repo_id.replace('/', '--')}"
    snap = repo / "snapshots" / COMMIT
    for d in (repo / "refs", snap, repo / "blobs"):
        d.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    rng = np.random.default_rng(0)
    files = {"config.json": b'{"model_type": "bench"}',
             "model.safetensors": rng.standard_normal(mb * 262_144).astype(np.float32).tobytes()}
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / digest)


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def use_home(home: Path) -> None:
    os.environ["STAIR_ES_HOME"] = str(home)
    os.environ["STAIR_ES_MODEL_CACHE"] = str(home / "_models")


def one_run(work: Path, mb: int) -> dict[str, float]:
    from huggingface_hub import constants

    from stair_es import models

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    hf_cache(work / "hf", "bench/model", mb)
    constants.HF_HUB_CACHE = str(work / "hf")
    use_home(work / "online")
    out = {"pull": timed(lambda: models.pull("bench/model", local_only=True)),
           "verify": timed(lambda: models.verify("bench/model"))}
    for name in ("folder", "b.tar", "b.tar.gz"):
        use_home(work / "online")
        out[f"export {name}"] = timed(lambda: models.export("bench/model", work / name, weights_only=True))
        out[f"size {name} MB"] = sum(p.stat().st_size for p in (work / name).rglob("*") if p.is_file()) / 1e6 \
            if (work / name).is_dir() else (work / name).stat().st_size / 1e6
        use_home(work / f"airgapped-{name}")
        out[f"import {name}"] = timed(lambda: models.import_bundle(work / name))
        shutil.rmtree(work / f"airgapped-{name}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=605, help="Size of the random weights file in MB (MiB).")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, help="Scratch folder (default: a temporary one, removed at the end).")
    ap.add_argument("--out", type=Path, help="Also write the report as JSON here.")
    args = ap.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    work = args.work or Path(tempfile.mkdtemp(prefix="stair-es-model-bundle-"))
    try:
        runs = [one_run(work / "run", args.mb) for _ in range(args.runs)]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    rows = {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in runs[0]}
    machine = machine_info()
    report = {"commit": machine["commit"], "machine": machine, "load_average": os.getloadavg(), "weights_mb": args.mb,
              "runs": args.runs, "figures": rows}
    print(f"model store, {args.mb} MiB of weights, median of {args.runs} runs ({provenance_line(machine)}, "
          f"load {os.getloadavg()[0]:.1f})")
    for k, v in rows.items():
        unit = "" if k.startswith("size") else " s"
        print(f"  {k:<22} {v['median']:8.2f}{unit}   (min {v['min']:.2f}, max {v['max']:.2f})")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
