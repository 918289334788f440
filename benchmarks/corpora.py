"""Benchmark corpora: seeded synthetic sparse corpora with STAIR-like statistics, cached on disk.

A corpus is CSR arrays over the 30,522 BERT WordPiece ids (documents = image vectors, queries =
text vectors), plus the seed that regenerates the dense 512-d baseline vectors of the same size.
This module owns generation, caching and top-n pruning; it knows nothing about the systems.
Real encoded corpora (``source = "scenes" | "samples"``) run images and captions through a
registered stair_es encoder instead, and are cached the same way.

Statistics (tunable in the config's ``corpus`` table), after STAIR section 6.3: image vectors
activate more tokens than text ones (``doc_nnz`` ~100-300 vs ``query_nnz`` ~10-30); token
frequencies follow a Zipf-Mandelbrot law over the non-special vocabulary; weights are positive,
gamma-distributed like ``log(1 + relu(x))`` activations. A query is a "caption" of a random target
image: ``query_overlap`` of its tokens come from that image's strongest tokens, the rest from the
background distribution, so rankings have structure (approximate systems are not judged on noise).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from stair_es.vocab import VOCAB_SIZE, default_vocabulary

log = logging.getLogger(__name__)

CACHE_DIR = Path(os.environ.get("STAIR_BENCH_CACHE", Path(__file__).resolve().parent / ".cache"))
GENERATOR_VERSION = 1  # bump when generation changes, so stale caches are not reused
_CHUNK_DOCS = 50_000


@dataclass
class CorpusSpec:
    n_docs: int
    n_queries: int = 500
    doc_nnz: tuple[int, int] = (100, 300)  # inclusive range, uniform
    query_nnz: tuple[int, int] = (10, 30)
    zipf_s: float = 1.0  # token-frequency exponent
    zipf_offset: float = 10.0  # Mandelbrot offset: flattens the head so no token is in every document
    weight_shape: float = 2.0  # gamma(shape, scale) weights
    weight_scale: float = 0.4
    query_overlap: float = 0.7  # share of query tokens taken from the target image
    dense_dim: int = 512
    seed: int = 0
    doc_top_n: int | None = None  # VisualSparta: keep only each image's top-n tokens
    # "synthetic", or a real encoded corpus: "scenes" (STAIR's synthetic captioned scenes, n_docs
    # of them) or "samples" (the sample catalog's photos); queries are captions of random images
    source: str = "synthetic"
    encoder: str = "default"

    @classmethod
    def from_config(cls, table: dict[str, Any], n_docs: int) -> "CorpusSpec":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(table) - known - {"kind", "sizes"}
        if unknown:
            raise ValueError(f"unknown corpus settings {sorted(unknown)}; known: {sorted(known)}")
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in table.items() if k in known}
        kw["n_docs"] = int(n_docs)
        return cls(**kw)

    def key(self) -> str:
        d = asdict(self)
        d.pop("doc_top_n")
        if self.source == "synthetic":  # keys of synthetic corpora predate these fields
            d.pop("source")
            d.pop("encoder")
        d["version"] = GENERATOR_VERSION
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Csr:
    indptr: np.ndarray  # int64 [n+1]
    indices: np.ndarray  # int32 token ids, sorted within a row
    weights: np.ndarray  # float32 > 0

    @property
    def n_rows(self) -> int:
        return len(self.indptr) - 1

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.indptr[i], self.indptr[i + 1]
        return self.indices[a:b], self.weights[a:b]

    def head(self, n: int) -> "Csr":
        end = int(self.indptr[n])
        return Csr(self.indptr[: n + 1], self.indices[:end], self.weights[:end])

    def to_scipy(self, n_cols: int = VOCAB_SIZE):
        import scipy.sparse as sp

        return sp.csr_matrix((self.weights, self.indices, self.indptr), shape=(self.n_rows, n_cols))

    def stats(self) -> dict[str, float]:
        lens = np.diff(self.indptr)
        return {
            "rows": self.n_rows,
            "nnz": self.nnz,
            "nnz_mean": float(lens.mean()) if len(lens) else 0.0,
            "nnz_min": int(lens.min()) if len(lens) else 0,
            "nnz_max": int(lens.max()) if len(lens) else 0,
        }


@dataclass
class Corpus:
    spec: CorpusSpec
    docs: Csr
    queries: Csr
    info: dict[str, Any] = field(default_factory=dict)

    def dense_docs(self) -> np.ndarray:
        return random_unit_vectors(self.spec.n_docs, self.spec.dense_dim, self.spec.seed + 1)

    def dense_doc_chunks(self):
        return iter_unit_vectors(self.spec.n_docs, self.spec.dense_dim, self.spec.seed + 1)

    def dense_queries(self) -> np.ndarray:
        return random_unit_vectors(self.spec.n_queries, self.spec.dense_dim, self.spec.seed + 2)


def iter_unit_vectors(n: int, dim: int, seed: int, chunk: int = 100_000):
    """Seeded random unit vectors (float32) in chunks, so a caller can index them without ever
    holding a second full copy."""
    rng = np.random.default_rng(seed)
    for a in range(0, n, chunk):
        x = rng.standard_normal((min(n, a + chunk) - a, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        yield x


def random_unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    a = 0
    for x in iter_unit_vectors(n, dim, seed):
        out[a : a + len(x)] = x
        a += len(x)
    return out


def _token_table(spec: CorpusSpec) -> tuple[np.ndarray, np.ndarray]:
    """(token id of each frequency rank, cumulative rank probabilities)."""
    rng = np.random.default_rng(spec.seed)
    allowed = np.flatnonzero(~default_vocabulary().special_mask).astype(np.int32)
    by_rank = rng.permutation(allowed)
    ranks = np.arange(1, len(by_rank) + 1, dtype=np.float64)
    p = (ranks + spec.zipf_offset) ** -spec.zipf_s
    cdf = np.cumsum(p)
    cdf /= cdf[-1]
    return by_rank, cdf


def _rows_from_draws(rows: np.ndarray, toks: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort draws by (row, token), drop repeats; return (indptr, indices)."""
    keys = rows.astype(np.int64) * VOCAB_SIZE + toks
    keys.sort()
    if keys.size:
        keep = np.ones(keys.size, dtype=bool)
        keep[1:] = keys[1:] != keys[:-1]
        keys = keys[keep]
    r = keys // VOCAB_SIZE
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(r, minlength=n_rows), out=indptr[1:])
    return indptr, (keys % VOCAB_SIZE).astype(np.int32)


def _generate_docs(spec: CorpusSpec, by_rank: np.ndarray, cdf: np.ndarray) -> Csr:
    rng = np.random.default_rng([spec.seed, 1])
    lo, hi = spec.doc_nnz
    indptrs, indices, weights = [np.zeros(1, np.int64)], [], []
    offset = 0
    for a in range(0, spec.n_docs, _CHUNK_DOCS):
        n = min(spec.n_docs, a + _CHUNK_DOCS) - a
        lens = rng.integers(lo, hi + 1, size=n)
        rows = np.repeat(np.arange(n, dtype=np.int64), lens)
        toks = by_rank[np.searchsorted(cdf, rng.random(rows.size))]
        ip, idx = _rows_from_draws(rows, toks, n)
        w = rng.gamma(spec.weight_shape, spec.weight_scale, size=idx.size).astype(np.float32)
        w = np.maximum(w, np.float32(1e-3))
        indptrs.append(ip[1:] + offset)
        indices.append(idx)
        weights.append(w)
        offset += int(ip[-1])
    return Csr(np.concatenate(indptrs), np.concatenate(indices), np.concatenate(weights))


def _generate_queries(spec: CorpusSpec, docs: Csr, by_rank: np.ndarray, cdf: np.ndarray) -> tuple[Csr, np.ndarray]:
    rng = np.random.default_rng([spec.seed, 2])
    lo, hi = spec.query_nnz
    targets = rng.integers(0, docs.n_rows, size=spec.n_queries)
    rows, toks = [], []
    for qi, t in enumerate(targets):
        n = int(rng.integers(lo, hi + 1))
        ids, w = docs.row(int(t))
        n_from_doc = min(len(ids), int(round(n * spec.query_overlap)))
        # the caption names the image's strongest tokens, sampled in proportion to their weight
        picked = rng.choice(ids, size=n_from_doc, replace=False, p=w / w.sum()) if n_from_doc else ids[:0]
        noise = by_rank[np.searchsorted(cdf, rng.random(n - n_from_doc))]
        q = np.concatenate([picked, noise])
        rows.append(np.full(q.size, qi, np.int64))
        toks.append(q)
    indptr, indices = _rows_from_draws(np.concatenate(rows), np.concatenate(toks).astype(np.int32), spec.n_queries)
    w = rng.gamma(spec.weight_shape, spec.weight_scale, size=indices.size).astype(np.float32)
    return Csr(indptr, indices, np.maximum(w, np.float32(1e-3))), targets


def _csr_from_vectors(vectors) -> Csr:
    lens = np.array([v.nnz for v in vectors], dtype=np.int64)
    indptr = np.zeros(len(vectors) + 1, np.int64)
    np.cumsum(lens, out=indptr[1:])
    idx = np.concatenate([v.ids for v in vectors]).astype(np.int32) if vectors else np.zeros(0, np.int32)
    w = np.concatenate([v.weights for v in vectors]).astype(np.float32) if vectors else np.zeros(0, np.float32)
    return Csr(indptr, idx, w)


def _encode_corpus(spec: CorpusSpec, work: Path) -> tuple[Csr, Csr, np.ndarray, dict[str, Any]]:
    """Encode real images and captions with ``spec.encoder`` (images -> docs, captions -> queries)."""
    from PIL import Image

    from stair_es.encoders.base import get_encoder

    if spec.source == "scenes":
        from stair_es.stair.scenes import make_scenes

        paths = make_scenes(work / "scenes", n_train=0, n_test=spec.n_docs, seed=spec.seed)
        rows = [json.loads(line) for line in Path(paths["test"]).read_text().splitlines() if line.strip()]
        base = Path(paths["test"]).parent
        items = [(base / r["image"], r["captions"][0]) for r in rows]
    elif spec.source == "samples":
        from stair_es.samples import write_sample_catalog

        manifest = write_sample_catalog(work / "samples", on_error=lambda s, e: log.warning("sample %s skipped: %s", s.id, e))
        rows = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
        items = [(manifest.parent / r["path"], r["caption"]) for r in rows]
    else:
        raise ValueError(f"unknown corpus source {spec.source!r}; use synthetic, scenes or samples")
    enc = get_encoder(spec.encoder)
    images = [Image.open(p).convert("RGB") for p, _ in items]
    docs = _csr_from_vectors(enc.encode_images(images, batch_size=32))
    rng = np.random.default_rng([spec.seed, 2])
    targets = rng.integers(0, len(items), size=spec.n_queries)
    queries = _csr_from_vectors(enc.encode_texts([items[t][1] for t in targets]))
    return docs, queries, targets, {"encoder": enc.config()}


def prune_rows(m: Csr, top_n: int | None) -> Csr:
    """Keep each row's ``top_n`` largest weights (VisualSparta's top-n terms per image)."""
    if top_n is None:
        return m
    lens = np.diff(m.indptr)
    if lens.max(initial=0) <= top_n:
        return m
    new_lens = np.minimum(lens, top_n)
    indptr = np.zeros_like(np.asarray(m.indptr))
    np.cumsum(new_lens, out=indptr[1:])
    keep = _top_n_positions(np.asarray(m.indptr), np.asarray(m.weights), int(top_n), int(indptr[-1]))
    return Csr(indptr, m.indices[keep], m.weights[keep])


@njit(cache=True)
def _top_n_positions(indptr, weights, top_n, total):
    out = np.empty(total, np.int64)
    o = 0
    for r in range(indptr.size - 1):
        a, b = indptr[r], indptr[r + 1]
        if b - a <= top_n:
            for p in range(a, b):
                out[o] = p
                o += 1
        else:
            best = np.sort(np.argsort(-weights[a:b], kind="mergesort")[:top_n])  # back to token order
            for p in best:
                out[o] = a + p
                o += 1
    return out


def _save(path: Path, c: Csr) -> None:
    for name in ("indptr", "indices", "weights"):
        np.save(path / f"{name}.npy", getattr(c, name))


def _load(path: Path, mmap: bool) -> Csr:
    mode = "r" if mmap else None
    return Csr(*(np.load(path / f"{n}.npy", mmap_mode=mode) for n in ("indptr", "indices", "weights")))


def corpus_dir(spec: CorpusSpec, cache_dir: Path | None = None) -> Path:
    return Path(cache_dir or CACHE_DIR) / f"{spec.source}-{spec.n_docs}-{spec.key()}"


def load_corpus(spec: CorpusSpec, cache_dir: Path | None = None, *, mmap: bool = False) -> Corpus:
    """Return the corpus for ``spec``, generating and caching it on first use."""
    path = corpus_dir(spec, cache_dir)
    if not (path / "info.json").exists():
        import time

        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock"):
            if not (path / "info.json").exists():
                t0 = time.perf_counter()
                tmp = path.with_name(path.name + ".tmp")
                if tmp.exists():
                    import shutil

                    shutil.rmtree(tmp)
                extra: dict[str, Any] = {}
                if spec.source == "synthetic":
                    by_rank, cdf = _token_table(spec)
                    docs = _generate_docs(spec, by_rank, cdf)
                    queries, targets = _generate_queries(spec, docs, by_rank, cdf)
                else:
                    docs, queries, targets, extra = _encode_corpus(spec, tmp)
                (tmp / "docs").mkdir(parents=True, exist_ok=True)
                (tmp / "queries").mkdir(parents=True, exist_ok=True)
                _save(tmp / "docs", docs)
                _save(tmp / "queries", queries)
                np.save(tmp / "targets.npy", targets)
                info = {
                    "spec": asdict(spec) | {"doc_top_n": None},
                    "docs": docs.stats(),
                    "queries": queries.stats(),
                    "generate_s": round(time.perf_counter() - t0, 2),
                } | extra
                (tmp / "info.json").write_text(json.dumps(info, indent=1))
                tmp.rename(path)
                log.info("generated %s in %.1f s", path.name, info["generate_s"])
    info = json.loads((path / "info.json").read_text())
    docs = _load(path / "docs", mmap)
    if spec.doc_top_n is not None:
        docs = prune_rows(docs, spec.doc_top_n)
        info = info | {"docs": docs.stats(), "doc_top_n": spec.doc_top_n}
    return Corpus(spec, docs, _load(path / "queries", mmap), info)
