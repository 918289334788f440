"""The `stair-es` command line: a thin layer over the stair_es library.

One module per command group; library errors become one-line messages with exit codes
(see :class:`cli.common.StairGroup`).
"""

from __future__ import annotations

import importlib
import logging

import click

from stair_es import __version__

from .common import StairGroup

#: Commands and the module that defines each, imported only when the command runs (or help
#: lists it): a search never pays for the ingest pipeline, the demo or the encoder listing.
LAZY_COMMANDS = {
    "index": "stair_es.cli.index_cmds:index_group",
    "ingest": "stair_es.cli.ingest_cmd:ingest",
    "encode-catalog": "stair_es.cli.encode_catalog_cmd:encode_catalog",
    "search": "stair_es.cli.search_cmds:search",
    "explain": "stair_es.cli.search_cmds:explain",
    "neighbours": "stair_es.cli.neighbours_cmd:neighbours",
    "rank-eval": "stair_es.cli.rank_eval_cmd:rank_eval",
    "get": "stair_es.cli.doc_cmds:get",
    "delete": "stair_es.cli.doc_cmds:delete",
    "encode": "stair_es.cli.doc_cmds:encode",
    "encoders": "stair_es.cli.doc_cmds:encoders",
    "demo": "stair_es.cli.demo:demo",
    "models": "stair_es.cli.models_cmd:models_group",
}


class LazyStairGroup(StairGroup):
    """A :class:`StairGroup` whose commands are imported on first use (``LAZY_COMMANDS``)."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=LazyStairGroup, lazy=LAZY_COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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


def _register_optional() -> None:
    """Command groups owned by other modules (STAIR training, benchmarks, the HTTP service)."""
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
