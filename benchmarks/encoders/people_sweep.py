"""Cost and agreement of the ``people`` token source's face-cascade settings.

    nice -n 10 python -m benchmarks.encoders.people_sweep            # every setting below
    nice -n 10 python -m benchmarks.encoders.people_sweep --images 60
    nice -n 10 python -m benchmarks.encoders.people_sweep --encode imagenet,colour,clipart,ocr,people --rounds 3

For each setting (grey-copy long side, ``scaleFactor``, ``minNeighbors``, ``minSize``) it
prints the CPU ms per image of ``PeopleSource.shares`` alone -- on the photos set's pictures
re-encoded as camera JPEGs (4000x3000 and 1600x1200, alternating) and decoded as ``stair-es
ingest`` decodes them for the default encoder (``load_image(min_side=256)``) -- and how
often its tokens agree with the reference setting (320 px, 1.1, 6, 24: people source v1) on
every photo of the photos set and the sample photos: pictures with a face under each, and
pictures whose token set differs. OpenCV is held to one thread (``cv2.setNumThreads(1)``),
as the pixel worker thread runs it beside the classifier. Needs the ``people`` extra.

``--encode SOURCES`` (repeatable) instead times ``DefaultEncoder.encode_images`` on the same
camera JPEGs -- the whole image side, classifier and pixel worker thread -- with the default
sources and with each SOURCES list, alternating for ``--rounds`` rounds in one process (so a
change in the machine's load hits all alike), and prints the median CPU ms per image of each
and its ratio to the default's (OpenCV's own thread count left as it is unless ``--cv-threads``).
"""

from __future__ import annotations

import argparse
import io
import time

DEFAULT, ALT2 = "haarcascade_frontalface_default.xml", "haarcascade_frontalface_alt2.xml"
SETTINGS = [  # (side, scaleFactor, minNeighbors, minSize, cascade); a window is never below the cascade's 24 or 20 px
    (320, 1.1, 6, 24, DEFAULT),
    (240, 1.1, 5, 20, DEFAULT),
    (240, 1.15, 5, 20, DEFAULT),
    (240, 1.2, 4, 20, DEFAULT),
    (200, 1.1, 5, 20, DEFAULT),
    (200, 1.15, 4, 18, DEFAULT),
    (200, 1.2, 4, 18, DEFAULT),
    (160, 1.1, 4, 16, DEFAULT),
    (160, 1.15, 4, 16, DEFAULT),
    (160, 1.2, 3, 16, DEFAULT),
    (240, 1.1, 4, 20, ALT2),
    (200, 1.1, 4, 20, ALT2),
    (200, 1.15, 3, 20, ALT2),
    (160, 1.1, 3, 20, ALT2),
    (160, 1.15, 3, 20, ALT2),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=60, help="camera JPEGs to time on (from the photos set)")
    ap.add_argument("--encode", action="append", default=[], metavar="SOURCES",
                    help="time DefaultEncoder.encode_images with these sources against the default (repeatable)")
    ap.add_argument("--people", action="append", default=[], metavar="SIDE,SCALE,NEIGHBOURS",
                    help="with --encode: also the default sources + people at this cascade setting (repeatable)")
    ap.add_argument("--cv-threads", type=int, default=None, help="with --encode: cv2.setNumThreads(N) first")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds for --encode")
    args = ap.parse_args()
    if args.encode or args.people:
        return encode_cost(args)
    import cv2
    from PIL import Image

    from stair_es.encoders.people import PeopleSource
    from stair_es.images import load_image

    from .sets import photos_set, samples_set

    cv2.setNumThreads(1)
    photos = [it.load().convert("RGB") for it in photos_set().items]
    samples = [it.load().convert("RGB") for it in samples_set()]
    judged = photos + samples
    camera = []
    for i, im in enumerate(photos[: args.images]):
        buf = io.BytesIO()
        im.resize((4000, 3000) if i % 2 == 0 else (1600, 1200), Image.Resampling.BILINEAR).save(buf, "JPEG", quality=88)
        camera.append(load_image(buf.getvalue(), min_side=256))
    print(f"# {len(camera)} camera JPEGs decoded at min_side 256 (e.g. {camera[0].size}); agreement on {len(photos)} "
          f"photos + {len(samples)} sample photos")
    print(f"{'side':>5} {'scale':>6} {'neigh':>5} {'minsz':>5} {'cascade':>8} {'CPU ms':>7} {'faces':>6} {'differ':>6} {'lost':>5} {'new':>5}")
    ref = None
    for side, sf, mn, ms, cascade in SETTINGS:
        src = PeopleSource(side=side, scale_factor=sf, min_neighbors=mn, min_size=ms, cascade=cascade)
        src.shares(camera[0], 0.0)  # load the cascade
        t = time.process_time()
        for im in camera:
            src.shares(im, 0.0)  # the cascade alone (the drawing score is the clip-art source's)
        ms_per = (time.process_time() - t) / len(camera) * 1e3
        out = [frozenset(src.shares(im, 0.0)) for im in judged]
        if ref is None:
            ref = out
        faces = sum(1 for o in out if o)
        differ = sum(1 for a, b in zip(out, ref) if a != b)
        lost = sum(1 for a, b in zip(out, ref) if b and not a)
        new = sum(1 for a, b in zip(out, ref) if a and not b)
        print(f"{side:>5} {sf:>6} {mn:>5} {ms:>5} {cascade[24:-4]:>8} {ms_per:>7.1f} {faces:>6} {differ:>6} {lost:>5} {new:>5}", flush=True)


def camera_jpegs(n: int) -> list:
    from PIL import Image

    from stair_es.images import load_image

    from .sets import photos_set

    out = []
    for i, it in enumerate(photos_set().items[:n]):
        buf = io.BytesIO()
        size = (4000, 3000) if i % 2 == 0 else (1600, 1200)
        it.load().convert("RGB").resize(size, Image.Resampling.BILINEAR).save(buf, "JPEG", quality=88)
        out.append(buf.getvalue())
    return out


def encode_cost(args: argparse.Namespace) -> None:
    import os
    import statistics

    from stair_es.encoders.default import DefaultEncoder, default_sources
    from stair_es.images import load_image

    if args.cv_threads is not None:
        import cv2

        cv2.setNumThreads(args.cv_threads)
    data = camera_jpegs(args.images)
    configs = {",".join(default_sources()): DefaultEncoder(text="bow")}
    for s in args.encode:
        configs[s] = DefaultEncoder(text="bow", sources=s)
    for p in args.people:
        from stair_es.encoders.people import PeopleSource

        side, sf, mn = p.split(",")
        enc = DefaultEncoder(text="bow", sources=default_sources() + ("people",))
        enc.people = PeopleSource(side=int(side), scale_factor=float(sf), min_neighbors=int(mn), vocab=enc.vocab)
        configs[f"+people@{p}"] = enc
    for enc in configs.values():  # model load, ONNX session, cascade: outside the timing
        enc.encode_images([load_image(data[0], min_side=enc.image_min_side)])
    times: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(args.rounds):
        for k, enc in configs.items():
            t = time.process_time()
            enc.encode_images([load_image(d, min_side=enc.image_min_side) for d in data], batch_size=16)
            times[k].append((time.process_time() - t) / len(data) * 1e3)
    base = statistics.median(next(iter(times.values())))
    print(f"# {len(data)} camera JPEGs (4000x3000 and 1600x1200) decoded as ingest does, then encode_images; "
          f"CPU ms per image (decode included), median of {args.rounds} alternating rounds; load {os.getloadavg()[0]:.1f}")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k:<45} {m:7.1f} ms  x{m / base:.3f}   rounds: {', '.join(f'{t:.1f}' for t in ts)}")


if __name__ == "__main__":
    main()
