"""The models stair_es knows how to use: id, encoder kind, purpose, size, licence, what a pull fetches.

Must not know where models are stored or how they are fetched.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What a pull downloads from a repository the catalog does not describe (no TF, Flax, ONNX or
#: Rust copies of the weights: the encoders load PyTorch/safetensors weights).
DEFAULT_PATTERNS = ("*.json", "*.txt", "*.model", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.npy", "*.npz",
                    "*.yaml", "*.yml", "*.md")


@dataclass(frozen=True)
class CatalogEntry:
    """A model stair_es knows how to use.

    ``revision`` is the revision a pull asks for unless ``--revision`` says otherwise. These
    machines cannot reach the hub to read commit hashes, so it is ``"main"``; the commit a
    pull actually got is recorded in the store entry (and in every index built with it).
    """

    id: str
    kind: str
    title: str
    purpose: str
    size: str
    licence: str
    revision: str = "main"
    patterns: tuple[str, ...] = DEFAULT_PATTERNS
    url: str = ""


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        id="vsearch/vdr-cross-modal",
        kind="vdr",
        title="VDR cross-modal (Zhou et al., ICLR 2024)",
        purpose="photos: image and text towers trained to give weights over the BERT vocabulary; the strongest "
                "route to photo search without training",
        size="~0.9 GB",
        licence="MIT (VDR repository; check the model card)",
        patterns=("*.json", "*.txt", "*.safetensors", "*.bin"),
        url="https://huggingface.co/vsearch/vdr-cross-modal",
    ),
    CatalogEntry(
        id="openai/clip-vit-base-patch32",
        kind="clip-vocab",
        title="CLIP ViT-B/32 (OpenAI)",
        purpose="photos, zero-shot: CLIP scores each image against a fixed vocabulary of words; fast (ViT-B/32)",
        size="~0.6 GB",
        licence="MIT (model card: research use)",
        patterns=("*.json", "*.txt", "*.safetensors", "*.bin"),
        url="https://huggingface.co/openai/clip-vit-base-patch32",
    ),
    CatalogEntry(
        id="google/siglip-base-patch16-224",
        kind="clip-vocab",
        title="SigLIP base patch16 224 (Google)",
        purpose="photos, zero-shot: like CLIP with a sigmoid loss; usually better zero-shot words than CLIP B/32, "
                "slower per image",
        size="~0.8 GB",
        licence="Apache-2.0",
        patterns=("*.json", "*.txt", "*.model", "*.safetensors", "*.bin"),
        url="https://huggingface.co/google/siglip-base-patch16-224",
    ),
)


def catalog_entry(model_id: str) -> CatalogEntry | None:
    return next((entry for entry in CATALOG if entry.id.lower() == model_id.lower()), None)

