"""benchmarks/engine_ab.py and first_query.py on a small index: the same tree twice gives the same
hits with bit-identical scores; the scale benchmark's query files (CSR with ``ids``) are read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from stair_es.engine import EngineIndex
from stair_es.schema import IndexSchema
from stair_es.vocab import default_vocabulary

ROOT = Path(__file__).resolve().parents[2]
TOKENS = np.flatnonzero(~default_vocabulary().special_mask)[1000:1200]


def _index_and_queries(tmp_path) -> tuple[Path, Path]:
    rng = np.random.default_rng(11)
    n = 3000
    rows = [np.sort(rng.choice(TOKENS.size, size=25, replace=False)) for _ in range(n)]
    indptr = np.zeros(n + 1, np.int64)
    indptr[1:] = np.cumsum([r.size for r in rows])
    ids = TOKENS[np.concatenate(rows)].astype(np.int32)
    ix = EngineIndex.create(tmp_path / "ix", IndexSchema(sparse_fields=("image",)))
    ix.add_arrays([str(i) for i in range(n)], {"image": (indptr, ids, rng.uniform(0.1, 2.0, ids.size).astype(np.float32))})
    ix.close()
    qi = np.concatenate([TOKENS[i:i + 12] for i in range(0, 60, 10)]).astype(np.int32)
    qp = np.arange(0, qi.size + 1, 12, dtype=np.int64)
    q = tmp_path / "queries.npz"
    np.savez(q, indptr=qp, ids=qi, weights=np.linspace(0.5, 1.5, qi.size).astype(np.float32))  # as benchmarks.scale writes them
    return tmp_path / "ix", q


def test_engine_ab_same_tree_twice_same_hits_and_p99(tmp_path):
    ix, q = _index_and_queries(tmp_path)
    out = tmp_path / "ab.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_ab.py"), "--index", str(ix), "--queries-npz", str(q),
                        "--queries", "6", "--tree", f"a={ROOT}", "--tree", f"b={ROOT}", "--rounds", "1", "--passes", "1",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "p99 wall / CPU ms" in p.stdout
    assert "bit-identical scores on every query in every tree and round: True" in p.stdout
    res = json.loads(out.read_text())
    assert res["same"] and len(res["workers"]["a"][0]["hits"]) == 6


def test_first_query_reports_faults_per_pass(tmp_path):
    ix, q = _index_and_queries(tmp_path)
    out = tmp_path / "fq.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "first_query.py"), "--index", str(ix), "--queries-npz", str(q),
                        "--queries", "6", "--rounds", "1", "--variants", "today,no-map-ahead,mapped", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())["results"]
    for v in ("today", "no-map-ahead", "mapped"):
        run = res[v][0]
        assert len(run["first"]) == len(run["steady"]) == 6
        assert run["first_faults"]["minflt"] >= 0 and run["steady_faults"]["majflt"] >= 0
    assert "mapping_s" in res["mapped"][0]
