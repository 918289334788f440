"""A one-shot `stair-es search` on an OpenSearch index: document frequencies counted every time vs remembered.

    python benchmarks/cluster_freqs.py --docs 20000,100000          # on the osmem-server emulator

Every text query needs its index's document frequencies, and on a cluster they are a scan of
the whole index (``ClusterBackend.doc_freqs``). Since 2026-11-28 they are remembered on the
machine while the index's document count holds (``stair_es.backends.cluster.freqs``). This
starts the OpenSearch emulator (``osmem-server``, the ``emulators`` extra) on loopback, ingests
``--docs`` documents of 5 words each (the ``bow`` encoder: no model), and times ``--runs`` CLI
searches as new processes with ``STAIR_ES_CLUSTER_STATS_TTL=0`` (counted every time) and then
with the default (the first run counts and remembers). Each run gets its own empty data home.
An emulator is not a cluster: the figures show the scan's share of a search, not a cluster's
speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import provenance_line  # noqa: E402

WORDS = ("cat dog car tree sky water house person red blue green street beach mountain flower bird boat road snow "
         "city").split()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", default="20000,100000", help="comma-separated index sizes")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    try:
        from osmem_server import OsmemServer
    except ImportError:
        sys.exit("error: the OpenSearch emulator is not installed (pip install 'stair-es[emulators]')")
    from stair_es.backends.base import get_backend
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector

    cli = str(Path(sys.executable).with_name("stair-es"))
    print(f"# {provenance_line()}")
    print(f"{'docs':>8} {'counted every time':>19} {'remembered (first, then median)':>32}")
    for n in (int(x) for x in args.docs.split(",")):
        server = OsmemServer.start(japanese=False, startup_timeout=60)
        home = Path(tempfile.mkdtemp(prefix="stair-es-freqs-"))
        try:
            backend = get_backend("opensearch", urls=server.url, timeout=300)
            backend.create_index("photos", IndexSchema(encoder={"name": "bow"}))
            rng = np.random.default_rng(n)
            docs = (Document(f"d{i}", {"image": SparseVector.from_token_map(
                {WORDS[j]: float(rng.uniform(0.2, 2.0)) for j in rng.choice(len(WORDS), 5, replace=False)})})
                for i in range(n))
            assert not backend.ingest("photos", docs).failures
            backend.request("POST", "/photos/_refresh")
            backend.close()
            times: dict[str, list[float]] = {"0": [], "": []}
            for ttl in times:
                env = {**os.environ, "STAIR_ES_HOME": str(home), "STAIR_ES_RERANK": "off"}
                env.pop("STAIR_ES_CLUSTER_STATS_TTL", None)
                if ttl:
                    env["STAIR_ES_CLUSTER_STATS_TTL"] = ttl
                for _ in range(args.runs):
                    t = time.perf_counter()
                    done = subprocess.run([cli, "search", "photos", "a red car", "--backend", "opensearch", "--url",
                                           server.url, "-k", "3"], capture_output=True, text=True, env=env)
                    if done.returncode:
                        sys.exit(f"error: stair-es search failed: {done.stderr.strip()[-300:]}")
                    times[ttl].append(time.perf_counter() - t)
            every, kept = times["0"], times[""]
            print(f"{n:>8,} {statistics.median(every):>17.2f} s {kept[0]:>18.2f} s, then {statistics.median(kept[1:]):.2f} s",
                  flush=True)
        finally:
            server.close()
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
