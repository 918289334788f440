"""`stair-es demo`: the main job end to end on the sample catalog, with no download.

Writes real photos that ship inside installed packages to a folder, ingests them into the
embedded engine, then runs example searches (filter, whitelist, blacklist, token
expression, --explain) -- each printed as the command a user would type.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

DEMO_QUERIES: tuple[tuple[str, ...], ...] = (
    ("search", "samples", "a cat", "--top-k", "3", "--explain"),
    ("search", "samples", "space rocket", "--where", "kind=photo", "--top-k", "3"),
    ("search", "samples", "a man in uniform", "--where", "added>=2024-01-08", "--require", "uniform", "--top-k", "3"),
    ("search", "samples", "a cup of coffee", "--exclude", "espresso", "--top-k", "3"),
    ("search", "samples", "stone", "--expr", "(stone OR wall) NOT brick", "--caption-weight", "0", "--top-k", "3"),
    ("explain", "samples", "chelsea"),
)


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False), default="stair-es-demo", show_default=True,
              help="Where the sample photos, manifest and (unless --home is given) the index go.")
@click.option("--home", type=click.Path(file_okay=False), help="Embedded-engine home for the demo index.")
@click.option("--keep", is_flag=True, help="Keep an existing demo index instead of rebuilding it.")
def demo(workdir: str, home: str | None, keep: bool) -> None:
    """Ingest the sample catalog into the embedded engine and run example searches."""
    from stair_es.samples import write_sample_catalog

    from .main import cli

    work = Path(workdir)
    home = home or str(work / "indices")
    missing = []
    manifest = write_sample_catalog(work / "catalog", on_error=lambda s, e: missing.append(f"{s.id}: {e}"))
    for m in missing:
        click.echo(f"sample skipped: {m}", err=True)
    base = ["--home", home]

    def run(*args: str) -> None:
        args_l = list(args)
        click.echo("\n$ stair-es " + " ".join(shlex.quote(a) for a in args_l + base))
        cli.main(args=args_l + base, prog_name="stair-es", standalone_mode=False)

    if not keep:
        from stair_es.backends.base import get_backend

        be = get_backend("embedded", home=home)
        try:
            if "samples" in be.list_indices():
                be.delete_index("samples")
        finally:
            be.close()
        run("index", "create", "samples", "--field", "added=date")
    run("ingest", "samples", str(manifest))
    run("index", "stats", "samples")
    for q in DEMO_QUERIES:
        run(*q)
    click.echo(f"\nDone. The index is in {home}; try: stair-es search samples \"your words\" --home {shlex.quote(home)}")
