"""Query grounding measured on and off, and its settings, on the encoder evaluation sets.

    python -m benchmarks.encoders.grounding_sweep --sets photos,samples,tuxpaint,openclipart --limit 300 \
        [--out benchmarks/results/encoders/grounding_sweep.json] [--misses 10]

Each set's images are encoded once by the ``default`` image encoder; then every query
configuration below encodes the set's queries exactly as ``stair-es search`` does on an index
of those images (``benchmarks.encoders.run._encode_queries``: IDF and the document frequencies
of the image vectors) and is scored with the harness's metrics (``run.query_set_metrics``: ties
count against the query, for nDCG@10 over the graded relevance too; a query's rank is that of
its best relevant image). Sets come from ``benchmarks.encoders.sets.load_query_set`` (``photos``: the
public real-photo set with its written queries).

Configurations (``name: DefaultEncoder text options``):

* ``off``: ``grounding=off`` (the query encoder before grounding);
* ``on``: the default (grounding on, SPLADE expansions restricted to the index and capped at
  ``EXPANSION_CAP`` x the strongest own word);
* ``cap=X``: grounding on with another expansion cap (1e9 = no cap, 0 = no expansion);
* ``rel=N``: at most N relatives per grounded word; ``ratio=R``: relatives within R of the best share;
* ``nogloss``: relatives reached only through a definition's words are not used;
* ``nohypo`` / ``hypo1``: no hyponyms / hyponyms one level down only; ``hypernyms``: synonyms
  and hypernyms only; ``nospread``: a word's relatives each take their full share instead of
  sharing the best one's.
* ``map=PATH``: grounding on with another map file (e.g. an older version:
  ``git show REV:stair_es/encoders/configs/query_grounding.bin > old.bin``).

``--misses N`` prints, for the ``on`` configuration against ``off``, the N most improved and
the N most worsened queries with their grounding steps (every query's rank per configuration
goes to the JSON report).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .run import _dense, _encode_queries, _git_commit, query_ranks, query_set_metrics
from .sets import SetUnavailable, load_query_set

CONFIGS = ("off", "on", "cap=1e9", "cap=0.5", "cap=0.25", "cap=0", "rel=1", "rel=5", "ratio=0.3", "nogloss", "nohypo",
           "hypo1", "hypernyms", "nospread", "nomero",
           "nohypomero", "nohypomerogloss")


@contextmanager
def settings(name: str):
    """Temporarily change a module-level grounding setting for one configuration."""
    from stair_es.encoders import grounding as g

    saved = (g.MAX_RELATIVES, g.RELATIVE_RATIO, g.EXPANSION_CAP, g.GroundingMap.relatives, g.grounding_map)
    saved2 = (g.SKIP_RELATIONS, g.MAX_HYPONYM_DISTANCE, g.SPREAD)
    try:
        if name == "nohypo":
            g.SKIP_RELATIONS = frozenset({"hyponym"})
        elif name == "hypo1":
            g.MAX_HYPONYM_DISTANCE = 1
        elif name == "nospread":
            g.SPREAD = False
        elif name == "nomero":
            g.SKIP_RELATIONS = frozenset({"meronym"})
        elif name == "nohypomero":
            g.SKIP_RELATIONS = frozenset({"hyponym", "meronym"})
        elif name == "nohypomerogloss":
            g.SKIP_RELATIONS = frozenset({"hyponym", "meronym", "word of the definition"})
        elif name == "hypernyms":
            g.SKIP_RELATIONS = frozenset({"hyponym", "holonym", "meronym", "word of the definition", "related adjective"})
        if name.startswith("map="):
            other = g.GroundingMap(Path(name[4:]))
            g.grounding_map = lambda: other  # plan_query looks the map up at call time
        elif name.startswith("rel="):
            g.MAX_RELATIVES = int(name[4:])
        elif name.startswith("ratio="):
            g.RELATIVE_RATIO = float(name[6:])
        elif name == "nogloss":
            orig = saved[3]
            g.GroundingMap.relatives = lambda self, lemma: [r for r in orig(self, lemma) if r.relation != "word of the definition"]
        yield
    finally:
        g.MAX_RELATIVES, g.RELATIVE_RATIO, g.EXPANSION_CAP, g.GroundingMap.relatives, g.grounding_map = saved
        g.SKIP_RELATIONS, g.MAX_HYPONYM_DISTANCE, g.SPREAD = saved2


def encoder_for(name: str):
    from stair_es.encoders import get_encoder

    if name == "off":
        return get_encoder("default", grounding="off")
    enc = get_encoder("default")
    if name.startswith("cap="):
        enc.text_encoder.expansion_cap = float(name[4:])
    return enc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="photos,samples,tuxpaint,openclipart")
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--misses", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    from stair_es.encoders import get_encoder

    image_encoder = get_encoder("default")
    report = {"commit": _git_commit(), "results": [], "changed": {}}
    print(f"# grounding sweep, commit {report['commit']}")
    print(f"{'set':<12} {'n':>4} {'config':<10} {'P@1':>6} {'MRR':>6} {'R@5':>6} {'med.rank':>8} {'nDCG@10':>7}")
    for name in args.sets.split(","):
        try:
            qs = load_query_set(name, limit=args.limit)
        except SetUnavailable as e:
            print(f"{name:<12} skipped: {e}")
            continue
        images, kept = [], []
        for it in qs.items:
            try:
                images.append(it.load())
                kept.append(it)
            except Exception as e:  # noqa: BLE001 - counted, as in run.py
                print(f"# {name}: skipped {it.id}: {type(e).__name__}: {e}", file=sys.stderr)
        pos = {it.id: i for i, it in enumerate(kept)}
        queries = [q for q in qs.queries if any(k in pos for k in q.relevant)]
        texts = [q.text for q in queries]
        grades = [{pos[k]: g for k, g in q.relevant.items() if k in pos} for q in queries]
        rel = [np.asarray(sorted(g)) for g in grades]
        t = time.perf_counter()
        img = _dense(image_encoder.encode_images(images, batch_size=32))
        print(f"# {name}: {len(images)} images encoded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        ranks = {}
        for cfg in args.configs.split(","):
            with settings(cfg):
                q = _encode_queries("default", texts, img, encoder_for(cfg))
            scores = q @ img.T
            ranks[cfg] = query_ranks(scores, rel)
            m = query_set_metrics(scores, grades)  # the harness's metrics, nDCG@10 with its tie rule
            report["results"].append({"set": name, "n_images": len(kept), "n_queries": len(texts), "config": cfg,
                                      **{k: round(v, 4) for k, v in m.items()}})
            print(f"{name:<12} {len(texts):>4} {cfg:<10} {m['p1']:>6.3f} {m['mrr']:>6.3f} {m['r5']:>6.3f} "
                  f"{m['median_rank']:>8.1f} {m['ndcg10']:>7.3f}")
        if args.misses and "off" in ranks and "on" in ranks:
            from stair_es.encoders.grounding import IndexStats

            stats = IndexStats(np.count_nonzero(img > 0, axis=0), img.shape[0])
            enc = get_encoder("default")
            delta = ranks["off"] - ranks["on"]
            better = [i for i in np.argsort(-delta, kind="stable") if delta[i] > 0][: args.misses]
            worse = [i for i in np.argsort(delta, kind="stable") if delta[i] < 0][: args.misses]
            order = better + worse
            print(f"  # {name}: {int((delta > 0).sum())} queries ranked better with grounding, {int((delta < 0).sum())} "
                  f"worse; the {len(better)} most improved, then the {len(worse)} most worsened:")
            report["ranks"] = report.get("ranks", {})
            report["ranks"][name] = {"queries": texts, **{c: r.astype(int).tolist() for c, r in ranks.items()}}
            changed = []
            for i in order:
                steps = enc.encode_queries([texts[i]], idf=stats.idf(), index_stats=stats)[0].grounding
                lines = [s.describe() for s in steps if s.action != "kept"]
                changed.append({"query": texts[i], "rank_off": int(ranks["off"][i]), "rank_on": int(ranks["on"][i]),
                                "grounding": lines})
                print(f"  {texts[i][:60]!r}: rank {int(ranks['off'][i])} -> {int(ranks['on'][i])}")
                for line in lines:
                    print(f"      {line}")
            report["changed"][name] = changed
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
