"""Random CLIP and SigLIP checkpoints made offline, for the clip-vocab tests and benchmarks.

The hub cannot be reached from the machines that build stair_es, so checkpoints are made
here from transformers configs with random weights, with tokenizers made by hand:

* CLIP: a byte-level BPE vocabulary (``vocab.json`` + ``merges.txt``: every byte alone and
  word-final, a few merges) loaded by transformers' own ``CLIPTokenizer``, which writes the
  ``tokenizer.json`` real CLIP checkpoints carry;
* SigLIP: a small Unigram ``tokenizer.json`` (lower-casing, ``▁`` word starts, ``</s>`` at
  the end) built with HF ``tokenizers`` and loaded by ``AutoTokenizer``.

``size="tiny"``: 2 layers, width 32, 32 px images, 16-d embeddings (seconds to build and
run). ``size="b32"``: ViT-B/32 (12 layers, width 768, 224 px, patch 32; text 12 layers,
width 512; 512-d embeddings) with the tiny tokenizer (speed does not depend on the
vocabulary's content). Needs torch and transformers.
"""

from __future__ import annotations

import json
from pathlib import Path


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map of bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _clip_tokenizer(folder: Path):
    from transformers import CLIPTokenizer

    chars = sorted(set(_bytes_to_unicode().values()))
    vocab: dict[str, int] = {}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    merges = ["#version: 0.2"]
    for a, b in [("p", "h"), ("ph", "o"), ("t", "o</w>"), ("pho", "to</w>"), ("a", "t</w>"), ("c", "at</w>"),
                 ("o", "f</w>"), ("t", "h"), ("th", "e</w>"), ("d", "o"), ("do", "g</w>")]:
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    src = folder / ".tokenizer-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "vocab.json").write_text(json.dumps(vocab), "utf-8")
    (src / "merges.txt").write_text("\n".join(merges) + "\n", "utf-8")
    tok = CLIPTokenizer(str(src / "vocab.json"), str(src / "merges.txt"))
    tok.save_pretrained(folder)
    for p in src.iterdir():
        p.unlink()
    src.rmdir()
    return tok


def _siglip_tokenizer(folder: Path, max_length: int) -> int:
    from tokenizers import Tokenizer, models, normalizers, processors

    pieces = ["<pad>", "</s>", "<unk>"] + [chr(c) for c in range(97, 123)] + ["\u2581" + chr(c) for c in range(97, 123)]
    pieces += ["\u2581photo", "\u2581of", "\u2581a", "\u2581the", "\u2581cat", "\u2581dog", "\u2581red", ".", ",", "\u2581"]
    tok = Tokenizer(models.Unigram([(p, -1.0 - i * 0.01) for i, p in enumerate(pieces)], unk_id=2))
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(" ", "\u2581"),
                                           normalizers.Prepend("\u2581")])
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": max_length}), "utf-8")
    return len(pieces)


def _dims(size: str) -> dict:
    if size == "tiny":
        return {"width": 32, "layers": 2, "heads": 2, "mlp": 64, "image": 32, "patch": 8, "text_width": 32, "proj": 16}
    if size == "b32":
        return {"width": 768, "layers": 12, "heads": 12, "mlp": 3072, "image": 224, "patch": 32, "text_width": 512, "proj": 512}
    raise ValueError(f"size must be 'tiny' or 'b32', got {size!r}")


def make_clip(folder: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """A random ``CLIPModel`` checkpoint with tokenizer and image processor in ``folder``."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = _dims(size)
    tok = _clip_tokenizer(folder)
    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=d["text_width"], intermediate_size=4 * d["text_width"] if size != "tiny" else 64,
                         num_hidden_layers=d["layers"], num_attention_heads=max(2, d["text_width"] // 64) if size != "tiny" else 2,
                         max_position_embeddings=77, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id),
        vision_config=dict(image_size=d["image"], patch_size=d["patch"], hidden_size=d["width"], intermediate_size=d["mlp"],
                           num_hidden_layers=d["layers"], num_attention_heads=d["heads"]),
        projection_dim=d["proj"],
    )
    CLIPModel(cfg).eval().save_pretrained(folder)
    CLIPImageProcessor(size={"shortest_edge": d["image"]}, crop_size={"height": d["image"], "width": d["image"]}).save_pretrained(folder)
    return folder


def _siglip_spm_tokenizer(folder: Path, max_length: int) -> int:
    """A SentencePiece ``spiece.model`` trained here on a few prompts, saved by transformers'
    ``SiglipTokenizer`` as SigLIP's hub checkpoints ship it (no ``tokenizer.json``). Needs
    ``sentencepiece``."""
    import io

    import sentencepiece as spm
    from transformers import SiglipTokenizer

    words = "a photo of the dog cat red blue sofa beach close up green car on".split()
    sentences = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 20
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, vocab_size=60, model_type="unigram",
                                   pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>",
                                   unk_piece="<unk>", minloglevel=2, hard_vocab_limit=False)
    src = folder / ".spiece-src.model"
    src.write_bytes(model.getvalue())
    tok = SiglipTokenizer(str(src), model_max_length=max_length)
    tok.save_pretrained(folder)
    src.unlink()
    return len(tok)


def make_siglip(folder: str | Path, size: str = "tiny", seed: int = 0, tokenizer: str = "fast") -> Path:
    """A random ``SiglipModel`` checkpoint with tokenizer and image processor in ``folder``;
    ``tokenizer="spm"`` saves a SentencePiece tokenizer (no ``tokenizer.json``) instead."""
    import torch
    from transformers import SiglipConfig, SiglipModel
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    d = _dims(size)
    max_length = 16 if size == "tiny" else 64
    n_tokens = _siglip_spm_tokenizer(folder, max_length) if tokenizer == "spm" else _siglip_tokenizer(folder, max_length)
    torch.manual_seed(seed)
    width = d["width"]
    cfg = SiglipConfig(
        text_config=dict(vocab_size=n_tokens, hidden_size=width, intermediate_size=d["mlp"], num_hidden_layers=d["layers"],
                         num_attention_heads=d["heads"], max_position_embeddings=max_length, projection_size=width,
                         pad_token_id=1 if tokenizer == "spm" else 0, eos_token_id=1, bos_token_id=None),
        vision_config=dict(image_size=d["image"], patch_size=d["patch"], hidden_size=width, intermediate_size=d["mlp"],
                           num_hidden_layers=d["layers"], num_attention_heads=d["heads"]),
    )
    SiglipModel(cfg).eval().save_pretrained(folder)
    SiglipImageProcessorPil(size={"height": d["image"], "width": d["image"]}).save_pretrained(folder)
    return folder
