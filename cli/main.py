"""The `stair-es` command line: a thin layer over the stair_es library.

One module per command group; library errors become one-line messages with exit codes
(see :class:`cli.common.StairGroup`).
"""

from __future__ import annotations

import logging

import click

from stair_es import __version__

from .common import StairGroup
from .demo import demo
from .doc_cmds import delete, encode, encoders, get
from .index_cmds import index_group
from .ingest_cmd import ingest
from .neighbours_cmd import neighbours
from .search_cmds import explain, search


@click.group(cls=StairGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="stair-es")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """Learned sparse image search: index images as token weights, search them with text,
    filters and token clauses, and see why each result matched.

    Indices live in the embedded engine by default (no cluster needed); pass
    --backend elasticsearch|opensearch --url URL to use a cluster instead.
    Start with `stair-es demo`.
    """
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


for command in (index_group, ingest, search, explain, neighbours, get, delete, encode, encoders, demo):
    cli.add_command(command)


def _register_optional() -> None:
    """Command groups owned by other modules (STAIR training, benchmarks, the HTTP service)."""
    import importlib

    for module in ("stair_es.cli.stair_commands", "stair_es.cli.bench", "stair_es.cli.serve_cmds"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
            continue
        for command in getattr(mod, "COMMANDS", []):
            cli.add_command(command)


_register_optional()


def main() -> None:
    cli(prog_name="stair-es")


if __name__ == "__main__":
    main()
