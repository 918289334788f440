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


@pytest.fixture
def memory_backend():
    return MemoryBackend()
