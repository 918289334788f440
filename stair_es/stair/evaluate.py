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

from ..errors import InvalidInputError
from ..vocab import Vocabulary
from .data import CaptionData, DataReport, pad_tokens
from .datasets import CaptionChecker, iter_eval_items
from .model import StairModel


@torch.no_grad()
def embed(model: StairModel, data: CaptionData, batch_size: int = 64, pairs: np.ndarray | None = None, mask_text: bool = False,
          text_mode: str = "model") -> tuple[torch.Tensor, torch.Tensor]:
    """(image embeddings, text embeddings for ``pairs``) as CPU float tensors.

    ``text_mode="bow"`` replaces the text tower by the caption's own tokens (0/1), as VDR's
    non-parametric inference and STAIR's text-encoder-free search (section 7.1) do."""
    model.eval()
    dev = model.device
    imgs = [model.encode_image(model.pixels(data.images[i : i + batch_size])).cpu() for i in range(0, len(data.images), batch_size)]
    pairs = np.arange(len(data)) if pairs is None else pairs
    txts = []
    for i in range(0, len(pairs), batch_size):
        ids, mask = pad_tokens([data.pair_tokens[p] for p in pairs[i : i + batch_size]])
        ids_t, mask_t = torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)
        if text_mode == "bow":
            txts.append(model.bag_of_words(ids_t, mask_t).cpu())
        else:
            txts.append(model.encode_text(ids_t, mask_t, mask_to_input=mask_text and model.head == "stair").cpu())
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


def evaluate(model: StairModel, data: CaptionData, batch_size: int = 64, mask_text: bool = False, text_mode: str = "model") -> dict[str, Any]:
    """One query caption per image (its first): text->image and image->text R@K and sparsity.

    ``mask_text`` evaluates the text tower as stage 1 trains it (eq. 8: only the caption's tokens).
    ``text_mode="bow"``: captions as bags of their own tokens (no text network).
    Vectors are those indexed (VDR gated, VisualSparta pruned to top-n), compared by cosine, or by
    the raw dot product for VisualSparta (its eq. 15).
    """
    if text_mode not in ("model", "bow"):
        raise InvalidInputError(f"text_mode must be 'model' or 'bow', got {text_mode!r}")
    first = data.first_caption_per_image()
    img, txt = embed(model, data, batch_size, first, mask_text, text_mode)
    if model.uses_cosine:
        simf = torch.nn.functional.normalize(img, dim=-1, eps=1e-6) @ torch.nn.functional.normalize(txt, dim=-1, eps=1e-6).t()
    else:
        simf = img @ txt.t()
    sim = simf.numpy()
    relevant = caption_relevance(data, first)  # images x queries
    out: dict[str, Any] = {"n_images": len(first), "distinct_query_captions": len({data.captions[q] for q in first})}
    out.update({f"t2i_r@{k}": v for k, v in recall_at_k(sim.T, relevant.T).items()})
    out.update({f"i2t_r@{k}": v for k, v in recall_at_k(sim, relevant).items()})
    if model.is_sparse:
        out["active_tokens_image"] = float((img > 0).sum(1).float().mean())
        out["active_tokens_text"] = float((txt > 0).sum(1).float().mean())
        out.update(interpretability(img.numpy(), data.labels, model.vocab))
        top = img.sum(0).topk(10).indices.tolist()
        out["most_used_image_tokens"] = [model.vocab.token(t) for t in top]
    else:
        out["dims"] = int(img.shape[1])
    return out


# --- the standard retrieval protocol (COCO 5K, Flickr30K 1K) -----------------------------------
class _Rows:
    """Row-normalised embeddings kept sparse (STAIR) or dense (baseline), appended batch by batch."""

    def __init__(self, sparse: bool, normalize: bool = True):
        self.sparse, self.normalize, self.parts, self.n = sparse, normalize, [], 0

    def add(self, emb: torch.Tensor) -> None:
        emb = emb.float().cpu()
        if self.normalize:
            emb = torch.nn.functional.normalize(emb, dim=-1, eps=1e-6)
        self.parts.append(emb.to_sparse_coo() if self.sparse else emb)
        self.n += emb.shape[0]

    def chunks(self, size: int):
        """Dense row blocks of at most ``size`` rows with their start offset."""
        start = 0
        for p in self.parts:
            dense = p.to_dense() if self.sparse else p
            for i in range(0, dense.shape[0], size):
                yield start + i, dense[i : i + size]
            start += dense.shape[0]

    def matrix(self) -> torch.Tensor:
        if not self.sparse:
            return torch.cat(self.parts)
        idx, val, off = [], [], 0
        for p in self.parts:
            p = p.coalesce()
            i = p.indices().clone()
            i[0] += off
            idx.append(i)
            val.append(p.values())
            off += p.shape[0]
        dim = self.parts[0].shape[1]
        return torch.sparse_coo_tensor(torch.cat(idx, 1), torch.cat(val), (off, dim), check_invariants=False).coalesce()

    def nnz_per_row(self) -> float:
        if not self.sparse:
            return float(self.parts[0].shape[1])
        return sum(p.coalesce().values().numel() for p in self.parts) / max(1, self.n)


@torch.no_grad()
def evaluate_retrieval(model: StairModel, source: Any, *, batch_size: int = 64, prompt: str = "", chunk: int = 512,
                       max_images: int | None = None, progress: bool = False) -> dict[str, Any]:
    """R@1/5/10 both ways on an image-caption set where each caption belongs to one image (the
    COCO 5K / Flickr30K 1K protocol: 5 captions per image).

    text->image: every caption is a query over all images. image->text: an image is right at K
    when any of its captions ranks in the top K among all captions. Ties count against the query.
    Images and captions stream through the model; embeddings are kept sparse (STAIR), never the
    decoded images. ``prompt`` is prepended to every caption (the paper uses "a photo of ").
    """
    # lazy: progress bars load only for long work
    from tqdm.auto import tqdm

    model.eval()
    dev = model.device
    report = DataReport(source=getattr(source, "name", str(source)))
    check = CaptionChecker(model.vocab, model.config.text_max_length)
    imgs, txts = _Rows(model.is_sparse, model.uses_cosine), _Rows(model.is_sparse, model.uses_cosine)
    owner: list[int] = []
    labels: list[list[str]] = []
    top_tokens: list[np.ndarray] = []
    pend_img: list[np.ndarray] = []
    pend_cap: list[list[int]] = []

    def flush_images() -> None:
        if pend_img:
            emb = model.encode_image(model.pixels(np.stack(pend_img)))
            imgs.add(emb)
            if model.is_sparse:
                top_tokens.append(emb.float().cpu().topk(10, dim=1).indices.numpy())
            pend_img.clear()

    def flush_captions() -> None:
        if pend_cap:
            ids, mask = pad_tokens(pend_cap)
            txts.add(model.encode_text(torch.from_numpy(ids).to(dev), torch.from_numpy(mask).to(dev)))
            pend_cap.clear()

    bar = tqdm(desc="encoding images and captions", unit=" images", disable=not progress)
    for n_img, (arr, caps, pair) in enumerate(iter_eval_items(source, model.config.image_size, check, report, prompt)):
        if max_images is not None and n_img >= max_images:
            break
        pend_img.append(arr)
        labels.append(pair.labels)
        for c in caps:
            pend_cap.append(c)
            owner.append(n_img)
            if len(pend_cap) >= batch_size:
                flush_captions()
        if len(pend_img) >= batch_size:
            flush_images()
        bar.update(1)
    flush_images()
    flush_captions()
    bar.close()
    if imgs.n < 2:
        raise InvalidInputError(f"{report.source}: fewer than 2 usable images to evaluate ({report.summary()})")
    owner_t = torch.as_tensor(owner)
    img_m, txt_m = imgs.matrix(), txts.matrix()
    t2i_rank = torch.empty(len(owner), dtype=torch.long)
    for start, q in txts.chunks(chunk):  # q: captions x V
        sim = (img_m @ q.t()).t() if model.is_sparse else q @ img_m.t()  # captions x images
        own = owner_t[start : start + q.shape[0]]
        true = sim.gather(1, own[:, None])
        t2i_rank[start : start + q.shape[0]] = (sim >= true).sum(1) - 1
    i2t_rank = torch.empty(imgs.n, dtype=torch.long)
    for start, q in imgs.chunks(chunk):  # q: images x V
        sim = (txt_m @ q.t()).t() if model.is_sparse else q @ txt_m.t()  # images x captions
        rel = owner_t[None, :] == torch.arange(start, start + q.shape[0])[:, None]
        best = sim.masked_fill(~rel, float("-inf")).amax(1, keepdim=True)
        i2t_rank[start : start + q.shape[0]] = ((sim >= best) & ~rel).sum(1)
    out: dict[str, Any] = {"n_images": imgs.n, "n_captions": len(owner), "prompt": prompt}
    out.update({f"t2i_r@{k}": float((t2i_rank < k).float().mean()) for k in (1, 5, 10)})
    out.update({f"i2t_r@{k}": float((i2t_rank < k).float().mean()) for k in (1, 5, 10)})
    if model.is_sparse:
        out["active_tokens_image"] = imgs.nnz_per_row()
        out["active_tokens_text"] = txts.nnz_per_row()
        out.update(_label_interpretability(np.concatenate(top_tokens), labels, model.vocab))
    out["data"] = report.to_dict()
    return out


def _label_interpretability(top10: np.ndarray, labels: list[list[str]], vocab: Vocabulary) -> dict[str, float]:
    """Table 4 on a labelled set: label words among each image's top-1/5/10 tokens."""
    rows = [(i, [t for w in lab for t in vocab.encode(w)]) for i, lab in enumerate(labels) if lab]
    rows = [(i, ids) for i, ids in rows if ids]
    if not rows:
        return {}
    out = {"interp_p@1": float(np.mean([top10[i, 0] in ids for i, ids in rows]))}
    for k in (1, 5, 10):
        out[f"interp_r@{k}"] = float(np.mean([t in top10[i, :k] for i, ids in rows for t in ids]))
    return out


def format_table(results: dict[str, Any], title: str, model_name: str) -> str:
    """The paper's Table 1 layout: text->image then image->text, R@1/5/10, in percent."""
    cols = [f"t2i_r@{k}" for k in (1, 5, 10)] + [f"i2t_r@{k}" for k in (1, 5, 10)]
    name_w = max(12, len(model_name))
    lines = [
        f"{'':{name_w}}  {title}",
        f"{'':{name_w}}  {'text -> image':<20}  {'image -> text':<20}",
        f"{'':{name_w}}  " + "  ".join(f"{h:>6}" for h in ("R@1", "R@5", "R@10")) + "  " + "  ".join(f"{h:>6}" for h in ("R@1", "R@5", "R@10")),
        f"{model_name:{name_w}}  " + "  ".join(f"{100 * results[c]:6.1f}" for c in cols[:3]) + "  " + "  ".join(f"{100 * results[c]:6.1f}" for c in cols[3:]),
    ]
    return "\n".join(lines)
