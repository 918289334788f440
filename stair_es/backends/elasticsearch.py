"""The Elasticsearch backend (8.x and 9.x) and the public DSL/mapping helpers.

For users embedding stair_es in an existing deployment, the translation functions are pure::

    from stair_es.backends.elasticsearch import mapping, query_dsl
    body = mapping("elasticsearch", "rank_features", schema)        # PUT /my-index
    q = query_dsl(request, engine="elasticsearch", schema=schema)   # {"query": q} or inside your bool

The client is the official ``elasticsearch`` package (extra ``stair-es[elasticsearch]``), imported
only when a backend is created. An 8.x client talks to 8.x and, through REST API compatibility,
9.x clusters; a 9.x client talks to 9.x clusters only.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import BackendError
from .cluster import ClusterBackend, ClusterConfig, EngineAdapter
from .cluster.mapping import mapping
from .cluster.translate import query_dsl, translate
from .cluster.transport import error_body_reason
from .codec import decode_token, encode_token, stored_value

__all__ = ["ElasticsearchBackend", "mapping", "query_dsl", "translate", "encode_token", "decode_token", "stored_value"]

_JSON = {"accept": "application/json", "content-type": "application/json"}


class ElasticsearchAdapter(EngineAdapter):
    engine = "elasticsearch"
    label = "Elasticsearch"
    loggers = ("elasticsearch", "elastic_transport")
    package, install = "elasticsearch", "'elasticsearch>=8.15,<9'"

    def make_client(self, cfg: ClusterConfig) -> Any:
        kwargs: dict[str, Any] = {
            "request_timeout": cfg.timeout,
            "max_retries": 0,  # stair_es retries itself, re-sending only what failed
            "retry_on_timeout": False,
            "retry_on_status": (),
            "verify_certs": cfg.verify_certs,
        }
        if not cfg.verify_certs:
            kwargs["ssl_show_warn"] = False
        if cfg.ca_certs:
            kwargs["ca_certs"] = cfg.ca_certs
        if cfg.api_key:
            kwargs["api_key"] = cfg.api_key
        elif cfg.bearer_token:
            kwargs["bearer_auth"] = cfg.bearer_token
        elif cfg.username:
            kwargs["basic_auth"] = (cfg.username, cfg.password or "")
        try:
            return self.lib.Elasticsearch(cfg.urls, **kwargs)
        except (ValueError, TypeError, OSError) as e:
            # e.g. a CA bundle path that does not exist
            raise BackendError(f"cannot set up the Elasticsearch client for {cfg.display_urls}: {e}") from None

    def request(self, client: Any, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        headers = _JSON if body is not None else {"accept": "application/json"}
        resp = client.perform_request(method, path, params=dict(params) if params else None, headers=headers, body=body)
        return resp.body

    def classify(self, exc: BaseException) -> tuple[str, int | None, str]:
        # lazy: optional client (extra elasticsearch), imported when the backend is used
        import elastic_transport as et

        es = self.lib
        if isinstance(exc, es.UnsupportedProductError):
            return "product", None, str(exc)
        if isinstance(exc, et.TlsError):
            return "tls", None, _short(exc)
        if isinstance(exc, et.ConnectionTimeout):
            return "timeout", None, _short(exc)
        if isinstance(exc, et.ConnectionError):
            return "connection", None, _short(exc)
        if isinstance(exc, es.ApiError):
            status = getattr(exc.meta, "status", None)
            typ, reason = error_body_reason(exc.body)
            return "api", status, f"{typ}: {reason}" if typ else (reason or str(exc.message))
        if isinstance(exc, et.TransportError):
            return "connection", None, _short(exc)
        return "other", None, f"{type(exc).__name__}: {exc}"

    def check_info(self, info: Mapping[str, Any]) -> None:
        if (info.get("version") or {}).get("distribution") == "opensearch":
            raise BackendError("this cluster is OpenSearch, not Elasticsearch: use --backend opensearch")


def _short(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


class ElasticsearchBackend(ClusterBackend):
    """stair_es indices on Elasticsearch 8.x/9.x (``rank_features`` by default, or ``sparse_vector``)."""

    name = "elasticsearch"
    adapter_class = ElasticsearchAdapter
