"""What a new `stair-es` process loads: a text search of a small index and `--help` import
neither torch nor transformers nor numba (numba's start-up alone is longer than the search)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stair_es.engine import EngineIndex
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

pytestmark = pytest.mark.process

HEAVY = ("torch", "transformers", "numba")

# Runs the CLI in this process, then prints which heavy modules it imported (and the exit code).
PROBE = """
import json, sys
from stair_es.cli.main import cli
code = 0
try:
    cli(sys.argv[1:], prog_name="stair-es")
except SystemExit as e:
    code = e.code or 0
print("@@" + json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def _probe(args: list[str], home: Path) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, "-c", PROBE, *args, "--home", str(home)] if args[0] != "--help" else
                       [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    line = [x for x in r.stdout.splitlines() if x.startswith("@@")]
    assert line, r.stdout + r.stderr
    return json.loads(line[-1][2:]), r.stdout


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A small index in two segments, with a deleted document and metadata."""
    home = tmp_path_factory.mktemp("home")
    vocab = default_vocabulary()
    ix = EngineIndex.create(home / "shop", IndexSchema(fields={"colour": "keyword"}))
    rng = np.random.default_rng(0)
    words = ["red", "car", "blue", "boat", "dog", "tree", "house", "road"]
    for batch in range(2):
        docs = []
        for i in range(30):
            picks = rng.choice(len(words), size=3, replace=False)
            ids = np.array(sorted(vocab.id(words[j]) for j in picks))
            docs.append(Document(f"d{batch}-{i}", {"image": SparseVector.from_arrays(ids, rng.uniform(0.2, 2.0, 3), vocab)},
                                 {"colour": ["red", "blue"][i % 2]}))
        ix.add(docs)
    ix.delete(["d0-3"])
    ix.close()
    return home


def test_text_search_of_a_small_index_imports_no_heavy_module(home):
    got, out = _probe(["search", "shop", "a red car", "--encoder", "bow", "--where", "colour=red", "--require", "car"], home)
    assert got["code"] == 0, out
    assert "d1-" in out or "d0-" in out  # it found something
    assert got["heavy"] == [], f"a text search imported {got['heavy']}"


def test_help_imports_no_heavy_module(home):
    got, out = _probe(["--help"], home)
    assert got["code"] == 0 and "search" in out
    assert got["heavy"] == []
