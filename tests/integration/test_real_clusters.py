"""Real Elasticsearch / OpenSearch: testcontainers images, or a cluster URL from the environment.

Both skip, saying why, when Docker or the URL is missing (as on the CI machine).

* ``STAIR_ES_TEST_URL`` / ``STAIR_OS_TEST_URL``: a disposable cluster (indices named ``stair-test-*``
  are created and deleted); credentials come from the usual ``STAIR_ES_*`` variables.
* testcontainers: ``docker.elastic.co/elasticsearch/elasticsearch:8.15.3`` and
  ``opensearchproject/opensearch:2.17.0`` (override with ``STAIR_ES_TEST_IMAGE`` / ``STAIR_OS_TEST_IMAGE``).
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from stair_es.backends.base import get_backend
from stair_es.backends.codec import stored_value
from stair_es.query import HasTokens, Not, SearchRequest, SparseClause
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

pytestmark = pytest.mark.cluster

VOCAB = default_vocabulary()


def _docker_available() -> str | None:
    try:
        import docker
    except ImportError:
        return "the docker Python package is not installed"
    try:
        docker.from_env().ping()
    except Exception as e:  # noqa: BLE001
        return f"no Docker engine answers ({type(e).__name__})"
    return None


def _container_url(engine: str) -> tuple[str, object]:
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    if engine == "elasticsearch":
        image = os.environ.get("STAIR_ES_TEST_IMAGE", "docker.elastic.co/elasticsearch/elasticsearch:8.15.3")
        c = (DockerContainer(image).with_env("discovery.type", "single-node").with_env("xpack.security.enabled", "false")
             .with_env("ES_JAVA_OPTS", "-Xms512m -Xmx512m").with_exposed_ports(9200))
    else:
        image = os.environ.get("STAIR_OS_TEST_IMAGE", "opensearchproject/opensearch:2.17.0")
        c = (DockerContainer(image).with_env("discovery.type", "single-node").with_env("DISABLE_SECURITY_PLUGIN", "true")
             .with_env("OPENSEARCH_JAVA_OPTS", "-Xms512m -Xmx512m").with_exposed_ports(9200))
    c.start()
    wait_for_logs(c, "started", timeout=180)
    return f"http://{c.get_container_host_ip()}:{c.get_exposed_port(9200)}", c


@pytest.fixture(scope="module", params=["elasticsearch", "opensearch"])
def real_cluster(request):
    engine = request.param
    env = "STAIR_ES_TEST_URL" if engine == "elasticsearch" else "STAIR_OS_TEST_URL"
    url = os.environ.get(env)
    container = None
    if not url:
        why = _docker_available()
        if why:
            pytest.skip(f"no {env} given and testcontainers cannot run: {why}")
        url, container = _container_url(engine)
    yield engine, url
    if container is not None:
        container.stop()


def test_exact_dot_product_on_a_real_cluster(real_cluster):
    engine, url = real_cluster
    b = get_backend(engine, urls=url)
    index = f"stair-test-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(3)
    allowed = np.flatnonzero(~VOCAB.special_mask)[:3000]
    docs = [Document(f"d{i}", {"image": SparseVector.from_arrays(rng.choice(allowed, 30, replace=False), rng.lognormal(0, 1, 30))})
            for i in range(200)]
    try:
        b.create_index(index, IndexSchema())
        assert not b.ingest(index, docs).failures
        q = docs[5].vectors["image"].prune(top_k=10)
        common = VOCAB.tokens[int(docs[0].vectors["image"].ids[0])]
        for flt in (None, Not(HasTokens([common])), HasTokens([common])):
            res = b.search(index, SearchRequest([SparseClause("image", q)], filter=flt, top_k=10))
            for h in res.hits:
                d = next(x for x in docs if x.id == h.id).vectors["image"]
                exact = SparseVector(d.ids, stored_value(d.weights), VOCAB).dot(q)
                assert h.score == pytest.approx(exact, rel=1e-5)
            ex = b.explain(index, res.hits[0].id, SearchRequest([SparseClause("image", q)], filter=flt))
            assert ex.total == pytest.approx(res.hits[0].score, rel=1e-5)
    finally:
        try:
            b.delete_index(index)
        finally:
            b.close()
