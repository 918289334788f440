"""Composable query objects: what to score with, what to filter on, how to prune.

A :class:`SearchRequest` holds

* scoring clauses: ``SparseClause(field, vector, weight)``; a document's score is
  ``sum over clauses of weight * dot(clause.vector, document[field])`` -- the exact
  dot product the encoders are trained for;
* a filter tree over metadata and tokens: ``Term``, ``Terms``, ``Range``, ``Exists``,
  ``HasTokens`` (index-side whitelist; ``~HasTokens`` is the index-side blacklist),
  combined with ``&``, ``|``, ``~``;
* query-side controls: ``drop_tokens`` (query-side blacklist), ``query_top_k`` and
  ``query_min_weight`` (query pruning).

Backends translate these objects: the embedded engine evaluates them, the
Elasticsearch/OpenSearch backends turn them into DSL. This module must not know any backend.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from .errors import EmptyQueryError, InvalidInputError
from .schema import IndexSchema, normalize_value
from .sparse import SparseVector
from .vocab import Vocabulary, default_vocabulary


class Filter:
    """Base of the filter tree; compose with ``&``, ``|`` and ``~``."""

    def __and__(self, other: "Filter") -> "Filter":
        return And((self, other))

    def __or__(self, other: "Filter") -> "Filter":
        return Or((self, other))

    def __invert__(self) -> "Filter":
        return Not(self)

    def fields(self) -> set[str]:
        return set()

    def resolve(self, schema: IndexSchema, vocab: Vocabulary) -> "Filter":
        """Check fields exist and coerce values to the field types; returns a resolved copy."""
        return self


class _OnField(Filter):
    """A filter on one metadata field (``self.field``)."""

    def fields(self) -> set[str]:
        return {self.field}  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Term(_OnField):
    field: str
    value: Any

    def resolve(self, schema, vocab):
        return Term(self.field, _coerce(schema, self.field, self.value))


@dataclass(frozen=True)
class Terms(_OnField):
    field: str
    values: tuple

    def __init__(self, field: str, values: Iterable[Any]):
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "values", tuple(values))
        if not self.values:
            raise InvalidInputError(f"a terms filter on {field!r} needs at least one value")

    def resolve(self, schema, vocab):
        return Terms(self.field, [_coerce(schema, self.field, v) for v in self.values])


@dataclass(frozen=True)
class Range(_OnField):
    field: str
    gt: Any = None
    gte: Any = None
    lt: Any = None
    lte: Any = None

    def __post_init__(self) -> None:
        if self.gt is None and self.gte is None and self.lt is None and self.lte is None:
            raise InvalidInputError(f"a range filter on {self.field!r} needs at least one bound")

    def resolve(self, schema, vocab):
        ftype = schema.field_type(self.field)
        if ftype not in ("number", "date"):
            raise InvalidInputError(f"range filters need a number or date field; {self.field!r} is {ftype}")
        c = lambda v: None if v is None else _coerce(schema, self.field, v)  # noqa: E731
        return Range(self.field, c(self.gt), c(self.gte), c(self.lt), c(self.lte))


@dataclass(frozen=True)
class Exists(_OnField):
    field: str

    def resolve(self, schema, vocab):
        schema.field_type(self.field)
        return self


@dataclass(frozen=True)
class HasTokens(Filter):
    """Documents whose sparse ``field`` has a non-zero weight on any/all of ``tokens``.

    ``tokens`` are WordPiece tokens (``"dog"``, ``"##s"``). ``~HasTokens`` excludes them.
    """

    tokens: tuple[str, ...]
    field: str = "image"
    mode: str = "any"

    def __init__(self, tokens: Iterable[str] | str, field: str = "image", mode: str = "any"):
        toks = (tokens,) if isinstance(tokens, str) else tuple(tokens)
        if not toks:
            raise InvalidInputError("a token filter needs at least one token")
        if mode not in ("any", "all"):
            raise InvalidInputError(f"token filter mode must be 'any' or 'all', got {mode!r}")
        object.__setattr__(self, "tokens", toks)
        object.__setattr__(self, "field", field)
        object.__setattr__(self, "mode", mode)

    def resolve(self, schema, vocab):
        schema.check_sparse_field(self.field)
        for t in self.tokens:
            i = vocab.id(t)
            if vocab.is_special(i):
                raise InvalidInputError(f"{t!r} is a special token; it is never indexed")
        return self

    def token_ids(self, vocab: Vocabulary) -> list[int]:
        return [vocab.id(t) for t in self.tokens]


@dataclass(frozen=True)
class _Group(Filter):
    """``And`` / ``Or``: a flat tuple of filters (a nested group of the same kind is unfolded)."""

    filters: tuple[Filter, ...]

    def __init__(self, filters: Iterable[Filter]):
        flat: list[Filter] = []
        for f in filters:
            flat.extend(f.filters if isinstance(f, type(self)) else (f,))
        object.__setattr__(self, "filters", tuple(flat))

    def fields(self):
        return set().union(*(f.fields() for f in self.filters)) if self.filters else set()

    def resolve(self, schema, vocab):
        return type(self)(f.resolve(schema, vocab) for f in self.filters)


class And(_Group):
    """Documents that pass every filter."""


class Or(_Group):
    """Documents that pass any of the filters."""


@dataclass(frozen=True)
class Not(Filter):
    filter: Filter

    def fields(self):
        return self.filter.fields()

    def resolve(self, schema, vocab):
        return Not(self.filter.resolve(schema, vocab))


def _coerce(schema: IndexSchema, name: str, value: Any) -> Any:
    ftype = schema.field_type(name)
    if isinstance(value, str) and ftype == "number":
        try:
            value = float(value)
        except ValueError:
            raise InvalidInputError(f"field {name!r} is a number field; {value!r} is not a number") from None
    elif isinstance(value, str) and ftype == "boolean":
        low = value.lower()
        if low not in ("true", "false"):
            raise InvalidInputError(f"field {name!r} is a boolean field; use true or false, not {value!r}")
        value = low == "true"
    return normalize_value(ftype, value, name)


def whitelist(tokens: Iterable[str], mode: str = "any", field: str = "image") -> Filter:
    """Index-side whitelist: documents must contain any/all of the tokens."""
    return HasTokens(tokens, field=field, mode=mode)


def blacklist(tokens: Iterable[str], field: str = "image") -> Filter:
    """Index-side blacklist: documents containing any of the tokens are excluded."""
    return Not(HasTokens(tokens, field=field, mode="any"))


# --- scoring -------------------------------------------------------------------------------
#: Limits that keep every query cheap and every score finite (see stair_es.sparse.MAX_WEIGHT):
MAX_CLAUSE_WEIGHT = 10_000.0
MAX_FILTER_DEPTH = 32
MAX_EXPRESSION_ITEMS = 2_000
MAX_EXPRESSION_CHARS = 20_000


def filter_depth(flt: "Filter | None") -> int:
    """Nesting depth of a filter tree, computed without recursion (a hostile tree cannot overflow the stack)."""
    if flt is None:
        return 0
    deepest, stack = 0, [(flt, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_FILTER_DEPTH:
            break
        children = getattr(node, "filters", None)
        if children is None and isinstance(node, Not):
            children = [node.filter]
        stack.extend((c, d + 1) for c in children or ())
    return deepest

@dataclass(frozen=True)
class SparseClause:
    field: str
    vector: SparseVector
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.weight, (int, float)) and math.isfinite(self.weight) and 0 < self.weight <= MAX_CLAUSE_WEIGHT):
            raise InvalidInputError(
                f"clause weight for field {self.field!r} must be positive and at most {MAX_CLAUSE_WEIGHT:g}, got {self.weight!r}"
            )


@dataclass
class SearchRequest:
    clauses: list[SparseClause]
    filter: Filter | None = None
    top_k: int = 10
    drop_tokens: tuple[str, ...] = ()
    query_top_k: int | None = None
    query_min_weight: float | None = None
    notes: list[str] = field(default_factory=list)
    #: tokens added by co-occurrence expansion (``stair_es.neighbours``), by token: shown apart from the query's own
    expansion: dict[str, Any] = field(default_factory=dict)
    #: how each query word was grounded on the index's tokens (``stair_es.encoders.grounding``), for explain
    grounding: list[dict[str, Any]] = field(default_factory=list)
    #: (document frequencies, documents) of the image field the query text was encoded with, kept so
    #: re-ranking by meaning (``stair_es.rerank``) does not ask again (on a cluster, a scan); never sent
    doc_freqs: tuple[Any, int] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.top_k, int) or self.top_k < 1 or self.top_k > 10_000:
            raise InvalidInputError(f"top_k must be an integer in [1, 10000], got {self.top_k!r}")
        if self.query_top_k is not None and self.query_top_k < 1:
            raise InvalidInputError("query_top_k must be at least 1")
        if filter_depth(self.filter) > MAX_FILTER_DEPTH:
            raise InvalidInputError(f"the filter nests more than {MAX_FILTER_DEPTH} levels deep; flatten it "
                                    "(And/Or take any number of filters)")
        self.drop_tokens = tuple(self.drop_tokens)

    def prepared(self, schema: IndexSchema, vocab: Vocabulary | None = None) -> "SearchRequest":
        """Resolve the filter against ``schema`` and apply query-side dropping and pruning.

        Raises :class:`EmptyQueryError` when no clause keeps a token.
        """
        vocab = vocab or default_vocabulary()
        drop_ids = [vocab.id(t) for t in self.drop_tokens]
        clauses = []
        notes = list(self.notes)
        for c in self.clauses:
            schema.check_sparse_field(c.field)
            v = c.vector.without(drop_ids) if drop_ids else c.vector
            before = v.nnz
            v = v.prune(self.query_top_k, self.query_min_weight)
            if v.nnz < before:
                notes.append(f"query on {c.field!r} pruned from {before} to {v.nnz} tokens")
            if v.nnz:
                clauses.append(SparseClause(c.field, v, c.weight))
        if not clauses:
            raise EmptyQueryError(
                "the query has no tokens left to score with (it tokenized to nothing, or every token was "
                "dropped or pruned); try other words or relax --exclude-query/--query-top-k")
        flt = self.filter.resolve(schema, vocab) if self.filter is not None else None
        return replace(self, clauses=clauses, filter=flt, drop_tokens=(), query_top_k=None, query_min_weight=None, notes=notes)


# --- the boolean token expression of STAIR appendix D ----------------------------------------
_TOKEN_RE = re.compile(r'\s*(\(|\)|"[^"]*"|[^\s()"]+)')


def parse_token_expression(text: str, field: str = "image", vocab: Vocabulary | None = None) -> Filter:
    """Parse ``dog AND (beach OR park) NOT cat`` into a filter over ``field``'s tokens.

    Operators: AND, OR, NOT (upper case), parentheses; adjacency means AND; ``a NOT b``
    means ``a AND NOT b``. A word is WordPiece-tokenized and requires all of its pieces
    (``frisbee`` -> ``fr ##is ##bee``); a double-quoted item is taken as one exact token
    (``"##s"``).
    """
    vocab = vocab or default_vocabulary()
    items = []
    pos = 0
    text = text.strip()
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidInputError(f"the token expression is {len(text):,} characters long; the limit is {MAX_EXPRESSION_CHARS:,}")
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m or m.end() == pos:
            raise InvalidInputError(f"cannot parse token expression at: {text[pos:]!r}")
        items.append(m.group(1))
        if len(items) > MAX_EXPRESSION_ITEMS:
            raise InvalidInputError(f"the token expression has more than {MAX_EXPRESSION_ITEMS:,} words and operators")
        pos = m.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    if not items:
        raise InvalidInputError("empty token expression")
    parser = _ExprParser(items, field, vocab, text)
    result = parser.parse_or()
    if parser.i != len(items):
        raise InvalidInputError(f"unexpected {items[parser.i]!r} in token expression {text!r}")
    return result


class _ExprParser:
    def __init__(self, items, field, vocab, text):
        self.items, self.field, self.vocab, self.text, self.i = items, field, vocab, text, 0
        self.depth = 0

    def _deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_FILTER_DEPTH:
            raise InvalidInputError(f"the token expression nests more than {MAX_FILTER_DEPTH} levels of parentheses "
                                    "or NOT; simplify it")

    def peek(self):
        return self.items[self.i] if self.i < len(self.items) else None

    def parse_or(self):
        left = self.parse_and()
        while self.peek() == "OR":
            self.i += 1
            left = left | self.parse_and()
        return left

    def parse_and(self):
        left = self.parse_unary()
        while self.peek() not in (None, "OR", ")"):
            op = self.peek()  # AND, NOT (a NOT b = a AND NOT b), or adjacency
            if op in ("AND", "NOT"):
                self.i += 1
            right = self.parse_unary()
            left = left & (Not(right) if op == "NOT" else right)
        return left

    def parse_unary(self):
        tok = self.peek()
        if tok is None:
            raise InvalidInputError(f"token expression {self.text!r} ends early")
        self.i += 1
        if tok == "NOT":
            self._deeper()
            inner = Not(self.parse_unary())
            self.depth -= 1
            return inner
        if tok == "(":
            self._deeper()
            inner = self.parse_or()
            if self.peek() != ")":
                raise InvalidInputError(f"missing ')' in token expression {self.text[:80]!r}")
            self.i += 1
            self.depth -= 1
            return inner
        if tok in (")", "AND", "OR"):
            raise InvalidInputError(f"unexpected {tok!r} in token expression {self.text!r}")
        return word_filter(tok, self.field, self.vocab)


def word_filter(word: str, field: str = "image", vocab: Vocabulary | None = None) -> HasTokens:
    """Documents containing ``word``: all of its WordPiece pieces, or one exact ``"token"`` if quoted."""
    vocab = vocab or default_vocabulary()
    word = word.strip()
    if len(word) >= 2 and word.startswith('"') and word.endswith('"'):
        t = word[1:-1]
        vocab.id(t)
        return HasTokens((t,), field=field)
    pieces = [p for p in vocab.tokenize(word) if p != "[UNK]"]
    if not pieces:
        raise InvalidInputError(f"{word!r} has no token in the vocabulary")
    return HasTokens(pieces, field=field, mode="all")


def words_to_token_ids(words: Iterable[str], vocab: Vocabulary | None = None) -> list[str]:
    """Tokens of each word (quoted items taken as exact tokens), for query-side dropping."""
    vocab = vocab or default_vocabulary()
    out: list[str] = []
    for w in words:
        out.extend(word_filter(w, vocab=vocab).tokens)
    return out


# --- the --where mini-language of the CLI ----------------------------------------------------
_WHERE_RE = re.compile(r"^\s*(!?)([A-Za-z_][A-Za-z0-9_\-]*)\s*(>=|<=|!=|=|>|<|\s+exists\s*$)\s*(.*)$")


def parse_where(expr: str) -> Filter:
    """Parse one ``--where`` condition.

    ``brand=acme``, ``brand=acme|globex`` (any of), ``brand!=acme``, ``price<20``,
    ``price>=5``, ``taken>=2024-01-01``, ``brand exists``, ``!brand exists``.
    Values are coerced to the field's type when the query runs.
    """
    m = _WHERE_RE.match(expr)
    if not m:
        raise InvalidInputError(
            f"cannot parse --where {expr!r}: use FIELD=VALUE, FIELD=A|B, FIELD!=VALUE, FIELD<N, FIELD>=N or 'FIELD exists'"
        )
    neg, name, op, value = m.group(1), m.group(2), m.group(3).strip(), m.group(4).strip()
    if op == "exists":
        f: Filter = Exists(name)
    else:
        if value == "":
            raise InvalidInputError(f"--where {expr!r} has no value after {op!r}")
        if op in ("=", "!="):
            vals = [v.strip() for v in value.split("|")]
            f = Term(name, vals[0]) if len(vals) == 1 else Terms(name, vals)
            if op == "!=":
                f = Not(f)
        else:
            key = {">": "gt", ">=": "gte", "<": "lt", "<=": "lte"}[op]
            f = Range(name, **{key: value})
    return Not(f) if neg else f


def combine(filters: Sequence[Filter | None]) -> Filter | None:
    fs = [f for f in filters if f is not None]
    if not fs:
        return None
    return fs[0] if len(fs) == 1 else And(fs)
