"""Every `stair-es ...` command shown in the README and docs/ must be a valid command line.

Each example is parsed by the real CLI (command names, option names, option values and
argument counts, with click's own parser) without running it: examples name files and
clusters the test machine does not have. A renamed option or command then fails here
instead of in a user's terminal. Lines that are prose about commands rather than commands
(``stair-es index list / stats NAME / delete NAME``) are listed in :data:`NOT_COMMANDS`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from stair_es.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
NOT_COMMANDS = (
    "stair-es index list / stats NAME / delete NAME",
    "stair-es index check NAME [--repair]",
)
_PLACEHOLDER = re.compile(r"<[^>]+>")


def _examples() -> list[tuple[str, int, str]]:
    out = []
    for doc in DOCS:
        lines = doc.read_text("utf-8").splitlines()
        in_code = False
        i = 0
        while i < len(lines):
            line = lines[i]
            if line.lstrip().startswith("```"):
                in_code = not in_code
                i += 1
                continue
            text = line.strip().removeprefix("$ ").strip()
            start = i
            if (in_code or line.startswith("    ")) and text.startswith("stair-es "):
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1] + " " + lines[i].strip()
                for part in text.split("&&"):
                    part = part.strip()
                    if part.startswith("stair-es ") and not any(part.startswith(n) for n in NOT_COMMANDS):
                        out.append((doc.relative_to(ROOT).as_posix(), start + 1, part))
            i += 1
    return out


def _parse(args: list[str]) -> None:
    """Resolve the command chain and parse its options exactly as a run would, without invoking it."""
    group: click.Command = cli
    ctx = group.make_context("stair-es", list(args), resilient_parsing=False)
    while isinstance(group, click.Group):
        rest = ctx.protected_args + ctx.args
        if not rest:
            return
        name, command, rest = group.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
        group = command


EXAMPLES = _examples()


def test_the_docs_have_examples():
    assert len(EXAMPLES) > 40


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # click 8.2 deprecates reading protected_args
@pytest.mark.parametrize("doc,line,example", EXAMPLES, ids=[f"{d}:{n}" for d, n, _ in EXAMPLES])
def test_example_is_a_valid_command_line(doc, line, example):
    text = example.split("  #")[0].split(" # ")[0]  # a trailing comment
    text = _PLACEHOLDER.sub("X", text).replace("...", "http://127.0.0.1:9200")
    args = shlex.split(text)[1:]
    try:
        _parse(args)
    except click.UsageError as e:
        if "does not exist" in e.format_message():  # an input file the example names: the user's, not ours
            return
        pytest.fail(f"{doc}:{line}: `{example}` is not a valid command line: {e.format_message()}")
