"""The vdr encoder's parity figures against the reference implementation.

    python benchmarks/vdr_parity.py

On ``tests/fixtures/vdr_tiny`` (a tiny random checkpoint and the reference's own outputs, see
its README): for each tower and runtime, whether stair_es gives the same tokens and the
largest absolute difference of their weights (docs/pretrained.md, "Parity with the reference").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402

from stair_es.encoders.vdr import VdrEncoder  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "vdr_tiny"


def compare(items: list[dict], vectors: list) -> tuple[bool, float]:
    same, worst = True, 0.0
    for item, vec in zip(items, vectors):
        ref = dict(zip(item["ids"], item["weights"]))
        got = dict(zip(vec.ids.tolist(), vec.weights.tolist()))
        same &= set(ref) == set(got)
        worst = max(worst, max(abs(ref.get(k, 0.0) - got.get(k, 0.0)) for k in set(ref) | set(got)))
    return same, worst


def main() -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text("utf-8"))
    images = [Image.open(FIXTURE / item["file"]).convert("RGB") for item in expected["images"]]
    texts = [item["text"] for item in expected["texts"]]
    for runtime in ("torch", "onnx"):
        enc = VdrEncoder(str(FIXTURE), runtime=runtime)
        for tower, items, vectors in (("image", expected["images"], enc.encode_images(images)),
                                      ("text", expected["texts"], enc.encode_texts(texts))):
            same, worst = compare(items, vectors)
            print(f"{runtime:<5} {tower:<5} {len(items)} inputs  same tokens: {same}  max abs diff: {worst:.2g}")


if __name__ == "__main__":
    main()
