"""Training objectives: symmetric contrastive loss (eq. 2-3) and FLOPs regulariser (eq. 6-7).

Pure functions of tensors; no model, data or optimiser knowledge.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model import top_k_gate


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
    return lam * min(1.0, step / warmup_steps) ** 2 if warmup_steps > 0 else lam


def visualsparta_loss(image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """VisualSparta's objective (eq. 13): for each text query, cross-entropy of f(q, v) over the
    batch's images, f the raw sum of log(CACHE + 1) over the query's tokens (eq. 12) -- the dot
    product of a bag-of-words count vector with the image's token scores. Text -> image only."""
    logits = text @ image.t()
    return F.cross_entropy(logits, torch.arange(text.shape[0], device=text.device))


def contrastive_mask(gate: torch.Tensor, keep: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """VDR's contrastive (CTS) mask: the vocabulary entries no query of the batch activates
    (``V \\ T(B)``, special tokens excluded) dealt out at random, |V \\ T(B)| / |B| to each query.
    Returns a 0/1 (B, V): row j = the entries query j must activate and its own image must not."""
    b, v = gate.shape
    free = ((gate > 0).any(dim=0).logical_not() & keep.bool()).nonzero().squeeze(1)
    per = free.numel() // b
    out = torch.zeros_like(gate)
    if per == 0:
        return out
    order = free[torch.randperm(free.numel(), generator=generator, device="cpu").to(free.device)][: per * b]
    rows = torch.arange(b, device=gate.device).repeat_interleave(per)
    out[rows, order] = 1.0
    return out


def vdr_loss(image: torch.Tensor, text: torch.Tensor, bow: torch.Tensor, k: int, logit_scale: torch.Tensor, keep: torch.Tensor,
             cts_mask: bool = True) -> torch.Tensor:
    """VDR's training loss (sec. 3.2, eq. 5): SCE(V_q(q) * G_q(q), V_p(p)) + SCE(bow(q), V_p(p)).

    ``image`` and ``text`` are the ungated weights V(x); the image side is fully active during
    training, the text side gated to its top-k plus its own tokens (``bow``). With ``cts_mask``,
    the batch's unused entries are dealt to the queries (activated in query j, deactivated in
    image j), so every vocabulary entry gets negative-pair supervision. The second term is the
    non-parametric entry: the plain bag of words of the caption against the image.
    """
    gate = torch.maximum(top_k_gate(text.detach(), k), bow)
    img = image
    if cts_mask:
        m = contrastive_mask(gate, keep)
        gate = torch.maximum(gate, m)
        img = image * (1.0 - m)
    return contrastive_loss(img, text * gate, logit_scale) + contrastive_loss(image, bow, logit_scale)
