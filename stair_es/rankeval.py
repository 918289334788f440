"""Rank evaluation: the equivalent of Elasticsearch's ``_rank_eval`` for stair_es.

Rated queries (a JSONL ratings file, or TREC qrels plus a queries file) are run exactly as
``stair-es search`` runs a query: a :class:`stair_es.search.QuerySpec` turned into a request by
:func:`stair_es.search.make_request` and answered by the backend's ``search``, on any backend.
The rankings are scored with ir-measures (P@1, P@5, MRR@10, nDCG@10, R@5, R@10; trec_eval's
definitions), never by hand. :func:`compare` runs two query configurations over the same
queries, side by side.

This module owns reading ratings, running rated queries and scoring them; it must not know how
a query is encoded or scored (``stair_es.search`` and the backends do that).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .errors import (BackendError, ConnectionFailedError, EncoderVersionError, InvalidInputError,
                     UnknownNameError, optional_import)

#: The reported metrics and the ir-measures measure behind each (RR@10 is reported as MRR@10,
#: its mean over queries).
METRICS: dict[str, str] = {
    "P@1": "P@1",
    "P@5": "P@5",
    "MRR@10": "RR@10",
    "nDCG@10": "nDCG@10",
    "R@5": "R@5",
    "R@10": "R@10",
}

#: The deepest cutoff among :data:`METRICS`: a ranking shorter than this would cut the metrics short.
MIN_TOP_K = 10

#: Keys a JSONL ratings line may hold (others are reported as warnings: a typo such as "wheres"
#: would otherwise silently drop a filter).
JSONL_KEYS = frozenset({"id", "query", "relevant", "ratings", "where"})


# --------------------------------------------------------------------------------------------
# Ratings
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RatedQuery:
    """One query and its judgments: ``ratings`` maps document ids to whole-number grades
    (>= 1 relevant, 0 or less judged non-relevant). ``where`` holds ``--where`` conditions."""

    id: str
    query: str
    ratings: Mapping[str, int]
    where: tuple[str, ...] = ()
    line: int | None = None
    file: str | None = None

    @property
    def relevant(self) -> set[str]:
        return {d for d, g in self.ratings.items() if g >= 1}

    def grade(self, doc_id: str) -> int | None:
        """The document's grade, or None when it is not rated for this query."""
        return self.ratings.get(doc_id)


@dataclass(frozen=True)
class Problem:
    """A reported input problem: an error (the query was not evaluated) or a warning (it was)."""

    message: str
    line: int | None = None
    file: str | None = None
    query_id: str | None = None
    kind: str = "error"

    def to_dict(self) -> dict[str, Any]:
        optional = {"file": self.file, "id": self.query_id}
        return {"line": self.line, self.kind: self.message, **{k: v for k, v in optional.items() if v is not None}}

    def __str__(self) -> str:
        where = f"{self.file or ''}:{self.line}" if self.line is not None else (self.file or "")
        return f"{where}: {self.message}" if where else self.message


@dataclass
class Ratings:
    """What :func:`read_ratings` found: the usable queries (in file order) and every problem."""

    queries: list[RatedQuery] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)


def _lines(path: str | Path) -> Iterator[tuple[int, str | None, str | None]]:
    """(line number, text or None, decoding error or None) for each line of a file; a line that
    is not UTF-8 is reported on its own instead of failing the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InvalidInputError(f"cannot read {path}: {e.strerror or e}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    for n, raw in enumerate(data.split(b"\n"), start=1):
        try:
            yield n, raw.decode("utf-8").rstrip("\r"), None
        except UnicodeDecodeError as e:
            yield n, None, f"not UTF-8 text (byte {e.start + 1} of the line)"


def _content(text: str | None) -> bool:
    return text is not None and bool(text.strip()) and not text.lstrip().startswith("#")


def _records(path: str | Path, errors: list[Problem]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line that holds something (not blank, not a ``#`` comment);
    a line that is not UTF-8 goes to ``errors`` with its number instead."""
    file = str(path)
    for n, text, err in _lines(path):
        if err is not None:
            errors.append(Problem(err, n, file))
        elif _content(text):
            yield n, text  # type: ignore[misc]


def _looks_like_jsonl(path: str | Path) -> bool:
    # the first line with content decides; an empty file counts as JSONL (reported as having no queries)
    return next((text.lstrip().startswith("{") for _, text, err in _lines(path) if err is None and _content(text)),
                True)


def _grade(value: Any) -> int:
    """A JSON grade as an int; ValueError says why it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{json.dumps(value, ensure_ascii=False)} is not a number")
    if not math.isfinite(value) or value != int(value):
        raise ValueError(f"{value!r} is not a whole number (grades are integers, as in Elasticsearch's _rank_eval)")
    return int(value)


def _number(text: str) -> int | float | str:
    """A qrels grade field as a number (the string itself when it is none, for the message)."""
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(text)
    return text


def _where(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(w, str) for w in value):
        return tuple(value)
    raise ValueError('"where" must be a list of conditions such as ["brand=acme", "price<=50"]')


def _judgments(obj: Mapping[str, Any]) -> dict[str, int]:
    """The line's ``relevant`` (``{"id": grade}`` or ``["id", ...]`` meaning grade 1) or ``ratings``
    (Elasticsearch's ``[{"_id": "id", "rating": grade}]``) as doc id -> grade."""
    if "relevant" in obj and "ratings" in obj:
        raise ValueError('give "relevant" or "ratings", not both')
    out: dict[str, int] = {}
    if "ratings" in obj:
        rated = obj["ratings"]
        if not isinstance(rated, list):
            raise ValueError('"ratings" must be a list like [{"_id": "doc-id", "rating": 1}]')
        for r in rated:
            if not isinstance(r, dict) or "_id" not in r or "rating" not in r:
                raise ValueError('each of "ratings" must be an object like {"_id": "doc-id", "rating": 1}')
            doc = _doc_id(r["_id"])
            try:
                out[doc] = _grade(r["rating"])
            except ValueError as e:
                raise ValueError(f"the rating of {doc!r}: {e}") from None
        return out
    rel = obj.get("relevant")
    if rel is None:
        return out
    if isinstance(rel, list):
        return {_doc_id(d): 1 for d in rel}
    if not isinstance(rel, dict):
        raise ValueError('"relevant" must map document ids to grades, e.g. {"doc-id": 1, "other-id": 2}')
    for doc, g in rel.items():
        doc = _doc_id(doc)
        try:
            out[doc] = _grade(g)
        except ValueError as e:
            raise ValueError(f"the grade of {doc!r}: {e}") from None
    return out


def _doc_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise ValueError(f"document id {json.dumps(value, ensure_ascii=False)} is not a non-empty string")
    return str(value)


def _check_rated(ratings: Mapping[str, int]) -> str | None:
    """Why a query's judgments cannot be evaluated, or None."""
    if not ratings:
        return 'no rated documents: give "relevant": {"doc-id": 1, ...} with at least one document graded 1 or more'
    if not any(g >= 1 for g in ratings.values()):
        return ("no document is rated relevant (every grade is below 1): MRR, nDCG and recall have nothing to find; "
                "grade at least one document 1 or more")
    return None


def parse_jsonl_ratings(path: str | Path) -> Ratings:
    """Read a JSONL ratings file: ``{"query": ..., "relevant": {"doc-id": grade}, "where": [...], "id": ...}``."""
    out = Ratings()
    file = str(path)
    seen: dict[str, int] = {}
    for n, text in _records(path, out.errors):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            hint = "; TREC qrels ('QID 0 DOCID GRADE') need the query texts: --queries FILE" if len(text.split()) == 4 else ""
            out.errors.append(Problem(f"not JSON ({e.msg} at column {e.colno}){hint}", n, file))
            continue
        if not isinstance(obj, dict):
            out.errors.append(Problem('not a JSON object like {"query": "two dogs", "relevant": {"doc-id": 1}}', n, file))
            continue
        qid = obj.get("id")
        if qid is not None and (isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid) == ""):
            out.errors.append(Problem('"id" must be a non-empty string or a number', n, file))
            continue
        qid = str(qid) if qid is not None else f"line-{n}"
        text_q = obj.get("query")
        if not isinstance(text_q, str) or not text_q.strip():
            out.errors.append(Problem('no query text: give "query": "two dogs"', n, file, qid))
            continue
        try:
            ratings = _judgments(obj)
            where = _where(obj.get("where"))
        except ValueError as e:
            out.errors.append(Problem(str(e), n, file, qid))
            continue
        why = _check_rated(ratings)
        if why:
            out.errors.append(Problem(why, n, file, qid))
            continue
        if qid in seen:
            out.errors.append(Problem(f"query id {qid!r} was already used on line {seen[qid]}", n, file, qid))
            continue
        seen[qid] = n
        unknown = sorted(set(obj) - JSONL_KEYS)
        if unknown:
            out.warnings.append(Problem(f"unknown key(s) ignored: {', '.join(unknown)} (known: "
                                        f"{', '.join(sorted(JSONL_KEYS))})", n, file, qid, kind="warning"))
        out.queries.append(RatedQuery(qid, text_q, ratings, where, n, file))
    return out


def parse_trec(qrels_path: str | Path, queries_path: str | Path) -> Ratings:
    """Read TREC qrels (``QID ITER DOCID GRADE``) and the query texts (``QID<TAB>text`` lines, or
    JSONL ``{"id", "query", "where"}``); queries keep the queries file's order."""
    out = Ratings()
    qfile, rfile = str(queries_path), str(qrels_path)
    judged: dict[str, dict[str, int]] = {}
    first_line: dict[str, int] = {}
    for n, text in _records(qrels_path, out.errors):
        parts = text.split()
        if len(parts) != 4:
            out.errors.append(Problem(f"expected 4 fields 'QID 0 DOCID GRADE', got {len(parts)}", n, rfile))
            continue
        qid, _, doc, g = parts
        try:
            grade = _grade(_number(g))
        except ValueError as e:
            out.errors.append(Problem(f"the grade of {doc!r}: {e}", n, rfile, qid))
            continue
        rated = judged.setdefault(qid, {})
        first_line.setdefault(qid, n)
        if doc in rated and rated[doc] != grade:
            out.warnings.append(Problem(f"{doc!r} is rated again for {qid!r} ({rated[doc]} -> {grade}): the last grade "
                                        "counts", n, rfile, qid, kind="warning"))
        rated[doc] = grade
    texts: dict[str, tuple[str, tuple[str, ...], int]] = {}
    jsonl = _looks_like_jsonl(queries_path)
    for n, text in _records(queries_path, out.errors):
        where: tuple[str, ...] = ()
        if jsonl:
            try:
                obj = json.loads(text)
                if not isinstance(obj, dict) or "id" not in obj or not isinstance(obj.get("query"), str):
                    raise ValueError('expected {"id": "Q1", "query": "two dogs"}')
                qid, q = str(obj["id"]), obj["query"]
                where = _where(obj.get("where"))
            except json.JSONDecodeError as e:
                out.errors.append(Problem(f"not JSON ({e.msg} at column {e.colno})", n, qfile))
                continue
            except ValueError as e:
                out.errors.append(Problem(str(e), n, qfile))
                continue
        else:
            qid, tab, q = text.partition("\t")
            qid = qid.strip()
            if not tab or not qid:
                out.errors.append(Problem("expected 'QID<TAB>query text'", n, qfile))
                continue
        if not q.strip():
            out.errors.append(Problem(f"query {qid!r} has no text", n, qfile, qid))
            continue
        if qid in texts:
            out.errors.append(Problem(f"query id {qid!r} was already given on line {texts[qid][2]}", n, qfile, qid))
            continue
        texts[qid] = (q, where, n)
    for qid, (q, where, n) in texts.items():
        if qid not in judged:
            out.errors.append(Problem(f"query {qid!r} has no rated documents in {rfile}", n, qfile, qid))
            continue
        why = _check_rated(judged[qid])
        if why:
            out.errors.append(Problem(why, first_line[qid], rfile, qid))
            continue
        out.queries.append(RatedQuery(qid, q, judged[qid], where, n, qfile))
    for qid, n in first_line.items():
        if qid not in texts:
            out.errors.append(Problem(f"query {qid!r} is rated but has no text in {qfile}", n, rfile, qid))
    return out


def read_ratings(path: str | Path, queries: str | Path | None = None) -> Ratings:
    """Read a ratings file: JSONL (one query a line) or, with ``queries``, TREC qrels (a line of
    qrels read as JSONL is reported as not JSON, with a hint to give ``queries``)."""
    if queries is not None:
        if _looks_like_jsonl(path):
            raise InvalidInputError(f"{path} is JSONL ratings, which carry their own query texts: --queries is for "
                                    "TREC qrels ('QID 0 DOCID GRADE' lines)")
        return parse_trec(path, queries)
    return parse_jsonl_ratings(path)


# --------------------------------------------------------------------------------------------
# Metrics (ir-measures)
# --------------------------------------------------------------------------------------------


def _ir_measures():
    return optional_import("ir_measures", "rank-eval's metrics (ir-measures)", "eval", "ir-measures")


def score_rankings(ratings: Mapping[str, Mapping[str, int]],
                   rankings: Mapping[str, Sequence[str]]) -> dict[str, dict[str, float]]:
    """Per query id, the :data:`METRICS` of its ranking (document ids, best first) against its
    graded judgments, computed by ir-measures.

    ir-measures re-sorts a run by score, and its providers break ties differently (pytrec_eval,
    which computes P, R and nDCG, by document id in reverse order; the msmarco provider behind
    RR@10 otherwise), so the same tied run can give P@1 = 0 and RR@10 = 1. The scores handed over
    here are therefore the ranks (N, N-1, ..., 1), never tied: every metric judges exactly the
    order given. Grades below 1 count as judged non-relevant (gain 0); nDCG gains are the grades.
    A query absent from ``rankings`` or with no hits scores 0 on every metric.
    """
    irm = _ir_measures()
    measures = {name: irm.parse_measure(spec) for name, spec in METRICS.items()}
    name_of = {m: name for name, m in measures.items()}
    qrels = [irm.Qrel(qid, doc, max(int(g), 0)) for qid, rated in ratings.items() for doc, g in rated.items()]
    run = []
    for qid, ids in rankings.items():
        ranked = list(dict.fromkeys(ids))  # a document counts once, at its best rank
        run.extend(irm.ScoredDoc(qid, doc, float(len(ranked) - i)) for i, doc in enumerate(ranked))
    out = {qid: dict.fromkeys(METRICS, 0.0) for qid in ratings}
    if run:
        for m in irm.iter_calc(list(measures.values()), qrels, run):
            if m.query_id in out:
                out[m.query_id][name_of[m.measure]] = float(m.value)
    return out


def mean_metrics(per_query: Sequence[Mapping[str, float]]) -> dict[str, float | None]:
    """The mean of each metric over queries (every metric here averages per query, as
    ir-measures' ``calc_aggregate`` does), None when there is no query."""
    if not per_query:
        return dict.fromkeys(METRICS)
    return {name: sum(q[name] for q in per_query) / len(per_query) for name in METRICS}


# --------------------------------------------------------------------------------------------
# Running rated queries
# --------------------------------------------------------------------------------------------


@dataclass
class QueryConfig:
    """How the rated queries are run: the query options of ``stair-es search`` (None = search's
    default). ``encoder``/``encoder_options`` override the index's recorded encoder."""

    encoder: str | None = None
    encoder_options: Mapping[str, Any] = field(default_factory=dict)
    caption_weight: float | None = None
    image_weight: float | None = None
    query_top_k: int | None = None
    min_weight: float | None = None
    expand: int | None = None
    force: bool = False
    label: str = "A"
    #: re-ranking by meaning (stair_es.rerank): auto | semantic | off, None = search's default
    rerank: str | None = None

    DEFAULT_SUMMARY = "search's defaults"

    def _search_options(self) -> dict[str, Any]:
        """The search options this configuration sets (the others are left to search's defaults)."""
        return {k: getattr(self, k) for k in ("caption_weight", "image_weight", "query_top_k", "min_weight", "expand")
                if getattr(self, k) is not None}

    def describe(self) -> dict[str, Any]:
        d: dict[str, Any] = {"label": self.label, "encoder": self.encoder or "(recorded in the index)"}
        if self.encoder_options:
            d["encoder_options"] = dict(self.encoder_options)
        return {**d, **self._search_options(), **({"rerank": self.rerank} if self.rerank else {})}

    def summary(self) -> str:
        """One line naming what this configuration sets, e.g. ``encoder=default text=grounded``."""
        parts = [f"encoder={self.encoder}"] if self.encoder else []
        parts += [f"{k}={v}" for k, v in self.encoder_options.items()]
        parts += [f"{k.replace('_', '-')}={v}" for k, v in self._search_options().items()]
        parts += [f"rerank={self.rerank}"] if self.rerank else []
        return " ".join(parts) or self.DEFAULT_SUMMARY

    def spec(self, query: RatedQuery, top_k: int, encoder: Any = None):
        """The :class:`stair_es.search.QuerySpec` that ``stair-es search QUERY --where ...`` would build."""
        # lazy: search brings the encoders; only running queries needs it
        from .search import QuerySpec

        kwargs = self._search_options()
        if encoder is not None:  # the encoder built once for the whole run (_one_encoder)
            return QuerySpec(text=query.query, wheres=query.where, top_k=top_k, encoder_instance=encoder, **kwargs)
        return QuerySpec(text=query.query, wheres=query.where, top_k=top_k, encoder=self.encoder,
                         encoder_options=dict(self.encoder_options), force=self.force, **kwargs)


class _ReadCache:
    """The backend, with the reads a query makes that cannot change during an evaluation (the
    index's schema, its document frequencies for IDF) done once: on a cluster each
    ``doc_freqs`` scans the whole index. Everything else, ``search`` first, goes to the backend."""

    def __init__(self, backend: Any):
        self._backend = backend
        self.index_info = functools.cache(backend.index_info)
        self.doc_freqs = functools.cache(backend.doc_freqs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def _one_encoder(backend: Any, index: str, config: QueryConfig) -> Any:
    """The query encoder of ``config``, built once, exactly as
    :func:`stair_es.search.make_request` builds it for a search (``query_encoder`` on the index's
    recorded config, ``force`` allowing another encoder version).

    make_request builds its encoder anew for every query: with the default encoder's SPLADE text
    tower that is ~0.5 s a query on two cores, against ~0.02 s to encode one; a ratings file of
    hundreds of queries would spend minutes building the same encoder. Each query's
    ``QuerySpec.encoder_instance`` is this one.
    """
    # lazy: search brings the encoders; only running queries needs it
    from .search import VERSIONED_ENCODERS, query_encoder

    schema = backend.index_info(index).schema
    recorded = (schema.encoder or {}).get("name")
    if not config.encoder and (not recorded or recorded == "precomputed"):
        raise InvalidInputError("this index holds precomputed vectors and records no encoder: pass --encoder (e.g. bow) "
                                "to encode the rated query texts")
    options = dict(config.encoder_options)
    if config.force and not config.encoder and recorded in VERSIONED_ENCODERS:
        options["allow_version_mismatch"] = True
    try:
        encoder = query_encoder(schema, config.encoder, **options)
    except TypeError as e:  # an option the encoder's constructor does not take
        raise InvalidInputError(f"the {config.encoder or recorded} encoder does not take these options "
                                f"({', '.join(options) or 'none'}): {e}") from None
    if "text" not in encoder.modalities:
        raise InvalidInputError(f"the {encoder.name!r} encoder does not encode texts; rank-eval's queries are texts")
    return encoder


@dataclass
class Hit:
    id: str
    score: float
    grade: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "score": self.score, "grade": self.grade}


@dataclass
class QueryResult:
    """One rated query's ranking and metrics."""

    query: RatedQuery
    top: list[Hit]
    query_tokens: dict[str, float]
    metrics: dict[str, float]
    missing: list[str] = field(default_factory=list)  # relevant ids the index does not hold
    #: what each query word became when the encoder grounds words on the index (``SearchRequest.grounding``)
    grounding: list[dict[str, Any]] = field(default_factory=list)
    #: the search's notes (IDF unavailable, no expansion for a word...)
    notes: list[str] = field(default_factory=list)
    #: tokens added by ``expand`` (``SearchRequest.expansion``: token, weight, the query token it came from...)
    expanded_tokens: list[dict[str, Any]] = field(default_factory=list)

    @property
    def first_relevant_rank(self) -> int | None:
        return next((i for i, h in enumerate(self.top, start=1) if h.grade is not None and h.grade >= 1), None)

    def to_dict(self) -> dict[str, Any]:
        d = {"query": self.query.query, "id": self.query.id, "line": self.query.line,
             "first_relevant_rank": self.first_relevant_rank, "top": [h.to_dict() for h in self.top],
             "query_tokens": self.query_tokens, "metrics": self.metrics, "relevant": len(self.query.relevant)}
        optional = {"where": list(self.query.where), "relevant_not_in_index": self.missing, "grounding": self.grounding,
                    "expanded_tokens": self.expanded_tokens, "notes": self.notes}
        return {**d, **{k: v for k, v in optional.items() if v}}


def _badness(r: QueryResult) -> tuple:
    """Sort key, worst first: no relevant hit, then the deepest first relevant hit, then nDCG@10."""
    rank = r.first_relevant_rank
    return (-(math.inf if rank is None else rank), r.metrics["nDCG@10"], r.metrics["P@5"], r.query.line or 0)


@dataclass
class Evaluation:
    """One configuration's results: the mean metrics and every evaluated query."""

    index: str
    config: QueryConfig
    top_k: int
    metrics: dict[str, float | None]
    results: list[QueryResult]
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """The notes every evaluated query's search gave (e.g. IDF the backend cannot report);
        a query's own notes are in its result."""
        if not self.results:
            return []
        common = set(self.results[0].notes).intersection(*(r.notes for r in self.results[1:]))
        return [n for n in self.results[0].notes if n in common]

    def worst_first(self) -> list[QueryResult]:
        return sorted(self.results, key=_badness)

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "top_k": self.top_k, "config": self.config.describe(),
                "evaluated": len(self.results), "metrics": self.metrics,
                "queries": [r.to_dict() for r in self.results],
                "errors": [p.to_dict() for p in self.errors], "warnings": [p.to_dict() for p in self.warnings],
                "notes": self.notes}


def _check_ready(top_k: int) -> None:
    """A usable ``top_k``, and ir-measures installed."""
    if not isinstance(top_k, int) or top_k < MIN_TOP_K:
        raise InvalidInputError(f"top_k must be at least {MIN_TOP_K} (got {top_k!r}): MRR@10, nDCG@10 and R@10 look at "
                                "the top 10 hits")
    _ir_measures()


def _missing_relevant(backend: Any, index: str, queries: Sequence[RatedQuery]) -> dict[str, list[str]]:
    """Per query id, its rated documents (any grade) that the index does not hold."""
    wanted = {d for q in queries for d in q.ratings}
    present = backend.existing_ids(index, sorted(wanted)) if wanted else set()
    return {q.id: sorted(d for d in q.ratings if d not in present) for q in queries}


def _missing_warnings(queries: Sequence[RatedQuery], missing: Mapping[str, list[str]]) -> list[Problem]:
    out = []
    for q in queries:
        ids = missing.get(q.id) or []
        if not ids:
            continue
        rel = [d for d in ids if q.ratings[d] >= 1]
        listed = rel or ids
        shown = ", ".join(repr(d) for d in listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")
        what = (f"{len(rel)} rated-relevant document(s) are not in the index ({shown}): counted as relevant but "
                "unretrievable (recall and nDCG cannot reach 1)" if rel else
                f"{len(ids)} document(s) rated non-relevant are not in the index ({shown}): no effect on the metrics")
        if rel and len(ids) > len(rel):
            what += f"; {len(ids) - len(rel)} more rated non-relevant are not in it either"
        out.append(Problem(what, q.line, q.file, q.id, kind="warning"))
    return out


#: Errors that no query could escape (wrong encoder, version, name; a cluster that cannot be
#: reached): raised, not reported per line. Other input and backend errors belong to their query.
_GLOBAL_ERRORS = (EncoderVersionError, UnknownNameError, ConnectionFailedError)


def _run(backend: Any, index: str, queries: Sequence[RatedQuery], config: QueryConfig, top_k: int,
         bar: Any) -> dict[str, Any]:
    """query id -> (SearchResult, query vector, {grounding, notes, expanded_tokens}) or the InvalidInputError
    that query raised."""
    # lazy: search brings the encoders; only running queries needs it
    from .rerank import search as rerank_search
    from .search import make_request

    out: dict[str, Any] = {}
    encoder = _one_encoder(backend, index, config)
    for q in queries:
        try:
            request, qvec = make_request(backend, index, config.spec(q, top_k, encoder))
            result = rerank_search(backend, index, request, q.query, rerank=config.rerank)
        except _GLOBAL_ERRORS:
            raise
        except (InvalidInputError, BackendError) as e:  # a bad "where", nothing searchable, a refused request...
            out[q.id] = e
        else:
            notes = list(dict.fromkeys([*request.notes, *result.notes]))
            extra = {"grounding": list(getattr(request, "grounding", None) or []), "notes": notes,
                     "expanded_tokens": list((getattr(request, "expansion", None) or {}).values())}
            out[q.id] = (result, qvec, extra)
        bar.update(1)
    return out


def _results(queries: Sequence[RatedQuery], runs: Mapping[str, Any], missing: Mapping[str, list[str]]) -> list[QueryResult]:
    rankings = {q.id: [h.id for h in runs[q.id][0].hits] for q in queries}
    scores = score_rankings({q.id: q.ratings for q in queries}, rankings)
    out = []
    for q in queries:
        result, qvec, extra = runs[q.id]
        top = [Hit(h.id, float(h.score), q.grade(h.id)) for h in result.hits]
        gone = [d for d in missing.get(q.id) or [] if q.ratings[d] >= 1]
        out.append(QueryResult(q, top, qvec.to_token_map(20), scores[q.id], gone, **extra))
    return out


def _progress(total: int, enabled: bool):
    # lazy: the encoders bring onnxruntime and image code; only this path needs them
    from .encoders.base import progress_bar

    return progress_bar(total, "rank-eval", enabled)


def evaluate(backend: Any, index: str, queries: Sequence[RatedQuery], config: QueryConfig | None = None, *,
             top_k: int = 10, progress: bool = False, problems: Ratings | None = None) -> Evaluation:
    """Run each rated query as ``stair-es search`` would and score the rankings.

    ``problems``: the :class:`Ratings` the queries came from; its errors and warnings are carried
    into the result. A query that fails (a bad ``where``, nothing searchable) is reported as an
    error and left out; the metrics are means over the evaluated queries.
    """
    config = config or QueryConfig()
    _check_ready(top_k)
    cached, missing, errors, warnings = _prepare(backend, index, queries, problems)
    with _progress(len(queries), progress) as bar:
        runs = _run(cached, index, queries, config, top_k, bar)
    ok = [q for q in queries if not isinstance(runs[q.id], Exception)]
    errors.extend(Problem(str(runs[q.id]), q.line, q.file, q.id) for q in queries if q not in ok)
    results = _results(ok, runs, missing)
    return Evaluation(index, config, top_k, mean_metrics([r.metrics for r in results]), results,
                      _by_line(errors), _by_line(warnings))


def _prepare(backend: Any, index: str, queries: Sequence[RatedQuery], problems: Ratings | None):
    """What :func:`evaluate` and :func:`compare` read before running any query: the backend behind
    a :class:`_ReadCache`, the rated documents the index lacks, and the errors and warnings so far
    (those of ``problems``, then the missing documents)."""
    cached = _ReadCache(backend)
    cached.index_info(index)
    missing = _missing_relevant(cached, index, queries)
    warnings = [*(problems.warnings if problems else []), *_missing_warnings(queries, missing)]
    return cached, missing, list(problems.errors) if problems else [], warnings


def _by_line(problems: list[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.file or "", p.line or 0))


@dataclass
class Comparison:
    """Two configurations over the same queries (a query either one could not run is left out of both)."""

    a: Evaluation
    b: Evaluation

    def pairs(self) -> list[tuple[QueryResult, QueryResult]]:
        return list(zip(self.a.results, self.b.results))

    def changed_first(self) -> list[tuple[QueryResult, QueryResult]]:
        """Pairs sorted by how much the query's ranking changed: the reciprocal rank of its first
        relevant hit within the top k, then nDCG@10."""
        def change(pair):
            ra, rb = (1 / r.first_relevant_rank if r.first_relevant_rank else 0.0 for r in pair)
            return (-abs(ra - rb), -abs(pair[0].metrics["nDCG@10"] - pair[1].metrics["nDCG@10"]), pair[0].query.line or 0)

        return sorted(self.pairs(), key=change)

    @staticmethod
    def ranked_differently(pair: tuple[QueryResult, QueryResult]) -> bool:
        """Whether the two configurations returned different hits or orders for the query."""
        return [h.id for h in pair[0].top] != [h.id for h in pair[1].top]

    @property
    def delta(self) -> dict[str, float | None]:
        return {k: (None if self.a.metrics[k] is None else self.b.metrics[k] - self.a.metrics[k]) for k in METRICS}

    def to_dict(self) -> dict[str, Any]:
        a, b = self.a.config.label, self.b.config.label
        queries = []
        for ra, rb in self.changed_first():
            da, db = ra.to_dict(), rb.to_dict()
            common = {k: da[k] for k in ("query", "id", "line", "relevant", "where", "relevant_not_in_index") if k in da}
            drop = set(common)
            common["ranked_differently"] = self.ranked_differently((ra, rb))
            queries.append({**common, a: {k: v for k, v in da.items() if k not in drop},
                            b: {k: v for k, v in db.items() if k not in drop}})
        return {"index": self.a.index, "top_k": self.a.top_k,
                "configs": {a: self.a.config.describe(), b: self.b.config.describe()},
                "evaluated": len(self.a.results),
                "metrics": {a: self.a.metrics, b: self.b.metrics, "delta": self.delta},
                "queries": queries, "errors": [p.to_dict() for p in self.a.errors],
                "warnings": [p.to_dict() for p in self.a.warnings], "notes": self.a.notes + [
                    n for n in self.b.notes if n not in self.a.notes]}


def compare(backend: Any, index: str, queries: Sequence[RatedQuery], config_a: QueryConfig, config_b: QueryConfig, *,
            top_k: int = 10, progress: bool = False, problems: Ratings | None = None) -> Comparison:
    """Run the rated queries under two configurations and score both on the queries both could run."""
    _check_ready(top_k)
    if config_a.label == config_b.label:
        raise InvalidInputError("the two configurations need different labels")
    cached, missing, errors, warnings = _prepare(backend, index, queries, problems)
    with _progress(2 * len(queries), progress) as bar:
        runs = [_run(cached, index, queries, c, top_k, bar) for c in (config_a, config_b)]
    ok = []
    for q in queries:
        failed = [(c, r[q.id]) for c, r in zip((config_a, config_b), runs) if isinstance(r[q.id], Exception)]
        if not failed:
            ok.append(q)
            continue
        why = "; ".join(f"{c.label} ({c.summary()}): {e}" for c, e in failed)
        errors.append(Problem(f"{why} (left out of both configurations)", q.line, q.file, q.id))
    errors, warnings = _by_line(errors), _by_line(warnings)
    evals = []
    for c, r in zip((config_a, config_b), runs):
        results = _results(ok, r, missing)
        evals.append(Evaluation(index, c, top_k, mean_metrics([x.metrics for x in results]), results, errors,
                                warnings))
    return Comparison(*evals)
