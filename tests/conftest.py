import pytest

from stair_es.encoders.base import register_encoder

from fakes import ColorEncoder, MemoryBackend

register_encoder("fake-color", ColorEncoder)


@pytest.fixture
def memory_backend():
    return MemoryBackend()
