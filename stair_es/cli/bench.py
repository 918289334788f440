"""`stair-es bench CONFIG`: run a benchmark config from a source checkout (see benchmarks/).

The benchmarks live beside the package in the repository, not in the wheel: this command finds
them next to this file and says so when they are not there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click


def _runner():
    try:
        from benchmarks import run
    except ImportError:
        root = Path(__file__).resolve().parent.parent / "benchmarks"
        if not (root / "run.py").exists():
            raise click.ClickException(
                "the benchmarks ship with the stair_es source checkout, not the installed package; "
                "run `stair-es bench` from a clone (pip install -e '.[bench]')") from None
        # Load the checkout's `benchmarks` package by its location, without editing sys.path
        # (which would let any module in the checkout shadow installed ones).
        import importlib.util

        spec = importlib.util.spec_from_file_location("benchmarks", root / "__init__.py", submodule_search_locations=[str(root)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = package
        spec.loader.exec_module(package)
        from benchmarks import run
    return run


@click.command("bench")
@click.argument("config")
@click.option("--out", type=click.Path(file_okay=False), help="Report folder [default: benchmarks/results/<config name>].")
@click.option("--es-url", envvar="STAIR_BENCH_ES_URL", help="Also run Elasticsearch at this URL (configs listing it). [env: STAIR_BENCH_ES_URL]")
@click.option("--os-url", envvar="STAIR_BENCH_OS_URL", help="Also run OpenSearch at this URL (configs listing it). [env: STAIR_BENCH_OS_URL]")
def bench(config: str, out: str | None, es_url: str | None, os_url: str | None) -> None:
    """Run benchmark CONFIG (a file, or a name under benchmarks/configs: tiny, 10k, 100k, 1m,
    visualsparta) and write JSON, Markdown and PNG reports.

    Each system (embedded engine, FAISS Flat/HNSW, Seismic, Elasticsearch/OpenSearch) is built and
    measured in its own process; progress goes to stderr, the report folder is printed at the end.
    """
    run = _runner()
    try:
        cfg = run.load_config(config)
    except (FileNotFoundError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    for var, url in (("STAIR_BENCH_ES_URL", es_url), ("STAIR_BENCH_OS_URL", os_url)):
        if url:
            os.environ[var] = url  # the worker processes inherit it
    result = run.run_config(cfg, Path(out) if out else None, progress=lambda msg: click.echo(msg, err=True))
    click.echo(str(Path(out) if out else run.RESULTS_DIR / cfg["name"]))
    skipped = [r for r in result["results"] if r["status"] != "ok"]
    for r in skipped:
        click.echo(f"{r['system']} ({r['size']:,} docs): {r['status']}: {r.get('reason', '')[:200]}", err=True)


COMMANDS = [bench]
