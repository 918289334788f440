"""Named fakes for unit tests: an in-memory backend and a deterministic encoder.

``MemoryBackend`` implements the SearchBackend protocol by brute force (exact dot products,
filters evaluated per document): it is the reference the real backends are compared to in
tests, and lets the ingest pipeline and CLI be tested without the engine or a model.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

import numpy as np

from stair_es.backends.base import IndexInfo, SearchBackend
from stair_es.encoders.base import Encoder
from stair_es.errors import DocumentNotFoundError, IndexExistsError, IndexNotFoundError
from stair_es.query import And, Exists, Filter, HasTokens, Not, Or, Range, SearchRequest, Term, Terms
from stair_es.schema import Document, Explanation, Hit, IndexSchema, IngestReport, ItemResult, SearchResult, TokenContribution
from stair_es.sparse import SparseVector
from stair_es.vocab import VOCAB_SIZE, default_vocabulary


def matches(f: Filter | None, doc: Document, vocab=None) -> bool:
    vocab = vocab or default_vocabulary()
    if f is None:
        return True
    if isinstance(f, And):
        return all(matches(x, doc, vocab) for x in f.filters)
    if isinstance(f, Or):
        return any(matches(x, doc, vocab) for x in f.filters)
    if isinstance(f, Not):
        return not matches(f.filter, doc, vocab)
    if isinstance(f, HasTokens):
        v = doc.vectors.get(f.field)
        have = set(v.ids.tolist()) if v is not None else set()
        ids = f.token_ids(vocab)
        return any(i in have for i in ids) if f.mode == "any" else all(i in have for i in ids)
    value = doc.metadata.get(f.field)
    vals = value if isinstance(value, tuple) else (value,)
    if isinstance(f, Exists):
        return value is not None
    if isinstance(f, Term):
        return value is not None and f.value in vals
    if isinstance(f, Terms):
        return value is not None and any(v in vals for v in f.values)
    if isinstance(f, Range):
        if value is None:
            return False
        ok = True
        ok &= f.gt is None or value > f.gt
        ok &= f.gte is None or value >= f.gte
        ok &= f.lt is None or value < f.lt
        ok &= f.lte is None or value <= f.lte
        return ok
    raise TypeError(f)


def score(request: SearchRequest, doc: Document) -> float:
    s = np.float32(0)
    for c in request.clauses:
        v = doc.vectors.get(c.field)
        if v is not None:
            s += np.float32(c.weight) * np.float32(c.vector.dot(v))
    return float(s)


class MemoryBackend(SearchBackend):
    name = "memory"

    def __init__(self, fail_ids: Iterable[str] = ()):
        self.indices: dict[str, tuple[IndexSchema, dict[str, Document]]] = {}
        self.fail_ids = set(fail_ids)
        self.ingest_calls = 0

    def _idx(self, index):
        try:
            return self.indices[index]
        except KeyError:
            raise IndexNotFoundError(f"no index {index!r}") from None

    def create_index(self, index, schema, *, exist_ok=False):
        if index in self.indices:
            if exist_ok:
                return
            raise IndexExistsError(f"index {index!r} exists")
        self.indices[index] = (schema, {})

    def list_indices(self):
        return sorted(self.indices)

    def index_info(self, index):
        schema, docs = self._idx(index)
        return IndexInfo(index, schema, len(docs))

    def delete_index(self, index):
        self._idx(index)
        del self.indices[index]

    def ingest(self, index, docs, *, on_batch=None):
        self.ingest_calls += 1
        schema, store = self._idx(index)
        report = IngestReport()
        for d in docs:
            if d.id in self.fail_ids:
                report.add(ItemResult(d.id, False, "rejected by fake"))
                continue
            try:
                meta, new = schema.normalize_metadata(d.metadata)
            except Exception as e:  # noqa: BLE001
                report.add(ItemResult(d.id, False, str(e)))
                continue
            schema.fields.update(new)
            action = "update" if d.id in store else "index"
            store[d.id] = Document(d.id, d.vectors, meta, d.caption, d.source)
            report.add(ItemResult(d.id, True, action=action))
        return report

    def get(self, index, doc_id):
        _, store = self._idx(index)
        try:
            return store[doc_id]
        except KeyError:
            raise DocumentNotFoundError(f"no document {doc_id!r}") from None

    def existing_ids(self, index, ids):
        _, store = self._idx(index)
        return {i for i in ids if i in store}

    def delete_documents(self, index, ids):
        _, store = self._idx(index)
        report = IngestReport()
        for i in ids:
            ok = store.pop(i, None) is not None
            report.add(ItemResult(i, ok, None if ok else "not found", action="delete"))
        return report

    def search(self, index, request):
        schema, store = self._idx(index)
        t = time.perf_counter()
        req = request.prepared(schema)
        scored = [(score(req, d), d) for d in store.values() if matches(req.filter, d)]
        scored = [(s, d) for s, d in scored if s > 0]
        scored.sort(key=lambda x: (-x[0], x[1].id))
        hits = [Hit(d.id, s, d.metadata, d.caption, d.source) for s, d in scored[: req.top_k]]
        return SearchResult(hits, len(scored), (time.perf_counter() - t) * 1000, req.notes)

    def explain(self, index, doc_id, request):
        schema, _ = self._idx(index)
        req = request.prepared(schema)
        doc = self.get(index, doc_id)
        contribs = []
        for c in req.clauses:
            v = doc.vectors.get(c.field)
            if v is None:
                continue
            for tok, qw, dw, _ in c.vector.contributions(v):
                contribs.append(TokenContribution(c.field, tok, qw * c.weight, dw, qw * c.weight * dw))
        contribs.sort(key=lambda x: -x.contribution)
        return Explanation(doc_id, score(req, doc), contribs, matches(req.filter, doc))

    def doc_freqs(self, index, field):
        _, store = self._idx(index)
        df = np.zeros(VOCAB_SIZE, np.int64)
        for d in store.values():
            v = d.vectors.get(field)
            if v is not None:
                df[v.ids] += 1
        return df, len(store)


class ColorEncoder(Encoder):
    """Deterministic fake: an image's dominant colour channel and brightness become tokens."""

    name = "fake-color"
    modalities = frozenset({"image", "text"})

    def __init__(self, fail_on_size: tuple[int, int] | None = None, **_):
        super().__init__()
        self.fail_on_size = fail_on_size
        self.calls = 0

    def encode_images(self, images, *, batch_size=16, progress=False):
        self.calls += 1
        out = []
        for im in images:
            if self.fail_on_size and im.size == self.fail_on_size:
                raise RuntimeError("fake encoder cannot handle this image")
            r, g, b = [float(x) for x in np.asarray(im.convert("RGB"), dtype=np.float32).mean(axis=(0, 1))]
            tm = {"red": r / 255 + 0.01, "green": g / 255 + 0.01, "blue": b / 255 + 0.01}
            tm["bright" if (r + g + b) / 3 > 127 else "dark"] = 1.0
            out.append(SparseVector.from_token_map(tm))
        return out

    def encode_texts(self, texts, *, batch_size=32, progress=False, idf=None):
        vocab = default_vocabulary()
        out = []
        for t in texts:
            ids = [i for i in vocab.encode(t) if not vocab.is_special(i)]
            out.append(SparseVector.from_arrays(ids, [1.0] * len(ids), vocab))
        return out

    def config(self):
        return {"name": self.name}


_LOCK_HOLDER = """
import sys, time
from stair_es.engine import EngineIndex
ix = EngineIndex.open(sys.argv[1], writable=True)
print("locked", flush=True)
time.sleep(120)
"""


@contextmanager
def writer_lock_held(index_dir) -> Iterator[None]:
    """Another process holds ``index_dir``'s writer lock for the duration of the block."""
    p = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(index_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "locked"
        yield
    finally:
        p.kill()
        p.wait()


def acked_until_killed(code: str, args: list[str], delay: float) -> list[int]:
    """Run ``python -c code *args``, SIGKILL it after ``delay`` seconds, and return the integers
    it printed one per line: what a writer acknowledged (flushed) before it was killed. The
    first line is awaited, so the writer has started before the clock runs."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    acked: list[int] = []
    first = proc.stdout.readline()
    if first.strip():
        acked.append(int(first))
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate()
    acked += [int(x) for x in out.split()]
    return acked
