"""The scale benchmark's streamed generator and its runner, at small sizes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.scale.corpus import SELECTIVITY, Generator, ScaleSpec, buckets
from stair_es.vocab import default_vocabulary


def test_chunks_are_deterministic_and_independent_of_corpus_size():
    a = Generator(ScaleSpec(5000, "iid", seed=3, chunk=1000))
    b = Generator(ScaleSpec(3000, "iid", seed=3, chunk=1000))
    for x, y in zip(a.chunk(2), b.chunk(2)):
        assert np.array_equal(x, y)
    c = Generator(ScaleSpec(5000, "iid", seed=4, chunk=1000))
    assert not np.array_equal(a.chunk(2)[1], c.chunk(2)[1])


def test_rows_have_the_corpora_shape():
    spec = ScaleSpec(2000, "iid", chunk=2000)
    indptr, ids, w = Generator(spec).chunk(0)
    lens = np.diff(indptr)
    assert lens.min() >= 100 and lens.max() <= 300 and 180 < lens.mean() < 220
    special = default_vocabulary().special_mask
    assert not special[ids].any()
    for r in range(0, 2000, 97):
        row = ids[indptr[r] : indptr[r + 1]]
        assert np.all(np.diff(row) > 0)  # sorted, distinct
    assert w.min() > 0 and 0.7 < w.mean() < 0.9  # gamma(2, 0.4): mean 0.8
    # Zipf-like: the most frequent token is in most documents, the median one in few
    df = np.bincount(ids, minlength=special.size)
    assert df.max() > 0.5 * 2000 and np.median(df[df > 0]) < 0.05 * 2000


def test_idf_weights_are_the_iid_ones_scaled_down_for_frequent_tokens():
    iid = Generator(ScaleSpec(1000, "iid", chunk=1000))
    idf = Generator(ScaleSpec(1000, "idf", chunk=1000))
    (pa, ia, wa), (pb, ib, wb) = iid.chunk(0), idf.chunk(0)
    assert np.array_equal(pa, pb) and np.array_equal(ia, ib)
    assert np.allclose(wb, wa * idf.factor[ia])
    head = idf.by_rank[0]
    assert idf.factor[head] < 0.05 and idf.factor[idf.by_rank[5000]] == 1.0


def test_queries_are_captions_of_documents_in_the_corpus():
    spec = ScaleSpec(5000, "iid", chunk=1000, n_queries=40)
    g = Generator(spec)
    indptr, ids, w, targets = g.queries()
    assert indptr.size == 41 and targets.min() >= 0 and targets.max() < 5000
    lens = np.diff(indptr)
    assert lens.min() >= 5 and lens.max() <= 30
    again = g.queries()
    assert all(np.array_equal(x, y) for x, y in zip((indptr, ids, w, targets), again))
    # most of a query's tokens are in its target document
    t = int(targets[0])
    c = t // spec.chunk
    dp, di, _ = g.chunk(c)
    doc = set(di[dp[t - c * spec.chunk] : dp[t - c * spec.chunk + 1]].tolist())
    q = ids[indptr[0] : indptr[1]].tolist()
    assert sum(x in doc for x in q) >= 0.5 * len(q)


def test_bucket_filters_have_their_selectivity():
    b = buckets(0, 200_000)
    for name, bound in SELECTIVITY.items():
        share = float(np.mean(b < bound))
        want = bound / 1000
        assert abs(share - want) < max(0.1 * want, 0.0005), name


def test_bad_arguments_are_one_line_errors():
    from benchmarks.scale.run import main

    with pytest.raises(SystemExit, match="--docs wants"):
        main(["--docs", "lots"])
    with pytest.raises(SystemExit, match="unknown system 'lucene'"):
        main(["--docs", "1000", "--systems", "engine,lucene"])
    with pytest.raises(SystemExit, match="unknown weighting"):
        main(["--docs", "1000", "--weights", "bm25"])
    with pytest.raises(ValueError, match="unknown weighting"):
        ScaleSpec(10, "tfidf")


def test_systems_above_their_cap_are_skipped_with_the_reason(tmp_path, capsys):
    from benchmarks.scale.run import main

    out = tmp_path / "r.json"
    main(["--docs", "2000", "--chunk", "1000", "--queries", "5", "--weights", "iid", "--systems", "engine,seismic",
          "--cap", "engine=1000,seismic=1000", "--workdir", str(tmp_path / "w"), "--out", str(out)])
    res = json.loads(out.read_text())["results"]
    assert {r["system"] for r in res} == {"engine", "seismic"}
    assert all("above its cap of 1,000" in r["skipped"] for r in res)
    assert "above its cap" in capsys.readouterr().out


@pytest.mark.process
@pytest.mark.slow  # ~20 s on a quiet machine, 45 s under load: two worker processes, numba loads
def test_engine_and_scipy_agree_on_a_small_run(tmp_path):
    """End to end in worker processes: the engine's exact top-10 is the reference; scipy's brute
    force agrees with it, unfiltered and filtered (float16 storage can swap near-ties only)."""
    from benchmarks.scale.run import main

    out = tmp_path / "r.json"
    main(["--docs", "3000", "--chunk", "1000", "--queries", "20", "--budget-s", "2", "--weights", "idf",
          "--systems", "engine,bruteforce", "--workdir", str(tmp_path / "w"), "--out", str(out)])
    data = json.loads(out.read_text())
    by = {r["system"]: r for r in data["results"]}
    assert "error" not in by["engine"], by["engine"].get("error")
    eng, bf = by["engine"], by["bruteforce"]
    assert eng["bytes_per_posting"] < 6 and eng["postings"] > 3000 * 150
    assert bf["runs"]["bruteforce"]["recall"] >= 0.98
    for sel in ("50%", "5%", "0.1%"):
        assert eng["runs"][f"engine filtered {sel}"]["recall"] >= 0.98
    assert eng["runs"]["engine-taat"]["recall"] == 1.0
    assert eng["runs"]["engine"]["passes"] == 2 and "first_pass" in eng["runs"]["engine"]
    assert eng["runs"]["engine"]["qps_2"] > 0 and eng["runs"]["engine"]["latency_ms"]["p50_ms"] > 0
    rows = {r["label"]: r for r in data["table"]}
    assert rows["engine (steady: pass 2)"]["p50_ms"] is not None and rows["engine (first pass)"]["p50_ms"] is not None
    assert any("exact p50" in t for t in data["targets"])


def test_pisa_numpy_ingest_ranks_like_the_packages_indexer(tmp_path):
    pytest.importorskip("pyterrier_pisa", reason="pyterrier-pisa is not installed (the scale extra)")
    from benchmarks.corpora import Corpus, Csr
    from benchmarks.systems.pisa import Pisa

    spec = ScaleSpec(300, "idf", chunk=300, n_queries=15)
    g = Generator(spec)
    corpus = Corpus(None, Csr(*g.materialize()), Csr(*g.queries()[:3]))
    got = {}
    for ingest in ("numpy", "toks_indexer"):
        (tmp_path / ingest).mkdir()
        s = Pisa("pisa", {"ingest": ingest, "algorithms": ["maxscore"]}, tmp_path / ingest)
        s.build(corpus)
        s.prepare_queries(corpus)
        got[ingest] = [s.search_one(i, 10, {"algorithm": "maxscore"}).tolist() for i in range(15)]
    assert got["numpy"] == got["toks_indexer"]
    assert all(len(r) == 10 for r in got["numpy"])
