"""Index schema, documents, and the result types every backend returns.

An index has *sparse fields* (token-weight maps; by default ``image`` and ``caption``)
and *metadata fields* of four types: keyword, number, boolean, date. Metadata types are
declared at index creation or inferred from the first document that uses a field; a
later value of another type is a per-document error, never a silent coercion.

This module owns value validation and normalisation. It must not know about any backend.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import InvalidInputError, InvalidVectorError, UnknownFieldError
from .sparse import SparseVector

FIELD_TYPES = ("keyword", "number", "boolean", "date")
DEFAULT_SPARSE_FIELDS = ("image", "caption")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]{0,63}$")
# Internal fields of the cluster mappings and documents ("dense": the optional dense vector).
RESERVED = {"id", "_id", "caption_text", "bm25_text", "path", "image", "caption", "dense"}
MAX_CAPTION_CHARS = 10_000
MAX_KEYWORD_CHARS = 1_000


def check_field_name(name: str, what: str = "field") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidInputError(
            f"invalid {what} name {name!r}: use letters, digits, '_' or '-', starting with a letter or '_', at most 64 chars"
        )
    return name


def parse_date(value: Any, field_name: str = "") -> int:
    """A date as epoch milliseconds (UTC). Accepts ISO 8601 strings, dates, datetimes, epoch ms ints."""
    where = f" for field {field_name!r}" if field_name else ""
    if isinstance(value, bool):
        raise InvalidInputError(f"expected a date{where}, got a boolean")
    if isinstance(value, (int, float)) and math.isfinite(value):
        return int(value)
    if isinstance(value, _dt.datetime):
        dt = value
    elif isinstance(value, _dt.date):
        dt = _dt.datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        s = value.strip()
        if s.endswith("Z"):
            s = s[:-1] + "+00:00"
        try:
            dt = _dt.datetime.fromisoformat(s)
        except ValueError:
            raise InvalidInputError(
                f"invalid date {value!r}{where}: use ISO 8601, e.g. 2024-05-01 or 2024-05-01T12:30:00Z") from None
    else:
        raise InvalidInputError(f"expected a date{where}, got {type(value).__name__}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.timezone.utc)
    return int(round(dt.timestamp() * 1000))


def format_date(ms: int) -> str:
    dt = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)
    if dt.hour == dt.minute == dt.second == dt.microsecond == 0:
        return dt.date().isoformat()
    return dt.isoformat().replace("+00:00", "Z")


def infer_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "keyword"
    if isinstance(value, (_dt.date, _dt.datetime)):
        return "date"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return "keyword"
    raise InvalidInputError(
        f"metadata of type {type(value).__name__} is not supported: use a string (or list of strings), "
        "a number, a boolean or an ISO date string in a field declared as date")


def normalize_value(ftype: str, value: Any, field_name: str) -> Any:
    """Validate one metadata value; returns the canonical form the backends store.

    keyword -> str or tuple[str, ...]; number -> float; boolean -> bool; date -> epoch ms int.
    """
    if value is None:
        return None
    if ftype == "keyword":
        many = isinstance(value, (list, tuple))
        for v in value if many else [value]:
            if not isinstance(v, str):
                raise InvalidInputError(f"field {field_name!r} is a keyword field; got {type(v).__name__} {v!r}")
            if len(v) > MAX_KEYWORD_CHARS:
                raise InvalidInputError(f"field {field_name!r}: keyword longer than {MAX_KEYWORD_CHARS} characters")
        return tuple(value) if many else value
    if ftype == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputError(f"field {field_name!r} is a number field; got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise InvalidInputError(f"field {field_name!r}: numbers must be finite, got {value!r}")
        return float(value)
    if ftype == "boolean":
        if not isinstance(value, bool):
            raise InvalidInputError(f"field {field_name!r} is a boolean field; got {type(value).__name__} {value!r}")
        return value
    if ftype == "date":
        return parse_date(value, field_name)
    raise InvalidInputError(f"unknown field type {ftype!r}; use one of {', '.join(FIELD_TYPES)}")


# --- the optional dense field (vectors and their search: stair_es.dense) ------------------------
DENSE_FIELD = "dense"
SIMILARITIES = ("cosine", "dot_product")
DTYPES = ("float16", "float32")
MAX_DIMS = 4096  # Elasticsearch's dense_vector limit


@dataclass(frozen=True)
class DenseSpec:
    """An index's dense field: ``dims`` floats per document, compared by ``similarity``.

    ``cosine`` vectors are L2-normalised at ingest and at query (the score is the cosine);
    ``dot_product`` keeps them as given. ``dtype`` is how the embedded engine stores them
    (float16 halves the size; cosine vectors lose about 3 decimal digits). ``encoder`` records
    the dense model (``{"name": "stair-dense", "model": PATH}``) whose text side encodes queries.
    """

    dims: int
    similarity: str = "cosine"
    dtype: str = "float16"
    encoder: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dims, bool) or not isinstance(self.dims, int) or not 1 <= self.dims <= MAX_DIMS:
            raise InvalidInputError(f"the dense dimension must be a whole number from 1 to {MAX_DIMS}, got {self.dims!r}")
        if self.similarity not in SIMILARITIES:
            raise InvalidInputError(f"unknown dense similarity {self.similarity!r}; use one of {', '.join(SIMILARITIES)}")
        if self.dtype not in DTYPES:
            raise InvalidInputError(f"unknown dense storage type {self.dtype!r}; use one of {', '.join(DTYPES)}")

    def to_dict(self) -> dict[str, Any]:
        return {"dims": self.dims, "similarity": self.similarity, "dtype": self.dtype,
                "encoder": dict(self.encoder) if self.encoder else None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "DenseSpec | None":
        if not d:
            return None
        return cls(int(d["dims"]), d.get("similarity", "cosine"), d.get("dtype", "float16"), d.get("encoder"))


def as_vector(value: Any, what: str) -> np.ndarray:
    """A 1-D float32 array from a list/array of numbers; NaN, inf and non-numbers are refused."""
    if isinstance(value, (str, bytes, Mapping)) or value is None:
        raise InvalidVectorError(f"{what} must be a list of numbers, got {type(value).__name__}")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidVectorError(f"{what} must be a list of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidVectorError(f"{what} must be a flat, non-empty list of numbers, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise InvalidVectorError(f"{what} has a non-finite value ({float(arr[bad[0]])!r}) at position {int(bad[0])}: "
                                 "NaN and infinity cannot be indexed or searched; fix the vector")
    if np.abs(arr).max() > np.finfo(np.float32).max:
        raise InvalidVectorError(f"{what} has a value too large for float32")
    return arr.astype(np.float32)


@dataclass
class IndexSchema:
    """What an index holds. Serialisable to JSON; stored with the index."""

    fields: dict[str, str] = field(default_factory=dict)  # metadata name -> type
    sparse_fields: tuple[str, ...] = DEFAULT_SPARSE_FIELDS
    vocab_name: str = "bert-base-uncased"
    vocab_md5: str = "64800d5d8528ce344256daf115d4965e"
    encoder: dict[str, Any] | None = None  # the encoder config used at ingest, for queries
    # the optional dense field (a DenseSpec as a dict: dims, similarity, dtype, encoder)
    dense: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name, ftype in self.fields.items():
            check_field_name(name)
            if name in RESERVED:
                raise InvalidInputError(f"{name!r} is reserved; choose another metadata field name")
            if ftype not in FIELD_TYPES:
                raise InvalidInputError(f"field {name!r}: unknown type {ftype!r}; use one of {', '.join(FIELD_TYPES)}")
        for name in self.sparse_fields:
            check_field_name(name, "sparse field")
        self.sparse_fields = tuple(self.sparse_fields)
        if self.dense is not None:
            spec = self.dense if isinstance(self.dense, DenseSpec) else DenseSpec.from_dict(self.dense)
            self.dense = spec.to_dict() if spec is not None else None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "fields": dict(self.fields),
            "sparse_fields": list(self.sparse_fields),
            "vocab_name": self.vocab_name,
            "vocab_md5": self.vocab_md5,
            "encoder": self.encoder,
        }
        if self.dense:
            d["dense"] = dict(self.dense)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "IndexSchema":
        return cls(fields=dict(d.get("fields", {})), sparse_fields=tuple(d.get("sparse_fields", DEFAULT_SPARSE_FIELDS)),
                   vocab_name=d.get("vocab_name", "bert-base-uncased"),
                   vocab_md5=d.get("vocab_md5", "64800d5d8528ce344256daf115d4965e"), encoder=d.get("encoder"),
                   dense=d.get("dense"))

    def field_type(self, name: str) -> str:
        try:
            return self.fields[name]
        except KeyError:
            known = ", ".join(sorted(self.fields)) or "(none yet)"
            raise UnknownFieldError(f"unknown metadata field {name!r}; this index has: {known}") from None

    def check_sparse_field(self, name: str) -> str:
        if name not in self.sparse_fields:
            raise UnknownFieldError(f"unknown sparse field {name!r}; this index has: {', '.join(self.sparse_fields)}")
        return name

    def normalize_metadata(self, metadata: Mapping[str, Any] | None, *, infer: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
        """Validate a document's metadata. Returns (normalised values, newly inferred fields).

        Does not mutate the schema: the backend adds new fields once the document is accepted.
        """
        if metadata is None:
            return {}, {}
        if not isinstance(metadata, Mapping):
            raise InvalidInputError(f"metadata must be a JSON object, got {type(metadata).__name__}")
        out: dict[str, Any] = {}
        new: dict[str, str] = {}
        for name, value in metadata.items():
            self.check_metadata_name(name)
            check_text(value, f"metadata field {name!r}")
            if value is None:
                continue
            ftype = self.fields.get(name)
            if ftype is None:
                if not infer:
                    raise UnknownFieldError(f"unknown metadata field {name!r}; declare it when creating the index")
                try:
                    ftype = infer_type(value)
                except InvalidInputError as e:
                    raise InvalidInputError(f"metadata field {name!r}: {e}") from None
                new[name] = ftype
            out[name] = normalize_value(ftype, value, name)
        return out, new

    def check_metadata_name(self, name: str) -> None:
        """A metadata field name a document may use (``normalize_metadata``'s name rules)."""
        check_field_name(name, "metadata field")
        if name in RESERVED or name in self.sparse_fields:
            raise InvalidInputError(f"metadata field {name!r} is reserved (an internal or sparse field); rename it")
        if name.startswith("_") and name not in self.fields:
            raise InvalidInputError(f"metadata field {name!r} starts with '_': Elasticsearch and OpenSearch reserve such "
                                    "names for their own fields (_id, _source, _routing...); rename it")

    def normalize_column(self, name: str, values: Any, *, nan_missing: bool = True) -> tuple[str | None, Any]:
        """Validate one metadata field's values for a batch of documents, one value (or None)
        per document: the columnar twin of :meth:`normalize_metadata`, for bulk ingest.

        Returns (type, values); type is None when every value is missing. Numpy arrays are
        checked at once and returned as arrays: numbers as float64 (NaN = missing, as in
        pandas), booleans as bool, integer epoch milliseconds of a date field as int64,
        datetime64 as dates. Anything else is checked value by value and returned as a list of
        normalised values, where a float NaN is missing too (pandas' marker in object and string
        columns) unless ``nan_missing`` is false (values from per-document dicts, where a NaN is
        refused as in :meth:`normalize_metadata`). A bad value raises :class:`ColumnValueError`
        naming its row. A field the schema does not have yet takes the type of its values.
        """
        self.check_metadata_name(name)
        ftype = self.fields.get(name)
        arr = values if isinstance(values, np.ndarray) else None
        if arr is not None and arr.ndim != 1:
            raise InvalidInputError(f"metadata column {name!r} must be one-dimensional, got shape {arr.shape}")
        if arr is not None and arr.dtype.kind == "M":  # datetime64: epoch ms, NaT = missing
            if ftype not in (None, "date"):
                raise InvalidInputError(f"field {name!r} is a {ftype} field; got a column of dates")
            ms = arr.astype("datetime64[ms]").astype(np.int64)
            nat = np.isnat(arr)
            if not nat.any():
                return "date", ms
            return (None, [None] * len(arr)) if nat.all() else ("date", [None if m else int(v) for v, m in zip(ms, nat)])
        if arr is not None and arr.dtype.kind == "b":
            if ftype not in (None, "boolean"):
                raise InvalidInputError(f"field {name!r} is a {ftype} field; got a column of booleans")
            return ("boolean", arr.astype(bool)) if arr.size else (None, [])
        if arr is not None and arr.dtype.kind in "iuf" and ftype in (None, "number", "date"):
            v = arr.astype(np.float64)
            bad = np.isinf(v)
            if bad.any():
                raise ColumnValueError(int(np.argmax(bad)), f"field {name!r}: numbers must be finite, got {arr[bad][0]!r}")
            missing = np.isnan(v)
            if missing.all():
                return None, [None] * len(arr)
            if ftype == "date":
                if missing.any():
                    return "date", [None if m else int(x) for x, m in zip(v, missing)]
                return "date", arr.astype(np.int64)
            return "number", v
        vals = list(values)
        if nan_missing:
            vals = [None if type(v) is float and v != v else v for v in vals]
        if ftype is None:
            first = next((v for v in vals if v is not None), None)
            if first is None:
                return None, vals
            try:
                ftype = infer_type(first)
            except InvalidInputError as e:
                raise ColumnValueError(next(i for i, v in enumerate(vals) if v is not None),
                                       f"metadata field {name!r}: {e}") from None
        if ftype == "number" and all(type(v) in _PLAIN_NUMBER for v in vals):  # the common case, without a call per value
            v = np.array([np.nan if x is None else x for x in vals], np.float64)
            bad = np.isinf(v) | (np.isnan(v) & np.array([x is not None for x in vals]))
            if bad.any():
                i = int(np.argmax(bad))
                raise ColumnValueError(i, f"field {name!r}: numbers must be finite, got {vals[i]!r}")
            return ftype, v
        out = []
        for i, v in enumerate(vals):
            try:
                check_text(v, f"metadata field {name!r}")
                out.append(normalize_value(ftype, v, name))
            except InvalidInputError as e:
                raise ColumnValueError(i, str(e)) from None
        return ftype, out


_PLAIN_NUMBER = (int, float, type(None))


class ColumnValueError(InvalidInputError):
    """A bad value in a metadata column; ``row`` is its position in the batch."""

    def __init__(self, row: int, message: str):
        super().__init__(message)
        self.row = row


def check_text(value: Any, what: str, depth: int = 0) -> None:
    """Strings must be encodable as UTF-8 (a lone surrogate such as ``\\ud800`` from a badly decoded
    file is not): refused here, per document, rather than failing a whole write later."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInputError(f"{what} is not valid Unicode text ({e.reason} at position {e.start}); "
                                    "fix the encoding of the catalog") from None
    elif isinstance(value, (list, tuple)):
        if depth > 4:
            raise InvalidInputError(f"{what} nests lists too deeply")
        for v in value:
            check_text(v, what, depth + 1)
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"{what} is {value!r}; numbers must be finite")


@dataclass
class Document:
    """One catalog item: an id, its sparse vectors per field, metadata, and optional caption/source."""

    id: str
    vectors: dict[str, SparseVector]
    metadata: dict[str, Any] = field(default_factory=dict)
    caption: str | None = None
    source: str | None = None  # path or URL of the image, stored for display
    dense: Any = None  # optional dense vector (list or 1-D array of finite numbers), see stair_es.dense

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 512 or "\n" in self.id:
            raise InvalidInputError(f"document id must be a non-empty string of at most 512 chars without newlines, got {self.id!r}")
        check_text(self.id, "the document id")
        if self.caption is not None:
            check_text(self.caption, f"the caption of {self.id!r}")
        if self.source is not None:
            check_text(self.source, f"the source of {self.id!r}")
        if not isinstance(self.metadata, Mapping):
            raise InvalidInputError(f"the metadata of {self.id!r} must be a JSON object, got {type(self.metadata).__name__}")
        for name, value in self.metadata.items():
            if not isinstance(name, str):
                raise InvalidInputError(f"metadata field names of {self.id!r} must be strings, got {name!r}")
            check_text(name, f"a metadata field name of {self.id!r}")
            check_text(value, f"metadata field {name!r} of {self.id!r}")
        if self.dense is not None:
            self.dense = as_vector(self.dense, f"the dense vector of {self.id!r}")


@dataclass
class Hit:
    id: str
    score: float
    metadata: dict[str, Any] = field(default_factory=dict)
    caption: str | None = None
    source: str | None = None
    # hybrid search: retriever name -> {"rank": 1-based rank or None, "score": its own score or None}
    retrievers: dict[str, dict[str, Any]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"id": self.id, "score": self.score, "metadata": self.metadata, "caption": self.caption, "source": self.source}
        if self.retrievers is not None:
            d["retrievers"] = self.retrievers
        return d


@dataclass
class SearchResult:
    hits: list[Hit]
    total: int | None  # documents that passed the filter and scored > 0 (None if unknown)
    took_ms: float
    notes: list[str] = field(default_factory=list)  # e.g. "query pruned to 1024 tokens"
    # how the backend searched, when it says (the embedded engine: a stair_es.engine.plan.SearchPlan,
    # each segment's strategy and why); shown by `search --explain` and `--json`, not part of to_dict()
    plan: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "took_ms": self.took_ms, "notes": self.notes, "hits": [h.to_dict() for h in self.hits]}


@dataclass
class TokenContribution:
    field: str
    token: str
    query_weight: float  # after the clause weight is applied
    doc_weight: float  # as stored by the backend (ES/OS: 9-bit precision)
    contribution: float  # query_weight * doc_weight


@dataclass
class Explanation:
    doc_id: str
    score: float  # the backend's score
    contributions: list[TokenContribution]
    matched_filter: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return float(sum(c.contribution for c in self.contributions))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.doc_id,
            "score": self.score,
            "sum_of_contributions": self.total,
            "matched_filter": self.matched_filter,
            "notes": self.notes,
            "contributions": [c.__dict__ for c in self.contributions],
        }


@dataclass
class ItemResult:
    id: str | None
    ok: bool
    error: str | None = None
    source: str | None = None  # file or manifest line the item came from
    action: str = "index"  # index | update | delete | skip
    warning: str | None = None  # accepted, but something was changed (e.g. a caption truncated)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class IngestReport:
    """Per-item outcome of a bulk operation. Nothing is dropped silently: every input is in here."""

    items: list[ItemResult] = field(default_factory=list)

    def add(self, item: ItemResult) -> None:
        self.items.append(item)

    def extend(self, items: Iterable[ItemResult]) -> None:
        self.items.extend(items)

    @property
    def succeeded(self) -> int:
        return sum(1 for i in self.items if i.ok and i.action != "skip")

    @property
    def skipped(self) -> int:
        return sum(1 for i in self.items if i.action == "skip")

    @property
    def failures(self) -> list[ItemResult]:
        return [i for i in self.items if not i.ok]

    @property
    def warnings(self) -> list[ItemResult]:
        return [i for i in self.items if i.warning]

    def summary(self) -> dict[str, int]:
        return {"ok": self.succeeded, "skipped": self.skipped, "failed": len(self.failures),
                "warnings": len(self.warnings), "total": len(self.items)}
