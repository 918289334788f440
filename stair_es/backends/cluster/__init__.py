"""The Elasticsearch and OpenSearch backends' shared machinery, one job a module.

* :mod:`.config`: :class:`ClusterConfig` (connection, credentials, index options) and
  :class:`BulkPolicy` (chunks, retries, back-off), resolved from flags, environment and a file;
* :mod:`.transport`: the client adapter seam, requests with back-off, typed errors, bulk sends;
* :mod:`.mapping`: the create-index body and the stair_es metadata kept in a mapping;
* :mod:`.translate`: a :class:`~stair_es.query.SearchRequest` as query DSL (pure);
* :mod:`.hybrid`: hybrid search bodies (retriever API, hybrid query) and their sending;
* :mod:`.backend`: :class:`ClusterBackend`, the stair_es operations on a cluster.

The engines themselves are ``stair_es.backends.elasticsearch`` and ``stair_es.backends.opensearch``.
"""

from .backend import ClusterBackend
from .config import BulkPolicy, ClusterConfig
from .transport import EngineAdapter

__all__ = ["ClusterBackend", "ClusterConfig", "BulkPolicy", "EngineAdapter"]
