"""The Elasticsearch/OpenSearch :class:`~stair_es.backends.base.SearchBackend`.

Owns: the stair_es operations on a cluster (create/list/delete indices, ingest with structured
per-document reports, get, search, explain, scans for statistics), each as requests through
:class:`~.transport.Transport`, with the mapping of :mod:`.mapping`, the query DSL of
:mod:`.translate` and the hybrid search of :mod:`.hybrid`. The engine modules
(``elasticsearch.py``, ``opensearch.py``) give the client adapter and engine-only behaviour
through the hooks ``translate_request``, ``_after_search`` and ``_explain_notes``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from dataclasses import replace
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import quote

import numpy as np

from ...dense import DENSE_FIELD, DenseSpec, prepare
from ...errors import (BackendError, DocumentNotFoundError, IncompatibleIndexError, IndexExistsError, InvalidInputError,
                       StairError)
from ...lexical import TEXT_FIELD, document_text
from ...query import SearchRequest
from ...schema import (Document, Explanation, Hit, IndexSchema, IngestReport, ItemResult, SearchResult,
                       TokenContribution, format_date)
from ...vocab import VOCAB_SIZE, Vocabulary, default_vocabulary
from ..base import IndexInfo, ProgressCallback, SearchBackend
from ..codec import feature_map, stored_value, vector_from_features
from . import freqs
from .config import BulkPolicy, ClusterConfig, settings_from_options
from .hybrid import ClusterHybrid
from .mapping import META_KEY, IndexMeta, check_index_name, field_type_for, index_meta, mapping, metadata_properties
from .translate import Translation, translate
from .transport import EngineAdapter, Transport

log = logging.getLogger(__name__)


class ClusterBackend(ClusterHybrid, SearchBackend):
    """A :class:`SearchBackend` on an Elasticsearch or OpenSearch cluster.

    Takes a :class:`~.config.ClusterConfig` (where and how to connect, index options) and a
    :class:`~.config.BulkPolicy` (chunks, retries, back-off), or the same settings as flat
    keyword options (``get_backend("elasticsearch", urls=..., api_key=..., chunk_docs=...)``).
    """

    adapter_class: type[EngineAdapter] = EngineAdapter

    def __init__(self, config: ClusterConfig | None = None, bulk: BulkPolicy | None = None, *,
                 vocab: Vocabulary | None = None, **options: Any):
        self.adapter = self.adapter_class()
        if isinstance(config, (str, list, tuple)):  # ElasticsearchBackend("https://host:9200") as before
            config, options = None, {**options, "urls": config}
        if config is not None and not isinstance(config, ClusterConfig):
            raise InvalidInputError(f"expected a ClusterConfig or the cluster URL(s), got {type(config).__name__}")
        if config is None:
            config, from_options = settings_from_options(self.adapter.engine, options)
            bulk = bulk or from_options
        elif options:
            raise InvalidInputError(f"pass either a ClusterConfig or keyword options, not both "
                                    f"(got {', '.join(sorted(options))})")
        self.config = config
        self.bulk_policy = bulk or BulkPolicy()
        self.transport = Transport(self.adapter, config, self.bulk_policy)
        self.vocab = vocab or default_vocabulary()
        self._meta_cache: dict[str, IndexMeta] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"

    # --- connection --------------------------------------------------------------------
    @property
    def client(self) -> Any:
        return self.transport.client

    @property
    def version(self) -> tuple[int, ...] | None:
        return self.transport.version

    @property
    def stats(self) -> dict[str, int]:
        """Bulk requests sent, items retried and retry rounds since this backend was made."""
        return self.transport.stats

    def connect(self) -> None:
        self.transport.connect()

    def close(self) -> None:
        self.transport.close()

    def request(self, method: str, path: str, body: Any = None, params: Mapping[str, Any] | None = None,
                *, action: str = "request", index: str | None = None, retry: bool = True) -> Any:
        """One request through this backend's client (its auth, TLS, back-off unless ``retry=False``,
        and errors mapped to typed ones naming the URL, never credentials); the raw response."""
        return self.transport.call(method, path, body, params, action=action, index=index, retry=retry)

    # --- index metadata ----------------------------------------------------------------
    def _path(self, index: str, *rest: str) -> str:
        return "/" + "/".join([quote(index, safe="")] + [quote(r, safe="_") for r in rest])

    def _meta(self, index: str, *, fresh: bool = False) -> IndexMeta:
        if fresh or index not in self._meta_cache:
            res = self.request("GET", self._path(index, "_mapping"), action=f"read the mapping of {index!r}", index=index)
            self._meta_cache[index] = index_meta(self.adapter.engine, index, res, self.config.display_urls)
        return self._meta_cache[index]

    def translate_request(self, req: SearchRequest, meta: IndexMeta, *, max_clauses: int | None = None) -> Translation:
        """The query DSL of a prepared request on this index (OpenSearch adds SEISMIC's parameters)."""
        return translate(req, engine=self.adapter.engine, field_type=meta.field_type, vocab=self.vocab,
                         max_clauses=self.config.max_clauses if max_clauses is None else max_clauses)

    # --- SearchBackend -----------------------------------------------------------------
    def create_index(self, index: str, schema: IndexSchema, *, exist_ok: bool = False) -> None:
        check_index_name(index)
        self.client  # connect: the version decides the field type and mapping options
        ftype = field_type_for(self.adapter.engine, self.config.field_type, self.version)
        if schema.dense is None and self.config.dense_dims:
            schema = replace(schema, dense=DenseSpec(int(self.config.dense_dims), "cosine", "float32").to_dict())
        body = mapping(self.adapter.engine, ftype, schema, prune=self.config.prune, version=self.version)
        try:
            self.adapter.request(self.client, "PUT", self._path(index), body)
        except Exception as e:  # noqa: BLE001
            kind, status, reason = self.adapter.classify(e)
            if status == 400 and "already_exists" in reason + str(getattr(e, "error", "")) + repr(e):
                if not exist_ok:
                    raise IndexExistsError(f"index {index!r} already exists on {self.config.display_urls}; delete it "
                                           "first or pick another name") from None
                meta = self._meta(index, fresh=True)
                if tuple(meta.schema.sparse_fields) != tuple(schema.sparse_fields):
                    raise IncompatibleIndexError(
                        f"index {index!r} exists with sparse fields {list(meta.schema.sparse_fields)}, "
                        f"not {list(schema.sparse_fields)}") from None
                for name, ftype_ in schema.fields.items():
                    have = meta.schema.fields.get(name)
                    if have is not None and have != ftype_:
                        raise IncompatibleIndexError(
                            f"index {index!r} exists with field {name!r} of type {have}, not {ftype_}") from None
                return
            raise self.transport.map_error(e, f"create index {index!r}") from None
        self._meta_cache.pop(index, None)

    def list_indices(self) -> list[str]:
        res = self.request("GET", "/_mapping", action="list indices")
        return sorted(name for name, entry in (res or {}).items() if not name.startswith(".") and isinstance(
            (((entry or {}).get("mappings") or {}).get("_meta") or {}).get(META_KEY), Mapping))

    def index_info(self, index: str) -> IndexInfo:
        meta = self._meta(index, fresh=True)
        count = self._count(index)
        size = None
        with contextlib.suppress(StairError, KeyError, TypeError, ValueError):
            stats = self.request("GET", self._path(index, "_stats", "store"), action="read index stats", index=index, retry=False)
            size = int(stats["_all"]["primaries"]["store"]["size_in_bytes"])
        extra = {"engine": self.adapter.engine, "field_type": meta.field_type,
                 "cluster_version": ".".join(map(str, self.version or ())), "url": self.config.display_urls}
        return IndexInfo(index, meta.schema, count, size, extra)

    def _count(self, index: str) -> int:
        """The index's number of documents (``_count``)."""
        return int(self.request("GET", self._path(index, "_count"), action=f"count {index!r}", index=index)
                   .get("count", 0))

    def delete_index(self, index: str) -> None:
        with contextlib.suppress(StairError):  # (an index that is not stair_es's has none)
            self._forget_freqs(index)
        self.request("DELETE", self._path(index), action=f"delete index {index!r}", index=index)
        self._meta_cache.pop(index, None)

    # --- ingestion ---------------------------------------------------------------------
    def _source(self, doc: Document, meta: IndexMeta, schema: IndexSchema, new_fields: dict[str, str]) -> dict[str, Any]:
        if not isinstance(doc, Document):
            raise InvalidInputError(f"expected a Document, got {type(doc).__name__}")
        src: dict[str, Any] = {}
        for name, vec in doc.vectors.items():
            schema.check_sparse_field(name)
            if vec.vocab is not self.vocab and vec.vocab.digest != self.vocab.digest:
                raise InvalidInputError(f"field {name!r}: the vector uses another vocabulary than the index")
            if vec.nnz:
                src[name] = feature_map(vec, meta.keys)
        if not src:
            raise InvalidInputError("the document has no non-zero token weight in any sparse field")
        values, new = schema.normalize_metadata(doc.metadata)
        schema.fields.update(new)
        new_fields.update(new)
        src.update({k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
        if doc.caption is not None:
            src["caption_text"] = doc.caption
        if meta.has_text:
            src[TEXT_FIELD] = document_text(doc.caption, values)
        if doc.source is not None:
            src["path"] = doc.source  # "path" is reserved in the schema; "source" may be user metadata
        if getattr(doc, "dense", None) is not None:
            spec = DenseSpec.from_dict(schema.dense)
            if spec is None or not meta.has_dense:
                raise InvalidInputError(f"{doc.id!r} has a dense vector but the index has no dense field: "
                                        "create the index with --dense-dims N (or ingest without dense vectors)")
            src[DENSE_FIELD] = [float(x) for x in prepare(doc.dense, spec, f"the dense vector of {doc.id!r}")]
        return src

    def ingest(self, index: str, docs: Iterable[Document], *, on_batch: ProgressCallback | None = None) -> IngestReport:
        meta = self._meta(index, fresh=True)
        report = IngestReport()
        it = iter(docs)
        while batch := list(itertools.islice(it, self.bulk_policy.chunk_docs)):
            self._ingest_batch(index, meta, batch, report, on_batch)
        self._forget_freqs(index)
        if self.config.refresh is True and report.succeeded:
            self.request("POST", self._path(index, "_refresh"), action=f"refresh {index!r}", index=index)
        return report

    def _ingest_batch(self, index: str, meta: IndexMeta, batch: list[Document], report: IngestReport,
                      on_batch: ProgressCallback | None) -> None:
        schema = meta.schema
        results: list[ItemResult | None] = [None] * len(batch)
        actions: dict[int, dict[str, Any]] = {}
        new_fields: dict[str, str] = {}
        for k, doc in enumerate(batch):
            did = getattr(doc, "id", None)
            try:
                before = dict(schema.fields)
                try:
                    src = self._source(doc, meta, schema, new_fields)
                except Exception:
                    # a rejected document must not leave its inferred fields behind
                    for name in set(schema.fields) - set(before):
                        schema.fields.pop(name, None)
                        new_fields.pop(name, None)
                    raise
                actions[k] = {"_op_type": "index", "_index": index, "_id": did, "_source": src}
            except StairError as e:
                results[k] = ItemResult(did, False, str(e), getattr(doc, "source", None))
        if new_fields:
            self._add_fields(index, meta, new_fields)
        outcome = self.transport.bulk(actions, refresh_wait=self.config.refresh == "wait_for") if actions else {}
        for k, (ok, err) in outcome.items():
            results[k] = ItemResult(batch[k].id, ok, err, batch[k].source)
        items = [r for r in results if r is not None]
        report.extend(items)
        if on_batch is not None:
            on_batch(items)

    def _add_fields(self, index: str, meta: IndexMeta, new_fields: dict[str, str]) -> None:
        raw = {**meta.raw_meta, "schema": meta.schema.to_dict()}
        body = {"properties": metadata_properties(new_fields), "_meta": {META_KEY: raw}}
        self.request("PUT", self._path(index, "_mapping"), body, action=f"add fields {sorted(new_fields)} to {index!r}", index=index)
        meta.raw_meta = raw

    def delete_documents(self, index: str, ids: Iterable[str]) -> IngestReport:
        self._meta(index)
        id_list = list(ids)
        actions = {k: {"_op_type": "delete", "_index": index, "_id": i} for k, i in enumerate(id_list)}
        outcome = self.transport.bulk(actions, refresh_wait=self.config.refresh == "wait_for") if actions else {}
        report = IngestReport()
        for k, i in enumerate(id_list):
            ok, err = outcome[k]
            if not ok and err and ("not_found" in err or "404" in err):
                err = f"document {i!r} not found"
            report.add(ItemResult(i, ok, err, action="delete"))
        self._forget_freqs(index)
        if self.config.refresh is True and report.succeeded:
            self.request("POST", self._path(index, "_refresh"), action=f"refresh {index!r}", index=index)
        return report

    # --- reading -----------------------------------------------------------------------
    def _doc_from_hit(self, hit: Mapping[str, Any], meta: IndexMeta) -> Document:
        src = dict(hit.get("_source") or {})
        vectors = {}
        for name in meta.schema.sparse_fields:
            feats = src.pop(name, None)
            if feats:
                vectors[name] = vector_from_features(feats, self.vocab, meta.keys)
        # caption_text, path and dense are reserved names: never metadata
        return Document(hit["_id"], vectors, self._metadata_out(src, meta.schema), src.get("caption_text"),
                        src.get("path"), src.get("dense"))

    def _hit(self, h: Mapping[str, Any], meta: IndexMeta) -> Hit:
        src = h.get("_source") or {}
        return Hit(h["_id"], float(h.get("_score") or 0.0), self._metadata_out(src, meta.schema), src.get("caption_text"),
                   src.get("path"))

    @staticmethod
    def _metadata_out(src: Mapping[str, Any], schema: IndexSchema) -> dict[str, Any]:
        return {k: format_date(int(v)) if schema.fields[k] == "date" and isinstance(v, (int, float)) else v
                for k, v in src.items() if k in schema.fields}

    def get(self, index: str, doc_id: str) -> Document:
        meta = self._meta(index)
        try:
            res = self.adapter.request(self.client, "GET", self._path(index, "_doc", doc_id))
        except Exception as e:  # noqa: BLE001
            kind, status, reason = self.adapter.classify(e)
            if status == 404 and "index_not_found" not in reason and "no such index" not in reason:
                raise DocumentNotFoundError(f"document {doc_id!r} not found in index {index!r}") from None
            raise self.transport.map_error(e, f"get document {doc_id!r}", index) from None
        if not res.get("found", True):
            raise DocumentNotFoundError(f"document {doc_id!r} not found in index {index!r}")
        return self._doc_from_hit(res, meta)

    def vectors_of(self, index: str, doc_ids: Sequence[str], field: str) -> list[Any]:
        """Each document's vector of ``field`` (None when gone or without it), in one ``_mget``
        request that returns only that field (re-ranking by meaning reads its hits this way)."""
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        if not doc_ids:
            return []
        res = self.request("POST", self._path(index, "_mget"),
                           {"docs": [{"_id": d, "_source": [field]} for d in doc_ids]},
                           action=f"read back {len(doc_ids)} documents' {field!r} tokens", index=index)
        docs = res.get("docs") or []
        if len(docs) != len(doc_ids):
            raise BackendError(f"_mget on {index!r} answered {len(docs)} documents for {len(doc_ids)} ids")
        out = []
        for d in docs:
            feats = (d.get("_source") or {}).get(field) if d.get("found") else None
            out.append(vector_from_features(feats, self.vocab, meta.keys) if feats else None)
        return out

    def existing_ids(self, index: str, ids: Iterable[str]) -> set[str]:
        self._meta(index)
        id_list = list(dict.fromkeys(ids))
        found: set[str] = set()
        for start in range(0, len(id_list), 1000):
            chunk = id_list[start : start + 1000]
            res = self.request("POST", self._path(index, "_mget"), {"ids": chunk}, {"_source": "false"},
                             action=f"look up ids in {index!r}", index=index)
            found.update(d["_id"] for d in res.get("docs", []) if d.get("found"))
        return found

    def search(self, index: str, request: SearchRequest) -> SearchResult:
        t0 = time.perf_counter()
        meta = self._meta(index)
        req = request.prepared(meta.schema, self.vocab)
        tr = self.translate_request(req, meta)
        body = {"query": tr.query, "size": req.top_k, "track_total_hits": True,
                "_source": {"excludes": list(meta.schema.sparse_fields) + ["dense"]}}
        res = self.request("POST", self._path(index, "_search"), body, action=f"search {index!r}", index=index)
        res, refill_notes = self._after_search(index, req, meta, body, res)
        hits = [self._hit(h, meta) for h in res.get("hits", {}).get("hits", [])]
        total = res.get("hits", {}).get("total")
        total = total.get("value") if isinstance(total, Mapping) else total
        notes = list(req.notes) + tr.notes + refill_notes
        took = (time.perf_counter() - t0) * 1000  # end to end, as the user waits for it
        return SearchResult(hits, total, took, notes)

    def _after_search(self, index: str, req: SearchRequest, meta: IndexMeta, body: dict[str, Any],
                      res: Mapping[str, Any]) -> tuple[Mapping[str, Any], list[str]]:
        """A hook on a search's response (OpenSearch repeats a filtered SEISMIC search): (response, notes)."""
        return res, []

    def _explain_notes(self, index: str, meta: IndexMeta, tr: Translation, doc: Document) -> list[str]:
        """A hook adding the engine's own notes to an explanation (OpenSearch: SEISMIC's quantisation)."""
        return []

    def explain(self, index: str, doc_id: str, request: SearchRequest) -> Explanation:
        meta = self._meta(index)
        req = request.prepared(meta.schema, self.vocab)
        tr = self.translate_request(req, meta)
        doc = self.get(index, doc_id)
        contributions = []
        for c in tr.request.clauses:
            dv = doc.vectors.get(c.field)
            if dv is None:
                continue
            for tok, qw, dw, _ in c.vector.contributions(dv):
                stored = float(stored_value(dw))
                q = float(c.weight) * qw
                contributions.append(TokenContribution(c.field, tok, q, stored, q * stored))
        contributions.sort(key=lambda t: -t.contribution)
        # the engine's own score for this document under the same query (and whether the filter matched)
        body = {"query": {"bool": {"must": [tr.query], "filter": [{"ids": {"values": [doc_id]}}]}}, "size": 1, "_source": False}
        res = self.request("POST", self._path(index, "_search"), body, action=f"explain in {index!r}", index=index)
        hits = res.get("hits", {}).get("hits", [])
        notes = list(req.notes) + tr.notes
        notes.append(
            f"document weights are shown as {self.adapter.label} stores them: float32 truncated to 9 significant "
            "bits (relative error < 0.4%); the score is sum(query weight * stored weight)")
        notes.extend(self._explain_notes(index, meta, tr, doc))
        if hits:
            score, matched = float(hits[0].get("_score") or 0.0), True
        else:
            score = float(sum(t.contribution for t in contributions))
            matched = False
            notes.append("the document does not match this query's filter (or shares no token with it); "
                         "the score shown is the sum of contributions")
        return Explanation(doc_id, score, contributions, matched, notes)

    def _scroll(self, index: str, sources: list[str]) -> Iterator[list[dict[str, Any]]]:
        """Every document of ``index`` with the given ``_source`` fields, one page (1000 hits) at a
        time, through the scroll API; the scroll context is cleared however the caller stops."""
        body = {"query": {"match_all": {}}, "size": 1000, "_source": sources, "sort": ["_doc"]}
        res = self.request("POST", self._path(index, "_search"), body, {"scroll": "2m"}, action=f"scan {index!r}", index=index)
        scroll_id = res.get("_scroll_id")
        try:
            while True:
                hits = res.get("hits", {}).get("hits", [])
                if not hits:
                    break
                yield hits
                if not scroll_id:
                    break
                res = self.request("POST", "/_search/scroll", {"scroll": "2m", "scroll_id": scroll_id}, action="scan (scroll)")
                scroll_id = res.get("_scroll_id", scroll_id)
        finally:
            if scroll_id:
                with contextlib.suppress(StairError):
                    self.request("DELETE", "/_search/scroll", {"scroll_id": [scroll_id]}, action="clear scroll", retry=False)

    def _freqs_key(self, index: str) -> tuple[Any, ...]:
        return (self.adapter.engine, self.config.display_urls, index, repr(self._meta(index).schema.to_dict()))

    def _forget_freqs(self, index: str) -> None:
        """What this process changed in ``index`` makes its remembered frequencies stale."""
        freqs.forget(self._freqs_key(index), self._meta(index).schema.sparse_fields)

    def doc_freqs(self, index: str, field: str) -> tuple[np.ndarray, int]:
        """Exact document frequencies by scanning the field's stored feature maps (one pass, 1000 docs/page).

        Costs a full read of the index, so they are remembered on this machine while the index
        holds the same number of documents, for up to an hour (:mod:`.freqs`).
        """
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        key = (*self._freqs_key(index), field)
        count = self._count(index) if freqs.ttl_s() > 0 else -1  # (-1: not remembered, nothing to compare)
        remembered = freqs.load(key, count)
        if remembered is not None:
            return remembered
        df = np.zeros(VOCAB_SIZE, dtype=np.int64)
        n = 0
        for hits in self._scroll(index, [field]):
            for h in hits:
                n += 1
                feats = (h.get("_source") or {}).get(field)
                if feats:
                    df[vector_from_features(feats, self.vocab, meta.keys).ids] += 1
        freqs.save(key, count, df, n)
        return df, n

    def scan(self, index: str, field: str) -> Iterator[tuple[np.ndarray, np.ndarray, list[str | None]]]:
        """Every document, 1000 per page (scroll), as ``(indptr, token ids of field, captions)`` per page.

        Costs a full read of the index (used for neighbour statistics, ``stair_es.neighbours``)."""
        meta = self._meta(index)
        meta.schema.check_sparse_field(field)
        for hits in self._scroll(index, [field, "caption_text"]):
            rows, captions = [], []
            for h in hits:
                src = h.get("_source") or {}
                feats = src.get(field)
                rows.append(vector_from_features(feats, self.vocab, meta.keys).ids if feats else np.zeros(0, np.int32))
                captions.append(src.get("caption_text"))
            ptr = np.zeros(len(rows) + 1, np.int64)
            np.cumsum([r.size for r in rows], out=ptr[1:])
            yield ptr, np.concatenate(rows).astype(np.int32), captions
