"""Merge a kept scale-benchmark index into fewer segments and measure the merge's memory.

    python -m benchmarks.scale.merge --index W/engine-idf-10000000 --dest W/engine-idf-10000000-2seg \\
        --max-segments 2 --out benchmarks/results/scale/merge-10m-2seg.json

``--dest`` becomes a copy of ``--index`` (segment files hard-linked: they are never written in
place, so the source stays intact; the manifests copied), then ``EngineIndex.optimize(max_segments
=N)`` runs on it in this process, while a thread samples ``/proc/self/status`` every 50 ms. Prints
(and writes with ``--out``) the merge's wall and CPU seconds, the segments before and after, and
the peak resident memory: all of it (``VmHWM``), the anonymous part (``RssAnon``: what the merge
allocates) and the file-backed part (pages of the memory-mapped segments). Run it alone: a 10M
merge reads and writes ~10 GB."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import threading
import time
from pathlib import Path


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0]) * 1024
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", required=True, help="a kept index (python -m benchmarks.scale ... --keep-index)")
    ap.add_argument("--dest", required=True, help="folder for the merged copy (must not exist)")
    ap.add_argument("--max-segments", type=int, required=True)
    ap.add_argument("--out", help="write the figures to this JSON file")
    args = ap.parse_args(argv)
    src, dest = Path(args.index), Path(args.dest)
    if dest.exists():
        ap.error(f"{dest} exists; give a new folder")
    need = sum(p.stat().st_size for p in src.glob("*.seg"))
    free = shutil.disk_usage(dest.parent).free
    if free < need + (3 << 30):
        ap.error(f"{free / 1e9:.1f} GB free at {dest.parent}; the merged copy needs {need / 1e9:.1f} GB and 3 GB to spare")
    dest.mkdir(parents=True)
    for p in src.iterdir():
        if p.name.endswith(".seg"):
            os.link(p, dest / p.name)
        elif p.is_file() and p.name != "write.lock":
            shutil.copy2(p, dest / p.name)

    from stair_es.engine import EngineIndex

    peak = {"RssAnon": 0, "RssFile": 0, "VmRSS": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            st = _status()
            for k in peak:
                peak[k] = max(peak[k], st.get(k, 0))
            time.sleep(0.05)

    ix = EngineIndex.open(dest, writable=True)
    before = len(ix._segs)
    base = _status()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    t0, c0 = time.perf_counter(), time.process_time()
    ix.optimize(max_segments=args.max_segments)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    stop.set()
    th.join()
    after = len(ix._segs)
    docs = ix.stats()["docs"]
    ix.close()
    res = {"index": str(src), "dest": str(dest), "max_segments": args.max_segments, "segments_before": before,
           "segments_after": after, "docs": docs, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
           "peak_rss_gb": round(max(peak["VmRSS"], _status()["VmHWM"]) / 1e9, 3),
           "peak_anon_gb": round(peak["RssAnon"] / 1e9, 3), "peak_file_gb": round(peak["RssFile"] / 1e9, 3),
           "rss_before_gb": round(base.get("VmRSS", 0) / 1e9, 3), "load": list(os.getloadavg())}
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    return res


if __name__ == "__main__":
    main()
