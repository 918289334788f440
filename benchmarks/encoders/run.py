"""Text -> image retrieval quality of the offline encoders on public sets.

    python -m benchmarks.encoders.run                                  # all sets, default encoder
    python -m benchmarks.encoders.run --sets photos,samples --query default   # a quick look
    python -m benchmarks.encoders.run --export-ratings /tmp/photos     # the photos set as a folder + ratings.jsonl
    python -m benchmarks.encoders.run --sets samples,tuxpaint --limit 300 --out benchmarks/results/encoders/after.json
    python benchmarks/encoders/run.py ...                              # same, without the repository on sys.path:
                                                                       # measures whichever stair_es is installed

For every set, each item's image is encoded by the image side of the ``default`` encoder
(or ``--image-encoder NAME``). In the item sets (samples, tuxpaint, openclipart) each item's
own description is a query and items sharing the same description are all relevant; the
``photos`` set has its own queries, written by a person looking at the photos, with graded
relevant sets (2 = clearly what was asked, 1 = acceptable). Queries are scored against every
image of the set by the sparse dot product -- what every backend computes -- and ranked with
**ties counted against the query** (an image scoring the same as a relevant one is ranked
before it).

Query encoders compared (``--query`` to choose):

* ``splade``: SPLADE-tiny expansion;
* ``bow``: the query's own tokens (no model), weight 1 each (count-saturated);
* ``bow-idf``: ``bow`` times the IDF of each token among the set's image vectors (what
  ``stair-es search`` does for ``bow`` on an index);
* ``splade-idf``: SPLADE-tiny restricted to tokens that occur in the image vectors, times IDF;
* ``grounded`` / ``grounded-idf``: the query's own tokens plus their WordNet relatives that
  images can carry (``stair_es.encoders.grounded``), without / with IDF;
* ``splade+grounded``: per token the larger of the two;
* ``default``: whatever the ``default`` encoder's text side is (with IDF if it uses it).

``--expand N`` adds, for every query encoder, a row ``ENCODER+xN``: the same queries expanded
with each token's N best image-token neighbours by PPMI (``stair_es.neighbours``, what
``stair-es search --expand N`` does). The PPMI statistics come from captions and image vectors
of items *other* than the ones queried: the set is split in two halves (fixed seed), the
statistics of one half expand the queries of the other, each query ranks the images of its
own half, and the two halves' ranks are pooled -- so the rows with and without expansion
are measured on the same halves. ``--expand-split transductive`` instead counts the whole
set, whose captions are the queries themselves (optimistic: the query's own caption is in
the statistics).

Metrics, every set in one table: P@1 (a relevant image first), MRR (1 / rank of the first
relevant image), nDCG@10 (graded; computed by ir-measures on the tie-broken ranking, ``pip
install 'stair-es[eval]'``), R@5 (a relevant image in the top 5: success at 5, as this harness
has always counted it -- not recall), the median rank of the first relevant image, and
images/s of the image encoder (PIL image in, vector out; the set's own loading and
rasterising is not counted). The photos set also reports P@1 per query category. Each report
carries the git commit, the stair_es version under test and machine info.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a file: import the sets module beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sets import QUERY_SETS, QuerySet, SetUnavailable, export_ratings, load_query_set  # type: ignore[no-redef]
else:
    from .sets import QUERY_SETS, QuerySet, SetUnavailable, export_ratings, load_query_set

QUERY_ENCODERS = ("default", "splade", "bow", "bow-idf", "splade-idf", "grounded", "grounded-idf", "splade+grounded")


def rank_metrics(scores: np.ndarray, relevant: list[np.ndarray]) -> dict[str, float]:
    """P@1, MRR, R@5 of a (queries x images) score matrix; ties count against the query.

    ``relevant[i]``: indices of the images relevant to query ``i``. The rank of a query is
    1 + the number of non-relevant images scoring at least as high as its best relevant one.
    """
    return metrics_of_ranks(query_ranks(scores, relevant))


def metrics_of_ranks(r: np.ndarray) -> dict[str, float]:
    r = np.asarray(r, dtype=np.float64)
    return {"p1": float(np.mean(r == 1)), "mrr": float(np.mean(1.0 / r)), "r5": float(np.mean(r <= 5)),
            "median_rank": float(np.median(r))}


def query_ranks(scores: np.ndarray, relevant: list[np.ndarray]) -> np.ndarray:
    """The rank of each query (see :func:`rank_metrics`)."""
    ranks = []
    for i, rel in enumerate(relevant):
        row = scores[i]
        best = row[rel].max()
        ahead = np.count_nonzero(row >= best) - np.count_nonzero(row[rel] >= best)
        ranks.append(1 + int(ahead))
    return np.asarray(ranks, dtype=np.float64)


def graded_ranking(row: np.ndarray, grades: dict[int, int]) -> np.ndarray:
    """Image indices in ranked order, ties broken against the query: among equal scores the
    non-relevant images come first, then the relevant ones from the lowest grade up."""
    g = np.zeros(row.shape[0], np.int64)
    for i, grade in grades.items():
        g[i] = grade
    return np.lexsort((g, -row))


def ndcg_at_10(scores: np.ndarray, grades: list[dict[int, int]]) -> float | None:
    """Mean nDCG@10 over the queries (ir-measures, trec_eval's definition) of the tie-broken
    rankings; ``None`` when ir-measures is not installed."""
    try:
        import ir_measures
        from ir_measures import nDCG
    except ImportError:
        return None
    qrels, run = [], []
    for qi, gr in enumerate(grades):
        qid = str(qi)
        qrels.extend(ir_measures.Qrel(qid, str(d), int(g)) for d, g in gr.items())
        order = graded_ranking(scores[qi], gr)[:10]
        run.extend(ir_measures.ScoredDoc(qid, str(int(d)), float(10 - r)) for r, d in enumerate(order))
    return float(ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10])


def query_set_metrics(scores: np.ndarray, grades: list[dict[int, int]]) -> dict[str, float | None]:
    """P@1, MRR, R@5, median rank (ties against the query) and nDCG@10 of a (queries x
    images) score matrix; ``grades[i]`` maps the images relevant to query ``i`` to their grade."""
    m: dict[str, float | None] = dict(rank_metrics(scores, [np.asarray(sorted(g)) for g in grades]))
    m["ndcg10"] = ndcg_at_10(scores, grades)
    return m


def _dense(vectors) -> np.ndarray:
    from stair_es.vocab import VOCAB_SIZE

    out = np.zeros((len(vectors), VOCAB_SIZE), np.float32)
    for i, v in enumerate(vectors):
        if v is not None and v.nnz:
            out[i, np.asarray(v.ids, dtype=np.int64)] = v.weights
    return out


def _idf(image_dense: np.ndarray) -> np.ndarray:
    df = np.count_nonzero(image_dense > 0, axis=0)
    n = image_dense.shape[0]
    return np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)


def _encode_queries(kind: str, texts: list[str], image_dense: np.ndarray, default_encoder) -> np.ndarray:
    from stair_es.encoders import get_encoder
    from stair_es.errors import StairError

    idf = _idf(image_dense)
    present = (image_dense > 0).any(axis=0)
    if kind == "splade+grounded":
        return np.maximum(_encode_queries("splade", texts, image_dense, default_encoder),
                          _encode_queries("grounded", texts, image_dense, default_encoder))
    if kind == "default":
        enc, weights = default_encoder, (idf if getattr(default_encoder, "uses_idf", False) else None)
    elif kind in ("splade", "splade-idf"):
        enc, weights = get_encoder("splade"), None
    elif kind in ("grounded", "grounded-idf"):
        enc, weights = get_encoder("grounded"), (idf if kind == "grounded-idf" else None)
    else:
        enc, weights = get_encoder("bow"), (idf if kind == "bow-idf" else None)
    # what `stair-es search` gives the encoder: the index's document frequencies (grounding)
    stats = None
    if getattr(enc, "uses_index_stats", False):
        from stair_es.encoders.grounding import IndexStats

        stats = IndexStats(np.count_nonzero(image_dense > 0, axis=0), image_dense.shape[0])
    vecs = []
    for t in texts:
        try:
            vecs.append(enc.encode_texts([t], idf=weights, index_stats=stats)[0] if stats is not None
                        else enc.encode_texts([t], idf=weights)[0])
        except StairError:  # nothing searchable in the text: it finds nothing
            vecs.append(None)
    q = _dense(vecs)
    if kind == "splade-idf":
        q = q * present * idf
    return q


def _held_shares(texts: list[str], image_dense: np.ndarray, default_encoder) -> list[float]:
    """Per query, the share of its words the index holds (what `stair-es search` re-ranks with)."""
    from stair_es.encoders.grounding import IndexStats
    from stair_es.rerank import held_share

    if not getattr(default_encoder, "uses_index_stats", False):
        return [1.0] * len(texts)
    stats = IndexStats(np.count_nonzero(image_dense > 0, axis=0), image_dense.shape[0])
    out = []
    for t in texts:
        try:
            steps = default_encoder.encode_queries([t], idf=_idf(image_dense), index_stats=stats)[0].grounding
        except Exception:  # noqa: BLE001 - a query with nothing to search: it is not re-ranked either
            steps = []
        out.append(held_share([s.to_dict() for s in steps]))
    return out


def _reranked(q: np.ndarray, texts: list[str], helds: list[float], img: np.ndarray, sentence) -> np.ndarray:
    """The scores of queries ``q`` with each query's best hits re-ranked by meaning, as `stair-es
    search` does (stair_es.rerank): the candidate search adds the words nearest the query's meaning
    at a small weight; its top WINDOW (score > 0, ties in item order) move above every other item,
    in their fused order."""
    from stair_es.rerank import CANDIDATE_WEIGHT, WINDOW, candidate_words, fused_order, meaning_scores

    idf, table = _idf(img), sentence.word_table()
    queries = sentence.embed(texts, batch_size=1)  # as a search embeds its query (SentenceEncoder.embed)
    df = np.count_nonzero(img > 0, axis=0)
    q = q.copy()
    for n in range(len(texts)):
        if q[n].max() > 0:
            words, cos = candidate_words(queries[n], df, table)
            q[n, words] = np.maximum(q[n, words], CANDIDATE_WEIGHT * q[n].max() * cos)
    scores = q @ img.T
    out = scores.astype(np.float64)  # float32 could not tell 1e6 + fused scores apart
    for n, row in enumerate(scores):
        cand = np.nonzero(row > 0)[0]
        cand = cand[np.lexsort((cand, -row[cand]))][:WINDOW]
        if cand.size < 2:
            continue
        docs = [(np.nonzero(img[j])[0], img[j][np.nonzero(img[j])[0]]) for j in cand]
        _, fused, _ = fused_order(meaning_scores(queries[n], docs, idf, table), helds[n], row[cand])
        out[n, cand] = 1e6 + fused
    return out


def _relevance(texts: list[str]) -> list[np.ndarray]:
    norm = [" ".join(t.lower().split()) for t in texts]
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(norm):
        groups.setdefault(t, []).append(i)
    return [np.asarray(groups[t]) for t in norm]


def _expand_rows(q: np.ndarray, counts, n: int, weight: float, min_count: int) -> np.ndarray:
    """Each query row expanded as ``stair-es search --expand n`` expands a query vector."""
    from stair_es.neighbours import expand_vector
    from stair_es.sparse import SparseVector
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    out = q.copy()
    for i in range(q.shape[0]):
        ids = np.flatnonzero(q[i])
        if ids.size:
            v, added = expand_vector(SparseVector(ids.astype(np.int32), q[i, ids], vocab), counts, n, weight=weight,
                                     min_count=min_count)
            out[i, v.ids] = v.weights
    return out


def _expansion_rows(q: np.ndarray, img: np.ndarray, vecs, texts: list[str], rel_all, expand: dict) -> tuple[dict, dict]:
    """(metrics without, metrics with expansion) on the split ``expand['split']`` describes."""
    from stair_es.neighbours import Cooccurrence

    def counts_of(rows):
        return Cooccurrence.from_documents((vecs[i].ids if vecs[i] is not None else np.zeros(0, np.int32), texts[i])
                                           for i in rows)

    n = len(texts)
    if expand["split"] == "transductive":
        folds = [(np.arange(n), np.arange(n))]
    else:
        perm = np.random.default_rng(0).permutation(n)
        a, b = np.sort(perm[: n // 2]), np.sort(perm[n // 2:])
        folds = [(a, b), (b, a)]  # (rows whose statistics are used, rows queried and ranked)
    plain, expanded, order = [], [], []
    for stats_rows, rows in folds:
        order.append(rows)
        counts = counts_of(stats_rows)
        rel = _relevance([texts[i] for i in rows])
        sub_img = img[rows]
        plain.append(query_ranks(q[rows] @ sub_img.T, rel))
        qx = _expand_rows(q[rows], counts, expand["n"], expand["weight"], expand["min_count"])
        expanded.append(query_ranks(qx @ sub_img.T, rel))
    # queries whose description no other item of the set shares: a title shared by many items
    # (e.g. a collection's boilerplate) makes every item of the collection relevant
    unique = np.asarray([rel_all[i].size == 1 for i in np.concatenate(order)])
    p, x = np.concatenate(plain), np.concatenate(expanded)
    base, exp = metrics_of_ranks(p), metrics_of_ranks(x)
    if unique.any():
        base.update({f"{k}_unique": v for k, v in metrics_of_ranks(p[unique]).items() if k in ("p1", "mrr")})
        exp.update({f"{k}_unique": v for k, v in metrics_of_ranks(x[unique]).items() if k in ("p1", "mrr")})
        base["n_unique"] = exp["n_unique"] = int(unique.sum())
    return base, exp


def evaluate_set(name: str, qs: QuerySet, image_encoder, queries: list[str], default_encoder, batch_size: int = 32,
                 expand: dict | None = None, sentence=None) -> list[dict]:
    images, kept = [], []
    for it in qs.items:
        try:
            images.append(it.load())
            kept.append(it)
        except Exception as e:  # noqa: BLE001 - a file the set's own decoder cannot read: counted, not fatal
            print(f"# {name}: skipped {it.id}: cannot load it ({type(e).__name__}: {e})", file=sys.stderr)
    index = {it.id: i for i, it in enumerate(kept)}
    rated = []
    for q in qs.queries:
        g = {index[k]: v for k, v in q.relevant.items() if k in index}
        if g:
            rated.append((q, g))
        else:
            print(f"# {name}: query {q.id} {q.text!r} left out: none of its relevant images could be loaded", file=sys.stderr)
    texts = [q.text for q, _ in rated]
    grades = [g for _, g in rated]
    image_encoder.encode_images(images[: min(4, len(images))], batch_size=batch_size)  # warm-up / export
    t = time.perf_counter()
    vecs = image_encoder.encode_images(images, batch_size=batch_size)
    ips = len(images) / max(time.perf_counter() - t, 1e-9)
    img = _dense(vecs)
    # query expansion needs the items' own descriptions (the PPMI statistics come from them)
    one_per_item = len(rated) == len(kept) and all(it.query for it in kept) and \
        all(q.id == it.id for (q, _), it in zip(rated, kept))
    if expand and not one_per_item:
        print(f"# {name}: --expand skipped: its images have no descriptions to draw co-occurrence statistics from",
              file=sys.stderr)
    rows = []
    for q in queries:
        qd = _encode_queries(q, texts, img, default_encoder)
        common = {"n_queries": len(texts), "images_per_s": round(ips, 1),
                  "mean_image_nnz": round(float(np.mean([v.nnz for v in vecs])), 1)}
        if expand and one_per_item:
            item_texts = [it.query for it in kept]
            rel = _relevance(item_texts)
            for split in expand["splits"]:
                for i, n in enumerate(expand["ns"]):
                    one = {"n": n, "split": split, "weight": expand["weight"], "min_count": expand["min_count"]}
                    base, exp = _expansion_rows(qd, img, vecs, item_texts, rel, one)
                    if i == 0:
                        rows.append({"set": name, "n": len(kept), "query_encoder": q, "split": split,
                                     **{k: round(v, 4) for k, v in base.items()}, **common})
                    rows.append({"set": name, "n": len(kept), "query_encoder": f"{q}+x{n}", "split": split,
                                 "expand": one, **{k: round(v, 4) for k, v in exp.items()}, **common})
            continue
        scores = qd @ img.T
        if sentence is not None and q == "default":
            scores = _reranked(qd, texts, _held_shares(texts, img, default_encoder), img, sentence)
        m = query_set_metrics(scores, grades)
        row = {"set": name, "n": len(kept), "query_encoder": q + ("+rerank" if sentence is not None and q == "default" else ""),
               **{k: (round(v, 4) if v is not None else None) for k, v in m.items()}, **common}
        cats = sorted({qq.category for qq, _ in rated if qq.category})
        if cats:
            ranks = query_ranks(scores, [np.asarray(sorted(g)) for g in grades])
            row["p1_by_category"] = {c: {"n": int(sum(qq.category == c for qq, _ in rated)),
                                         "p1": round(float(np.mean([r == 1 for (qq, _), r in zip(rated, ranks)
                                                                    if qq.category == c])), 4)}
                                     for c in cats}
            row["misses"] = [{"query": qq.text, "rank": int(r)} for (qq, _), r in zip(rated, ranks) if r > 1]
        rows.append(row)
    return rows


def _git_commit() -> str:
    """The commit under test: git's HEAD beside this file, else ``$STAIR_ES_BENCH_COMMIT`` (for a
    ``git archive`` of an older commit, which has no .git), else "unknown"."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except Exception:
        return os.environ.get("STAIR_ES_BENCH_COMMIT", "").strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join(QUERY_SETS), help=f"comma-separated, from {', '.join(QUERY_SETS)}")
    ap.add_argument("--limit", type=int, default=400, help="items per set (fixed-seed sample of larger sets)")
    ap.add_argument("--query", default=",".join(QUERY_ENCODERS), help=f"query encoders, from {', '.join(QUERY_ENCODERS)}")
    ap.add_argument("--image-encoder", default="default", help="registry name of the image encoder")
    ap.add_argument("--image-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the image encoder, e.g. sources=imagenet,colour (repeatable)")
    ap.add_argument("--query-option", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the default encoder's query side (--query default), e.g. similar_words=0 "
                         "(repeatable)")
    ap.add_argument("--rerank", default=None, choices=("auto", "semantic", "off"),
                    help="re-rank the default query encoder's best hits by meaning as `stair-es search --rerank` "
                         "does (auto: when the sentence model is on this machine; default: $STAIR_ES_RERANK, else auto)")
    ap.add_argument("--expand", default="", metavar="N[,N...]",
                    help="also measure each query encoder with co-occurrence expansion (N neighbours per token)")
    ap.add_argument("--expand-split", default="halves", metavar="halves|transductive[,...]",
                    help="where the PPMI statistics come from: the other half of the set (default), or the whole set")
    ap.add_argument("--expand-weight", type=float, default=0.5, help="--expand-weight of stair-es search")
    ap.add_argument("--expand-min-count", type=int, default=2, help="--expand-min-count of stair-es search")
    ap.add_argument("--label", default="", help="a name for this run in the report (e.g. before / after)")
    ap.add_argument("--out", type=Path, help="write the report as JSON here")
    ap.add_argument("--export-ratings", type=Path, metavar="DIR",
                    help="write the photos set to DIR (a new folder outside the repository) as a folder catalog "
                         "(symlinks to the photos) plus DIR/ratings.jsonl, then exit: run `stair-es ingest photos DIR` "
                         "and `stair-es rank-eval photos DIR/ratings.jsonl` on it")
    args = ap.parse_args(argv)

    if args.export_ratings:
        try:
            qs = load_query_set("photos")
            ratings, n_photos, n_queries = export_ratings(qs, args.export_ratings)
        except (SetUnavailable, ValueError, OSError) as e:
            print(f"error: --export-ratings: {e}", file=sys.stderr)
            return 2
        for note in qs.notes:
            if "downsized" not in note:  # the symlinked originals keep their size; ingest reads them as they are
                print(f"# photos: {note}")
        print(f"wrote {n_photos} photos to {ratings.parent} and {n_queries} rated queries to {ratings}")
        print(f"next: stair-es ingest photos {ratings.parent} && stair-es rank-eval photos {ratings}")
        return 0

    import stair_es
    from stair_es.encoders import get_encoder

    def key_values(flag: str, given: list[str]) -> dict[str, str]:
        out = {}
        for opt in given:
            key, sep, value = opt.partition("=")
            if not sep:
                ap.error(f"{flag} takes KEY=VALUE, got {opt!r}")
            out[key.strip()] = value
        return out

    default_encoder = get_encoder("default", **key_values("--query-option", args.query_option))
    from stair_es.rerank import semantic_encoder

    sentence = semantic_encoder(args.rerank)
    options = key_values("--image-option", args.image_option)
    image_encoder = (default_encoder if args.image_encoder == "default" and not options
                     else get_encoder(args.image_encoder, **options))
    for split in args.expand_split.split(","):
        if split not in ("halves", "transductive"):
            ap.error(f"unknown --expand-split {split!r}; choose halves or transductive")
    queries = [q for q in args.query.split(",") if q]
    for q in queries:
        if q not in QUERY_ENCODERS:
            ap.error(f"unknown query encoder {q!r}; choose from {', '.join(QUERY_ENCODERS)}")
    report = {
        "label": args.label, "commit": _git_commit(), "stair_es": str(Path(stair_es.__file__).parent),
        "image_encoder": image_encoder.config(), "default_encoder": default_encoder.config(),
        "rerank": sentence.version if sentence is not None else "off",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m_at_start": round(os.getloadavg()[0], 2)},
        "results": [], "skipped": {}, "notes": {},
    }
    print(f"# encoder eval {args.label}  commit {report['commit']}  stair_es from {report['stair_es']}")
    print(f"# image encoder {report['image_encoder']}")
    print(f"# re-ranking by meaning: {report['rerank']}")
    header = (f"{'set':<12} {'images':>6} {'queries':>7} {'query':<16} {'P@1':>6} {'MRR':>6} {'nDCG@10':>7} {'R@5':>6} "
              f"{'med.rank':>8} {'img/s':>7} {'nnz':>5}")
    if args.expand:
        header += "  P@1/MRR of queries with a description no other item has (n)"
    print(header)
    names = [s for s in args.sets.split(",") if s]
    for name in names:
        if name not in QUERY_SETS:
            ap.error(f"unknown set {name!r}; choose from {', '.join(QUERY_SETS)}")
    for name in names:
        try:
            qs = load_query_set(name, limit=args.limit)
        except SetUnavailable as e:
            print(f"{name:<12} skipped: {e}")
            report["skipped"][name] = str(e)
            continue
        if qs.notes:
            report["notes"][name] = qs.notes
            for note in qs.notes:
                print(f"# {name}: {note}")
        expand = ({"ns": [int(x) for x in args.expand.split(",") if x], "splits": args.expand_split.split(","),
                   "weight": args.expand_weight, "min_count": args.expand_min_count} if args.expand else None)
        for row in evaluate_set(name, qs, image_encoder, queries, default_encoder, expand=expand, sentence=sentence):
            report["results"].append(row)
            ndcg = f"{row['ndcg10']:>7.3f}" if row.get("ndcg10") is not None else f"{'n/a':>7}"
            label = row["query_encoder"] + " " + row.get("split", "")[:5]
            print(f"{row['set']:<12} {row['n']:>6} {row['n_queries']:>7} {label:<16} "
                  f"{row['p1']:>6.3f} {row['mrr']:>6.3f} {ndcg} {row['r5']:>6.3f} {row['median_rank']:>8.1f} "
                  f"{row['images_per_s']:>7.1f} {row['mean_image_nnz']:>5.1f}"
                  + (f"  {row['p1_unique']:.3f} / {row['mrr_unique']:.3f} ({row['n_unique']})" if "n_unique" in row else ""))
    if any(r.get("ndcg10", 0) is None for r in report["results"]):
        print("# nDCG@10 n/a: ir-measures is not installed (pip install 'stair-es[eval]')")
    for row in report["results"]:
        if "p1_by_category" in row:
            cats = "  ".join(f"{c} {v['p1']:.2f} ({v['n']})" for c, v in row["p1_by_category"].items())
            print(f"# {row['set']} {row['query_encoder']}: P@1 by query category: {cats}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
