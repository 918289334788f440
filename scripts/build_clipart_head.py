#!/usr/bin/env python3
"""Train the ``clipart`` token source of the default encoder from the public-domain Openclipart set.

    python scripts/build_clipart_head.py features       # rasterise + classify every drawing (cached)
    python scripts/build_clipart_head.py train          # fit the head, write stair_es/encoders/configs/clipart_head.npz
    python scripts/build_clipart_head.py all            # both

Why: the default image encoder reads words off an ImageNet photo classifier. On drawings,
icons and clip art (a large share of product and archive catalogs) its 1,000 photo classes
fire on the wrong things ("envelope", "web site", "jigsaw puzzle"), so a query such as
"a red car" rarely finds a drawn car. The ``clipart`` source is a small learned head on top
of the same classifier: it reads the classifier's 1,000 log-probabilities (no second network,
no extra inference) and predicts, per token, the probability that a *drawing's* description
contains that word. It is trained here on Debian's ``openclipart-svg`` (public domain, so
the trained head ships with stair_es under no licence condition):

* **images**: every SVG, rasterised with ``rsvg-convert`` (Debian ``librsvg2-bin``) at 320 px
  wide on white, and classified by EfficientNet-Lite0 exactly as at ingest;
* **labels**: the words of the drawing's title (``dc:title``), keywords (``rdf:li``) and its
  folder path in the collection (the drawing's folder, its parent and its file name, such as
  ``animals/birds/duck``, not the collection's broad top-level sections), tokenized with the BERT vocabulary,
  whole-token words only, stopwords and boilerplate dropped (``clipart``, ``svg``, author
  names in ``by ...``, file-name hashes, dates of upload, icon-theme folder names such as
  ``actions`` or ``mimetypes``: words no user searches a picture by); a token is a label when at least :data:`MIN_IMAGES` drawings carry it;
* **held out**: every drawing that the evaluation harness samples (``benchmarks/encoders``,
  fixed seed, any of the usual limits) is excluded from training, so its openclipart figures
  are measured on drawings the head never saw; Tux Paint stamps (GPL) are never used.

The head is a one-hidden-layer network (log-probabilities -> ReLU -> per-token logits),
trained with binary cross-entropy, early-stopped on a validation split. Its output is
turned into weights as the ``imagenet`` source does: ``log(1 + 10 p)``, pruned below
``min_weight``. The output file records the training data, parameters, validation scores and
a ``version`` (content hash) that indices store, so vectors from another head are never
mixed with these.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPENCLIPART = Path("/usr/share/openclipart/svg")
CACHE = Path(os.environ.get("STAIR_ES_BUILD_CACHE", str(Path.home() / ".cache" / "stair-es-build")))
OUT = ROOT / "stair_es" / "encoders" / "configs" / "clipart_head.npz"
MIN_IMAGES = 4
HIDDEN = 512
SIDE = 320
EVAL_LIMITS = (50, 100, 150, 200, 250, 300, 400, 500, 600, 800, 1000)
BOILERPLATE = frozenset(
    """clipart clip art svg openclipart open library image images picture drawing drawings icon icons theme
    collection part untitled unsorted flat lemon misc other various set nicu buculei by version remix
    png jpg file simple cartoon hash
    theme action actions apps app mimetypes devices filesystems places status emblems categories stock
    mon tue wed thu fri sat sun jan feb mar apr may jun jul aug sep sept oct nov dec""".split()
)
_TITLE = re.compile(r"<dc:title>([^<]*)</dc:title>")
_KEYWORD = re.compile(r"<rdf:li>([^<]*)</rdf:li>")


def _read_meta(svg: Path) -> tuple[str, list[str]]:
    text = svg.read_text("utf-8", errors="replace")
    titles = [t.strip() for t in _TITLE.findall(text)]
    title = next((t for t in titles if t.lower() not in {"open clip art library", "openclipart", "untitled", ""}), "")
    return title, [k.strip() for k in _KEYWORD.findall(text) if k.strip()]


def _rasterise(svg: Path):
    from PIL import Image

    done = subprocess.run(["rsvg-convert", "-w", str(SIDE), "-b", "white", str(svg)], capture_output=True, timeout=60)
    if done.returncode != 0 or not done.stdout:
        return None
    img = Image.open(io.BytesIO(done.stdout))
    img.load()
    return img.convert("RGB")


def held_out_ids() -> set[str]:
    """Ids the encoder evaluation samples from openclipart at its usual limits (never trained on)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "encoders"))
    from sets import openclipart_set  # type: ignore[import-not-found]

    every = openclipart_set(limit=None)
    ids: set[str] = set()
    for limit in EVAL_LIMITS:
        pool = list(every)
        if len(pool) > limit:
            pool = random.Random(0).sample(pool, limit)
        ids.update(it.id for it in pool)
    return ids


def features(args) -> None:
    from stair_es.encoders.imagenet import ImageNetLabelEncoder

    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / "openclipart_features.npz"
    svgs = sorted(OPENCLIPART.rglob("*.svg"))
    if args.limit:
        svgs = svgs[: args.limit]
    enc = ImageNetLabelEncoder("lite0")
    ids, titles, keywords, feats = [], [], [], []
    t0 = time.perf_counter()
    batch: list = []
    meta: list = []

    def flush():
        if batch:
            p = enc.class_probabilities(batch, batch_size=len(batch))
            feats.append(np.log(np.clip(p, 1e-12, 1.0)).astype(np.float16))
            for rel, title, kws in meta:
                ids.append(rel)
                titles.append(title)
                keywords.append("|".join(kws))
            batch.clear()
            meta.clear()

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        for n, (svg, img) in enumerate(zip(svgs, pool.map(_rasterise, svgs)), 1):
            if img is None:
                print(f"skipped (does not rasterise): {svg}", file=sys.stderr)
                continue
            title, kws = _read_meta(svg)
            batch.append(img)
            meta.append((str(svg.relative_to(OPENCLIPART).with_suffix("")), title, kws))
            if len(batch) == 32:
                flush()
            if n % 500 == 0:
                print(f"{n}/{len(svgs)} drawings, {n / (time.perf_counter() - t0):.1f}/s", file=sys.stderr)
    flush()
    np.savez_compressed(out, ids=np.array(ids), titles=np.array(titles), keywords=np.array(keywords),
                        logp=np.concatenate(feats))
    print(f"wrote {out}: {len(ids)} drawings in {time.perf_counter() - t0:.0f} s")


def _words(text: str) -> list[str]:
    from stair_es.vocab import basic_tokenize

    text = re.sub(r"\bby\s+\w+(\s+\w+)?", " ", text, flags=re.I)  # author credits
    text = re.sub(r"\b(hash_)?0x[0-9a-f]+\b", " ", text, flags=re.I)  # file-name hashes
    text = text.replace("_", " ").replace("-", " ")
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)  # camelCase file names
    return [w for w in basic_tokenize(text) if w.isalpha() and len(w) > 1]


def label_tokens(rel: str, title: str, keywords: str, vocab) -> set[int]:
    from stair_es.encoders.imagenet import CLASSNAME_STOPWORDS

    # Only the drawing's own folder, its parent and its file name: the collection's top-level
    # sections ("computer" holds icons, not computers; "recreation", "signs_and_symbols") would
    # otherwise become words every drawing of a big section carries.
    words = _words(title) + _words(keywords.replace("|", " ")) + _words(" ".join(rel.split("/")[-3:]))
    out = set()
    for w in words:
        if w in CLASSNAME_STOPWORDS or w in BOILERPLATE:
            continue
        i = vocab.get(w)
        if i is not None and not vocab.is_special(i):
            out.add(i)
    return out


def train(args) -> None:
    import torch

    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    data = np.load(CACHE / "openclipart_features.npz")
    ids, titles, keywords = data["ids"].tolist(), data["titles"].tolist(), data["keywords"].tolist()
    x_all = data["logp"].astype(np.float32)
    held = held_out_ids()
    train_rows = [i for i, r in enumerate(ids) if r not in held]
    labels = [label_tokens(ids[i], titles[i], keywords[i], vocab) for i in range(len(ids))]
    counts: dict[int, int] = {}
    for i in train_rows:
        for t in labels[i]:
            counts[t] = counts.get(t, 0) + 1
    tokens = np.array(sorted(t for t, c in counts.items() if c >= args.min_images), dtype=np.int64)
    col = {int(t): j for j, t in enumerate(tokens)}
    y_all = np.zeros((len(ids), len(tokens)), np.float32)
    for i, lab in enumerate(labels):
        for t in lab:
            if t in col:
                y_all[i, col[t]] = 1.0
    rng = np.random.default_rng(0)
    order = rng.permutation(train_rows)
    n_val = len(order) // 10
    val, fit = order[:n_val], order[n_val:]
    mean, std = x_all[fit].mean(0), x_all[fit].std(0) + 1e-3
    x = torch.from_numpy((x_all - mean) / std)
    y = torch.from_numpy(y_all)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(1000, args.hidden), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                              torch.nn.Linear(args.hidden, len(tokens)))
    with torch.no_grad():  # start from the label frequencies
        prior = y[fit].mean(0).clamp(1e-4, 1 - 1e-4)
        net[3].bias.copy_(torch.log(prior / (1 - prior)))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=args.weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    best, best_state, bad = float("inf"), None, 0
    fit_t = torch.from_numpy(np.asarray(fit))
    for epoch in range(args.epochs):
        net.train()
        perm = fit_t[torch.randperm(len(fit_t))]
        for s in range(0, len(perm), 128):
            b = perm[s : s + 128]
            opt.zero_grad()
            loss = loss_fn(net(x[b]), y[b])
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            v = loss_fn(net(x[val]), y[val]).item()
        print(f"epoch {epoch + 1}: validation BCE {v:.5f}", file=sys.stderr)
        if v < best - 1e-5:
            best, best_state, bad = v, {k: t.clone() for k, t in net.state_dict().items()}, 0
        else:
            bad += 1
            if bad >= 3:
                break
    net.load_state_dict(best_state)
    net.eval()
    net.tokens = tokens
    w1 = (net[0].weight.detach().numpy() / std[None, :]).T  # fold the standardisation in
    b1 = net[0].bias.detach().numpy() - (mean / std) @ net[0].weight.detach().numpy().T
    w2 = net[3].weight.detach().numpy().T
    b2 = net[3].bias.detach().numpy()
    arrays = {"w1": w1.astype(np.float16), "b1": b1.astype(np.float32), "w2": w2.astype(np.float16),
              "b2": b2.astype(np.float32), "tokens": tokens.astype(np.int32)}
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k]).tobytes())
    provenance = {
        "what": "stair_es clipart token head: EfficientNet-Lite0 ImageNet log-probabilities -> P(token in a drawing's description)",
        "data": "Debian openclipart-svg (public domain), titles + keywords + folder paths; rasterised with rsvg-convert",
        "drawings_trained": int(len(fit)), "drawings_validation": int(len(val)), "drawings_held_out": len(held),
        "tokens": int(len(tokens)), "min_images": args.min_images, "hidden": args.hidden, "validation_bce": round(best, 6),
        "validation_retrieval": _validation_retrieval(net, x, val, ids, titles, vocab),
        "built_by": "scripts/build_clipart_head.py",
        "version": f"clipart-v1-{h.hexdigest()[:12]}",
    }
    np.savez_compressed(args.out, provenance=np.array(json.dumps(provenance)), **arrays)
    print(json.dumps(provenance, indent=2))
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")


def _validation_retrieval(net, x, val, ids, titles, vocab) -> dict[str, float]:
    """Title -> drawing retrieval among the validation drawings (model selection, never the eval sets):
    each title's whole-token words (weight 1 each) against the head's weights ``log(1 + 10 p)``."""
    import torch

    with torch.no_grad():
        w = np.log1p(10.0 * torch.sigmoid(net(x[val])).numpy())
    tokens = net.tokens
    col = {int(t): j for j, t in enumerate(tokens)}
    ranks = []
    for qi, row in enumerate(val):
        q = np.zeros(len(tokens), np.float32)
        for t in label_tokens("", titles[row], "", vocab):
            if t in col:
                q[col[t]] = 1.0
        if not q.any():
            continue
        s = w @ q
        same = np.array([titles[r].lower() == titles[row].lower() for r in val])
        best = s[same].max()
        ranks.append(1 + int(np.count_nonzero(s >= best) - np.count_nonzero(s[same] >= best)))
    r = np.asarray(ranks, np.float64)
    return {"queries": int(r.size), "p1": round(float(np.mean(r == 1)), 4), "mrr": round(float(np.mean(1 / r)), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=["features", "train", "all"])
    ap.add_argument("--workers", type=int, default=2, help="rasterising processes")
    ap.add_argument("--limit", type=int, default=0, help="only the first N drawings (a quick check)")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--min-images", type=int, default=MIN_IMAGES, help="drawings a token needs to become a label")
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--weight-decay", type=float, default=1e-2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.stage in ("features", "all"):
        features(args)
    if args.stage in ("train", "all"):
        train(args)


if __name__ == "__main__":
    main()
