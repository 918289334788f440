"""Co-occurrence neighbours (PPMI) and query expansion, on a corpus small enough to count by hand.

The corpus (caption -> image tokens):

    d1  "cat on a sofa"   cat sofa
    d2  "a cat"           cat animal
    d3  "a dog"           dog animal
    d4  (no caption)      dog

Caption word ``cat`` with image tokens, over the N_c = 3 captioned documents: ``cat`` is in 2
captions; image ``cat`` is in 2 captioned documents, both with the word: PPMI = log(2*3/(2*2)) =
log 1.5, NPMI = log 1.5 / -log(2/3) = 1; image ``sofa`` in 1, shared 1: PPMI = log(1*3/(2*1)) =
log 1.5, NPMI = log 1.5 / log 3; image ``animal`` in 2, shared 1: log(3/4) < 0, not a neighbour.
Image token ``cat`` with image tokens over all N = 4 documents: ``sofa`` (1 doc, shared 1):
log(1*4/(2*1)) = log 2; ``animal`` (2 docs, shared 1): log(4/4) = 0, not a neighbour.
"""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from stair_es.backends.embedded import EmbeddedBackend
from stair_es.cli.main import cli
from stair_es.errors import DamagedIndexError, IndexNotFoundError, InvalidInputError
from stair_es.neighbours import (STATS_FILE, Cooccurrence, StatsUpdater, expand_vector, index_counts, load_counts,
                                  neighbours)
from stair_es.schema import Document, IndexSchema
from stair_es.search import QuerySpec, make_request
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

V = default_vocabulary()
CORPUS = [("d1", "cat on a sofa", {"cat": 1.0, "sofa": 0.5}), ("d2", "a cat", {"cat": 0.8, "animal": 0.7}),
          ("d3", "a dog", {"dog": 1.0, "animal": 0.6}), ("d4", None, {"dog": 0.9})]


def doc(i, caption, tokens):
    return Document(i, {"image": SparseVector.from_token_map(tokens)}, caption=caption)


@pytest.fixture
def home(tmp_path):
    b = EmbeddedBackend(tmp_path)
    b.create_index("tiny", IndexSchema())
    b.ingest("tiny", [doc(*row) for row in CORPUS])
    b.close()
    return tmp_path


def run(home, *args):
    return CliRunner().invoke(cli, [*args, "--home", str(home)], catch_exceptions=False)


def by_token(ns):
    return {V.token(n.token_id): n for n in ns}


def test_ppmi_matches_the_hand_count(home):
    with EmbeddedBackend(home) as b:
        rep = neighbours(b, "tiny", "cat", min_count=1)
    word = by_token(rep.as_word)
    assert [V.token(n.token_id) for n in rep.as_word] == ["cat", "sofa"]  # equal PPMI: more shared documents first
    assert word["cat"].ppmi == pytest.approx(math.log(1.5)) and word["cat"].npmi == pytest.approx(1.0)
    assert word["sofa"].ppmi == pytest.approx(math.log(1.5))
    assert word["sofa"].npmi == pytest.approx(math.log(1.5) / math.log(3))
    assert (word["cat"].count, word["cat"].count_x, word["cat"].count_y) == (2, 2, 2)
    assert "animal" not in word  # PPMI < 0
    image = by_token(rep.as_image)
    assert list(image) == ["sofa"] and image["sofa"].ppmi == pytest.approx(math.log(2))
    assert (rep.n_docs, rep.n_captioned, rep.word_docs, rep.image_docs) == (4, 3, 2, 2)
    # the default minimum of 2 shared documents keeps only the image token cat
    with EmbeddedBackend(home) as b:
        assert [V.token(n.token_id) for n in neighbours(b, "tiny", "cat").as_word] == ["cat"]


def test_statistics_are_stored_checksummed_and_recomputed_when_damaged(home):
    with EmbeddedBackend(home) as b:
        neighbours(b, "tiny", "cat")
        gen = b.generation("tiny")
    path = home / "tiny" / STATS_FILE
    stored = load_counts(home / "tiny")
    assert stored.generation == gen and stored.n_docs == 4
    raw = bytearray(path.read_bytes())
    raw[100] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DamagedIndexError, match="delete"):
        load_counts(home / "tiny")
    notes = []
    with EmbeddedBackend(home) as b:
        again = index_counts(b, "tiny", notes=notes)
    assert again.same_counts(stored) and any("recomputed" in n for n in notes)
    assert load_counts(home / "tiny").same_counts(stored)  # rewritten whole


def test_incremental_upkeep_equals_recomputation(home):
    with EmbeddedBackend(home) as b:
        index_counts(b, "tiny")  # stored: from now on ingest and delete keep it current
        b.ingest("tiny", [doc("d5", "a cat and a dog on a sofa", {"cat": 1, "dog": 1, "sofa": 1}),
                          doc("d1", "a sofa", {"sofa": 1.0}),  # replaces d1: its old counts are subtracted
                          doc("d6", "a cat", {"cat": 1.0})])
        b.delete_documents("tiny", ["d2", "no-such-doc"])
        b.optimize("tiny")  # a merge: new generation, same documents
        gen = b.generation("tiny")
    stored = load_counts(home / "tiny")
    assert stored.generation == gen  # kept current, not recomputed on next use
    live = [("d1", "a sofa", {"sofa": 1.0}), ("d3", "a dog", {"dog": 1.0, "animal": 0.6}), ("d4", None, {"dog": 0.9}),
            ("d5", "a cat and a dog on a sofa", {"cat": 1, "dog": 1, "sofa": 1}), ("d6", "a cat", {"cat": 1.0})]
    fresh = Cooccurrence.from_documents([(SparseVector.from_token_map(t).ids, c) for _, c, t in live])
    assert stored.same_counts(fresh)
    assert stored.n_docs == 5 and stored.word_df[V.id("cat")] == 2


def test_a_stale_file_is_recomputed_for_the_current_generation(home):
    with EmbeddedBackend(home) as b:
        index_counts(b, "tiny")
    (home / "tiny" / STATS_FILE).unlink()
    with EmbeddedBackend(home) as b:  # no stored file: ingest does not create one ...
        b.ingest("tiny", [doc("d7", "a dog", {"dog": 1.0})])
        assert not (home / "tiny" / STATS_FILE).exists()
        assert index_counts(b, "tiny").n_docs == 5  # ... the first use does
        assert load_counts(home / "tiny").generation == b.generation("tiny")


def test_expansion_adds_the_best_neighbours_with_npmi_scaled_weights(home):
    with EmbeddedBackend(home) as b:
        counts = index_counts(b, "tiny")
    q = SparseVector.from_token_map({"cat": 2.0})
    out, added = expand_vector(q, counts, 1, weight=0.5, min_count=1)
    assert list(added) == ["sofa"]  # image token cat is the query's own token: not added again
    want = 0.5 * 2.0 * math.log(1.5) / math.log(3)
    assert added["sofa"].weight == pytest.approx(want) and added["sofa"].source == "cat"
    assert out.to_token_map() == pytest.approx({"cat": 2.0, "sofa": want})
    assert expand_vector(q, counts, 0)[1] == {}


def test_expansion_in_the_request_joins_the_image_clause_only(home):
    with EmbeddedBackend(home) as b:
        req, qvec = make_request(b, "tiny", QuerySpec(tokens={"cat": 2.0}, expand=3, expand_min_count=1))
        image = next(c for c in req.clauses if c.field == "image")
        caption = next(c for c in req.clauses if c.field == "caption")
        assert set(image.vector.to_token_map()) == {"cat", "sofa"}
        assert set(caption.vector.to_token_map()) == {"cat"} and set(qvec.to_token_map()) == {"cat"}
        assert req.expansion["sofa"]["from"] == "cat"
        # d1 (cat + sofa) now ranks first; the score is still the dot product explain sums
        hits = b.search("tiny", req).hits
        assert hits[0].id == "d1"
        exp = b.explain("tiny", "d1", req)
        assert exp.score == pytest.approx(sum(c.contribution for c in exp.contributions), rel=1e-5)


def test_explain_shows_expanded_tokens_apart(home):
    r = run(home, "explain", "tiny", "d1", "--tokens", '{"cat": 2}', "--expand", "2", "--expand-min-count", "1")
    assert r.exit_code == 0, r.output
    own, _, added = r.output.partition("expanded tokens:")
    assert "query tokens:" in own and " cat " in own and "sofa" not in own
    assert "sofa" in added and "cat" in added  # the row names the query token it came from
    r = run(home, "explain", "tiny", "d1", "--tokens", '{"cat": 2}', "--expand", "2", "--expand-min-count", "1", "--json")
    kinds = {(c["field"], c["token"]): (c["kind"], c.get("expanded_from")) for c in json.loads(r.output)["contributions"]}
    assert kinds[("image", "sofa")] == ("expanded", "cat") and kinds[("image", "cat")] == ("query", None)
    r = run(home, "search", "tiny", "--tokens", '{"cat": 2}', "--expand", "2", "--expand-min-count", "1", "--json")
    data = json.loads(r.output)
    assert data["query_tokens"] == {"cat": 2.0}
    assert [(e["token"], e["from"]) for e in data["expanded_tokens"]] == [("sofa", "cat")]


def test_cli_neighbours_table_and_json(home):
    r = run(home, "neighbours", "tiny", "cat")
    assert r.exit_code == 0, r.output
    assert "4 documents, 3 with captions" in r.output and "sofa" in r.output and "0.4055" in r.output  # log 1.5
    data = json.loads(run(home, "neighbours", "tiny", "cat", "--json").output)
    assert [n["token"] for n in data["word_to_image"]] == ["cat", "sofa"]
    assert data["word_to_image"][1]["count"] == 1


def test_expanding_a_token_never_seen_is_not_an_error(home):
    r = run(home, "search", "tiny", "--tokens", '{"zebra": 1, "cat": 1}', "--expand", "2")
    assert r.exit_code == 0, r.output
    assert "no expansion for 'zebra': never seen in a caption" in r.output
    assert "expanded tokens" not in r.output.split("note:")[0] or "zebra" not in r.output.split("note:")[0]


def test_index_without_captions_explains_the_empty_answer(tmp_path):
    with EmbeddedBackend(tmp_path) as b:
        b.create_index("nocap", IndexSchema())
        b.ingest("nocap", [doc("a", None, {"cat": 1.0, "sofa": 1.0}), doc("b", None, {"cat": 1.0, "sofa": 1.0}),
                           doc("c", None, {"dog": 1.0})])
        rep = neighbours(b, "nocap", "cat")
        assert rep.as_word == [] and any("has a caption" in n for n in rep.notes)
        assert [V.token(n.token_id) for n in rep.as_image] == ["sofa"]  # image token pairs still count
        req, _ = make_request(b, "nocap", QuerySpec(tokens={"cat": 1.0}, expand=2))
        assert req.expansion == {} and any("no captioned documents" in n for n in req.notes)
    r = run(tmp_path, "neighbours", "nocap", "cat")
    assert r.exit_code == 0 and "no caption-word neighbours" in r.output


def test_bad_input(home):
    r = run(home, "neighbours", "nope", "cat")
    assert r.exit_code != 0 and "no index named 'nope'" in r.output
    r = run(home, "neighbours", "tiny", "frisbee")  # several WordPiece tokens
    assert r.exit_code != 0 and "is not one vocabulary token" in r.output
    r = run(home, "neighbours", "tiny", "[CLS]")
    assert r.exit_code != 0 and "special token" in r.output
    with EmbeddedBackend(home) as b:
        with pytest.raises(IndexNotFoundError):
            neighbours(b, "nope", "cat")
        with pytest.raises(InvalidInputError):
            neighbours(b, "tiny", "cat", top=0)
    r = run(home, "search", "tiny", "--tokens", '{"cat": 1}', "--expand", "-1")
    assert r.exit_code != 0


def test_counts_are_additive():
    a = Cooccurrence.from_rows([np.array([1, 2])], [np.array([5])])
    b = Cooccurrence.from_rows([np.array([2, 3])], [np.array([5, 6])])
    both = Cooccurrence.from_rows([np.array([1, 2]), np.array([2, 3])], [np.array([5]), np.array([5, 6])])
    assert (a + b).same_counts(both) and (both - b).same_counts(a)
    with pytest.raises(InvalidInputError):
        a - b


def test_a_damaged_stats_file_never_fails_an_ingest(home):
    with EmbeddedBackend(home) as b:
        index_counts(b, "tiny")
    path = home / "tiny" / STATS_FILE
    path.write_bytes(path.read_bytes()[:-10])  # truncated
    with EmbeddedBackend(home) as b:
        rep = b.ingest("tiny", [doc("d8", "a cat", {"cat": 1.0})])
        assert rep.summary()["ok"] == 1
        notes = []
        assert index_counts(b, "tiny", notes=notes).n_docs == 5 and any("recomputed" in n for n in notes)


def test_search_prints_query_and_expanded_tokens_on_separate_lines(home):
    r = run(home, "search", "tiny", "--tokens", '{"cat": 2}', "--expand", "2", "--expand-min-count", "1")
    lines = r.output.splitlines()
    assert lines[0] == "query tokens: cat:2.00"
    assert lines[1].startswith("expanded tokens: sofa:0.37(<-cat)")


@pytest.mark.parametrize("count_every", [4096, 1])
def test_upkeep_over_many_batches_with_a_document_replaced_twice(home, monkeypatch, count_every):
    monkeypatch.setattr(StatsUpdater, "COUNT_EVERY", count_every)  # 1: counted after every batch
    with EmbeddedBackend(home) as b:
        index_counts(b, "tiny")
    with EmbeddedBackend(home, batch_size=2) as b:  # 5 documents: 3 batches (commits), one write of the statistics
        b.ingest("tiny", [doc("d2", "a sofa", {"sofa": 1.0}), doc("d9", "a dog", {"dog": 1.0}),
                          doc("d2", "a dog on a sofa", {"dog": 1.0, "sofa": 1.0}), doc("d10", "a cat", {"cat": 1.0}),
                          doc("d2", "a cat", {"cat": 1.0, "animal": 1.0})])
        gen = b.generation("tiny")
        stored = load_counts(home / "tiny")
        assert stored.generation == gen
        live = [b.get("tiny", i) for i in ("d1", "d2", "d3", "d4", "d9", "d10")]
        fresh = Cooccurrence.from_documents([(d.vectors["image"].ids, d.caption) for d in live])
    assert stored.same_counts(fresh) and stored.n_docs == 6
