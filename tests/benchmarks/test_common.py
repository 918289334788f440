"""benchmarks/common: the one naming of latency figures and the provenance every report carries."""

import os

from benchmarks.common import Timer, machine_info, percentiles, provenance_line, stat


def test_latency_figures_have_one_naming_and_old_results_still_read():
    figs = percentiles([1.0, 2.0, 3.0, 4.0, 100.0])
    assert set(figs) == {"p50_ms", "p95_ms", "p99_ms", "mean_ms", "n"} and figs["p50_ms"] == 3.0 and figs["n"] == 5
    assert percentiles([]) == {}
    assert stat(figs, "p50") == stat({"p50": 3.0}, "p50_ms") == 3.0


def test_provenance_line_names_the_commit_and_the_machine():
    info = machine_info()
    line = provenance_line(info)
    assert line.startswith(f"commit {info['commit'] or 'unknown'};") and f"{os.cpu_count()} cores" in line
    assert info["started"] in line and f"Python {info['python']}" in line


def test_timer_gives_wall_and_cpu_time_of_a_block():
    with Timer() as t:
        sum(i * i for i in range(200_000))
    assert t.wall_s > 0 and t.cpu_s > 0 and t.wall_ms == t.wall_s * 1000
