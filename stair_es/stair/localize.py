"""Text-encoder-free localisation (section 7.2): a query's token activations per image patch.

``localize`` returns the (grid x grid) map of log(1+ReLU(p(h_patch)[token])) averaged over
the query's tokens (footnote 3: multi-token queries are averaged); ``overlay`` lays it over the
image. Only the image tower runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EmptyQueryError, InvalidInputError


def query_token_ids(model, query: str) -> list[int]:
    """The query's content tokens: stopwords ("a", "of"), which fire everywhere, would blur the map."""
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from ..encoders.text import BagOfWordsEncoder

    ids = list(BagOfWordsEncoder(vocab=model.vocab).counts(query))
    if not ids:
        raise EmptyQueryError(f"query {query!r} has no content tokens to localise (only stopwords or punctuation)")
    return ids


def localize(model, image: Any, query: str) -> np.ndarray:
    """Heatmap of shape (grid, grid) (``image_size // patch_size`` per side), non-negative."""
    # lazy: torch takes seconds to import; loaded only when a model runs
    import torch

    ids = query_token_ids(model, query)
    with torch.no_grad():
        act = model.patch_activations(model.preprocess_images([image]), ids)
    return act[0].mean(dim=0).cpu().numpy().astype(np.float32)


def overlay(image: Any, heatmap: np.ndarray, alpha: float = 0.5):
    """The image with the heatmap (normalised to its max, upsampled) blended over it."""
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image

    if not 0 <= alpha <= 1:
        raise InvalidInputError(f"alpha must lie in [0, 1], got {alpha}")
    image = image.convert("RGB")
    h = np.asarray(heatmap, dtype=np.float32)
    h = h / h.max() if h.max() > 0 else h
    try:
        # lazy: image libraries load only when images are read or drawn
        from matplotlib import colormaps

        rgb = (colormaps["jet"](h)[..., :3] * 255).astype(np.uint8)
    except ImportError:  # plain red ramp without matplotlib
        rgb = np.stack([h * 255, np.zeros_like(h), (1 - h) * 255], axis=-1).astype(np.uint8)
    heat = Image.fromarray(rgb).resize(image.size, Image.BILINEAR)
    return Image.blend(image, heat, alpha)


def write_heatmap(model, image: Any, query: str, out: str | Path, alpha: float = 0.5, scale: int = 4) -> Path:
    """Write ``image`` (enlarged ``scale`` times) with the query's heatmap over it; returns ``out``."""
    # lazy: image libraries load only when images are read or drawn
    from PIL import Image

    image = image.convert("RGB")
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    out = Path(out)
    overlay(image, localize(model, image, query), alpha).save(out)
    return out
