"""Calibrate the ``imagenet`` source's label weights: one classifier pass, many settings.

    python -m benchmarks.encoders.label_sweep --sets photos,samples,tuxpaint,openclipart --limit 300 \\
        --grid temperature=1,1.5,2 --grid top_classes=5,10,20 --out benchmarks/results/encoders/label_sweep.json

Each set's images go through the default encoder once: the 1,000 class probabilities and
every other token source's vector (``colour``, ``clipart``, ``ocr``; optionally ``scene``)
are kept in a cache (``--cache``, keyed by set, limit and the map version). Then every
combination of the ``--grid`` values re-maps the probabilities with
:class:`~stair_es.encoders.imagenet.ImageNetLabelEncoder` (``temperature``, ``top_classes``,
``class_mass``, ``scale``, ``min_weight``), merges the sources per token by max as the default
encoder does, and scores the set's queries (each item's own description, or the photos set's
written queries with graded relevance) exactly as
``benchmarks.encoders.run`` does (the default query encoder, with the IDF and the word
grounding of the set's own image vectors; ties counted against the query). ``--no-source scene`` style switches measure a source on/off.

The point is the curve, not one best cell: pick few parameters, prefer settings that are
good on the photo sets and do not cost the drawing sets more than 0.02 P@1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pickle
import sys
import time
from pathlib import Path

import numpy as np

from .run import _encode_queries, query_set_metrics
from .sets import SetUnavailable, load_query_set

PARAMS = ("temperature", "top_classes", "class_mass", "scale", "min_weight")


def _parts_cache(name: str, limit: int, cache: Path, image_model: str = "lite0") -> dict:
    from stair_es.encoders import get_encoder
    from stair_es.encoders.imagenet import wordnet_token_map

    sources = ["imagenet", "colour", "clipart", "ocr"]
    key = f"{name}-{limit}-{'+'.join(sources)}-v3.pkl" if image_model == "lite0" else \
        f"{name}-{limit}-{'+'.join(sources)}-{image_model}-v3.pkl"
    path = cache / key
    if path.is_file():
        return pickle.loads(path.read_bytes())
    qs = load_query_set(name, limit=limit)
    images, ids = [], []
    for it in qs.items:
        try:
            images.append(it.load())
        except Exception as e:  # noqa: BLE001 - counted like run.py does
            print(f"# {name}: skipped {it.id}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        ids.append(it.id)
    index = {k: i for i, k in enumerate(ids)}
    texts, grades = [], []
    for q in qs.queries:
        g = {index[k]: v for k, v in q.relevant.items() if k in index}
        if g:
            texts.append(q.text)
            grades.append(g)
    enc = get_encoder("default", sources=sources, image_model=image_model)
    t = time.perf_counter()
    probs = enc.image_encoder.class_probabilities(images)
    parts = enc.encode_images_detailed(images)
    print(f"# {name}: {len(images)} images encoded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    others = [{k: (v.ids.copy(), v.weights.copy()) for k, v in p.items() if k != "imagenet"} for p in parts]
    # what the scene source reads (the 64 px copy and the drawing score), so its rules can be
    # measured without encoding the set again
    from stair_es.encoders.clipart import drawing_score
    from stair_es.encoders.colour import small_copy

    small = [np.asarray(small_copy(im)) for im in images]
    flat = [drawing_score(im) for im in images]
    data = {"ids": ids, "texts": texts, "grades": grades, "probs": probs, "others": others, "small": small, "flat": flat,
            "token_map": wordnet_token_map()["version"]}
    cache.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(data))
    return data


_QUERY: list = []


def _query_encoder():
    """The default encoder's query side, as ``benchmarks.encoders.run`` uses it (IDF and word
    grounding on the set's own image vectors)."""
    if not _QUERY:
        from stair_es.encoders import get_encoder

        _QUERY.append(get_encoder("default"))
    return _QUERY[0]


def evaluate(data: dict, settings: dict, sources: set[str]) -> dict:
    from stair_es.encoders.imagenet import ImageNetLabelEncoder
    from stair_es.vocab import VOCAB_SIZE

    enc = ImageNetLabelEncoder(**settings)
    scene = None
    if "scene" in sources:
        from PIL import Image

        from stair_es.encoders.scene import SceneSource

        scene = SceneSource()
    n = len(data["ids"])
    img = np.zeros((n, VOCAB_SIZE), np.float32)
    for i, p in enumerate(data["probs"]):
        v = enc.vector_from_probabilities(p)
        img[i, v.ids] = v.weights
        for name, (ids, w) in data["others"][i].items():
            if name in sources:
                img[i, ids] = np.maximum(img[i, ids], w)
        if scene is not None:
            v = scene.encode(Image.fromarray(data["small"][i]), data["flat"][i])
            img[i, v.ids] = np.maximum(img[i, v.ids], v.weights)
    q = _encode_queries("default", data["texts"], img, _query_encoder())
    m = query_set_metrics(q @ img.T, data["grades"])
    m["mean_image_nnz"] = float(np.mean(np.count_nonzero(img, axis=1)))
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="samples,tuxpaint,openclipart")
    ap.add_argument("--limit", type=int, default=300)
    ap.add_argument("--grid", action="append", default=[], metavar="PARAM=V1,V2,...",
                    help=f"values to try, PARAM from {', '.join(PARAMS)} (repeatable; the rest stay at their defaults)")
    ap.add_argument("--sources", default="colour,clipart,ocr", help="non-imagenet sources merged in, from colour, clipart, "
                    "ocr, scene")
    ap.add_argument("--compare-sources", default="", metavar="SOURCES",
                    help="also measure every setting with these sources instead (e.g. colour,clipart,ocr,scene)")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/stair-es-label-sweep"))
    ap.add_argument("--image-model", default="lite0", help="the EfficientNet-Lite classifier (lite1, lite2 if installed)")
    ap.add_argument("--token-map", action="append", default=[], type=Path, metavar="JSON",
                    help="also measure every setting with this class -> token map (e.g. an older "
                         "imagenet_wordnet.json from git history); repeatable")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    grid: dict[str, list] = {}
    for g in args.grid:
        k, _, vals = g.partition("=")
        if k not in PARAMS:
            ap.error(f"unknown parameter {k!r}; choose from {', '.join(PARAMS)}")
        grid[k] = [int(x) if k == "top_classes" else float(x) for x in vals.split(",") if x]
    source_sets = [{s for s in args.sources.split(",") if s}]
    if args.compare_sources:
        source_sets.append({s for s in args.compare_sources.split(",") if s})
    sets = {}
    for name in [s for s in args.sets.split(",") if s]:
        try:
            sets[name] = _parts_cache(name, args.limit, args.cache, args.image_model)
        except SetUnavailable as e:
            print(f"{name}: skipped: {e}")
    keys = list(grid)
    rows = []
    print(f"{'setting':<56} " + " ".join(f"{n[:10]:>16}" for n in sets) + "   (P@1 / MRR)")
    import stair_es.encoders.imagenet as imagenet

    installed = imagenet.wordnet_token_map()
    maps = [("", installed)] + [(f" map={p.name}", json.loads(p.read_text("utf-8"))) for p in args.token_map]
    for (map_label, token_map), combo in itertools.product(maps, itertools.product(*[grid[k] for k in keys]) if keys else [()]):
        settings = dict(zip(keys, combo))
        imagenet.wordnet_token_map = lambda m=token_map: m  # what the encoder's table is read from
        if token_map is not installed:
            settings["allow_version_mismatch"] = True
        for sources in source_sets:
            row = {"settings": settings, "sources": sorted(sources), "sets": {}}
            for name, data in sets.items():
                row["sets"][name] = {k: (round(v, 4) if v is not None else None)
                                     for k, v in evaluate(data, settings, sources).items()}
            rows.append(row)
            row["token_map"] = token_map["version"]
            label = (" ".join(f"{k}={v}" for k, v in settings.items() if k != "allow_version_mismatch") or "(defaults)") + \
                map_label + \
                (f" +{','.join(sorted(sources - source_sets[0]))}" if sources != source_sets[0] else "")
            print(f"{label:<56} " + " ".join(f"{row['sets'][n]['p1']:.3f} / {row['sets'][n]['mrr']:.3f}".rjust(16)
                                             for n in sets), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"grid": grid, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
