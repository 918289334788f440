"""Request bodies of `stair-es serve` parsed as JSON within the per-request limits.

:func:`parse_capped` refuses a list or an object the moment it holds one item more than the
limit of its field (``where`` -> ``--max-filters``, ``tokens`` -> ``--max-query-tokens``, ...),
and a body whose values add up to more than all limits together, or nest deeper than
:data:`MAX_DEPTH`. So a 14 MB body of a million filters is refused after reading 65 of them,
and parsing never builds more values than the limits allow (strings are bounded by the body
cap). Strings, the bulk of large bodies (base64 images), go through the C ``scanstring`` of
the standard library; bodies up to :data:`SMALL_BODY` bytes, which cannot hold much, through
``json.loads`` itself.

This module knows JSON, not FastAPI.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from json.decoder import JSONDecodeError, scanstring
from json.scanner import NUMBER_RE
from typing import Any, Mapping

from .service import LimitExceededError

#: Bodies up to this many bytes are parsed by ``json.loads`` (they cannot hold much); larger ones item by item.
SMALL_BODY = 64 * 1024
#: Deepest nesting of lists and objects accepted (the API's deepest is 4).
MAX_DEPTH = 32

_WS = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class Cap:
    limit: int
    what: str  # e.g. "where: filters"
    option: str  # e.g. "--max-filters"


def caps_of(config) -> tuple[dict[str, Cap], int]:
    """The per-field caps of a :class:`~.service.ServeConfig` (by top-level field; ``""`` for a
    body that is itself a list), and the cap of any other list or object."""
    inputs = Cap(config.max_inputs, "inputs", "--max-inputs")
    clause = config.max_clause_tokens
    caps = {
        "where": Cap(config.max_filters, "where: filters", "--max-filters"),
        "require": Cap(clause, "require: tokens", "--max-clause-tokens"),
        "exclude": Cap(clause, "exclude: tokens", "--max-clause-tokens"),
        "exclude_query": Cap(clause, "exclude_query: tokens", "--max-clause-tokens"),
        "tokens": Cap(config.max_query_tokens, "tokens: entries in the token map", "--max-query-tokens"),
        "inputs": inputs, "input": Cap(config.max_inputs, "input: inputs", "--max-inputs"), "": inputs,
    }
    return caps, max(c.limit for c in caps.values())


def parse_capped(text: str, caps: Mapping[str, Cap], other: int, *, small: int = SMALL_BODY) -> Any:
    """``text`` as JSON, refusing (:class:`LimitExceededError`) past a cap; JSONDecodeError if not JSON."""
    if len(text) <= small:
        try:
            return json.loads(text)
        except RecursionError:  # tens of thousands of brackets fit in a small body
            raise LimitExceededError(f"the body nests lists and objects deeper than {MAX_DEPTH}; send a flatter body") from None
    return _Parser(text, caps, other).parse()


class _Parser:
    def __init__(self, s: str, caps: Mapping[str, Cap], other: int):
        self.s, self.caps, self.other = s, caps, max(1, int(other))
        # all values of one body: every field at its limit, and some
        self.budget = sum(c.limit for c in caps.values()) + 4 * self.other + 1024

    def parse(self) -> Any:
        value, i = self.value(_WS.match(self.s, 0).end(), 0, "")
        i = _WS.match(self.s, i).end()
        if i != len(self.s):
            raise JSONDecodeError("Extra data", self.s, i)
        return value

    def _count(self, n: int, key: str | None, is_list: bool, depth: int) -> None:
        self.budget -= 1
        cap = self.caps.get(key) if key is not None and (key or is_list) else None
        limit = cap.limit if cap is not None else self.other
        if n > limit:
            if cap is None:
                raise LimitExceededError(f"a {'list' if is_list else 'object'} at depth {depth} of the body holds more "
                                         f"than {limit} items, more than any field accepts; send fewer")
            raise LimitExceededError(f"{cap.what}: more than {limit}; the limit is {limit} per request ({cap.option}); "
                                     "send fewer")
        if self.budget < 0:
            raise LimitExceededError("the body holds more values than the per-request limits allow together; send less")

    def value(self, i: int, depth: int, key: str | None) -> tuple[Any, int]:
        s = self.s
        try:
            c = s[i]
        except IndexError:
            raise JSONDecodeError("Expecting value", s, i) from None
        if c == '"':
            return scanstring(s, i + 1)
        if c == "{" or c == "[":
            if depth >= MAX_DEPTH:
                raise LimitExceededError(f"the body nests lists and objects deeper than {MAX_DEPTH}; send a flatter body")
            return (self.obj if c == "{" else self.arr)(i + 1, depth + 1, key)
        if s.startswith("null", i):
            return None, i + 4
        if s.startswith("true", i):
            return True, i + 4
        if s.startswith("false", i):
            return False, i + 5
        m = NUMBER_RE.match(s, i)
        if m is None:
            raise JSONDecodeError("Expecting value", s, i)
        integer, frac, exp = m.groups()
        if frac or exp:
            return float(integer + (frac or "") + (exp or "")), m.end()
        return int(integer), m.end()

    def arr(self, i: int, depth: int, key: str | None) -> tuple[list, int]:
        s, out = self.s, []
        i = _WS.match(s, i).end()
        if s[i:i + 1] == "]":
            return out, i + 1
        while True:
            self._count(len(out) + 1, key, True, depth)
            v, i = self.value(_WS.match(s, i).end(), depth, None)
            out.append(v)
            i = _WS.match(s, i).end()
            c = s[i:i + 1]
            if c == "]":
                return out, i + 1
            if c != ",":
                raise JSONDecodeError("Expecting ',' delimiter", s, i)
            i += 1

    def obj(self, i: int, depth: int, key: str | None) -> tuple[dict, int]:
        s, out = self.s, {}
        i = _WS.match(s, i).end()
        if s[i:i + 1] == "}":
            return out, i + 1
        while True:
            if s[i:i + 1] != '"':
                raise JSONDecodeError("Expecting property name enclosed in double quotes", s, i)
            self._count(len(out) + 1, key, False, depth)
            name, i = scanstring(s, i + 1)
            i = _WS.match(s, i).end()
            if s[i:i + 1] != ":":
                raise JSONDecodeError("Expecting ':' delimiter", s, i)
            # a top-level field's lists and objects take that field's cap; deeper ones the general one
            v, i = self.value(_WS.match(s, i + 1).end(), depth, name if depth == 1 else None)
            out[name] = v
            i = _WS.match(s, i).end()
            c = s[i:i + 1]
            if c == "}":
                return out, i + 1
            if c != ",":
                raise JSONDecodeError("Expecting ',' delimiter", s, i)
            i = _WS.match(s, i + 1).end()
