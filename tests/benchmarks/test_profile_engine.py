"""benchmarks.profile_engine runs the engine's own kernel (both strategies agree) on a small corpus."""

import re


def test_profile_engine_runs_the_engines_kernel(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STAIR_BENCH_CACHE", str(tmp_path))
    import benchmarks.corpora as corpora

    monkeypatch.setattr(corpora, "CACHE_DIR", tmp_path)
    from benchmarks import profile_engine

    assert profile_engine.main(["--docs", "2000", "--queries", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"bit-identical float32 scores as block-max for 5 of 5 queries", out), out
    assert "`_block_plan`" in out and "TAAT" in out
    assert not hasattr(profile_engine, "taat_topk") and not hasattr(profile_engine, "_phase_bounds")
