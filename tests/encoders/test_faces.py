"""Faces in photos of people (part of the ``objects`` source since its rules 3): the detector's
anchors and kept boxes, the crops the attribute models see, the words and when they are given,
and the real models when their files are here."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from stair_es.encoders import faces
from stair_es.encoders.faces import Face, face_shares, kept_boxes, read_faces

torch = pytest.importorskip("torch")

from stair_es.encoders import objects as obj  # noqa: E402


def test_anchors_follow_the_detectors_two_grids():
    a = faces.anchors(256)
    assert a.shape == (896, 2)  # 16 x 16 cells x 2, then 8 x 8 cells x 6
    assert a[0].tolist() == a[1].tolist() == [8.0, 8.0] and a[2].tolist() == [24.0, 8.0]
    assert a[512].tolist() == [16.0, 16.0] and a[-1].tolist() == [240.0, 240.0]
    assert faces.anchors(192).shape == (504, 2)  # the same feature maps of a smaller picture: 12 x 12, 6 x 6


def test_faces_are_kept_by_score_best_first_without_overlaps():
    boxes = np.array([[0.1, 0.1, 0.3, 0.3], [0.12, 0.1, 0.32, 0.3], [0.6, 0.6, 0.8, 0.8], [0.5, 0.0, 0.6, 0.1]])
    scores = np.array([0.85, 0.95, 0.9, 0.5])
    assert kept_boxes(scores, boxes) == [1, 2]  # 0 overlaps the better 1; 3 scores under the floor
    many = np.array([[i / 10, 0, i / 10 + 0.05, 0.05] for i in range(10)])
    assert len(kept_boxes(np.full(10, 0.9), many)) == faces.MAX_FACES


def test_words_of_a_smiling_woman_and_of_a_man():
    woman = face_shares([Face(score=0.9, area=0.04, male=0.1, happy=0.95)])
    assert {"woman", "female", "smiling", "smile", "happy", "face"} <= set(woman) and "man" not in woman
    assert woman["woman"] == pytest.approx(0.9 * (0.8 - 0.3) / 0.7)
    assert woman["face"] == pytest.approx(0.8 * 0.9 * 0.4)  # a face of 4 % of the picture
    man = face_shares([Face(score=0.9, area=0.5, male=0.95, happy=0.1)])
    assert man["man"] > 0.7 and man["face"] == pytest.approx(0.8 * 0.9) and "smiling" not in man


def test_an_unsure_gender_gives_no_gender_word():
    shares = face_shares([Face(score=0.95, area=0.02, male=0.6, happy=0.0)])  # |2p - 1| = 0.2 < 0.3
    assert not {"man", "woman", "male", "female"} & set(shares) and "face" in shares


def test_counts_of_men_and_women_and_a_couple():
    man, woman = Face(0.9, 0.02, 0.9, 0.0), Face(0.9, 0.02, 0.1, 0.0)
    assert "couple" in face_shares([man, woman])
    assert "couple" not in face_shares([man, woman, woman]) and "women" in face_shares([man, woman, woman])
    assert "men" in face_shares([man, man]) and "couple" not in face_shares([man, man])
    assert face_shares([]) == {}


def test_every_face_word_is_a_whole_bert_token():
    from stair_es.vocab import default_vocabulary

    vocab = default_vocabulary()
    assert all(vocab.get(t) is not None for t in faces.FACE_TOKENS)


def test_the_attribute_models_see_the_face_cropped_from_the_full_picture():
    # a wide picture: the detector sees it padded to a square at the bottom, so its box
    # fractions are of the long side
    picture = Image.new("RGB", (400, 200), (0, 0, 200))
    picture.paste((200, 0, 0), (100, 50, 160, 110))  # the "face": 60 x 60 px, red
    seen = {}

    def detect(squares):
        seen["squares"] = squares
        boxes = np.zeros((len(squares), 896, 4), np.float32)
        boxes[:, 0] = [100 / 400, 50 / 400, 160 / 400, 110 / 400]
        scores = np.zeros((len(squares), 896), np.float32)
        scores[:, 0] = 0.9
        return scores, boxes

    def describe(crops, grey):
        seen["crops"], seen["grey"] = crops, grey
        return np.full(len(crops), 0.95, np.float32), np.full(len(crops), 0.2, np.float32)

    (found,) = read_faces([picture], detect, describe)
    side = faces.DETECTOR_SIZE
    assert seen["squares"].shape == (1, 3, side, side)
    assert seen["squares"][0, :, side // 2 + 1:, :].max() == 0  # padded below the picture, not stretched
    assert seen["squares"][0, :, : side // 2 - 1, :].sum(axis=0).min() > 0
    crop = seen["crops"][0]
    assert crop.shape == (3, faces.FACE_SIZE, faces.FACE_SIZE) and seen["grey"].shape == (1, 1, 64, 64)
    c = faces.FACE_SIZE // 2
    centre = crop[:, c - 20:c + 20, c - 20:c + 20].mean(axis=(1, 2))
    assert centre[0] > 190 and centre[2] < 10  # the red face fills the middle of its crop
    assert found == [Face(score=pytest.approx(0.9), area=pytest.approx(3600 / 80000), male=pytest.approx(0.95),
                          happy=pytest.approx(0.2))]


def test_faces_are_read_only_on_photos_with_a_person_and_only_since_rules_3():
    names = [c["name"] for c in obj.coco_token_map()["classes"]]
    photos = [Image.new("RGB", (64, 64), (90, 120, 30)), Image.new("RGB", (64, 64), (30, 60, 90))]
    for rules, expect_read in ((3, 1), (2, 0)):
        src = obj.ObjectsSource(rules=rules)

        def detector(x):
            peaks = np.zeros((len(x), 80), np.float32)
            peaks[0, names.index("person")] = 0.9  # the first picture shows a person, the second a dog
            peaks[1, names.index("dog")] = 0.9
            return peaks, np.zeros((len(x), 8, 8), np.float32)

        read = []

        def detect(squares, read=read):
            read.append(len(squares))
            boxes = np.tile(np.array([0.2, 0.2, 0.6, 0.6], np.float32), (len(squares), 896, 1))
            scores = np.zeros((len(squares), 896), np.float32)
            scores[:, 0] = 0.95
            return scores, boxes

        src._run = detector
        src._faces = (detect, lambda crops, grey: (np.full(len(crops), 0.05), np.full(len(crops), 0.9)))
        person, dog = src.encode_many(photos, [0.0, 0.0])
        assert read == ([1] if expect_read else [])  # the dog photo never runs the face models
        tokens = person.to_token_map()
        assert ("woman" in tokens and "smiling" in tokens) == bool(expect_read) and "person" in tokens
        assert "woman" not in dog.to_token_map()
        assert ("woman" in src.tokens) == bool(expect_read)


@pytest.mark.slow
def test_the_real_models_see_a_smiling_woman(photos, human_models):
    (astronaut,) = obj.ObjectsSource(model=human_models).encode_many([photos["astronaut"]], [0.0])
    tokens = astronaut.to_token_map()
    assert {"person", "woman", "smiling", "face"} <= set(tokens) and "man" not in tokens
