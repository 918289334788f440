"""The OpenSearch backend (2.x and 3.x).

``rank_features`` (default; exact dot product with ``rank_feature`` ``linear`` clauses) or the
3.3+ ``sparse_vector`` field with the seismic method (integer token ids as keys, queried with
``neural_sparse`` and raw ``query_tokens``). The client is ``opensearch-py``
(extra ``stair-es[opensearch]``), imported only when a backend is created.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..errors import BackendError, MissingDependencyError
from ._cluster import ClusterBackend, EngineAdapter, _error_body_reason
from .connection import ClusterConfig
from .dsl import mapping, query_dsl, translate
from .seismic import MAX_K, SeismicParams

__all__ = ["OpenSearchBackend", "mapping", "query_dsl", "translate"]

def _client_module():
    try:
        import opensearchpy
    except ImportError:
        raise MissingDependencyError("the OpenSearch backend", "opensearch", "opensearch-py") from None
    return opensearchpy


class OpenSearchAdapter(EngineAdapter):
    engine = "opensearch"
    label = "OpenSearch"
    loggers = ("opensearch",)

    def __init__(self) -> None:
        self.os = _client_module()

    def make_client(self, cfg: ClusterConfig) -> Any:
        headers: dict[str, str] = {}
        kwargs: dict[str, Any] = {
            "timeout": cfg.timeout,
            "max_retries": 0,  # stair_es retries itself, re-sending only what failed
            "retry_on_timeout": False,
            "verify_certs": cfg.verify_certs,
            "ssl_show_warn": cfg.verify_certs,
        }
        if cfg.ca_certs:
            kwargs["ca_certs"] = cfg.ca_certs
        if cfg.api_key:
            headers["authorization"] = f"ApiKey {cfg.api_key}"
        elif cfg.bearer_token:
            headers["authorization"] = f"Bearer {cfg.bearer_token}"
        elif cfg.username:
            kwargs["http_auth"] = (cfg.username, cfg.password or "")
        if headers:
            kwargs["headers"] = headers
        try:
            return self.os.OpenSearch(hosts=list(cfg.urls), **kwargs)
        except (ValueError, TypeError, OSError, self.os.exceptions.ImproperlyConfigured) as e:
            raise BackendError(f"cannot set up the OpenSearch client for {cfg.display_urls}: {e}") from None

    def request(self, client: Any, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        return client.transport.perform_request(method, path, params=dict(params) if params else None, body=body)

    def streaming_bulk(self):
        from opensearchpy.helpers import streaming_bulk

        return streaming_bulk

    def classify(self, exc: BaseException) -> tuple[str, int | None, str]:
        ex = self.os.exceptions
        if isinstance(exc, ex.SSLError):
            return "tls", None, _short(exc)
        if isinstance(exc, ex.ConnectionTimeout):
            return "timeout", None, _short(exc)
        if isinstance(exc, ex.ConnectionError):
            return "connection", None, _short(exc)
        if isinstance(exc, ex.TransportError):
            status = exc.status_code if isinstance(exc.status_code, int) else None
            typ, reason = _error_body_reason(exc.info)
            if not reason:
                reason = str(exc.error)
            return "api", status, f"{typ}: {reason}" if typ else reason
        return "other", None, f"{type(exc).__name__}: {exc}"

    def check_info(self, info: Mapping[str, Any]) -> None:
        if (info.get("version") or {}).get("distribution") != "opensearch":
            raise BackendError("this cluster is not OpenSearch (GET / has no version.distribution=opensearch): "
                               "use --backend elasticsearch")


def _short(exc: BaseException) -> str:
    info = getattr(exc, "info", None)
    text = str(info if isinstance(info, BaseException) else exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__


class OpenSearchBackend(ClusterBackend):
    """stair_es indices on OpenSearch 2.x/3.x."""

    name = "opensearch"

    def __init__(self, *args: Any, method_parameters: Mapping[str, Any] | None = None, **kwargs: Any):
        """``method_parameters``: SEISMIC query parameters for ``sparse_vector`` indices, e.g.
        ``{"k": 100, "top_n": 10, "heap_factor": 1.2, "filter_overfetch": 4}``
        (:mod:`stair_es.backends.seismic`); ``k`` defaults to top_k (x filter_overfetch with a filter)."""
        self.seismic = SeismicParams.from_options(method_parameters)
        self.adapter = OpenSearchAdapter()
        super().__init__(*args, **kwargs)

    def _after_search(self, index: str, req: Any, meta: Any, body: dict[str, Any], res: Mapping[str, Any]
                      ) -> tuple[Mapping[str, Any], list[str]]:
        """A filtered SEISMIC search that came back with fewer than ``top_k`` hits although more
        documents pass the filter (the approximate search's k candidates were filtered away) is
        repeated with ``k`` multiplied by ``filter_overfetch`` each time, up to the number of
        documents passing the filter, where OpenSearch switches to an exact search over them."""
        if meta.field_type != "sparse_vector" or req.filter is None:
            return res, []
        got = len(res.get("hits", {}).get("hits", []))
        if got >= req.top_k:
            return res, []
        params: SeismicParams = self.seismic or SeismicParams()
        b = body["query"].get("bool", {})
        flt = {key: b[key] for key in ("filter", "must_not") if b.get(key)}
        if not flt:
            return res, []
        counted = self.request("POST", self._path(index, "_search"), {"query": {"bool": flt}, "size": 0, "track_total_hits": True},
                               action=f"count filtered documents in {index!r}", index=index)
        total = counted.get("hits", {}).get("total")
        passing = int(total.get("value") if isinstance(total, Mapping) else total or 0)
        if got >= min(req.top_k, passing):
            return res, []
        k = params.k if params.k is not None else req.top_k * params.filter_overfetch
        factor = max(params.filter_overfetch, 2)
        tries = 0
        while got < min(req.top_k, passing) and k < min(passing, MAX_K):
            k = min(k * factor, passing, MAX_K)
            tr = translate(req, engine=self.adapter.engine, field_type=meta.field_type, max_clauses=self.max_clauses,
                           vocab=self.vocab, seismic=replace(params, k=k))
            body = {**body, "query": tr.query}
            res = self.request("POST", self._path(index, "_search"), body, action=f"search {index!r}", index=index)
            got = len(res.get("hits", {}).get("hits", []))
            tries += 1
        exact = " (k >= the documents passing the filter: OpenSearch searches them exactly)" if k >= passing else ""
        return res, [f"the filtered SEISMIC search returned fewer than top_k hits; repeated {tries} time(s) with k up to {k}"
                     f"{exact}; {passing} documents pass the filter"]
