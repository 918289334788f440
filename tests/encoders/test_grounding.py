"""Query words grounded onto the words an index holds (stair_es/encoders/grounding.py)."""

import json

import numpy as np
import pytest

from stair_es.encoders.grounded import GroundedQueryEncoder
from stair_es.encoders.grounding import (
    IndexStats,
    apply_plan,
    grounding_map,
    map_version,
    parse_grounding,
    plan_query,
)
from stair_es.encoders.text import DEFAULT_STOPWORDS, BagOfWordsEncoder
from stair_es.errors import EmptyQueryError, InvalidInputError
from stair_es.vocab import default_vocabulary

VOCAB = default_vocabulary()


def stats_of(*words, n_docs=20, extra_tokens=()):
    df = np.zeros(len(VOCAB))
    for w in [*words, *extra_tokens]:
        df[VOCAB.id(w)] = 2
    return IndexStats(df, n_docs)


def test_the_map_is_versioned_carries_the_wordnet_licence_and_knows_relatives():
    m = grounding_map()
    assert map_version().startswith("wordnet3.0-qg-v")
    assert "Princeton University" in m.header["license_notice"]
    rel = {r.word: r for r in m.relatives("giraffe")}
    assert rel["mammal"].relation == "hypernym" and rel["mammal"].distance >= 1
    assert rel["animal"].share < rel["mammal"].share  # further up, weighted down
    assert m.relatives("no such word at all") == []
    assert "aloe vera" in m and "storm cloud" in m  # multiword expressions
    assert m.lemmas("clouds")[:2] == ["clouds", "cloud"] and "mouse" in m.lemmas("mice")


def test_a_word_the_index_holds_is_searched_as_itself_and_nothing_else():
    enc = BagOfWordsEncoder(similar_words=0)  # WordNet alone: no similar words (tested below)
    q = enc.encode_query("a cat", index_stats=stats_of("cat", "mammal", "animal"))
    assert q.vector.to_token_map() == {"cat": 1.0}
    assert [s.action for s in q.grounding] == ["kept"]


def test_similar_words_the_index_holds_are_added_weighted_down_and_explained():
    # the desert photo carries sand, not desert (a word WordNet does not relate to sand)
    st = stats_of("desert", "sand", "beach", "car", "blue", "red")
    q = BagOfWordsEncoder().encode_query("desert", index_stats=st)
    tokens = q.vector.to_token_map()
    assert tokens["desert"] == 1.0 and 0 < tokens["sand"] < 0.25 * tokens["desert"]
    assert "car" not in tokens  # not similar
    [step] = q.grounding
    assert step.action == "kept" and "sand" in step.similar
    assert "similar words it holds: sand" in step.describe()
    d = step.to_dict()
    assert d["similar"][0]["token"] in ("sand", "beach") and 0.55 <= d["similar"][0]["cosine"] <= 1
    json.dumps(d)
    # an inflected form finds its base form's similar words
    plural = BagOfWordsEncoder().encode_query("deserts", index_stats=st)
    assert plural.grounding[0].action == "lemma" and "sand" in plural.vector.to_token_map()
    # only words the index holds are added, and siblings never: red is not evidence of blue
    assert set(BagOfWordsEncoder().encode_query("red", index_stats=st).vector.to_token_map()) == {"red"}
    # off: the query is its words and their WordNet grounding only
    assert BagOfWordsEncoder(similar_words=0).encode_query("desert", index_stats=st).vector.to_token_map() == {
        "desert": 1.0}


def test_the_similar_word_table_is_versioned_best_first_and_leaves_siblings_out():
    from stair_es.encoders.grounding import similar_words

    table = similar_words()
    assert table.version.startswith("similar-v2-")
    ids, cos = table.of(VOCAB.id("desert"))
    assert "sand" in {VOCAB.tokens[i] for i in ids} and (np.diff(cos) <= 0).all() and cos.min() >= 0.45
    for a, b in (("red", "blue"), ("cat", "dog"), ("italy", "germany")):  # alternatives, not evidence
        assert VOCAB.id(b) not in table.of(VOCAB.id(a))[0]
    assert len(table.of(VOCAB.id("[CLS]"))[0]) == 0


def test_similar_words_option_is_checked_and_round_trips_through_the_recorded_config():
    from stair_es.encoders import get_encoder

    with pytest.raises(InvalidInputError, match="similar_words must be a number in"):
        BagOfWordsEncoder(similar_words=2)
    cfg = get_encoder("default", text="bow", similar_words=0.1).config()
    assert cfg["similar_words"].endswith("@0.1")
    assert get_encoder(**cfg).text_encoder.similar_words == 0.1  # an index's recorded config rebuilds it
    off = get_encoder("default", text="bow", similar_words=0).config()
    assert off["similar_words"] == "off" and get_encoder(**off).text_encoder.similar_words == 0


def test_a_split_word_the_index_lacks_is_grounded_never_searched_as_fragments():
    # the index holds giraffe's WordPiece fragments (from other words), but not the word
    st = stats_of("mammal", "animal", "flower", extra_tokens=("gi", "##raf", "##fe"))
    q = BagOfWordsEncoder().encode_query("giraffe", index_stats=st)
    tokens = q.vector.to_token_map()
    assert "mammal" in tokens and not {"gi", "##raf", "##fe"} & set(tokens)
    [step] = q.grounding
    assert step.action == "grounded" and step.dropped == ["gi", "##raf", "##fe"]
    assert step.via["mammal"][0] == "hypernym"
    text = step.describe()
    assert "giraffe" in text and "hypernym 'mammal'" in text and "distance" in text and "gi ##raf ##fe" in text
    assert tokens["mammal"] < 1.0  # a relative weighs less than the word itself would
    d = step.to_dict()
    assert d["tokens"][0]["relation"] == "hypernym" and d["dropped_fragments"] == ["gi", "##raf", "##fe"]
    json.dumps(d)


def test_without_index_statistics_or_with_grounding_off_the_query_is_unchanged():
    st = stats_of("mammal")
    plain = BagOfWordsEncoder().encode_query("giraffe")
    assert set(plain.vector.to_token_map()) == {"gi", "##raf", "##fe"} and plain.grounding == []
    off = BagOfWordsEncoder(grounding="off").encode_query("giraffe", index_stats=st)
    assert off.vector.to_token_map() == plain.vector.to_token_map()
    assert BagOfWordsEncoder(grounding="off").config()["grounding"] == "off"
    assert "grounding" not in BagOfWordsEncoder().config()


def test_inflected_words_reduce_to_the_lemma_the_index_holds():
    q = BagOfWordsEncoder(similar_words=0).encode_query("clouds", index_stats=stats_of("cloud", "sky"))
    assert q.vector.to_token_map() == {"cloud": 1.0}
    assert q.grounding[0].action == "lemma" and "base form" in q.grounding[0].describe()


def test_multiword_expressions_wordnet_knows_are_looked_up_first():
    q = BagOfWordsEncoder().encode_query("storm clouds", index_stats=stats_of("cloud", "rain", "sky"))
    assert q.grounding[0].word == "storm clouds" and q.grounding[0].action == "grounded"
    assert q.grounding[0].via["cloud"][2] == "storm cloud"
    assert "cloud" in q.vector.to_token_map()


def test_a_word_with_no_relative_in_the_index_is_reported_and_fragments_still_dropped():
    st = stats_of("car", extra_tokens=("dan",))
    q = BagOfWordsEncoder().encode_query("red car dandelion", index_stats=st)
    steps = {s.word: s for s in q.grounding}
    assert steps["dandelion"].action == "not found" and "no relative" in steps["dandelion"].describe()
    assert "dan" not in q.vector.to_token_map()
    with pytest.raises(EmptyQueryError, match="WordNet relatives"):
        BagOfWordsEncoder(grounding="on").encode_query("dandelion", idf=st.idf(), index_stats=st)


def test_expansions_are_restricted_to_the_index_capped_and_fragments_dropped():
    st = stats_of("cat", "lamb", "dog")
    plan = plan_query("a cat", VOCAB, st, DEFAULT_STOPWORDS)
    raw = {VOCAB.id("cat"): 2.0, VOCAB.id("lamb"): 1.8, VOCAB.id("means"): 1.0, VOCAB.id("##fe"): 0.9}
    out = apply_plan(raw, plan, VOCAB, st.present, expansion_cap=0.5)
    assert out == {VOCAB.id("cat"): 2.0, VOCAB.id("lamb"): 1.0}  # lamb capped at 0.5 x cat; absent/fragment gone
    loose = apply_plan(raw, plan, VOCAB, st.present, restrict_expansions=False, expansion_cap=None)
    assert loose[VOCAB.id("lamb")] == 1.8 and VOCAB.id("means") in loose and VOCAB.id("##fe") not in loose


def test_grounded_words_take_the_models_weight_for_the_word_times_the_share():
    st = stats_of("mammal")
    plan = plan_query("giraffe", VOCAB, st, DEFAULT_STOPWORDS)
    raw = {VOCAB.id("gi"): 1.5, VOCAB.id("##raf"): 2.0, VOCAB.id("##fe"): 1.0}
    out = apply_plan(raw, plan, VOCAB, st.present)
    share = plan.steps[0].tokens["mammal"]
    assert out == {VOCAB.id("mammal"): pytest.approx(2.0 * share)}


def test_grounded_encoder_keeps_its_own_expansion_and_gains_grounding():
    st = stats_of("mammal", "dog", "animal")
    q = GroundedQueryEncoder().encode_query("giraffe", idf=st.idf(), index_stats=st)
    assert "mammal" in q.vector.to_token_map() and q.grounding[0].action == "grounded"


def test_bad_options_and_statistics_are_refused_with_a_reason():
    assert parse_grounding("off") is False and parse_grounding(map_version()) is True
    with pytest.raises(InvalidInputError, match="on or off"):
        parse_grounding("maybe")
    with pytest.raises(InvalidInputError, match="non-negative"):
        IndexStats(np.array([-1.0, 2.0]), 3)
    with pytest.raises(InvalidInputError, match="one document frequency per vocabulary entry"):
        BagOfWordsEncoder().encode_query("cat", index_stats=IndexStats(np.ones(5), 3))
    with pytest.raises(InvalidInputError, match="IndexStats"):
        BagOfWordsEncoder().encode_query("cat", index_stats={"cat": 1})


def test_default_encoder_records_the_map_version_query_side_only():
    from stair_es.encoders import get_encoder
    from stair_es.ingest import encoder_signature

    on = get_encoder("default", text="bow").config()
    off = get_encoder("default", text="bow", grounding="off").config()
    assert on["grounding"] == map_version() and off["grounding"] == "off"
    assert encoder_signature(on) == encoder_signature(off)  # stored vectors do not depend on it
    # an index recorded before grounding or similar words existed (no keys) just gains them
    old = {k: v for k, v in on.items() if k not in ("grounding", "similar_words")}
    assert get_encoder(**old).uses_index_stats and get_encoder(**old).text_encoder.similar_words > 0


def test_search_reports_grounding_and_says_so_when_a_backend_cannot_give_frequencies(tmp_path):
    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.schema import Document, IndexSchema
    from stair_es.search import QuerySpec, encode_query_text, make_request
    from stair_es.sparse import SparseVector

    be = EmbeddedBackend(tmp_path)
    be.create_index("ix", IndexSchema(encoder={"name": "bow"}))
    be.ingest("ix", [Document("zoo", {"image": SparseVector.from_token_map({"mammal": 1.0, "animal": 0.5})}),
                     Document("car", {"image": SparseVector.from_token_map({"car": 1.0, "gi": 1.0})})])
    request, qvec = make_request(be, "ix", QuerySpec(text="a giraffe"))
    assert [h.id for h in be.search("ix", request).hits] == ["zoo"]  # not the car via the fragment gi
    assert request.grounding[0]["word"] == "giraffe" and request.grounding[0]["action"] == "grounded"

    class NoFreqs:
        def doc_freqs(self, index, field):
            raise NotImplementedError

    notes: list[str] = []
    grounding: list = []
    vec = encode_query_text(BagOfWordsEncoder(), "giraffe", NoFreqs(), "ix", notes=notes, grounding=grounding)
    assert set(vec.to_token_map()) == {"gi", "##raf", "##fe"} and grounding == []
    assert len(notes) == 1 and "without grounding" in notes[0]


def test_cli_search_and_encode_show_every_grounding_step(tmp_path):
    from click.testing import CliRunner

    from stair_es.backends.embedded import EmbeddedBackend
    from stair_es.cli.main import cli
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector

    be = EmbeddedBackend(tmp_path)
    be.create_index("ix", IndexSchema(encoder={"name": "bow"}))
    be.ingest("ix", [Document("zoo", {"image": SparseVector.from_token_map({"mammal": 1.0, "animal": 0.5})}),
                     Document("car", {"image": SparseVector.from_token_map({"car": 1.0})})])
    be.close()
    run = CliRunner().invoke
    res = run(cli, ["search", "ix", "a giraffe", "--home", str(tmp_path), "--explain"])
    assert res.exit_code == 0, res.output
    assert "grounding: word 'giraffe' is not in this index: grounded via WordNet hypernym 'mammal'" in res.output
    res = run(cli, ["search", "ix", "a giraffe or car", "--home", str(tmp_path), "--json"])
    data = json.loads(res.output)
    assert {g["word"]: g["action"] for g in data["grounding"]} == {"giraffe": "grounded", "car": "kept"}
    res = run(cli, ["search", "ix", "a giraffe", "--home", str(tmp_path), "--json",
                    "--encoder-option", "grounding=off"])
    assert json.loads(res.output)["grounding"] == [] and json.loads(res.output)["hits"] == []
    res = run(cli, ["encode", "a giraffe", "--index", "ix", "--home", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "grounding: word 'giraffe'" in res.output and "mammal" in res.output


def test_words_written_together_are_searched_as_those_words_only_when_wordnet_does_not_know_them():
    from stair_es.encoders.grounding import compound_parts

    assert compound_parts("blueman", VOCAB) == ["blue", "man"]
    q = BagOfWordsEncoder().encode_query("BlueMan", index_stats=stats_of("blue", "man"))
    assert q.grounding[0].action == "split" and q.grounding[0].parts == ["blue", "man"]
    assert set(q.vector.to_token_map()) == {"blue", "man"} and "blue + man" in q.grounding[0].describe()
    # dandelion is a WordNet word: never read as dan + del + ion
    q = BagOfWordsEncoder().encode_query("dandelion car", index_stats=stats_of("car", "dan"))
    assert q.grounding[0].action == "not found" and "dan" not in q.vector.to_token_map()


def test_expansions_of_a_query_of_grounded_words_only_are_capped_too():
    st = stats_of("mammal", "coffee")
    plan = plan_query("giraffe", VOCAB, st, DEFAULT_STOPWORDS)
    raw = {VOCAB.id("gi"): 2.0, VOCAB.id("coffee"): 1.5}
    out = apply_plan(raw, plan, VOCAB, st.present, expansion_cap=0.1)
    assert out[VOCAB.id("coffee")] == pytest.approx(0.2)  # 0.1 x the grounded word's weight
    assert out[VOCAB.id("mammal")] > out[VOCAB.id("coffee")]


def test_query_words_are_the_words_bert_basic_tokenizer_finds():
    from stair_es.encoders.grounding import query_words
    from stair_es.vocab import basic_tokenize

    for text in ("a red car", "BlueMan#212", "café crème", "l'été", "e-mail 3.5kg", "日本 tokyo", "x_y", "naïve Ñandú",
                 "Part of the Flat Icon Collection (Wed Aug 25 23:23:49 2004)"):
        assert query_words(text) == [w for w in basic_tokenize(text) if any(c.isalnum() for c in w)], text


def test_counting_words_are_never_grounded_onto_playing_cards():
    # WordNet's nouns "two", "three" are also a deuce and a trey: cards, made of paper
    stats = stats_of("people", "card", "paper", "person")
    plan = plan_query("two people", VOCAB, stats, DEFAULT_STOPWORDS)
    steps = {s.word: s for s in plan.steps}
    assert steps["two"].action == "not found" and not steps["two"].tokens
    q = BagOfWordsEncoder().encode_query("three people", index_stats=stats)
    assert not {"card", "paper"} & set(q.vector.to_token_map())
    # a counting word the index holds is still searched as itself
    assert "two" in BagOfWordsEncoder().encode_query("two", index_stats=stats_of("two")).vector.to_token_map()
