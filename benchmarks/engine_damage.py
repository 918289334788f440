"""Damage at rest, measured: random bit flips in every kind of index file, and what checksums cost.

    python benchmarks/engine_damage.py --flips 240                      # this checkout
    /path/to/old/.venv/bin/python benchmarks/engine_damage.py --flips 240   # the same with another stair_es
    python benchmarks/engine_damage.py --flips 0 --cost-docs 1000000    # checksum cost on open and search

Bit flips: builds an index of ``--docs`` documents in 3 segments with tombstones, then for each
flip copies it, flips one random bit of one file (segments weighted by size, tombstones and the
manifest picked as often as a segment), and answers 120 queries covering every token of the
corpus (top 20) and 31 ``get`` calls in a *subprocess*
(so a crash is seen, not suffered). Each flip ends as: ``detected`` (a clear stair_es error),
``same`` (identical answers: the bit was in padding or a field no answer reads), ``WRONG``
(different answers and exit 0: a silent wrong answer) or ``CRASH`` (killed by a signal or an
internal error). Prints the table per file kind.

Cost: builds ``--cost-docs`` documents of ~200 tokens (one segment after ``optimize``), then,
with checksums (the default) and with ``STAIR_ES_VERIFY=size`` (sizes and footers only), each
in ``--runs`` fresh processes: the time to open the index, the first query, the median of the
first pass over 100 queries (postings read, and verified, for the first time) and the median
of two more passes (steady state); then, in ``--runs`` more processes, the same first-read cost
query by query with the checksums switched on and off between queries (see ``COST_AB``: the
steadier figure on a shared machine). Run it with the stair_es you want to measure: the script
uses the public EngineIndex API, and Segment.verifier for that switch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import provenance_line  # noqa: E402

ANSWER = r"""
import json, sys, numpy as np
from stair_es.engine import EngineIndex
from stair_es.errors import DocumentNotFoundError, StairError
from stair_es.query import SearchRequest, SparseClause
from stair_es.sparse import SparseVector
try:
    with EngineIndex.open(sys.argv[1]) as ix:
        if len(sys.argv) > 2 and sys.argv[2] == "numba":  # the numba kernels (they verify as they read), not numpy
            ix.numpy_max_postings = 0
        out = []
        for i in range(0, 600, 5):  # every token of the corpus is in some query
            ids = np.arange(2000 + i, 2005 + i, dtype=np.int64)
            res = ix.search(SearchRequest([SparseClause("image", SparseVector.from_arrays(ids, np.linspace(1.0, 0.2, 5)))], top_k=20))
            out.append([[h.id, round(h.score, 4)] for h in res.hits])
        for d in range(1, 3000, 97):
            try:
                out.append(sorted(ix.get(f"d{d}").vectors["image"].to_token_map().items()))
            except DocumentNotFoundError:
                out.append("deleted")  # a deleted document: not found, as it should be
        out.append(ix.doc_count)
    print(json.dumps({"ok": out}))
except StairError as e:
    print(json.dumps({"error": str(e)}))
"""


def build(path: Path, n_docs: int) -> None:
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    rng = np.random.default_rng(0)
    ix = EngineIndex.create(path, IndexSchema())
    ix.max_segments = 100
    per = n_docs // 3
    for b in range(3):
        nnz = 30
        ids = np.sort(np.stack([rng.choice(np.arange(2000, 2600), nnz, replace=False) for _ in range(per)]), axis=1)
        indptr = np.arange(0, per * nnz + 1, nnz, dtype=np.int64)
        w = rng.uniform(0.05, 2.5, per * nnz).astype(np.float32)
        ix.add_arrays([f"d{b * per + i}" for i in range(per)], {"image": (indptr, ids.reshape(-1).astype(np.int64), w)})
    ix.delete([f"d{i}" for i in range(0, n_docs, 37)])
    ix.close()


KERNELS = "numpy"  # --kernels: which search path the answering process uses on these small segments


def answer(path: Path) -> tuple[str, str]:
    # (cwd: `python -c` puts the working directory first on sys.path, so a checkout there would be
    # imported instead of the stair_es this script runs with, e.g. one given by PYTHONPATH)
    done = subprocess.run([sys.executable, "-c", ANSWER, str(path), KERNELS], capture_output=True, text=True, timeout=300,
                          cwd=path.parent)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return "CRASH", f"exit {done.returncode}: {tail[:120]}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return ("error", out["error"]) if "error" in out else ("ok", json.dumps(out["ok"]))


def kind_of(name: str) -> str:
    if name == "manifest.json":
        return "manifest"
    if ".del." in name:
        return "tombstones"
    return "segment" if name.endswith(".seg") else "other"


def flips(n: int, n_docs: int, seed: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="stair-es-damage-"))
    try:
        base = work / "base"
        build(base, n_docs)
        status, expected = answer(base)
        assert status == "ok", expected
        files = sorted(p for p in base.iterdir() if p.is_file() and p.name != "write.lock")
        by_kind = defaultdict(list)
        for p in files:
            by_kind[kind_of(p.name)].append(p)
        rng = random.Random(seed)
        table: dict[str, Counter] = defaultdict(Counter)
        examples: dict[str, str] = {}
        for i in range(n):
            kind = rng.choice(sorted(by_kind))
            src = rng.choice(by_kind[kind])
            copy = work / f"c{i}"
            shutil.copytree(base, copy)
            target = copy / src.name
            data = bytearray(target.read_bytes())
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
            target.write_bytes(bytes(data))
            status, detail = answer(copy)
            outcome = {"error": "detected", "CRASH": "CRASH"}.get(status) or ("same" if detail == expected else "WRONG")
            table[kind][outcome] += 1
            if outcome in ("WRONG", "CRASH") or (outcome == "detected" and "detected" not in examples):
                examples.setdefault(outcome, f"{src.name}@{pos}: {detail[:150]}")
            shutil.rmtree(copy)
        import stair_es

        print(f"# {n} random bit flips, stair_es from {Path(stair_es.__file__).parent}, index of {n_docs} docs "
              f"({len(by_kind['segment'])} segments, tombstones); search path: {KERNELS}\n# {provenance_line()}")
        print(f"{'file kind':<12} {'flips':>5} {'detected':>9} {'same':>5} {'WRONG':>6} {'CRASH':>6}")
        total = Counter()
        for kind, c in sorted(table.items()):
            total.update(c)
            print(f"{kind:<12} {sum(c.values()):>5} {c['detected']:>9} {c['same']:>5} {c['WRONG']:>6} {c['CRASH']:>6}")
        print(f"{'all':<12} {sum(total.values()):>5} {total['detected']:>9} {total['same']:>5} {total['WRONG']:>6} {total['CRASH']:>6}")
        for k, v in examples.items():
            print(f"e.g. {k}: {v}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


COST = r"""
import os, sys, time, statistics, numpy as np
t = time.perf_counter()
from stair_es.engine import EngineIndex
from stair_es.query import SearchRequest, SparseClause
from stair_es.sparse import SparseVector
t0, c0 = time.perf_counter(), time.thread_time()
ix = EngineIndex.open(sys.argv[1])
opened, opened_cpu = time.perf_counter() - t0, time.thread_time() - c0
rng = np.random.default_rng(1)
reqs = []
for i in range(100):
    ids = np.sort(rng.choice(np.arange(1000, 30000), 20, replace=False))
    reqs.append(SearchRequest([SparseClause("image", SparseVector.from_arrays(ids, rng.uniform(0.1, 2, 20)))], top_k=10))
lat, cpu = [], []
for rep in range(3):  # pass 1: every query reads (and verifies) its postings for the first time; then steady state
    for req in reqs:
        s, c = time.perf_counter(), time.thread_time()
        ix.search(req)
        lat.append(time.perf_counter() - s); cpu.append(time.thread_time() - c)
n = len(reqs)
print(opened, lat[0], statistics.median(lat[1:n]), statistics.median(lat[n:]), statistics.median(cpu[1:n]),
      statistics.median(cpu[n:]), cpu[0], opened_cpu + sum(cpu[1:n]))  # (the first query loads numba: shown apart)
"""

# The same first-read cost measured query by query in one process: every query has tokens no
# earlier query had (a permutation of the vocabulary, 20 per query), and the segments' checksum
# verifier is switched on and off between queries (ABBA order; "off" is what STAIR_ES_VERIFY=size
# gives a search: no verification, the kernels without checksum arguments). Both modes see the
# same machine load, page cache and process state, so this is the steadier figure on a shared
# machine. (It reaches into the engine for the switch: Segment.verifier.)
COST_AB = r"""
import sys, time, numpy as np
from stair_es.engine import EngineIndex
from stair_es.query import SearchRequest, SparseClause
from stair_es.sparse import SparseVector
ix = EngineIndex.open(sys.argv[1])
segs = [s.seg for s in ix._segs]
vers = [s.verifier for s in segs]
rng = np.random.default_rng(int(sys.argv[2]))
toks = rng.permutation(np.arange(1000, 30000))
def req(i):
    ids = np.sort(toks[i * 20:(i + 1) * 20])
    return SearchRequest([SparseClause("image", SparseVector.from_arrays(ids, rng.uniform(0.1, 2, 20)))], top_k=10)
n = toks.size // 20
got = {True: [], False: []}
for i in range(n):
    on = i == 0 or (i // 2) % 2 == i % 2
    for s, v in zip(segs, vers):
        s.verifier = v if on else None
    r = req(i)
    c = time.thread_time()
    ix.search(r)
    if i >= 2:  # the first query of each mode loads its kernel
        got[on].append(time.thread_time() - c)
print(np.median(got[True]), np.median(got[False]), len(got[True]) + len(got[False]))
"""


def cost(n_docs: int, runs: int, keep: str | None = None) -> None:
    from stair_es.engine import EngineIndex
    from stair_es.schema import IndexSchema

    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="stair-es-cost-"))
    try:
        path = work / "ix"
        if not (path / "manifest.json").is_file():
            shutil.rmtree(path, ignore_errors=True)
            rng = np.random.default_rng(0)
            ix = EngineIndex.create(path, IndexSchema())
            chunk = 100_000
            for start in range(0, n_docs, chunk):
                n = min(chunk, n_docs - start)
                nnz = rng.integers(150, 250, n)
                indptr = np.concatenate([[0], np.cumsum(nnz)]).astype(np.int64)
                ids = np.concatenate([np.sort(rng.choice(np.arange(1000, 30000), k, replace=False)) for k in nnz]).astype(np.int64)
                w = rng.uniform(0.05, 2.5, ids.size).astype(np.float32)
                ix.add_arrays([f"d{start + i}" for i in range(n)], {"image": (indptr, ids, w)})
            ix.optimize()
            ix.close()
        size = sum(p.stat().st_size for p in path.iterdir() if p.is_file()) / 1e6
        rows = {}
        import stair_es

        print(f"# stair_es from {Path(stair_es.__file__).parent}, {n_docs:,} docs, {size:.0f} MB; medians of {runs} fresh processes per mode, the modes interleaved; "
              "search = 100 queries of 20 tokens, top 10, pass 1 (first reads) then 2 more passes (steady state)\n"
              f"# {provenance_line()}")
        modes = (("checksums", "full"), ("sizes only", "size"))
        got: dict[str, list] = {label: [] for label, _ in modes}
        for _ in range(runs):  # interleaved, so both modes see the same machine load
            for label, verify in modes:
                env = dict(os.environ, STAIR_ES_VERIFY=verify)
                out = subprocess.run([sys.executable, "-c", COST, str(path)], capture_output=True, text=True, env=env,
                                     check=True, cwd=work)
                got[label].append(list(map(float, out.stdout.split())))
        ab = []
        for r in range(runs):  # the in-process A/B (see COST_AB), a different permutation per run
            out = subprocess.run([sys.executable, "-c", COST_AB, str(path), str(r)], capture_output=True, text=True,
                                 env=dict(os.environ, STAIR_ES_VERIFY="full"), check=True, cwd=work)
            ab.append(list(map(float, out.stdout.split())))
        for label, _ in modes:
            rows[label] = [statistics.median(col) for col in zip(*got[label])]
            o, first, p1, steady, c1, cs, cf, tot = rows[label]
            print(f"{label:<11} open {o * 1000:8.1f} ms   first query {first * 1000:7.2f} ms (CPU {cf * 1000:6.1f})   pass-1 p50 {p1 * 1000:6.2f} ms   "
                  f"steady p50 {steady * 1000:6.2f} ms   CPU p50 pass-1 {c1 * 1000:6.2f} ms, steady {cs * 1000:6.2f} ms   "
                  f"CPU open + pass 1 {tot * 1000:6.1f} ms   "
                  f"(pass-1 CPU p50 per run: {', '.join(f'{r[4] * 1000:.2f}' for r in got[label])})")
        (fo, ff, f1, fs, fc1, fcs, fcf, ft), (so, sf, s1, ss, sc1, scs, scf, st) = rows["checksums"], rows["sizes only"]
        print(f"checksum cost: open {(fo - so) * 1000:+.1f} ms ({(fo / max(so, 1e-9) - 1) * 100:+.1f} %), first query "
              f"{(ff - sf) * 1000:+.2f} ms wall, {(fcf - scf) * 1000:+.1f} ms CPU (numba's import and start included in both), pass-1 p50 {(f1 / max(s1, 1e-9) - 1) * 100:+.1f} % wall, "
              f"{(fc1 / max(sc1, 1e-9) - 1) * 100:+.1f} % CPU; steady p50 {(fs / max(ss, 1e-9) - 1) * 100:+.1f} % wall, "
              f"{(fcs / max(scs, 1e-9) - 1) * 100:+.1f} % CPU; open + the 99 first-read queries after the first {(ft / max(st, 1e-9) - 1) * 100:+.1f} % CPU; "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"same process, checksums switched on and off between first-read queries ({int(ab[0][2])} queries per run, "
              f"CPU p50 on / off): " + ", ".join(f"{a * 1000:.2f} / {b * 1000:.2f} ms ({(a / b - 1) * 100:+.1f} %)" for a, b, _ in ab)
              + f"; median {statistics.median((a / b - 1) * 100 for a, b, _ in ab):+.1f} %")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flips", type=int, default=240)
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cost-docs", type=int, default=0, help="also measure the checksum cost at this many documents")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kernels", choices=("numpy", "numba"), default="numpy",
                    help="search path of the answering process: numpy (what these small segments use) or numba "
                         "(the block-max kernels, which verify postings as they read them)")
    ap.add_argument("--keep", metavar="DIR", help="build the cost index in DIR and keep it (reused when it exists)")
    args = ap.parse_args()
    global KERNELS
    KERNELS = args.kernels
    if args.flips:
        flips(args.flips, args.docs, args.seed)
    if args.cost_docs:
        cost(args.cost_docs, args.runs, args.keep)


if __name__ == "__main__":
    main()
