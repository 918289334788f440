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
    # plain text search, each hit explained token by token
    ("search", "samples", "a cat", "--top-k", "3", "--explain"),
    # metadata filter: only photos (the Hubble field and the moon are kind=scientific)
    ("search", "samples", "space", "--where", "kind=photo", "--top-k", "3"),
    # whitelist with a date filter: documents must contain the token "uniform"
    ("search", "samples", "a man in uniform", "--where", "added>=2024-01-08", "--require", "uniform", "--top-k", "3"),
    # index-side blacklist: drop documents whose image has the token "missile"
    ("search", "samples", "space", "--exclude", "missile", "--top-k", "3"),
    # boolean token expression over image tokens (STAIR appendix D)
    ("search", "samples", "a drink or a pet", "--expr", "(cat OR coffee) NOT tiger", "--top-k", "3"),
    # a document's own top tokens
    ("explain", "samples", "chelsea"),
)


@click.command("demo")
@click.option("--workdir", type=click.Path(file_okay=False), default="stair-es-demo", show_default=True,
              help="Where the sample photos, manifest and (unless --home is given) the index go.")
@click.option("--home", type=click.Path(file_okay=False), help="Embedded-engine home for the demo index.")
@click.option("--keep", is_flag=True, help="Keep an existing demo index instead of rebuilding it.")
@click.pass_context
def demo(ctx: click.Context, workdir: str, home: str | None, keep: bool) -> None:
    """Ingest the sample catalog into the embedded engine and run example searches."""
    from stair_es.samples import write_sample_catalog

    cli = ctx.find_root().command  # the `stair-es` group this command runs in (no import of cli.main)

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
