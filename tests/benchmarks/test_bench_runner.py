"""The benchmark runner end to end on the shipped tiny config (CI keeps it from rotting), plus
the corpus generator and recall scoring it relies on."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks import corpora, run
from benchmarks.corpora import CorpusSpec, load_corpus, prune_rows
from stair_es.vocab import default_vocabulary


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    cfg = run.load_config("tiny")
    return run.run_config(cfg, out, cache_dir=tmp_path_factory.mktemp("cache")), out


def test_tiny_config_writes_reports_with_provenance(tiny_result):
    result, out = tiny_result
    for name in ("results.json", "report.md", "latency_vs_size.png", "recall_vs_latency.png"):
        assert (out / name).stat().st_size > 0, name
    saved = json.loads((out / "results.json").read_text())
    assert saved["git"]["commit"] and saved["machine"]["cores"] >= 1 and saved["versions"]["numpy"]
    md = (out / "report.md").read_text()
    assert "speed-up vs Flat" in md and "## Targets" in md


def test_exact_systems_agree_and_skips_say_why(tiny_result):
    result, _ = tiny_result
    by_name = {(r["system"], r["doc_top_n"]): r for r in result["results"]}
    for name in ("bruteforce", "faiss-flat"):
        r = by_name[(name, None)]
        assert r["status"] == "ok", r.get("reason")
        assert r["settings"][0]["recall@10"] == 1.0
        assert r["settings"][0]["latency_ms"]["p50_ms"] > 0 and r["peak_rss_mb"] > 0
    for r in result["results"]:
        assert r["status"] in ("ok", "skipped"), r.get("traceback") or r.get("reason")
        if r["status"] == "skipped":
            assert r["reason"]
    engine = by_name[("engine", None)]
    if engine["status"] == "ok":  # exact: only reduced weight precision may swap near-ties
        assert engine["settings"][0]["recall@10"] >= 0.99


def test_corpus_is_seeded_and_follows_the_spec(tmp_path):
    spec = CorpusSpec(n_docs=500, n_queries=20, doc_nnz=(50, 80), query_nnz=(5, 9), seed=3)
    a = load_corpus(spec, tmp_path)
    b = load_corpus(spec, tmp_path / "other")
    assert np.array_equal(a.docs.indices, b.docs.indices) and np.array_equal(a.queries.weights, b.queries.weights)
    special = default_vocabulary().special_mask
    for m, (lo, hi) in ((a.docs, spec.doc_nnz), (a.queries, spec.query_nnz)):
        lens = np.diff(m.indptr)
        assert lens.max() <= hi and lens.min() >= lo // 2  # repeats of common tokens merge
        assert not special[m.indices].any() and (m.weights > 0).all()
        for i in range(m.n_rows):
            ids, _ = m.row(i)
            assert (np.diff(ids) > 0).all()
    assert a.dense_docs().shape == (500, 512)


def test_prune_rows_keeps_each_rows_heaviest_tokens():
    m = corpora.Csr(np.array([0, 3, 5]), np.array([1, 2, 3, 4, 5], np.int32), np.array([0.5, 2.0, 1.0, 0.1, 0.2], np.float32))
    p = prune_rows(m, 2)
    assert p.indptr.tolist() == [0, 2, 4]
    assert p.indices.tolist() == [2, 3, 4, 5] and p.weights.tolist() == pytest.approx([2.0, 1.0, 0.1, 0.2])


def test_sparse_recall_counts_ties_at_the_kth_score(tmp_path):
    docs = corpora.Csr(np.array([0, 1, 2, 3]), np.array([7, 7, 8], np.int32), np.array([1.0, 1.0, 0.5], np.float32))
    queries = corpora.Csr(np.array([0, 1]), np.array([7], np.int32), np.array([1.0], np.float32))
    c = corpora.Corpus(CorpusSpec(n_docs=3, n_queries=1), docs, queries)
    truth = np.array([[0, -1]])
    assert run.sparse_recall(c, np.array([[1, -1]]), truth, 1) == 1.0  # doc 1 ties doc 0
    assert run.sparse_recall(c, np.array([[2, -1]]), truth, 1) == 0.0


def test_cli_bench_rejects_an_unknown_config():
    from stair_es.cli.bench import bench

    res = CliRunner().invoke(bench, ["no-such-config"])
    assert res.exit_code == 2 and "shipped configs" in res.output
