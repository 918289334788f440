"""`stair-es rank-eval`: rated queries run as `stair-es search` runs them, scored with ir-measures.

The index is tiny and built from token maps with the `bow` query encoder recorded, so every
ranking (and so every metric) below can be checked by hand:

* "dog"      -> dog-beach (not rated), dog-park (grade 2), puppy (grade 1)
                P@1 0, P@5 2/5, RR 1/2, R 1, nDCG@10 (2/log2 3 + 1/log2 4) / (2 + 1/log2 3) = 0.66967
* "cat"      -> cat-sofa (1), cat-garden (0)
                P@1 1, P@5 1/5, RR 1, R 1, nDCG 1
* "red car" where kind=photo -> blue-car (1); "ghost" (rated 1) is not in the index
                P@1 1, P@5 1/5, RR 1, R 1/2, nDCG 1 / (1 + 1/log2 3) = 0.61315
"""

from __future__ import annotations

import json
import math
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from stair_es.backends.embedded import EmbeddedBackend
from stair_es.cli.main import cli
from stair_es.encoders.text import BagOfWordsEncoder
from stair_es.rankeval import QueryConfig
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import SparseVector

pytest.importorskip("ir_measures", reason="rank-eval needs the 'eval' extra (ir-measures)")

L2_3 = math.log2(3)
DOG = {"P@1": 0.0, "P@5": 0.4, "MRR@10": 0.5, "nDCG@10": (2 / L2_3 + 1 / 2) / (2 + 1 / L2_3), "R@5": 1.0, "R@10": 1.0}
CAT = {"P@1": 1.0, "P@5": 0.2, "MRR@10": 1.0, "nDCG@10": 1.0, "R@5": 1.0, "R@10": 1.0}
CAR = {"P@1": 1.0, "P@5": 0.2, "MRR@10": 1.0, "nDCG@10": 1 / (1 + 1 / L2_3), "R@5": 0.5, "R@10": 0.5}
MEAN = {k: (DOG[k] + CAT[k] + CAR[k]) / 3 for k in DOG}

DOCS = {  # id: (image tokens, caption tokens, kind)
    "dog-beach": ({"dog": 2.0, "beach": 1.0}, None, "photo"),
    "dog-park": ({"dog": 1.5, "park": 1.0}, None, "photo"),
    "puppy": ({"dog": 1.0, "grass": 0.5}, None, "drawing"),
    "cat-sofa": ({"cat": 2.0, "sofa": 1.0}, None, "photo"),
    "cat-garden": ({"cat": 1.2, "garden": 1.0, "flower": 0.3}, None, "photo"),
    "red-car": ({"car": 2.0, "red": 1.5}, None, "drawing"),
    "blue-car": ({"car": 1.8, "blue": 1.5}, None, "photo"),
    "red-flower": ({"flower": 2.0, "red": 1.0}, None, "drawing"),
    # a caption that speaks of the boat lifts this photo above the drawing only while captions count
    "boat-photo": ({"boat": 0.5}, {"boat": 4.0}, "photo"),
    "boat-drawing": ({"boat": 1.0}, None, "drawing"),
}


class DropBow(BagOfWordsEncoder):
    """bow with extra stopwords given as one option (``drop=car,the``), as a user's plugin might take them."""

    name = "drop-bow"

    def __init__(self, *, drop: str = "", **kw):
        super().__init__(**kw)
        self.drop = drop
        self.stopwords = self.stopwords | {w for w in str(drop).split(",") if w}


class VersionedBow(BagOfWordsEncoder):
    """bow whose index records a map version this installation does not have (as the default encoder's token map)."""

    name = "versioned-bow"

    def __init__(self, *, token_map: str = "v2", allow_version_mismatch: bool = False, **kw):
        from stair_es.encoders.base import check_recorded_version

        super().__init__(**kw)
        check_recorded_version("token map", token_map, "v2", allow_version_mismatch, "vectors are not comparable")


RATINGS = [
    {"query": "dog", "relevant": {"dog-park": 2, "puppy": 1}},
    {"query": "cat", "relevant": {"cat-sofa": 1, "cat-garden": 0}, "id": "cats"},
    {"query": "red car", "where": ["kind=photo"], "relevant": {"blue-car": 1, "ghost": 1}},
]


def build(home: Path, name: str = "pets", encoder: dict | None = None) -> None:
    backend = EmbeddedBackend(home)
    backend.create_index(name, IndexSchema(fields={"kind": "keyword"},
                                           encoder={"name": "bow"} if encoder is None else encoder))
    docs = []
    for doc_id, (image, caption, kind) in DOCS.items():
        vectors = {"image": SparseVector.from_token_map(image)}
        if caption:
            vectors["caption"] = SparseVector.from_token_map(caption)
        docs.append(Document(doc_id, vectors, {"kind": kind}))
    assert not backend.ingest(name, docs).failures
    backend.close()


def write(path: Path, lines) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _test_encoders(monkeypatch):
    """This file's encoders, registered for its tests only."""
    from stair_es.encoders import base

    monkeypatch.setitem(base._BUILTIN, "drop-bow", DropBow)
    monkeypatch.setitem(base._BUILTIN, "versioned-bow", VersionedBow)


@pytest.fixture
def home(tmp_path):
    build(tmp_path / "home")
    return tmp_path / "home"


@pytest.fixture
def rank_eval(home):
    def invoke(*args):
        return CliRunner().invoke(cli, ["rank-eval", *map(str, args), "--home", str(home)], catch_exceptions=False)

    return invoke


def approx(d):
    return pytest.approx(d, abs=1e-9)


def test_metrics_of_the_three_query_example_are_the_ones_worked_by_hand(rank_eval, tmp_path):
    r = rank_eval("pets", write(tmp_path / "r.jsonl", RATINGS), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["metrics"] == approx(MEAN)
    assert list(out["metrics"]) == ["P@1", "P@5", "MRR@10", "nDCG@10", "R@5", "R@10"]
    assert out["evaluated"] == 3 and out["errors"] == []
    dog, cats, car = out["queries"]
    assert (dog["id"], cats["id"], car["id"]) == ("line-1", "cats", "line-3")
    assert dog["metrics"] == approx(DOG) and cats["metrics"] == approx(CAT) and car["metrics"] == approx(CAR)
    assert [(h["id"], h["grade"]) for h in dog["top"]] == [("dog-beach", None), ("dog-park", 2), ("puppy", 1)]
    assert dog["first_relevant_rank"] == 2 and cats["first_relevant_rank"] == 1
    assert set(dog["query_tokens"]) == {"dog"} and set(car["query_tokens"]) == {"red", "car"}
    # the line's "where" filtered exactly as `search --where` does: red-car is a drawing
    assert [h["id"] for h in car["top"]] == ["blue-car"]
    assert car["relevant_not_in_index"] == ["ghost"] and "relevant_not_in_index" not in dog
    assert [w["line"] for w in out["warnings"]] == [3] and "ghost" in out["warnings"][0]["warning"]
    assert all(set(h) == {"id", "score", "grade"} for q in out["queries"] for h in q["top"])


def test_each_query_ranks_as_stair_es_search_ranks_it(rank_eval, home, tmp_path):
    out = json.loads(rank_eval("pets", write(tmp_path / "r.jsonl", RATINGS), "--json").stdout)
    for q, rated in zip(out["queries"], RATINGS):
        args = ["search", "pets", rated["query"], "--json", "--home", str(home)]
        for w in rated.get("where", []):
            args += ["--where", w]
        hits = json.loads(CliRunner().invoke(cli, args).stdout)["hits"]
        assert [(h["id"], h["score"]) for h in hits] == [(h["id"], h["score"]) for h in q["top"]]


def test_the_table_shows_the_metrics_then_the_worst_queries_with_tokens_and_marked_hits(rank_eval, tmp_path):
    r = rank_eval("pets", write(tmp_path / "r.jsonl", RATINGS))
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "3 queries evaluated" in lines[0]
    assert any(line.split() == ["P@1", "0.6667"] for line in lines)
    assert any(line.split() == ["MRR@10", "0.8333"] for line in lines)
    rows = [line for line in lines if line.startswith(("1 ", "2 ", "none "))]
    assert [row.split()[2] for row in rows] == ["dog", "red", "cat"]  # worst first: first relevant at 2, then nDCG
    assert re.search(r" dog:\d\.\d\d ", rows[0]) and "dog-beach? dog-park+2 puppy+1" in rows[0]
    assert "[kind=photo]" in rows[1] and "cat-garden-" in rows[2]
    assert "r.jsonl:3: 1 rated-relevant document(s) are not in the index ('ghost')" in r.output


def test_bad_lines_are_reported_with_their_line_numbers_and_the_rest_is_evaluated(rank_eval, tmp_path):
    lines = [
        RATINGS[0],                                                   # 1 ok
        "{not json",                                                  # 2
        {"query": "cat", "relevant": {}},                             # 3 no rated documents
        {"query": "cat", "relevant": {"cat-sofa": "high"}},           # 4 grade not a number
        {"query": "cat", "relevant": {"cat-sofa": 1.5}},              # 5 not a whole number
        {"query": "cat", "relevant": {"cat-sofa": 0}},                # 6 nothing relevant
        {"query": "cat", "relevant": {"cat-sofa": 1}, "where": ["colour=red"]},  # 7 unknown field, at query time
        {"relevant": {"cat-sofa": 1}},                                # 8 no query
        "",                                                           # 9 blank: skipped
        "# a comment",                                                # 10 skipped
        {"query": "cat", "ratings": [{"_id": "cat-sofa", "rating": 1}], "id": "es"},  # 11 ok (ES style)
        {"query": "cat", "relevant": ["cat-sofa"], "id": "es"},       # 12 id used on line 11
        {"query": "cat", "relevant": {"cat-sofa": 1, "gone": 0}, "wheres": ["kind=photo"]},  # 13 ok, typo warned
        [1, 2],                                                       # 14 not an object
    ]
    r = rank_eval("pets", write(tmp_path / "r.jsonl", lines), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [q["line"] for q in out["queries"]] == [1, 11, 13]
    errors = {e["line"]: e["error"] for e in out["errors"]}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8, 12, 14]
    assert errors[2].startswith("not JSON")
    assert "no rated documents" in errors[3]
    assert '"high" is not a number' in errors[4]
    assert "not a whole number" in errors[5]
    assert "no document is rated relevant" in errors[6]
    assert "colour" in errors[7]
    assert "no query text" in errors[8]
    assert "already used on line 11" in errors[12]
    assert "not a JSON object" in errors[14]
    assert any(w["line"] == 13 and "wheres" in w["warning"] for w in out["warnings"])
    assert any(w["line"] == 13 and "rated non-relevant are not in the index ('gone'): no effect" in w["warning"]
               for w in out["warnings"])
    assert "relevant_not_in_index" not in out["queries"][2]
    assert out["metrics"]["P@1"] == pytest.approx((0 + 1 + 1) / 3)
    table = rank_eval("pets", tmp_path / "r.jsonl")
    assert table.exit_code == 0 and "not evaluated (9):" in table.output and "r.jsonl:4: the grade of 'cat-sofa'" in table.output


def test_exit_status_is_non_zero_only_when_nothing_could_be_evaluated(rank_eval, tmp_path):
    bad = write(tmp_path / "bad.jsonl", ["nope", {"query": "cat", "relevant": {}}])
    r = rank_eval("pets", bad)
    assert r.exit_code == 2
    assert "bad.jsonl:1: not JSON" in r.output and "bad.jsonl:2: no rated documents" in r.output
    assert r.output.strip().splitlines()[-1].startswith("Error: no query could be evaluated")
    r = rank_eval("pets", bad, "--json")
    assert r.exit_code == 2
    out = json.loads(r.stdout)
    assert out["evaluated"] == 0 and out["metrics"]["P@1"] is None and len(out["errors"]) == 2
    # every query failing the same way (a filter on a field the index lacks) says so in one line
    same = write(tmp_path / "same.jsonl", [{"query": q, "relevant": ["cat-sofa"], "where": ["colour=red"]} for q in ("a cat", "cat")])
    r = rank_eval("pets", same)
    assert r.exit_code == 2 and "Error: no query could be evaluated: " in r.output and "colour" in r.output.splitlines()[-1]
    empty = write(tmp_path / "empty.jsonl", [])
    r = rank_eval("pets", empty)
    assert r.exit_code == 2 and "holds no rated queries" in r.output


def test_trec_qrels_with_a_queries_file_give_the_same_figures(rank_eval, tmp_path):
    qrels = write(tmp_path / "qrels.txt", ["q1 0 dog-park 2", "q1 0 puppy 1", "cats 0 cat-sofa 1", "cats 0 cat-garden 0",
                                           "q3 0 blue-car 1", "q3 0 ghost 1"])
    topics = write(tmp_path / "topics.jsonl", [{"id": "q1", "query": "dog"}, {"id": "cats", "query": "cat"},
                                               {"id": "q3", "query": "red car", "where": ["kind=photo"]}])
    out = json.loads(rank_eval("pets", qrels, "--queries", topics, "--json").stdout)
    assert out["metrics"] == approx(MEAN)
    tsv = write(tmp_path / "topics.tsv", ["q1\tdog", "cats\tcat"])
    out = json.loads(rank_eval("pets", qrels, "--queries", tsv, "--json").stdout)
    assert [q["id"] for q in out["queries"]] == ["q1", "cats"]
    assert out["metrics"]["MRR@10"] == pytest.approx(0.75)
    # q3 is rated but has no text: reported at its first qrels line
    assert [(e["file"].endswith("qrels.txt"), e["line"]) for e in out["errors"]] == [(True, 5)]


def test_trec_problems_are_reported_per_line(rank_eval, tmp_path):
    qrels = write(tmp_path / "qrels.txt", ["q1 0 dog-park 2", "q1 0 puppy", "q1 0 puppy x", "q2 0 cat-sofa 1"])
    topics = write(tmp_path / "topics.tsv", ["q1\tdog", "no tab here", "q9\tnothing rated"])
    out = json.loads(rank_eval("pets", qrels, "--queries", topics, "--json").stdout)
    problems = {(Path(e["file"]).name, e["line"]): e["error"] for e in out["errors"]}
    assert "expected 4 fields" in problems[("qrels.txt", 2)]
    assert "not a number" in problems[("qrels.txt", 3)]
    assert "has no text" in problems[("qrels.txt", 4)]
    assert "QID<TAB>" in problems[("topics.tsv", 2)]
    assert "no rated documents" in problems[("topics.tsv", 3)]
    assert [q["id"] for q in out["queries"]] == ["q1"]
    r = rank_eval("pets", qrels)  # qrels without --queries
    assert r.exit_code == 2 and "--queries FILE" in r.output
    r = rank_eval("pets", write(tmp_path / "r.jsonl", RATINGS), "--queries", topics)
    assert r.exit_code == 2 and "--queries is for TREC qrels" in r.output


def test_compare_runs_two_configurations_side_by_side(rank_eval, tmp_path):
    ratings = write(tmp_path / "r.jsonl", [*RATINGS, {"query": "boat", "relevant": {"boat-photo": 1}, "id": "boat"}])
    r = rank_eval("pets", ratings, "--compare-caption-weight", "0", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["configs"]["A"]["encoder"] == "(recorded in the index)" and out["configs"]["B"]["caption_weight"] == 0
    first = out["queries"][0]  # the query that changed most comes first
    assert first["id"] == "boat" and first["A"]["first_relevant_rank"] == 1 and first["B"]["first_relevant_rank"] == 2
    assert [h["id"] for h in first["B"]["top"]] == ["boat-drawing", "boat-photo"]
    assert out["metrics"]["A"]["P@1"] == pytest.approx(1.0 * 3 / 4) and out["metrics"]["B"]["P@1"] == pytest.approx(0.5)
    assert out["metrics"]["delta"]["MRR@10"] == pytest.approx(-0.5 / 4)
    for q in out["queries"]:
        assert set(q["A"]) >= {"first_relevant_rank", "top", "query_tokens", "metrics"}
    table = rank_eval("pets", ratings, "--compare-caption-weight", "0")
    lines = table.output.splitlines()
    assert "B: `stair-es search` with caption-weight=0.0" in table.output
    assert any(line.split() == ["P@1", "0.7500", "0.5000", "-0.2500"] for line in lines)
    row = next(line for line in lines if "boat" in line and "0." in line)
    assert row.split()[:2] == ["1", "2"]
    assert "1 shown of 1 changed, 4 evaluated" in table.output  # only the boat query is ranked differently
    assert [q["ranked_differently"] for q in out["queries"]] == [True, False, False, False]
    same = rank_eval("pets", ratings, "--compare-image-weight", "2")  # every score doubles: same order
    assert same.exit_code == 0 and "no query is ranked differently under B" in same.output


def test_compare_with_encoder_options_and_a_second_encoder(rank_eval, tmp_path):
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    # B = A's encoder with one more option, dropping "car": the "red car" query loses it
    r = rank_eval("pets", ratings, "--encoder", "drop-bow", "--compare-encoder-option", "drop=car", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    car = next(q for q in out["queries"] if q["id"] == "line-3")
    assert set(car["A"]["query_tokens"]) == {"red", "car"} and set(car["B"]["query_tokens"]) == {"red"}
    r = rank_eval("pets", ratings, "--compare-encoder", "bow", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["configs"]["B"]["encoder"] == "bow"
    r = rank_eval("pets", ratings, "--encoder", "bow", "--compare-encoder", "bow")
    assert r.exit_code == 2 and "same configuration" in r.output


def test_a_query_one_configuration_cannot_run_is_left_out_of_both(rank_eval, tmp_path):
    ratings = write(tmp_path / "r.jsonl", [*RATINGS, {"query": "the car", "relevant": ["red-car"], "id": "thecar"}])
    out = json.loads(rank_eval("pets", ratings, "--encoder", "drop-bow", "--compare-encoder-option", "drop=car",
                               "--json").stdout)
    assert out["evaluated"] == 3 and {q["id"] for q in out["queries"]} == {"line-1", "cats", "line-3"}
    (err,) = [e for e in out["errors"] if e["id"] == "thecar"]
    assert err["error"].startswith("B (encoder=drop-bow drop=car): ") and "left out of both" in err["error"]
    assert err["line"] == 4


def test_ties_are_judged_in_the_order_search_returns_them(tmp_path):
    """Two documents with the same vector score the same; the engine puts the older first. The
    metrics judge that order (ir-measures on its own would break the tie by document id, and
    differently in its two providers)."""
    home = tmp_path / "home"
    backend = EmbeddedBackend(home)
    backend.create_index("ties", IndexSchema(encoder={"name": "bow"}))
    backend.ingest("ties", [Document("a-old", {"image": SparseVector.from_token_map({"kite": 1.0})})])
    backend.ingest("ties", [Document("z-new", {"image": SparseVector.from_token_map({"kite": 1.0})})])
    backend.close()
    ratings = write(tmp_path / "r.jsonl", [{"query": "kite", "relevant": ["z-new"]}])
    r = CliRunner().invoke(cli, ["rank-eval", "ties", str(ratings), "--json", "--home", str(home)])
    (q,) = json.loads(r.stdout)["queries"]
    assert [h["id"] for h in q["top"]] == ["a-old", "z-new"] and q["top"][0]["score"] == q["top"][1]["score"]
    assert q["first_relevant_rank"] == 2
    assert q["metrics"]["P@1"] == 0.0 and q["metrics"]["MRR@10"] == 0.5


def test_ir_measures_alone_breaks_ties_inconsistently_which_is_why_ranks_are_handed_over():
    import ir_measures
    from ir_measures import P, RR, Qrel, ScoredDoc

    from stair_es.rankeval import score_rankings

    qrels = [Qrel("q", "a", 1)]
    tied = [ScoredDoc("q", "c", 1.0), ScoredDoc("q", "a", 1.0)]
    raw = ir_measures.calc_aggregate([P @ 1, RR @ 10], qrels, tied)
    if not (raw[P @ 1] == 0.0 and raw[RR @ 10] == 1.0):
        pytest.skip(f"this ir-measures version breaks ties consistently ({raw}); the doc's note needs updating")
    ours = score_rankings({"q": {"a": 1}}, {"q": ["c", "a"]})["q"]
    assert ours["P@1"] == 0.0 and ours["MRR@10"] == 0.5


def test_the_mean_is_ir_measures_own_aggregate():
    import ir_measures

    from stair_es.rankeval import METRICS, mean_metrics, score_rankings

    ratings = {"q1": {"a": 2, "b": 1, "x": 0}, "q2": {"c": 1}, "q3": {"d": 3, "e": 1}}
    rankings = {"q1": ["x", "b", "y", "a"], "q2": ["c"], "q3": ["f", "g", "h", "i", "j", "k", "e"]}
    per = score_rankings(ratings, rankings)
    qrels = [ir_measures.Qrel(q, d, g) for q, r in ratings.items() for d, g in r.items()]
    run = [ir_measures.ScoredDoc(q, d, float(100 - i)) for q, ids in rankings.items() for i, d in enumerate(ids)]
    agg = ir_measures.calc_aggregate([ir_measures.parse_measure(m) for m in METRICS.values()], qrels, run)
    assert mean_metrics(list(per.values())) == pytest.approx({k: agg[ir_measures.parse_measure(m)] for k, m in METRICS.items()})
    assert per["q3"]["MRR@10"] == pytest.approx(1 / 7) and per["q3"]["P@5"] == 0.0


def test_a_query_without_hits_scores_zero_and_counts_in_the_mean(rank_eval, tmp_path):
    ratings = write(tmp_path / "r.jsonl", [RATINGS[1], {"query": "zebra", "relevant": ["cat-sofa"], "id": "z"}])
    out = json.loads(rank_eval("pets", ratings, "--json").stdout)
    z = next(q for q in out["queries"] if q["id"] == "z")
    assert z["top"] == [] and z["first_relevant_rank"] is None and set(z["metrics"].values()) == {0.0}
    assert out["metrics"]["P@1"] == 0.5
    table = rank_eval("pets", ratings)
    assert "(no hits)" in table.output and table.output.index("zebra") < table.output.index(" cat ")


def test_limit_top_k_and_help(rank_eval, tmp_path):
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    out = json.loads(rank_eval("pets", ratings, "--limit", "2", "--json").stdout)
    assert [q["query"] for q in out["queries"]] == ["dog", "cat"]
    r = rank_eval("pets", ratings, "--top-k", "5")
    assert r.exit_code == 2 and "--top-k" in r.output
    out = json.loads(rank_eval("pets", ratings, "--top-k", "20", "--json").stdout)
    assert out["top_k"] == 20 and out["metrics"] == approx(MEAN)
    help_ = CliRunner().invoke(cli, ["rank-eval", "--help"]).output
    for words in ("_rank_eval", "relevant but unretrievable", "--compare-encoder-option", "qrels", "nDCG@10"):
        assert words in help_


def test_index_errors_and_encoder_errors_are_one_line(rank_eval, home, tmp_path):
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    r = rank_eval("nope", ratings)
    assert r.exit_code == 4 and r.output.strip().splitlines()[-1].startswith("Error:")
    r = rank_eval("pets", ratings, "--encoder-option", "colour=blue")
    # the encoder registry names the option and lists the ones the encoder takes
    assert r.exit_code == 2 and "encoder does not take the option colour; its options are " in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    r = rank_eval("pets", ratings, "--encoder", "no-such-encoder")
    assert r.exit_code == 2 and "unknown encoder 'no-such-encoder'" in r.output
    build(home, "pre", encoder={"name": "precomputed"})
    r = rank_eval("pre", ratings)
    assert r.exit_code == 2 and "pass --encoder" in r.output
    out = json.loads(rank_eval("pre", ratings, "--encoder", "bow", "--json").stdout)
    assert out["evaluated"] == 3


def test_missing_ir_measures_names_the_eval_extra(rank_eval, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ir_measures", None)  # import raises ImportError
    r = rank_eval("pets", write(tmp_path / "r.jsonl", RATINGS))
    assert r.exit_code == 3 and "stair-es[eval]" in r.output and "ir-measures" in r.output


def test_the_query_encoder_is_built_once_per_run_and_leaves_no_registry_name(home, tmp_path, monkeypatch):
    from stair_es.encoders import base
    from stair_es.encoders.base import list_encoders
    from stair_es.encoders.text import BagOfWordsEncoder
    from stair_es.rankeval import evaluate, read_ratings

    built = []

    class CountingBow(BagOfWordsEncoder):
        def __init__(self, **kw):
            super().__init__(**kw)
            built.append(self)

    monkeypatch.setitem(base._BUILTIN, "counting-bow", CountingBow)
    backend = EmbeddedBackend(home)
    rated = read_ratings(write(tmp_path / "r.jsonl", RATINGS))
    ev = evaluate(backend, "pets", rated.queries, QueryConfig(encoder="counting-bow"))
    assert len(ev.results) == 3 and len(built) == 1
    assert not [n for n in list_encoders() if n.startswith("_rank_eval")]
    assert ev.metrics == approx(MEAN)


def test_the_command_in_a_separate_process(home, tmp_path):
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    env = {**os.environ, "STAIR_ES_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "stair_es.cli.main", "rank-eval", "pets", str(ratings), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metrics"] == approx(MEAN)
    p = subprocess.run([sys.executable, "-m", "stair_es.cli.main", "rank-eval", "pets",
                        str(write(tmp_path / "bad.jsonl", ["nope"]))], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2 and "bad.jsonl:1: not JSON" in p.stdout and p.stderr.startswith("Error: no query could be")


def test_explain_shows_how_each_listed_query_became_tokens(rank_eval, home, tmp_path):
    from stair_es.search import QuerySpec, make_request

    backend = EmbeddedBackend(home)
    request, _ = make_request(backend, "pets", QuerySpec(text="red car"))
    backend.close()
    steps = getattr(request, "grounding", None)
    if not steps:
        pytest.skip("this query encoder reports no word grounding")
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    out = json.loads(rank_eval("pets", ratings, "--json").stdout)
    assert next(q for q in out["queries"] if q["id"] == "line-3")["grounding"] == steps
    r = rank_eval("pets", ratings, "--explain")
    assert "how the query words became tokens:" in r.output
    assert all(f"    {s['explain']}" in r.output for s in steps)
    # with a comparison, the queries ranked differently (here only "boat") are listed, A's and B's steps
    backend = EmbeddedBackend(home)
    request, _ = make_request(backend, "pets", QuerySpec(text="boat"))
    backend.close()
    ratings = write(tmp_path / "r.jsonl", [*RATINGS, {"query": "boat", "relevant": {"boat-photo": 1}}])
    r = rank_eval("pets", ratings, "--explain", "--compare-caption-weight", "0")
    assert all(f"    A: {s['explain']}" in r.output and f"    B: {s['explain']}" in r.output for s in request.grounding)
    assert "'red car'" not in r.output.split("how the query words became tokens:")[1]


@pytest.mark.parametrize("flavor", ["elasticsearch", "opensearch"])
def test_on_a_cluster_the_figures_hold_and_the_index_is_scanned_once_per_run(flavor, tmp_path, monkeypatch):
    """The fake node of tests/backends (9-bit stored weights, as the engines): same figures as the
    embedded engine; the IDF scan (a full read of a cluster index) happens once, not per query."""
    pytest.importorskip("elasticsearch" if flavor == "elasticsearch" else "opensearchpy")
    from backends.fake_cluster import FakeCluster

    from stair_es.backends.cluster import ClusterBackend
    from stair_es.backends.base import get_backend

    scans = []
    real = ClusterBackend.doc_freqs
    monkeypatch.setattr(ClusterBackend, "doc_freqs", lambda self, *a: scans.append(a) or real(self, *a))
    for k in ("STAIR_ES_URL", "STAIR_ES_API_KEY", "STAIR_ES_USERNAME", "STAIR_ES_PASSWORD", "STAIR_ES_BEARER_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    ratings = write(tmp_path / "r.jsonl", [*RATINGS, {"query": "boat", "relevant": {"boat-photo": 1}, "id": "boat"}])
    with FakeCluster(flavor) as node:
        backend = get_backend(flavor, urls=node.url)
        backend.create_index("pets", IndexSchema(fields={"kind": "keyword"}, encoder={"name": "bow"}))
        docs = [Document(i, {"image": SparseVector.from_token_map(im),
                             **({"caption": SparseVector.from_token_map(cap)} if cap else {})}, {"kind": kind})
                for i, (im, cap, kind) in DOCS.items()]
        assert not backend.ingest("pets", docs).failures
        backend.close()
        args = ["rank-eval", "pets", str(ratings), "--json", "--backend", flavor, "--url", node.url]
        r = CliRunner().invoke(cli, args)
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert len(scans) == 1
        r = CliRunner().invoke(cli, [*args, "--compare-caption-weight", "0"])
        assert r.exit_code == 0, r.output
        assert len(scans) == 2
    by_id = {q["id"]: q["metrics"] for q in out["queries"]}
    assert by_id["line-1"] == approx(DOG) and by_id["cats"] == approx(CAT) and by_id["line-3"] == approx(CAR)
    assert [w["line"] for w in out["warnings"]] == [3]
    assert json.loads(r.stdout)["queries"][0]["id"] == "boat"


def test_an_index_from_another_encoder_version_stops_the_run_unless_forced(tmp_path, monkeypatch):
    import stair_es.search

    monkeypatch.setattr(stair_es.search, "VERSIONED_ENCODERS", (*stair_es.search.VERSIONED_ENCODERS, "versioned-bow"))
    home = tmp_path / "home"
    build(home, encoder={"name": "versioned-bow", "token_map": "v1"})
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    r = CliRunner().invoke(cli, ["rank-eval", "pets", str(ratings), "--home", str(home)])
    assert r.exit_code == 2 and "token map 'v1'" in r.output and "--force" in r.output
    assert r.output.count("Error:") == 1  # once, not once per query
    r = CliRunner().invoke(cli, ["rank-eval", "pets", str(ratings), "--force", "--json", "--home", str(home)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["metrics"] == approx(MEAN)


def test_a_search_the_cluster_refuses_is_reported_for_its_query_and_the_rest_evaluated(tmp_path, monkeypatch):
    pytest.importorskip("elasticsearch")
    from backends.fake_cluster import FakeCluster, Faults

    from stair_es.backends.base import get_backend

    for k in ("STAIR_ES_URL", "STAIR_ES_API_KEY", "STAIR_ES_USERNAME", "STAIR_ES_PASSWORD", "STAIR_ES_BEARER_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    ratings = write(tmp_path / "r.jsonl", RATINGS)
    with FakeCluster("elasticsearch") as node:
        backend = get_backend("elasticsearch", urls=node.url)
        backend.create_index("pets", IndexSchema(fields={"kind": "keyword"}, encoder={"name": "bow"}))
        assert not backend.ingest("pets", [Document(i, {"image": SparseVector.from_token_map(im)}, {"kind": kind})
                                           for i, (im, _, kind) in DOCS.items()]).failures
        backend.close()
        node.faults = Faults(search_status={400: 1.0}, max_faulty_requests=1)  # the next search is refused
        r = CliRunner().invoke(cli, ["rank-eval", "pets", str(ratings), "--json", "--backend", "elasticsearch",
                                     "--url", node.url])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["evaluated"] == 2 and [e["line"] for e in out["errors"]] == [1]
    assert [q["id"] for q in out["queries"]] == ["cats", "line-3"]
    r = CliRunner().invoke(cli, ["rank-eval", "pets", str(ratings), "--backend", "elasticsearch", "--url",
                                 "http://127.0.0.1:9", "--timeout", "2"])
    assert r.exit_code == 5 and r.output.count("Error:") == 1  # an unreachable cluster stops the run once
