"""The OpenSearch backend (2.x and 3.x).

``rank_features`` (default; exact dot product with ``rank_feature`` ``linear`` clauses) or the
3.3+ ``sparse_vector`` field with the seismic method (integer token ids as keys, queried with
``neural_sparse`` and raw ``query_tokens``). The client is ``opensearch-py``
(extra ``stair-es[opensearch]``), imported only when a backend is created.

SEISMIC. Query side: ``method_parameters`` of ``neural_sparse``, see :class:`SeismicParams`; a
filtered search that comes back short is repeated with a larger ``k`` (:meth:`OpenSearchBackend._after_search`).
Storage side: a segment of at least ``approximate_threshold`` documents (1,000,000 in stair_es's
mapping) is searched by SEISMIC over byte-quantised weights: a document weight ``w`` is stored as
``round(min(w, c_ingest) * 255 / c_ingest)`` (``quantization_ceiling_ingest``, default 3.0) and a
query weight as ``round(min(q, c_search) * 255 / c_search)`` (``quantization_ceiling_search``,
default 16). Weights above the ceilings are clipped. Smaller segments are searched exactly.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import numpy as np

from ..errors import BackendError
from ..query import SearchRequest
from ..schema import Document
from .cluster import ClusterBackend, ClusterConfig, EngineAdapter
from .cluster.mapping import IndexMeta, mapping
from .cluster.translate import SeismicParams, Translation, filter_of, query_dsl, translate
from .cluster.transport import error_body_reason

__all__ = ["OpenSearchBackend", "SeismicParams", "mapping", "query_dsl", "translate", "quantise"]

#: ``approximate_threshold`` in stair_es's ``os_sparse_vector.json`` mapping.
APPROXIMATE_THRESHOLD = 1_000_000
CEILING_INGEST = 3.0
CEILING_SEARCH = 16.0
MAX_K = 10_000


class OpenSearchAdapter(EngineAdapter):
    engine = "opensearch"
    label = "OpenSearch"
    loggers = ("opensearch",)
    package, install = "opensearchpy", "opensearch-py"

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
            return self.lib.OpenSearch(hosts=list(cfg.urls), **kwargs)
        except (ValueError, TypeError, OSError, self.lib.exceptions.ImproperlyConfigured) as e:
            raise BackendError(f"cannot set up the OpenSearch client for {cfg.display_urls}: {e}") from None

    def request(self, client: Any, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None) -> Any:
        return client.transport.perform_request(method, path, params=dict(params) if params else None, body=body)

    def classify(self, exc: BaseException) -> tuple[str, int | None, str]:
        ex = self.lib.exceptions
        if isinstance(exc, ex.SSLError):
            return "tls", None, _short(exc)
        if isinstance(exc, ex.ConnectionTimeout):
            return "timeout", None, _short(exc)
        if isinstance(exc, ex.ConnectionError):
            return "connection", None, _short(exc)
        if isinstance(exc, ex.TransportError):
            status = exc.status_code if isinstance(exc.status_code, int) else None
            typ, reason = error_body_reason(exc.info)
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
    adapter_class = OpenSearchAdapter

    def __init__(self, *args: Any, method_parameters: Mapping[str, Any] | SeismicParams | None = None, **kwargs: Any):
        """``method_parameters``: SEISMIC query parameters for ``sparse_vector`` indices, e.g.
        ``{"k": 100, "top_n": 10, "heap_factor": 1.2, "filter_overfetch": 4}``;
        ``k`` defaults to top_k (x filter_overfetch with a filter)."""
        self.seismic = SeismicParams.from_options(method_parameters)
        super().__init__(*args, **kwargs)

    def translate_request(self, req: SearchRequest, meta: IndexMeta, *, max_clauses: int | None = None) -> Translation:
        return translate(req, engine="opensearch", field_type=meta.field_type, vocab=self.vocab, seismic=self.seismic,
                         max_clauses=self.config.max_clauses if max_clauses is None else max_clauses)

    def _explain_notes(self, index: str, meta: IndexMeta, tr: Translation, doc: Document) -> list[str]:
        if meta.field_type != "sparse_vector":
            return []
        return explain_notes(tr.request.clauses, doc.vectors, self.index_info(index).doc_count, self.seismic)

    def _after_search(self, index: str, req: Any, meta: Any, body: dict[str, Any], res: Mapping[str, Any]
                      ) -> tuple[Mapping[str, Any], list[str]]:
        """A filtered SEISMIC search that came back with fewer than ``top_k`` hits although more
        documents pass the filter (the approximate search's k candidates were filtered away) is
        repeated with ``k`` multiplied by ``filter_overfetch`` each time, up to the number of
        documents passing the filter, where OpenSearch switches to an exact search over them."""
        if meta.field_type != "sparse_vector":
            return res, []
        approximate = ["OpenSearch seismic search is approximate on segments above its approximate_threshold"]
        got = len(res.get("hits", {}).get("hits", []))
        if req.filter is None or got >= req.top_k:
            return res, approximate
        params: SeismicParams = self.seismic or SeismicParams()
        flt = filter_of(body["query"])
        if not flt:
            return res, approximate
        counted = self.request("POST", self._path(index, "_search"), {"query": {"bool": flt}, "size": 0, "track_total_hits": True},
                               action=f"count filtered documents in {index!r}", index=index)
        total = counted.get("hits", {}).get("total")
        passing = int(total.get("value") if isinstance(total, Mapping) else total or 0)
        if got >= min(req.top_k, passing):
            return res, approximate
        k = params.k if params.k is not None else req.top_k * params.filter_overfetch
        factor = max(params.filter_overfetch, 2)
        tries = 0
        while got < min(req.top_k, passing) and k < min(passing, MAX_K):
            k = min(k * factor, passing, MAX_K)
            tr = translate(req, engine="opensearch", field_type=meta.field_type, max_clauses=self.config.max_clauses,
                           vocab=self.vocab, seismic=replace(params, k=k))
            body = {**body, "query": tr.query}
            res = self.request("POST", self._path(index, "_search"), body, action=f"search {index!r}", index=index)
            got = len(res.get("hits", {}).get("hits", []))
            tries += 1
        exact = " (k >= the documents passing the filter: OpenSearch searches them exactly)" if k >= passing else ""
        return res, [f"the filtered SEISMIC search returned fewer than top_k hits; repeated {tries} time(s) with k up to {k}"
                     f"{exact}; {passing} documents pass the filter"] + approximate


def quantise(w: np.ndarray | float, ceiling: float) -> np.ndarray:
    """The weight SEISMIC scores with: clipped to ``[0, ceiling]``, rounded to 1/255 of it."""
    q = np.floor(np.clip(np.asarray(w, np.float64), 0.0, ceiling) * 255.0 / ceiling + 0.5)  # Java Math.round
    return q * ceiling / 255.0


def explain_notes(clauses, doc_vectors: Mapping[str, Any], doc_count: int, params: SeismicParams | None = None) -> list[str]:
    """What SEISMIC does to one document's score: the byte-quantised sum it is ranked by on an
    approximate segment, the weights clipped by the ceilings, and whether any segment can be approximate."""
    exact = 0.0
    quant = 0.0
    clipped_doc = clipped_query = 0
    for c in clauses:
        dv = doc_vectors.get(c.field)
        if dv is None:
            continue
        for _, qw, dw, _ in c.vector.contributions(dv):
            exact += float(c.weight) * qw * dw
            quant += float(c.weight) * float(quantise(qw, CEILING_SEARCH)) * float(quantise(dw, CEILING_INGEST))
            clipped_doc += dw > CEILING_INGEST
            clipped_query += qw > CEILING_SEARCH
    where = ("every segment of this index is below approximate_threshold "
             f"({APPROXIMATE_THRESHOLD:,} documents; the index has {doc_count:,}), so it was scored exactly"
             if doc_count < APPROXIMATE_THRESHOLD else
             f"segments of at least {APPROXIMATE_THRESHOLD:,} documents are searched approximately")
    p = (params or SeismicParams())
    notes = [f"OpenSearch SEISMIC: {where}; on an approximate segment this document scores {quant:.4f} instead of "
             f"{exact:.4f}: document weights are stored as bytes, min(w, {CEILING_INGEST:g}) in steps of "
             f"{CEILING_INGEST:g}/255, query weights min(q, {CEILING_SEARCH:g}) in steps of {CEILING_SEARCH:g}/255"
             f" (method_parameters: k={p.k or 'top_k'}, top_n={p.top_n or 'engine default 10'}, "
             f"heap_factor={p.heap_factor or 'engine default 1.0'})"]
    if clipped_doc or clipped_query:
        notes.append(f"{clipped_doc} document weight(s) above {CEILING_INGEST:g} and {clipped_query} query weight(s) above "
                     f"{CEILING_SEARCH:g} are clipped on approximate segments (quantization_ceiling_ingest/search)")
    return notes
