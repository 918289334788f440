"""Training objectives: symmetric contrastive loss (eq. 2-3) and FLOPs regulariser (eq. 6-7).

Pure functions of tensors; no model, data or optimiser knowledge.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, logit_scale: torch.Tensor, max_scale: float = 100.0) -> torch.Tensor:
    """Symmetric InfoNCE over cosine similarities (eq. 2-3); ``logit_scale`` = log(1/T).

    Row i of ``image`` pairs with row i of ``text``; every other row in the batch is a negative.
    A zero vector (possible for sparse embeddings) has cosine 0 with everything, not NaN.
    """
    img = F.normalize(image, dim=-1, eps=1e-6)
    txt = F.normalize(text, dim=-1, eps=1e-6)
    scale = logit_scale.clamp(max=math.log(max_scale)).exp()
    logits = scale * img @ txt.t()
    target = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def flops_loss(enc: torch.Tensor) -> torch.Tensor:
    """sum_k (mean_i ENC_k^(i))^2 (eq. 6): penalises tokens active across many inputs."""
    return enc.abs().mean(dim=0).pow(2).sum()


def flops_weight(lam: float, step: int, warmup_steps: int) -> float:
    """lambda grows quadratically from 0 to ``lam`` over ``warmup_steps`` (as in SPLADE)."""
    if warmup_steps <= 0:
        return lam
    return lam * min(1.0, step / warmup_steps) ** 2
