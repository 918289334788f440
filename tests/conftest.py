import os
import tempfile

import pytest

from stair_es.encoders.base import register_encoder

from fakes import ColorEncoder, MemoryBackend

register_encoder("fake-color", ColorEncoder)

# Exported ONNX towers go to one throw-away cache per test run (subprocesses inherit it), never
# to the user's data home; each tower is exported once per run.
if "STAIR_ES_MODEL_CACHE" not in os.environ:
    os.environ["STAIR_ES_MODEL_CACHE"] = tempfile.mkdtemp(prefix="stair-es-test-models-")
# Searches keep the sparse order unless a test asks for re-ranking by meaning (tests/test_rerank.py):
# the suite's expectations are about the engine and the encoders, and the real sentence model
# would be exported (and its word table computed) in every test run's fresh model cache.
os.environ.setdefault("STAIR_ES_RERANK", "off")
# A cluster's document frequencies are counted afresh unless a test asks for them to be remembered
# (tests/integration/test_emulators.py): nothing of a test run lands in the user's data home.
os.environ.setdefault("STAIR_ES_CLUSTER_STATS_TTL", "0")


@pytest.fixture
def run(tmp_path):
    """``run(*args, input=None)``: the stair-es CLI in this process, on an embedded home of the test's own."""
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    home = tmp_path / "home"

    def invoke(*args, input=None):
        return CliRunner().invoke(cli, [*args, "--home", str(home)], input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def memory_backend():
    return MemoryBackend()
