"""``python -m benchmarks.scale.merge`` merges a hard-linked copy of an index and leaves the source alone."""

from __future__ import annotations

import numpy as np

from benchmarks.scale import merge
from stair_es.engine import EngineIndex
from stair_es.schema import IndexSchema
from stair_es.vocab import default_vocabulary

TOKENS = np.flatnonzero(~default_vocabulary().special_mask)[2000:2100]


def test_merge_copy_into_fewer_segments(tmp_path):
    rng = np.random.default_rng(2)
    src = tmp_path / "src"
    ix = EngineIndex.create(src, IndexSchema(sparse_fields=("image",)))
    ix.max_segments = 100
    for b in range(4):
        rows = [np.sort(rng.choice(TOKENS, size=10, replace=False)) for _ in range(50)]
        indptr = np.concatenate(([0], np.cumsum([r.size for r in rows])))
        ix.add_arrays([f"{b}-{i}" for i in range(50)],
                      {"image": (indptr, np.concatenate(rows).astype(np.int32), rng.uniform(0.1, 1, indptr[-1]).astype(np.float32))})
    ix.close()
    res = merge.main(["--index", str(src), "--dest", str(tmp_path / "dst"), "--max-segments", "2",
                      "--out", str(tmp_path / "m.json")])
    assert (res["segments_before"], res["segments_after"], res["docs"]) == (4, 2, 200)
    assert res["peak_anon_gb"] >= 0 and (tmp_path / "m.json").exists()
    with EngineIndex.open(src) as a:
        assert len(a._segs) == 4 and a.stats()["docs"] == 200
