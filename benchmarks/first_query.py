"""The first query after a start against the hundredth: ``python benchmarks/first_query.py --index DIR``.

Each variant runs in a fresh process (the index files in the page cache, as after a restart of
the searching process; nothing is mapped, verified or loaded in it yet), searches every query
once (the *first pass*: each query's terms are read for the first time, or nearly) and then
again (*steady*), and reports both p50 (wall clock) and their ratio. The variants take the
first pass apart:

* ``today``: a reader as it starts (the default: kernels loaded on first use, the
  resident pages of big segments mapped by a background thread from the open on, racing the first
  queries): kernel load, checksums of the first-read chunks and what faults are left;
* ``no-map-ahead``: the same with ``STAIR_ES_MAP_AHEAD=0`` (every first read of a page faults);
* ``no-map-verify``: ``today`` with ``STAIR_ES_MAP_AHEAD_VERIFY=0``: the background thread maps
  pages but leaves their chunk checksums to the searches that first read them;
* ``mapped``: ``today`` once the background mapping is done (``EngineIndex.mapping_done``; a
  service that has been up a second or so at 10M documents);
* ``kernels-loaded``: the numba kernels loaded before the first pass (untimed):
  the first pass then pays checksums and page faults only;
* ``no-verify``: kernels loaded, ``STAIR_ES_VERIFY=size`` (no chunk checksums):
  page faults only;
* ``warm``: ``EngineIndex.warm()`` first (timed apart): every page mapped, every byte verified,
  the kernels loaded;
* ``warm-huge``: ``EngineIndex.warm(huge_pages=True)``: the same, the segments first read again
  into the page cache as 2 MiB folios where they were not.

``--folios`` sets how the page cache holds the index before each process (with ``--cache warm``):
``asis`` (default) reads the files through and keeps whatever folios the cache has (from their
history: how they were written and read); ``small`` drops them and reads them back with
read-ahead off (4 KiB folios: every first read of a mapped range faults per 64 KiB);
``huge`` drops them and reads them back through a mapping that asks for huge pages (2 MiB
folios: a fault maps 2 MiB). The first pass at 10M depends on it more than on anything else.

Queries: ``engine_bench``'s Zipf queries (``--weights``, ``--seed``) or ``--queries-npz``. Every
figure is printed with the load average beside it; run it on a quiet machine for absolute values,
and compare variants within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
VARIANTS = ("today", "no-map-ahead", "no-map-verify", "mapped", "kernels-loaded", "no-verify", "warm", "warm-huge")


def worker(args) -> None:
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    t_import = time.perf_counter()
    import numpy as np

    sys.path.insert(0, str(HERE.parent))
    from engine_ab import query_pairs

    from stair_es.engine import EngineIndex
    from stair_es.query import SearchRequest, SparseClause
    from stair_es.sparse import SparseVector

    pairs = query_pairs(args)
    reqs = [SearchRequest([SparseClause("image", SparseVector.from_arrays(i, w))], top_k=10) for i, w in pairs]
    out = {"import_s": time.perf_counter() - t_import}
    t = time.perf_counter()
    ix = EngineIndex.open(Path(args.index))
    out["open_s"] = time.perf_counter() - t
    if args.variant == "mapped":
        t = time.perf_counter()
        ix.mapping_done()
        out["mapping_s"] = time.perf_counter() - t
    if args.variant in ("kernels-loaded", "no-verify"):
        from stair_es.engine import kernels as K
        from stair_es.engine.layout import TopK

        seg = ix.snapshot().segments[0].seg
        t = time.perf_counter()
        none = (np.zeros(0, np.int64), np.zeros(0, np.float32))
        for strategy in (1, 2):
            K.search_segment(*none, tuple(seg.kernel_arrays()), np.zeros(0, np.uint8), np.int64(0), tuple(TopK.empty(1)),
                             (strategy, 64, 0, -1, -1.0, -1.0), np.zeros(4096, np.float32), seg.kernel_check())
        out["kernel_load_s"] = time.perf_counter() - t
    if args.variant == "warm":
        out["warm"] = ix.warm()
    if args.variant == "warm-huge":
        out["warm"] = ix.warm(huge_pages=True)
    import resource

    def thread_faults() -> tuple[int, int]:
        # the searching thread's own page faults (minor, major): getrusage(RUSAGE_SELF) also counts
        # the background mapping thread's, whose MADV_POPULATE_READ counts a fault per mapping it makes
        try:
            with open("/proc/thread-self/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            return int(fields[7]), int(fields[9])
        except (OSError, IndexError, ValueError):  # not Linux
            return 0, 0

    def run_pass() -> tuple[list[float], list[float], dict]:
        # page faults of the whole pass (minor: a page in the page cache mapped into the process;
        # major: read from disk), of the process and of the searching thread alone, and the
        # searching thread's CPU time beside the wall clock
        wall, cpu, tmin = [], [], []
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = thread_faults()
        for r in reqs:
            f0 = thread_faults()[0]
            t, c = time.perf_counter(), time.thread_time()
            ix.search(r)
            cpu.append((time.thread_time() - c) * 1e3)
            wall.append((time.perf_counter() - t) * 1e3)
            tmin.append(thread_faults()[0] - f0)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        t1 = thread_faults()
        return wall, cpu, {"minflt": r1.ru_minflt - r0.ru_minflt, "majflt": r1.ru_majflt - r0.ru_majflt,
                           "thread_minflt": t1[0] - t0[0], "thread_majflt": t1[1] - t0[1], "thread_minflt_per_query": tmin}

    def background() -> dict:
        # how far the background mapping and verification had got (bytes mapped, share of chunks verified)
        st = ix.__dict__.get("_mapping") or {}
        oks = [s.seg.verifier.ok for s in ix.snapshot().segments if s.seg.verifier is not None]
        n = sum(o.size for o in oks)
        return {"mapped_gb": st.get("mapped", 0) / 1e9, "running": bool(st.get("running", False)),
                "verified_share": float(sum(int(o.sum()) for o in oks) / n) if n else 1.0}

    out["background_at_start"] = background()
    first, first_cpu, first_faults = run_pass()
    out["background_after_first"] = background()
    steady, steady_cpu, steady_faults = run_pass()
    out.update(first=first, steady=steady, first_cpu=first_cpu, steady_cpu=steady_cpu, first_faults=first_faults,
               steady_faults=steady_faults, load=os.getloadavg()[0])
    json.dump(out, sys.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--index", required=True)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--weights", choices=("idf", "iid"), default="idf")
    ap.add_argument("--queries-npz", help="queries from an .npz of CSR arrays (indptr, indices, weights)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=2, help="processes per variant (interleaved)")
    ap.add_argument("--cache", choices=("warm", "cold"), default="warm",
                    help="warm: the index files are read into the page cache before each process (a restart of the "
                         "searching process); cold: "
                         "they are dropped from it before each process (posix_fadvise DONTNEED of this index's files "
                         "only: as after a reboot, or when other work pushed them out)")
    ap.add_argument("--folios", choices=("asis", "small", "huge"), default="asis",
                    help="with --cache warm: asis keeps the page cache's folios as they are; small / huge read the "
                         "files back as 4 KiB / 2 MiB folios before each process (see the module's notes)")
    ap.add_argument("--out", help="write every process's figures to this JSON file")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        worker(args)
        return 0
    import numpy as np

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; use some of {', '.join(VARIANTS)}")
    res: dict[str, list[dict]] = {v: [] for v in names}
    for r in range(args.rounds):
        for v in (names if r % 2 == 0 else names[::-1]):
            env = dict(os.environ, NUMBA_NUM_THREADS="1")
            if v == "no-verify":
                env["STAIR_ES_VERIFY"] = "size"
            if v == "no-map-ahead":
                env["STAIR_ES_MAP_AHEAD"] = "0"
            if v == "no-map-verify":
                env["STAIR_ES_MAP_AHEAD_VERIFY"] = "0"
            cmd = [sys.executable, str(HERE), "--variant", v, "--index", args.index, "--queries", str(args.queries),
                   "--seed", str(args.seed), "--weights", args.weights]
            if args.queries_npz:
                cmd += ["--queries-npz", str(Path(args.queries_npz).resolve())]
            if args.cache == "cold":
                evict(Path(args.index))
            elif args.folios != "asis":
                reread(Path(args.index), args.folios)
            else:
                read_through(Path(args.index))
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if p.returncode:
                raise SystemExit(f"variant {v} failed:\n{p.stderr[-3000:]}")
            res[v].append(json.loads(p.stdout))
    print(f"index {args.index}, {args.queries} queries, {args.rounds} processes per variant (interleaved), "
          f"page cache {args.cache}" + (f", {args.folios} folios" if args.cache == "warm" else ""))
    print("| variant | first pass p50 ms (CPU) | steady p50 ms (CPU) | first / steady | first pass total s "
          "| faults first pass: minor / major | of them the searching thread's (p50 a query) | steady: minor / major "
          "| set-up before it | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for v in names:
        f = float(np.median([np.median(x["first"]) for x in res[v]]))
        s = float(np.median([np.median(x["steady"]) for x in res[v]]))
        fc = float(np.median([np.median(x["first_cpu"]) for x in res[v]]))
        sc = float(np.median([np.median(x["steady_cpu"]) for x in res[v]]))
        ff = {k: int(np.median([x["first_faults"].get(k, 0) for x in res[v]])) for k in ("minflt", "majflt", "thread_minflt")}
        sf = {k: int(np.median([x["steady_faults"].get(k, 0) for x in res[v]])) for k in ("minflt", "majflt", "thread_minflt")}
        fq = float(np.median([np.median(x["first_faults"].get("thread_minflt_per_query", [0])) for x in res[v]]))
        tot = float(np.median([sum(x["first"]) / 1e3 for x in res[v]]))
        setup = ""
        if "mapping_s" in res[v][0]:
            setup = f"background mapping waited for {np.median([x['mapping_s'] for x in res[v]]):.2f} s after the open"
        if "kernel_load_s" in res[v][0]:
            setup = f"kernels loaded in {np.median([x['kernel_load_s'] for x in res[v]]):.2f} s"
        if "warm" in res[v][0]:
            w = {k: float(np.median([x["warm"][k] for x in res[v]])) for k in res[v][0]["warm"]}
            setup = "warm(): " + ", ".join(f"{k[:-2]} {val:.2f} s" for k, val in w.items())
        bg = res[v][0].get("background_after_first")
        if bg:
            setup += (f"{'; ' if setup else ''}after the first pass: background {'running' if bg['running'] else 'done'}, "
                      f"{bg['mapped_gb']:.1f} GB mapped, {100 * bg['verified_share']:.0f} % of chunks verified")
        load = ", ".join(f"{x['load']:.1f}" for x in res[v])
        print(f"| {v} | {f:.3f} ({fc:.3f}) | {s:.3f} ({sc:.3f}) | x{f / s:.2f} | {tot:.2f} | {ff['minflt']:,} / "
              f"{ff['majflt']:,} | {ff['thread_minflt']:,} ({fq:.0f}) | {sf['minflt']:,} / {sf['majflt']:,} | {setup} | {load} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"index": args.index, "cache": args.cache, "queries": args.queries,
                                              "rounds": args.rounds, "results": res}))
    return 0


def read_through(index: Path) -> None:
    """Read the index's files through, so that every page is in the page cache (the same start
    for every process of a "warm" run, whatever other work evicted meanwhile)."""
    buf = bytearray(16 << 20)
    for f in index.rglob("*"):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass


def reread(index: Path, folios: str) -> None:
    """Drop the index's segment files from the page cache and read them back as small (4 KiB, read-ahead
    off) or huge (2 MiB: through a mapping with ``MADV_HUGEPAGE``, populated at once) folios."""
    import mmap

    for f in sorted(index.glob("*.seg")):
        fd = os.open(f, os.O_RDONLY)
        try:
            n = os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if folios == "small":
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                buf = bytearray(1 << 20)
                off = 0
                while off < n:
                    got = os.preadv(fd, [buf], off)
                    if got <= 0:
                        break
                    off += got
            elif n:
                m = mmap.mmap(fd, n, prot=mmap.PROT_READ)
                try:
                    m.madvise(mmap.MADV_HUGEPAGE)
                    m.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))
                finally:
                    m.close()
        finally:
            os.close(fd)
    read_through(index)  # (the other files)


def evict(index: Path) -> None:
    """Drop the index's files from the page cache (clean pages only; nothing else is touched)."""
    for f in index.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
