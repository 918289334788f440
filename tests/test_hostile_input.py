"""Hostile input at the boundary: every case is a clear stair_es error (or a correct answer),
never an internal error, a hang, a stack overflow, or a non-finite score."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stair_es.errors import InvalidInputError, StairError
from stair_es.query import (
    MAX_FILTER_DEPTH,
    And,
    Not,
    SearchRequest,
    SparseClause,
    Term,
    parse_token_expression,
    parse_where,
)
from stair_es.schema import Document, IndexSchema
from stair_es.sparse import MAX_WEIGHT, SparseVector


@pytest.mark.parametrize("text", ["(" * 2000 + "cat", "NOT " * 3000 + "cat", "(" * 50_000, ")" * 50_000,
                                  "cat AND " * 5000 + "dog", "x" * 100_000])
def test_deep_or_huge_token_expressions_are_refused_clearly(text):
    with pytest.raises(InvalidInputError) as e:
        parse_token_expression(text)
    assert "Recursion" not in str(e.value) and len(str(e.value)) < 300


def test_nesting_up_to_the_limit_still_works():
    flt = parse_token_expression("(" * 10 + "cat" + ")" * 10 + " NOT NOT dog")
    assert flt is not None


def test_a_deep_filter_tree_from_the_api_is_refused():
    flt = Term("brand", "acme")
    for _ in range(MAX_FILTER_DEPTH + 5):
        flt = Not(flt)
    with pytest.raises(InvalidInputError, match="nests more than"):
        SearchRequest([SparseClause("image", SparseVector.from_token_map({"cat": 1.0}))], filter=flt)
    wide = And([Term("brand", str(i)) for i in range(5000)])  # wide is fine
    SearchRequest([SparseClause("image", SparseVector.from_token_map({"cat": 1.0}))], filter=wide)


@pytest.mark.parametrize("weight", [10**300, 10**400, 1e38, float("inf"), float("nan"), MAX_WEIGHT * 2])
def test_overflowing_weights_are_refused(weight):
    with pytest.raises(InvalidInputError):
        SparseVector.from_token_map({"dog": weight})


def test_huge_clause_weights_are_refused_so_no_score_is_infinite():
    v = SparseVector.from_token_map({"dog": MAX_WEIGHT})
    with pytest.raises(InvalidInputError, match="at most"):
        SparseClause("caption", v, 1e30)
    # at the limits, the largest possible score is still finite in float32
    assert np.isfinite(np.float32(MAX_WEIGHT) * np.float32(1e4) * np.float32(MAX_WEIGHT) * np.float32(30522))


def test_lone_surrogates_and_non_finite_metadata_are_refused_per_document():
    schema = IndexSchema()
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        schema.normalize_metadata({"title": "bad \ud800 text"})
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        schema.normalize_metadata({"tags": ["ok", "\udfff"]})
    with pytest.raises(InvalidInputError, match="finite"):
        schema.normalize_metadata({"price": float("nan")})
    with pytest.raises(InvalidInputError, match="not valid Unicode"):
        Document("a", {"image": SparseVector.from_token_map({"cat": 1.0})}, caption="x\ud800")


@pytest.mark.parametrize("name", ["dense", "image", "caption", "id", "path"])
def test_internal_field_names_cannot_be_metadata(name):
    with pytest.raises(InvalidInputError, match="reserved"):
        IndexSchema().normalize_metadata({name: "x"})


def test_ingest_reports_an_undecodable_document_and_keeps_the_rest(tmp_path, memory_backend):
    from stair_es.ingest import IngestOptions, ingest_catalog

    lines = [json.dumps({"id": f"d{i}", "vectors": {"image": {"cat": 1.0}}, "metadata": {"t": "ok"}}) for i in range(3)]
    lines.insert(1, json.dumps({"id": "bad", "vectors": {"image": {"cat": 1.0}}, "metadata": {"t": "\ud800"}}))
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = ingest_catalog(memory_backend, "ix", tmp_path / "c.jsonl", None, IngestOptions())
    failed = {i.id: i.error for i in report.items if not i.ok}
    assert list(failed) == ["bad"] and "Unicode" in failed["bad"]
    assert sum(1 for i in report.items if i.ok) == 3


# --- properties -----------------------------------------------------------------------------------
_words = st.sampled_from(["cat", "dog", "AND", "OR", "NOT", "(", ")", '"##s"', "beach", "(((", ")))", "NOT NOT"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_words, max_size=400))
def test_any_token_expression_parses_or_fails_clearly(words):
    try:
        parse_token_expression(" ".join(words))
    except StairError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_where_string_parses_or_fails_clearly(text):
    try:
        parse_where(text)
    except StairError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                                      st.integers(min_value=-10**400, max_value=10**400),
                                                      st.text(max_size=5), st.booleans(), st.none()), max_size=8))
def test_any_token_map_builds_a_finite_vector_or_fails_clearly(tm):
    try:
        v = SparseVector.from_token_map(tm)
    except StairError:
        return
    assert np.all(np.isfinite(v.weights)) and np.all(v.weights > 0) and np.all(v.weights <= MAX_WEIGHT)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), st.recursive(
    st.one_of(st.text(max_size=6), st.floats(), st.integers(), st.booleans(), st.none()),
    lambda inner: st.lists(inner, max_size=3), max_leaves=10), max_size=6))
def test_any_metadata_normalises_or_fails_clearly(meta):
    try:
        out, _ = IndexSchema().normalize_metadata(meta)
    except StairError:
        return
    json.dumps(out, allow_nan=False, default=str).encode("utf-8")  # storable as it is
    for v in out.values():
        assert not (isinstance(v, float) and not math.isfinite(v))


def test_metadata_names_reserved_by_the_clusters_are_refused_per_document():
    """``_source``, ``_routing``... would be refused by Elasticsearch/OpenSearch with their own
    error; stair_es refuses any new '_' name up front, with the reason, on every backend."""
    from stair_es.schema import IndexSchema

    with pytest.raises(InvalidInputError, match="starts with '_'"):
        IndexSchema().normalize_metadata({"_routing": "x"})
    assert IndexSchema().normalize_metadata({"brand_": "acme"})[0] == {"brand_": "acme"}


def test_a_document_checks_its_metadata_when_built():
    from stair_es.schema import Document

    with pytest.raises(InvalidInputError, match="metadata field 'title'.*not valid Unicode"):
        Document("d1", {}, metadata={"title": "bad \ud800"})
    with pytest.raises(InvalidInputError, match="must be a JSON object"):
        Document("d1", {}, metadata=["not", "a", "map"])
