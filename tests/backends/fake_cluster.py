"""A fake Elasticsearch/OpenSearch node for unit tests, with fault injection.

A stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (random port) that the real ``elasticsearch``
and ``opensearch-py`` clients talk to. It answers the handful of endpoints stair_es uses the
way the engines do (``X-Elastic-Product`` header, bulk item errors, status codes, error
bodies) and evaluates the query shapes stair_es sends (bool / rank_feature linear / term /
terms / range / exists / ids / match_all), storing ``rank_features`` with the engines' 9-bit
truncation. It is not an engine: it exists to make faults reproducible.

Faults (see :class:`Faults`): whole-request status storms (429/503), per-item bulk rejections
(429, transient), permanent per-document errors, dropped connections (optionally after the
write was applied, as a real node can), slow responses.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import numpy as np


def stored(w: float) -> float:
    a = np.asarray(w, dtype=np.float32)
    return float((a.view(np.uint32) & np.uint32(0xFFFF8000)).view(np.float32))


@dataclass
class Faults:
    """What to break. Probabilities are per request (or per bulk item); ``seed`` makes runs repeatable."""

    seed: int = 0
    bulk_status: dict[int, float] = field(default_factory=dict)  # whole-bulk status -> probability
    item_429: float = 0.0  # per bulk item: es_rejected_execution_exception
    drop: float = 0.0  # per bulk request: close the connection without an answer
    drop_after_apply: bool = True  # ... after applying the writes (a lost acknowledgement)
    slow: float = 0.0  # per bulk request: sleep ``slow_seconds`` before answering
    slow_seconds: float = 1.0
    max_faulty_requests: int | None = None  # stop injecting after this many faulty requests
    poison_caption: str = "POISON"  # documents with this caption_text get a permanent 400
    search_status: dict[int, float] = field(default_factory=dict)
    max_bulk_bytes: int | None = None  # answer 413 to bigger bulk bodies (http.max_content_length)


class FakeCluster:
    def __init__(self, flavor: str = "elasticsearch", version: str | None = None, faults: Faults | None = None,
                 auth: str | None = None):
        self.flavor = flavor
        self.version = version or ("8.15.0" if flavor == "elasticsearch" else "2.17.0")
        self.faults = faults or Faults()
        self.rng = random.Random(self.faults.seed)
        self.auth = auth  # exact Authorization header value required, if set
        self.indices: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "bulk_requests": 0, "faults": 0, "status_faults": 0, "item_faults": 0,
                       "drops": 0, "slow": 0, "permanent": 0}
        self.seen_headers: list[dict[str, str]] = []
        handler = type("Handler", (_Handler,), {"cluster": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "FakeCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def docs(self, index: str) -> dict[str, dict]:
        return self.indices[index]["docs"]

    def _fault_allowed(self) -> bool:
        m = self.faults.max_faulty_requests
        return m is None or self.counts["faults"] < m

    def _roll(self, p: float) -> bool:
        return p > 0 and self._fault_allowed() and self.rng.random() < p


def _error(status: int, typ: str, reason: str) -> tuple[int, dict]:
    return status, {"error": {"root_cause": [{"type": typ, "reason": reason}], "type": typ, "reason": reason}, "status": status}


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.cluster.flavor == "elasticsearch":
            self.send_header("X-Elastic-Product", "Elasticsearch")
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout) before a slow answer: as with a real node

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def _dispatch(self, method: str) -> None:
        c = self.cluster
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        parts = [unquote(p) for p in split.path.split("/") if p]
        params = {k: v[0] for k, v in parse_qs(split.query).items()}
        with c.lock:
            c.counts["requests"] += 1
            c.seen_headers.append({k.lower(): v for k, v in self.headers.items()})
        if c.auth is not None and self.headers.get("Authorization") != c.auth:
            return self._send(*_error(401, "security_exception", "unable to authenticate user [x] for REST request [/]"))
        try:
            result = self._route(method, parts, params, raw)
        except _Drop:
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if result is not None:
            self._send(*result)

    # --- routing ---------------------------------------------------------------------------
    def _route(self, method: str, parts: list[str], params: dict, raw: bytes) -> tuple[int, Any] | None:
        c = self.cluster
        body = json.loads(raw) if raw and parts[-1:] != ["_bulk"] else None
        if not parts:
            info = {"name": "fake", "cluster_name": "fake", "version": {"number": c.version}, "tagline": "You Know, for Search"}
            if c.flavor == "opensearch":
                info["version"]["distribution"] = "opensearch"
            return 200, info
        if parts[-1] == "_bulk":
            return self._bulk(parts[0] if len(parts) == 2 else None, raw, params)
        if parts == ["_mapping"]:
            return 200, {n: {"mappings": ix["mappings"]} for n, ix in c.indices.items()}
        if parts[0] == "_search" and parts[1:] == ["scroll"]:
            if method == "DELETE":
                return 200, {"succeeded": True}
            return 200, {"_scroll_id": "s", "hits": {"hits": []}}
        name = parts[0]
        ix = c.indices.get(name)
        if len(parts) == 1:
            if method == "PUT":
                if ix is not None:
                    return _error(400, "resource_already_exists_exception", f"index [{name}/x] already exists")
                c.indices[name] = {"mappings": body.get("mappings", {}), "settings": body.get("settings", {}), "docs": {}}
                return 200, {"acknowledged": True, "index": name}
            if ix is None:
                return _error(404, "index_not_found_exception", f"no such index [{name}]")
            if method == "DELETE":
                del c.indices[name]
                return 200, {"acknowledged": True}
        if ix is None:
            return _error(404, "index_not_found_exception", f"no such index [{name}]")
        op = parts[1]
        if op == "_mapping":
            if method == "PUT":
                ix["mappings"].setdefault("properties", {}).update(body.get("properties", {}))
                if "_meta" in body:
                    ix["mappings"]["_meta"] = body["_meta"]
                return 200, {"acknowledged": True}
            return 200, {name: {"mappings": ix["mappings"]}}
        if op == "_refresh":
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if op == "_count":
            return 200, {"count": len(ix["docs"])}
        if op == "_stats":
            return 200, {"_all": {"primaries": {"store": {"size_in_bytes": 1234}}}}
        if op == "_doc":
            did = parts[2]
            if did in ix["docs"]:
                return 200, {"_index": name, "_id": did, "found": True, "_source": ix["docs"][did]}
            return 404, {"_index": name, "_id": did, "found": False}
        if op == "_mget":
            return 200, {"docs": [{"_index": name, "_id": i, "found": i in ix["docs"]} for i in body["ids"]]}
        if op == "_search":
            for status, p in c.faults.search_status.items():
                if c._roll(p):
                    c.counts["faults"] += 1
                    c.counts["status_faults"] += 1
                    return _error(status, "es_rejected_execution_exception", "rejected execution (fake)")
            return self._search(name, ix, body or {})
        return _error(400, "illegal_argument_exception", f"fake cluster: unsupported {method} {'/'.join(parts)}")

    # --- bulk --------------------------------------------------------------------------------
    def _bulk(self, default_index: str | None, raw: bytes, params: dict) -> tuple[int, Any]:
        c = self.cluster
        f = c.faults
        with c.lock:
            c.counts["bulk_requests"] += 1
            if f.max_bulk_bytes is not None and len(raw) > f.max_bulk_bytes:
                c.counts["faults"] += 1
                return 413, {"error": "Request Entity Too Large", "status": 413}
            for status, p in f.bulk_status.items():
                if c._roll(p):
                    c.counts["faults"] += 1
                    c.counts["status_faults"] += 1
                    typ = "es_rejected_execution_exception" if status == 429 else "unavailable_shards_exception"
                    return _error(status, typ, f"fake {status}")
            drop = c._roll(f.drop)
            slow = not drop and c._roll(f.slow)
            if drop or slow:
                c.counts["faults"] += 1
                c.counts["drops" if drop else "slow"] += 1
        if drop and not f.drop_after_apply:
            raise _Drop()
        if slow:
            time.sleep(f.slow_seconds)
        lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
        items = []
        i = 0
        errors = False
        with c.lock:
            while i < len(lines):
                action = lines[i]
                op, meta = next(iter(action.items()))
                i += 1
                src = None
                if op != "delete":
                    src = lines[i]
                    i += 1
                index = meta.get("_index", default_index)
                did = meta.get("_id")
                item = {"_index": index, "_id": did}
                ix = c.indices.get(index)
                if ix is None:
                    item.update(status=404, error={"type": "index_not_found_exception", "reason": f"no such index [{index}]"})
                elif c._roll(f.item_429):
                    c.counts["item_faults"] += 1
                    item.update(status=429, error={"type": "es_rejected_execution_exception",
                                                   "reason": "rejected execution of coordinating operation"})
                elif op == "delete":
                    if did in ix["docs"]:
                        del ix["docs"][did]
                        item.update(status=200, result="deleted")
                    else:
                        item.update(status=404, result="not_found")
                else:
                    err = self._check_source(ix, src)
                    if err:
                        c.counts["permanent"] += 1
                        item.update(status=400, error={"type": "document_parsing_exception", "reason": err})
                    else:
                        created = did not in ix["docs"]
                        ix["docs"][did] = src
                        item.update(status=201 if created else 200, result="created" if created else "updated")
                if item["status"] >= 300:
                    errors = True
                items.append({op: item})
            if f.item_429 and any(next(iter(x.values()))["status"] == 429 for x in items):
                c.counts["faults"] += 1
        if drop:
            raise _Drop()
        return 200, {"took": 1, "errors": errors, "items": items}

    def _check_source(self, ix: dict, src: dict) -> str | None:
        c = self.cluster
        if src.get("caption_text") == c.faults.poison_caption:
            return "[1:1] failed to parse field [caption_text] (fake permanent error)"
        props = ix["mappings"].get("properties", {})
        if ix["mappings"].get("dynamic") == "strict":
            for k in src:
                if k not in props:
                    return f"[1:1] mapping set to strict, dynamic introduction of [{k}] within [_doc] is not allowed"
        for k, v in src.items():
            if props.get(k, {}).get("type") == "rank_features":
                for feat, w in v.items():
                    if "." in feat and c.flavor == "elasticsearch":
                        return f"[1:1] failed to parse: [rank_features] fields do not support dots in feature names but found [{feat}]"
                    if not (isinstance(w, (int, float)) and w > 0):
                        return f"[rank_features] fields do not support negative or zero values [{feat}]"
        return None

    # --- search ------------------------------------------------------------------------------
    def _search(self, name: str, ix: dict, body: dict) -> tuple[int, Any]:
        q = body.get("query", {"match_all": {}})
        _ann_candidates(q, ix["docs"])
        hits = []
        for did, src in ix["docs"].items():
            m, s = _eval(q, did, src)
            if m:
                hits.append((s, did, src))
        hits.sort(key=lambda t: (-t[0], t[1]))
        size = body.get("size", 10)
        excludes = (body.get("_source") or {}).get("excludes", []) if isinstance(body.get("_source"), dict) else []
        out = [{"_index": name, "_id": d, "_score": s,
                "_source": {k: v for k, v in src.items() if k not in excludes}} for s, d, src in hits[:size]]
        return 200, {"took": 1, "hits": {"total": {"value": len(hits), "relation": "eq"}, "hits": out}}


class _Drop(Exception):
    pass


_ANN: dict[int, set] = {}  # id(neural_sparse clause) -> doc ids its SEISMIC search returned


def _seismic_score(a: dict, src: dict) -> float:
    (fld, spec), = a.items()
    doc = src.get(fld) or {}
    return sum(w * doc[t] for t, w in spec["query_tokens"].items() if t in doc)


def _ann_candidates(q: Any, docs: dict) -> None:
    """A model of OpenSearch SEISMIC on a ``sparse_vector`` field (the Lucene engine, documented
    behaviour): with P documents passing ``method_parameters.filter``, P <= k is an exact search
    over them; otherwise the approximate search returns its k best documents over the whole
    index and the filter is applied to those (so fewer than k may remain)."""
    if isinstance(q, list):
        for x in q:
            _ann_candidates(x, docs)
        return
    if not isinstance(q, dict):
        return
    if "neural_sparse" in q:
        a = q["neural_sparse"]
        (_, spec), = a.items()
        mp = spec.get("method_parameters")
        if mp is not None:
            k = mp["k"]
            flt = mp.get("filter")
            passing = [d for d, src in docs.items() if flt is None or _eval(flt, d, src)[0]]
            scored = {d: _seismic_score(a, src) for d, src in docs.items()}
            if len(passing) <= k:
                cands = {d for d in passing if scored[d] > 0}
            else:
                top = sorted((d for d in docs if scored[d] > 0), key=lambda d: (-scored[d], d))[:k]
                cands = set(top) & set(passing)
            _ANN[id(a)] = cands
        return
    for v in q.values():
        _ann_candidates(v, docs)


def _eval(q: dict, did: str, src: dict) -> tuple[bool, float]:
    """(matches, score) for the query shapes stair_es sends."""
    (kind, a), = q.items()
    if kind == "neural_sparse":
        (_, spec), = a.items()
        if "method_parameters" in spec and did not in _ANN.get(id(a), set()):
            return False, 0.0
        s = _seismic_score(a, src)
        return s > 0, s * spec.get("boost", 1.0)
    if kind == "match_all":
        return True, 1.0
    if kind == "ids":
        return did in a["values"], 0.0
    if kind == "rank_feature":
        fld, _, feat = a["field"].partition(".")
        w = (src.get(fld) or {}).get(feat)
        if w is None:
            return False, 0.0
        return True, stored(w) * a.get("boost", 1.0) if "linear" in a else 0.0
    if kind == "term":
        (f, v), = a.items()
        val = src.get(f)
        return (v in val if isinstance(val, list) else val == v), 0.0
    if kind == "terms":
        (f, vs), = a.items()
        val = src.get(f)
        vals = val if isinstance(val, list) else [val]
        return any(x in vs for x in vals), 0.0
    if kind == "exists":
        return src.get(a["field"]) is not None, 0.0
    if kind == "range":
        (f, b), = a.items()
        v = src.get(f)
        if v is None:
            return False, 0.0
        ok = all([b.get("gt") is None or v > b["gt"], b.get("gte") is None or v >= b["gte"],
                  b.get("lt") is None or v < b["lt"], b.get("lte") is None or v <= b["lte"]])
        return ok, 0.0
    if kind == "bool":
        score = 0.0
        for sub in a.get("must", []):
            m, s = _eval(sub, did, src)
            if not m:
                return False, 0.0
            score += s
        for sub in a.get("filter", []):
            if not _eval(sub, did, src)[0]:
                return False, 0.0
        for sub in a.get("must_not", []):
            if _eval(sub, did, src)[0]:
                return False, 0.0
        matched = 0
        for sub in a.get("should", []):
            m, s = _eval(sub, did, src)
            if m:
                matched += 1
                score += s
        msm = a.get("minimum_should_match", 0 if (a.get("must") or a.get("filter")) else 1)
        if a.get("should") and matched < msm:
            return False, 0.0
        return True, float(np.float32(score))
    raise ValueError(f"fake cluster cannot evaluate {kind}")
