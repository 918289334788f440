import pytest

from .fake_cluster import FakeCluster

FLAVORS = ["elasticsearch", "opensearch"]


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch, tmp_path):
    """Tests must not pick up a developer's STAIR_ES_* variables or config file."""
    for k in ("STAIR_ES_URL", "STAIR_ES_API_KEY", "STAIR_ES_USERNAME", "STAIR_ES_PASSWORD",
              "STAIR_ES_BEARER_TOKEN", "STAIR_ES_CA_CERTS"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture(params=FLAVORS)
def flavor(request):
    return request.param


@pytest.fixture
def fake(flavor):
    with FakeCluster(flavor) as c:
        yield c
