#!/usr/bin/env python3
"""Generate the COCO class -> WordPiece token map of the ``objects`` token source from WordNet 3.0.

    python scripts/build_coco_tokens.py        # writes stair_es/encoders/configs/coco_wordnet.json

The ``objects`` source (``stair_es/encoders/objects.py``) runs a detector trained on the 80
COCO classes. Each class is given the WordNet 3.0 noun synset it means (:data:`COCO_CLASSES`,
chosen by hand among the senses: ``kite`` the toy, not the bird or the cheque; ``mouse`` the
computer mouse), and its tokens are made exactly as the ImageNet classes' are
(``scripts/build_imagenet_tokens.py``: whole-word names and lemmas, hypernyms with decaying
shares, context words from the definition), so a query grounded onto the index's words treats
both sources alike. :data:`DROP` removes the few words that name the class wrongly when read
alone (``hot dog`` -> ``dog``) or that no query about a picture means (``person`` ->
``soul``, ``mortal``). The output records WordNet's licence notice and a ``version`` string
(content hash) that the source stores in every index it builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_imagenet_tokens import (
    ROOT,
    SCRIPT_VERSION,
    WORDNET_NOTICE,
    build,
    ensure_wordnet,
)

#: (COCO label in the detector's output order, WordNet 3.0 noun offset)
COCO_CLASSES: tuple[tuple[str, str], ...] = (
    ("person", "00007846"), ("bicycle", "02834778"), ("car", "02958343"), ("motorcycle", "03790512"),
    ("airplane", "02691156"), ("bus", "02924116"), ("train", "04468005"), ("truck", "04490091"),
    ("boat", "02858304"), ("traffic light", "06874185"), ("fire hydrant", "03346898"), ("stop sign", "06794110"),
    ("parking meter", "03891332"), ("bench", "02828884"), ("bird", "01503061"), ("cat", "02121620"),
    ("dog", "02084071"), ("horse", "02374451"), ("sheep", "02411705"), ("cow", "02403454"),
    ("elephant", "02503517"), ("bear", "02131653"), ("zebra", "02391049"), ("giraffe", "02439033"),
    ("backpack", "02769748"), ("umbrella", "04507155"), ("handbag", "02774152"), ("tie", "03815615"),
    ("suitcase", "02773838"), ("frisbee", "03397947"), ("skis", "04228054"), ("snowboard", "04251791"),
    ("sports ball", "02778669"), ("kite", "03621473"), ("baseball bat", "02799175"), ("baseball glove", "02800213"),
    ("skateboard", "04225987"), ("surfboard", "04363559"), ("tennis racket", "04409806"), ("bottle", "02876657"),
    ("wine glass", "04592099"), ("cup", "03147509"), ("fork", "03383948"), ("knife", "03623556"),
    ("spoon", "04284002"), ("bowl", "02881193"), ("banana", "07753592"), ("apple", "07739125"),
    ("sandwich", "07695965"), ("orange", "07747607"), ("broccoli", "07714990"), ("carrot", "07730207"),
    ("hot dog", "07697537"), ("pizza", "07873807"), ("donut", "07639069"), ("cake", "07628870"),
    ("chair", "03001627"), ("couch", "04256520"), ("potted plant", "11536230"), ("bed", "02818832"),
    ("dining table", "03201208"), ("toilet", "04446521"), ("tv", "04405907"), ("laptop", "03642806"),
    ("mouse", "03793489"), ("remote", "04074963"), ("keyboard", "03614007"), ("cell phone", "02992529"),
    ("microwave", "03761084"), ("oven", "03862676"), ("toaster", "04442312"), ("sink", "04223580"),
    ("refrigerator", "04070727"), ("book", "02870092"), ("clock", "03046257"), ("vase", "04522168"),
    ("scissors", "04148054"), ("teddy bear", "04399382"), ("hair drier", "03483316"), ("toothbrush", "04453156"),
)
#: words removed from a class's tokens (see the module docstring)
DROP: dict[str, tuple[str, ...]] = {
    "person": ("mortal", "soul", "somebody", "someone", "individual"),
    "cat": ("true",),
    "hot dog": ("dog", "hot", "red"),
    "tv": ("idiot", "box", "tube"),
    "toilet": ("can", "pot", "throne", "stool"),
    "frisbee": ("sheet",), "snowboard": ("sheet",), "surfboard": ("sheet",), "skateboard": ("sheet",),
}


def build_coco(wordnet: Path) -> dict:
    data = build(wordnet, ["n" + off for _, off in COCO_CLASSES], [name for name, _ in COCO_CLASSES])
    for c in data["classes"]:
        for word in DROP.get(c["name"], ()):
            c["tokens"].pop(word, None)
    content = json.dumps([c["tokens"] for c in data["classes"]], sort_keys=True).encode()
    data["version"] = f"coco-wordnet3.0-v{SCRIPT_VERSION}-{hashlib.sha256(content).hexdigest()[:12]}"
    data["generated_by"] = "scripts/build_coco_tokens.py (stair_es); re-run it to regenerate"
    data["provenance"] = ("Classes: the 80 COCO detection classes in the detector's output order, each mapped by hand "
                          "to a WordNet 3.0 noun synset. Lemmas and hypernyms: WordNet 3.0 (Debian package wordnet-base).")
    data["parameters"]["dropped_words"] = {k: list(v) for k, v in DROP.items()}
    data["license_notice"] = WORDNET_NOTICE
    return data


def main() -> None:
    out = ROOT / "stair_es" / "encoders" / "configs" / "coco_wordnet.json"
    data = build_coco(ensure_wordnet(Path("/usr/share/wordnet")))
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", "utf-8")
    os.replace(tmp, out)
    print(f"wrote {out}: {len(data['classes'])} classes, version {data['version']}")


if __name__ == "__main__":
    main()
