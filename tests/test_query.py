"""The query model: filters, token clauses, pruning, the token expression and --where parsing."""

import pytest

from stair_es.errors import EmptyQueryError, InvalidInputError, UnknownFieldError
from stair_es.query import (
    And, Exists, HasTokens, Not, Or, Range, SearchRequest, SparseClause, Term, Terms, blacklist,
    parse_token_expression, parse_where, whitelist,
)
from stair_es.schema import IndexSchema
from stair_es.sparse import SparseVector

SCHEMA = IndexSchema(fields={"brand": "keyword", "price": "number", "sale": "boolean", "added": "date"})


def q(**tm):
    return SparseVector.from_token_map(tm)


def test_filters_compose_with_operators():
    f = Term("brand", "acme") & (Range("price", lt=10) | Exists("sale")) & ~Term("brand", "x")
    assert isinstance(f, And) and len(f.filters) == 3
    assert isinstance(f.filters[1], Or) and isinstance(f.filters[2], Not)


def test_resolve_coerces_values_to_field_types():
    f = And([Term("price", "12.5"), Term("sale", "true"), Range("added", gte="2024-01-01")]).resolve(SCHEMA, None or __import__("stair_es").default_vocabulary())
    assert f.filters[0].value == 12.5 and f.filters[1].value is True
    assert f.filters[2].gte == 1704067200000


def test_filter_on_missing_field_names_the_fields_that_exist():
    req = SearchRequest([SparseClause("image", q(dog=1.0))], filter=Term("colour", "red"))
    with pytest.raises(UnknownFieldError, match="unknown metadata field 'colour'.*brand"):
        req.prepared(SCHEMA)


def test_bad_values_and_ranges():
    with pytest.raises(InvalidInputError, match="not a number"):
        SearchRequest([SparseClause("image", q(dog=1.0))], filter=Term("price", "cheap")).prepared(SCHEMA)
    with pytest.raises(InvalidInputError, match="number or date"):
        SearchRequest([SparseClause("image", q(dog=1.0))], filter=Range("brand", lt="b")).prepared(SCHEMA)
    with pytest.raises(InvalidInputError, match="at least one bound"):
        Range("price")
    with pytest.raises(InvalidInputError, match="ISO 8601"):
        SearchRequest([SparseClause("image", q(dog=1.0))], filter=Term("added", "yesterday")).prepared(SCHEMA)


def test_query_side_blacklist_and_pruning_with_notes():
    req = SearchRequest([SparseClause("image", q(dog=3.0, cat=2.0, beach=1.0, sea=0.1))],
                        drop_tokens=("cat",), query_top_k=2, query_min_weight=0.5)
    p = req.prepared(SCHEMA)
    assert p.clauses[0].vector.to_token_map() == {"dog": 3.0, "beach": 1.0}
    assert any("pruned" in n for n in p.notes)


def test_query_that_is_emptied_raises():
    with pytest.raises(EmptyQueryError, match="no tokens left"):
        SearchRequest([SparseClause("image", q(dog=1.0))], drop_tokens=("dog",)).prepared(SCHEMA)
    with pytest.raises(EmptyQueryError):
        SearchRequest([]).prepared(SCHEMA)


def test_unknown_sparse_field_and_bad_top_k():
    with pytest.raises(UnknownFieldError, match="sparse field 'photo'"):
        SearchRequest([SparseClause("photo", q(dog=1.0))]).prepared(SCHEMA)
    with pytest.raises(InvalidInputError, match="top_k"):
        SearchRequest([SparseClause("image", q(dog=1.0))], top_k=0)
    with pytest.raises(InvalidInputError, match="positive"):
        SparseClause("image", q(dog=1.0), weight=float("nan"))


def test_whitelist_blacklist_helpers():
    assert whitelist(["dog", "cat"], mode="all") == HasTokens(("dog", "cat"), "image", "all")
    assert blacklist(["cat"]) == Not(HasTokens(("cat",), "image", "any"))
    with pytest.raises(InvalidInputError, match="special"):
        HasTokens(["[CLS]"]).resolve(SCHEMA, __import__("stair_es").default_vocabulary())


def test_token_expression_from_stair_appendix_d():
    f = parse_token_expression("dog AND (beach OR park) NOT cat")
    assert f == And([HasTokens(("dog",), mode="all"),
                     Or([HasTokens(("beach",), mode="all"), HasTokens(("park",), mode="all")]),
                     Not(HasTokens(("cat",), mode="all"))])
    # adjacency is AND, a multi-piece word needs all its pieces, quoted items are exact tokens
    g = parse_token_expression('frisbee "##s"', field="caption")
    assert g == And([HasTokens(("fr", "##is", "##bee"), "caption", "all"), HasTokens(("##s",), "caption")])


@pytest.mark.parametrize("bad", ["dog AND", "(dog OR cat", "OR dog", "dog )", "", "\"notatoken!\""])
def test_token_expression_errors(bad):
    with pytest.raises(InvalidInputError):
        parse_token_expression(bad)


def test_where_mini_language():
    assert parse_where("brand=acme") == Term("brand", "acme")
    assert parse_where("brand=acme|globex") == Terms("brand", ["acme", "globex"])
    assert parse_where("brand!=acme") == Not(Term("brand", "acme"))
    assert parse_where("price<=20") == Range("price", lte="20")
    assert parse_where("added>2024-01-01") == Range("added", gt="2024-01-01")
    assert parse_where("brand exists") == Exists("brand")
    assert parse_where("!brand exists") == Not(Exists("brand"))
    with pytest.raises(InvalidInputError, match="cannot parse"):
        parse_where("brand ~ acme")
    with pytest.raises(InvalidInputError, match="no value"):
        parse_where("brand=")
