"""EfficientNet-Lite0 forward speed: eager PyTorch vs ONNX Runtime (fp32, and int8), same run.

    python benchmarks/onnx_vs_torch.py                       # batch 16, 3 rounds, with int8
    python benchmarks/onnx_vs_torch.py --batch 32 --rounds 5 --no-int8

Inputs are real photos (the stair_es sample photos and their mirror images, preprocessed
exactly as the ``imagenet`` encoder does), cycled to ``--batch``. Every round runs each
variant once on the same batch, in turn, so a change in the machine's load hits all alike;
the figures are medians over rounds of wall-clock images/s and of CPU ms per image (user +
sys of this process, which a busy shared machine disturbs less). Variants:

* ``torch``: the PyTorch module, eager, ``torch.get_num_threads()`` threads;
* ``onnx fp32 intra-op``: one ONNX Runtime call with intra-op threads = cores;
* ``onnx fp32 batch-parallel``: what the encoder does (one single-threaded slice per core);
* ``onnx int8``: the static int8 tower (``precision=int8``), batch-parallel.

Fidelity on all the photos: max |logit difference| from PyTorch, and for int8 against fp32
the top-1 class agreement, the top-5 class overlap and the cosine of the encoder's token
vectors. The towers come from the model cache (exported / quantised on first use: the
first run takes longer; that time is not in the figures).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Timer, provenance_line  # noqa: E402


def photos():
    from PIL import ImageOps

    from stair_es.samples import SAMPLES, _load

    ims = []
    for s in SAMPLES:
        try:
            ims.append(_load(s.loader).convert("RGB"))
        except Exception:  # noqa: BLE001 - a sample that cannot be loaded here is left out (count printed)
            continue
    return ims + [ImageOps.mirror(i) for i in ims]


def timed(fn, x: np.ndarray) -> tuple[float, float, np.ndarray]:
    with Timer() as t:
        out = fn(x)
    return len(x) / t.wall_s, t.cpu_s / len(x) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-int8", action="store_true", help="leave out the int8 tower")
    args = ap.parse_args()
    import onnxruntime as ort
    import torch

    from stair_es.encoders.imagenet import ImageNetLabelEncoder, load_efficientnet
    from stair_es.encoders.runtime import OnnxTower

    enc = ImageNetLabelEncoder(runtime="onnx")
    fp32 = enc.load()
    intra = OnnxTower(fp32.path, fp32.meta, parallel=False)
    net = load_efficientnet("lite0")
    variants = {
        "torch": lambda x: net(torch.from_numpy(x)).detach().numpy(),
        "onnx fp32 intra-op": lambda x: intra.run({"pixels": x})[0],
        "onnx fp32 batch-parallel": lambda x: fp32.run_parallel({"pixels": x})[0],
    }
    int8_enc = None
    if not args.no_int8:
        int8_enc = ImageNetLabelEncoder(precision="int8")
        int8 = int8_enc.load()
        variants["onnx int8"] = lambda x: int8.run_parallel({"pixels": x})[0]

    ims = photos()
    pixels = np.stack([enc.preprocess(i) for i in ims]).astype(np.float32)
    batch = np.ascontiguousarray(np.resize(pixels, (args.batch,) + pixels.shape[1:]))
    print(f"# EfficientNet-Lite0, batch {args.batch}, {os.cpu_count()} cpus, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), onnxruntime {ort.__version__}, load avg {os.getloadavg()[0]:.2f}\n"
          f"# {provenance_line()}")
    with torch.no_grad():
        for fn in variants.values():
            fn(batch)  # warm-up
        speed: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        for _ in range(args.rounds):
            for k, fn in variants.items():
                rate, cpu, _ = timed(fn, batch)
                speed[k].append((rate, cpu))
        logits = {k: np.concatenate([fn(pixels[i : i + 16]) for i in range(0, len(pixels), 16)]) for k, fn in variants.items()}
    base = speed["torch"]
    print(f"{'variant':<26} {'img/s':>7} {'CPU ms/img':>11} {'vs torch':>9} {'max|logit - torch|':>19}")
    for k in variants:
        rate = statistics.median(r for r, _ in speed[k])
        cpu = statistics.median(c for _, c in speed[k])
        diff = float(np.max(np.abs(logits[k].astype(np.float64) - logits["torch"])))
        print(f"{k:<26} {rate:>7.1f} {cpu:>11.1f} {rate / statistics.median(r for r, _ in base):>8.2f}x {diff:>19.3g}")
    if int8_enc is not None:
        def probs(lg):
            lg = lg.astype(np.float64) - lg.max(axis=1, keepdims=True)
            e = np.exp(lg)
            return e / e.sum(axis=1, keepdims=True)

        p32, p8 = probs(logits["onnx fp32 batch-parallel"]), probs(logits["onnx int8"])
        top1 = float(np.mean(p32.argmax(1) == p8.argmax(1)))
        top5 = float(np.mean([len(set(np.argsort(-a)[:5]) & set(np.argsort(-b)[:5])) / 5 for a, b in zip(p32, p8)]))
        cos = []
        for a, b in zip(p32, p8):
            va, vb = enc.vector_from_probabilities(a).to_dense(), enc.vector_from_probabilities(b).to_dense()
            cos.append(float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb) + 1e-12)))
        print(f"int8 vs fp32 on {len(ims)} photos: top-1 class agreement {top1:.3f}, top-5 overlap {top5:.3f}, "
              f"token-vector cosine mean {np.mean(cos):.3f} (min {min(cos):.3f})")


if __name__ == "__main__":
    main()
