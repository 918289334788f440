"""Evaluation: R@1/5/10 both ways, active tokens per image/text, interpretability top-K.

Interpretability follows the paper's Table 4 on data with ``labels`` (the scene's shape and
colour words): ``interp_p@1`` = share of images whose strongest token is one of their label
words; ``interp_r@K`` = share of (image, label word) pairs whose token is among the image's
top-K tokens. Knows nothing about training.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..vocab import Vocabulary
from .data import CaptionData, pad_tokens
from .model import StairModel


@torch.no_grad()
def embed(model: StairModel, data: CaptionData, batch_size: int = 64, pairs: np.ndarray | None = None, mask_text: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(image embeddings, text embeddings for ``pairs``) as CPU float tensors."""
    model.eval()
    dev = model.device
    imgs = [model.encode_image(model.pixels(data.images[i : i + batch_size])).cpu() for i in range(0, len(data.images), batch_size)]
    pairs = np.arange(len(data)) if pairs is None else pairs
    txts = []
    for i in range(0, len(pairs), batch_size):
        ids, mask = pad_tokens([data.pair_tokens[p] for p in pairs[i : i + batch_size]])
        txts.append(model.encode_text(torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev), mask_to_input=mask_text and model.is_sparse).cpu())
    return torch.cat(imgs), torch.cat(txts)


def recall_at_k(sim: np.ndarray, relevant: np.ndarray, ks=(1, 5, 10)) -> dict[int, float]:
    """``sim``: queries x candidates; ``relevant``: same-shape bool matrix (or one index per query).

    A query's rank is the number of irrelevant candidates scoring **at least** as high as its
    best relevant one: ties count against the query. Sparse models give many exact ties (an
    all-zero model ties everything), and counting them in the query's favour would report a
    model that sees nothing as perfect; against it, such a model scores R@K = 0 unless the
    candidates are fewer than K.
    """
    if relevant.ndim == 1:
        rel = np.zeros(sim.shape, dtype=bool)
        rel[np.arange(len(sim)), relevant] = True
        relevant = rel
    best = np.where(relevant, sim, -np.inf).max(axis=1, keepdims=True)
    rank = ((sim >= best) & ~relevant).sum(axis=1)
    return {k: float((rank < k).mean()) for k in ks}


def caption_relevance(data: "CaptionData", first: np.ndarray) -> np.ndarray:
    """images x query captions: True where the image has that exact caption among its own.

    Synthetic scenes repeat captions ("a red circle" is drawn many times at other positions and
    sizes): every image the caption describes is a right answer, in both directions, so that
    text->image is not capped below 1 by identical queries and matches image->text's treatment.
    """
    norm = [" ".join(c.lower().split()) for c in data.captions]
    per_image: list[set[str]] = [set() for _ in range(len(data.images))]
    for p, i in enumerate(data.pair_image):
        per_image[int(i)].add(norm[p])
    return np.array([[norm[q] in caps for q in first] for caps in per_image], dtype=bool)


def interpretability(image_emb: np.ndarray, labels: list[list[str]], vocab: Vocabulary, ks=(1, 5, 10)) -> dict[str, float]:
    rows = [(i, [vocab.get(w) for w in lab if vocab.get(w) is not None]) for i, lab in enumerate(labels) if lab]
    rows = [(i, ids) for i, ids in rows if ids]
    if not rows:
        return {}
    emb = image_emb.copy()
    emb[:, vocab.special_mask] = -np.inf
    out = {}
    top1 = emb.argmax(axis=1)
    out["interp_p@1"] = float(np.mean([top1[i] in ids for i, ids in rows]))
    for k in ks:
        hits = []
        for i, ids in rows:
            kth = np.partition(-emb[i], k - 1)[k - 1]
            hits.extend(float(-emb[i, t] <= kth and emb[i, t] > 0) for t in ids)
        out[f"interp_r@{k}"] = float(np.mean(hits))
    return out


def evaluate(model: StairModel, data: CaptionData, batch_size: int = 64, mask_text: bool = False) -> dict[str, Any]:
    """One query caption per image (its first): text->image and image->text R@K and sparsity.

    ``mask_text`` evaluates the text tower as stage 1 trains it (eq. 8: only the caption's tokens).
    """
    first = data.first_caption_per_image()
    img, txt = embed(model, data, batch_size, first, mask_text)
    simf = torch.nn.functional.normalize(img, dim=-1, eps=1e-6) @ torch.nn.functional.normalize(txt, dim=-1, eps=1e-6).t()
    sim = simf.numpy()
    relevant = caption_relevance(data, first)  # images x queries
    out: dict[str, Any] = {"n_images": len(first), "distinct_query_captions": len({data.captions[q] for q in first})}
    for k, v in recall_at_k(sim.T, relevant.T).items():
        out[f"t2i_r@{k}"] = v
    for k, v in recall_at_k(sim, relevant).items():
        out[f"i2t_r@{k}"] = v
    if model.is_sparse:
        out["active_tokens_image"] = float((img > 0).sum(1).float().mean())
        out["active_tokens_text"] = float((txt > 0).sum(1).float().mean())
        out.update(interpretability(img.numpy(), data.labels, model.vocab))
        top = img.sum(0).topk(10).indices.tolist()
        out["most_used_image_tokens"] = [model.vocab.token(t) for t in top]
    else:
        out["dims"] = int(img.shape[1])
    return out
