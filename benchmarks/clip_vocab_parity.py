"""clip-vocab's largest differences from transformers, printed (the parity tests assert <= 1e-5).

    python benchmarks/clip_vocab_parity.py

On tiny random CLIP, SigLIP (tokenizer.json) and SigLIP (SentencePiece spiece.model, needs
``sentencepiece``) checkpoints (``benchmarks/clip_models.py``), for five odd-sized random
pictures and four texts: max |difference| of the preprocessed pixels against transformers'
image processor, of the image and text features against ``get_image_features`` /
``get_text_features`` in ONNX Runtime and in PyTorch, and of the image token weights against
the calibration written again from transformers' features (threshold 0, top 12; ONNX Runtime).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("STAIR_ES_MODEL_CACHE", tempfile.mkdtemp(prefix="stair-es-parity-"))

TEXTS = ["a photo of a dog.", "A red cat, on the sofa", "the", "dog " * 40]


def main() -> None:
    import numpy as np
    import torch
    import transformers
    from PIL import Image

    from benchmarks.clip_models import make_clip, make_siglip
    from stair_es.encoders.base import get_encoder

    def feats(out):
        return (out if isinstance(out, torch.Tensor) else out.pooler_output).detach().float().numpy()

    root = Path(tempfile.mkdtemp(prefix="stair-es-parity-models-"))
    rng = np.random.default_rng(7)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 64), (64, 40), (32, 32), (20, 90), (300, 200)]]
    models = [("clip", make_clip(root / "clip"), "clip"), ("siglip", make_siglip(root / "siglip"), "siglip")]
    try:
        import sentencepiece  # noqa: F401

        models.append(("siglip-spm", make_siglip(root / "spm", tokenizer="spm"), "siglip"))
    except ImportError:
        print("siglip-spm: skipped (pip install sentencepiece)")
    for name, folder, family in models:
        cls = transformers.CLIPModel if family == "clip" else transformers.SiglipModel
        model = cls.from_pretrained(str(folder)).eval()
        proc = transformers.AutoImageProcessor.from_pretrained(str(folder))
        tok = transformers.AutoTokenizer.from_pretrained(str(folder))
        px = np.asarray(proc(images=images, return_tensors="np")["pixel_values"], np.float32)
        n = model.config.text_config.max_position_embeddings
        if family == "siglip":
            inputs = {"input_ids": tok(TEXTS, padding="max_length", truncation=True, max_length=n, return_tensors="pt")["input_ids"]}
        else:
            enc_t = tok(TEXTS, padding=True, truncation=True, max_length=n, return_tensors="pt")
            inputs = {"input_ids": enc_t["input_ids"], "attention_mask": enc_t["attention_mask"]}
        with torch.no_grad():
            ref_img = feats(model.get_image_features(pixel_values=torch.from_numpy(px)))
            ref_txt = feats(model.get_text_features(**inputs))
        row: dict[str, float] = {}
        for runtime in ("torch", "onnx"):  # the ONNX Runtime encoder last: it gives the token weights below
            enc = get_encoder("clip-vocab", model=str(folder), runtime=runtime, threshold=0.0, top_k=12)
            row["pixels"] = float(np.abs(np.stack([enc._image_preprocess()(im) for im in images]) - px).max())
            row[f"image_{runtime}"] = float(np.abs(enc.image_embeddings(images) - ref_img).max())
            row[f"text_{runtime}"] = float(np.abs(enc.text_embeddings(TEXTS) - ref_txt).max())
        matrix = enc.vocabulary_matrix()
        e = ref_img / np.linalg.norm(ref_img, axis=1, keepdims=True)
        s = e.astype(np.float64) @ matrix.T.astype(np.float64)
        w = np.log1p(np.clip((s - s.mean(1, keepdims=True)) / s.std(1, keepdims=True), 0, None))
        worst = 0.0
        for got, ref in zip(enc.encode_images(images), w):
            top = np.argsort(-ref)[:12]
            want = {int(enc.word_ids[i]): float(ref[i]) for i in top if ref[i] > 0}
            have = dict(zip(got.ids.tolist(), got.weights.tolist()))
            if set(have) != set(want):
                raise SystemExit(f"{name}: different words: {sorted(set(have) ^ set(want))}")
            worst = max(worst, max(abs(have[k] - v) for k, v in want.items()))
        row["token_weights"] = worst
        print(f"{name:<11} " + "  ".join(f"{k} {v:.2g}" for k, v in row.items()), flush=True)


if __name__ == "__main__":
    main()
