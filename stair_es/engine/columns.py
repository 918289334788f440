"""The columnar in-memory form of documents a segment is built from (:class:`Batch`) and the
metadata columns: numbers as float64 with NaN for missing, dates as int64 epoch ms (missing: the
lowest int64), booleans as int8 with -1 for missing, keywords dictionary-encoded as CSR code lists."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

DATE_MISSING = np.iinfo(np.int64).min  # a date column's missing value (below any bound)


# --- strings -------------------------------------------------------------------------------------
def encode_strings(values: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(utf-8 blob as uint8, int64 offsets n+1, uint8 present mask)."""
    enc = [b"" if v is None else v.encode("utf-8") for v in values]
    lens = np.fromiter((len(e) for e in enc), dtype=np.int64, count=len(enc))
    offs = np.zeros(len(enc) + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    present = np.fromiter((v is not None for v in values), dtype=np.uint8, count=len(values))
    return np.frombuffer(b"".join(enc), dtype=np.uint8).copy(), offs, present


def encode_ids(ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Fast path for ids (never contain a newline): one join + one encode."""
    if not ids:
        return np.zeros(0, np.uint8), np.zeros(1, np.int64)
    blob = "\n".join(ids).encode("utf-8")
    arr = np.frombuffer(blob, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    if nl.size != len(ids) - 1:
        raise ValueError("document ids must not contain newlines")
    # id i ends where the i-th newline was; removing the i newlines before it shifts it by i
    offs = np.empty(len(ids) + 1, np.int64)
    offs[0] = 0
    offs[1:-1] = nl - np.arange(nl.size)
    offs[-1] = arr.size - nl.size
    return arr[arr != 10].copy(), offs


def concat_offsets(offsets: Sequence[np.ndarray]) -> np.ndarray:
    """Offset (pointer) arrays laid end to end, as int64: each part shifted so that it starts where
    the parts before it ended."""
    out, base = [np.zeros(1, np.int64)], 0
    for o in offsets:
        out.append(np.asarray(o[1:], np.int64) - int(o[0]) + base)
        base += int(o[-1] - o[0])
    return np.concatenate(out)


def str_at(blob: np.ndarray, offs: np.ndarray, i: int) -> str:
    return blob[offs[i]:offs[i + 1]].tobytes().decode("utf-8")  # (bytes(slice) took 3x as long: the buffer protocol)


# --- the columnar batch a segment is built from ----------------------------------------------------
@dataclass
class Batch:
    """Documents in columnar form. ``vectors[field] = (indptr int64, token ids int32, fp16 bits uint16)``."""

    id_blob: np.ndarray
    id_offs: np.ndarray
    seq: np.ndarray  # uint64 insertion sequence numbers (tie-break: older first)
    vectors: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    columns: dict[str, tuple[str, dict[str, np.ndarray]]] = field(default_factory=dict)
    captions: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    sources: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # the ids' fnv1a64 hashes sorted, and the order that sorts them, when the writer has them
    id_hash: np.ndarray | None = None
    id_order: np.ndarray | None = None

    @property
    def n_docs(self) -> int:
        return self.id_offs.size - 1


def columns_from_rows(rows: Sequence[dict[str, Any]], types: dict[str, str]) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Normalised metadata dicts (see ``IndexSchema.normalize_metadata``) -> typed columns."""
    used = {name for r in rows for name in r}
    return {name: (types[name], column_arrays(types[name], [r.get(name) for r in rows])) for name in sorted(used)}


def column_arrays(ftype: str, vals: Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
    """One field's normalised values, one per document (None = missing), as the segment's
    arrays; the arrays ``IndexSchema.normalize_column`` returns are taken as they are."""
    n = len(vals)
    if isinstance(vals, np.ndarray):
        conv = {"number": np.float64, "date": np.int64, "boolean": np.int8}[ftype]
        return {"v": vals.astype(conv)}
    if ftype == "number":
        return {"v": np.array([np.nan if v is None else v for v in vals], np.float64)}
    if ftype == "date":
        return {"v": np.array([DATE_MISSING if v is None else v for v in vals], np.int64)}
    if ftype == "boolean":
        return {"v": np.array([-1 if v is None else int(v) for v in vals], np.int8)}
    words = sorted({w for v in vals if v is not None for w in ((v,) if isinstance(v, str) else v)})
    code = {w: i for i, w in enumerate(words)}
    ptr = np.zeros(n + 1, np.int64)
    codes: list[int] = []
    islist = np.zeros(n, np.uint8)
    for i, v in enumerate(vals):
        if v is not None:
            if isinstance(v, str):
                codes.append(code[v])
            else:
                islist[i] = 1
                codes.extend(code[w] for w in v)
        ptr[i + 1] = len(codes)
    blob, offs, _ = encode_strings(words)
    return {"ptr": ptr, "codes": np.array(codes, np.int32), "list": islist, "dict": blob, "dict_offs": offs}


def concat_columns(parts: list[tuple[int, dict[str, tuple[str, dict[str, np.ndarray]]]]]) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    """Concatenate per-part columns (each part: (rows, columns)); absent columns become missing values."""
    types: dict[str, str] = {}
    for _, cols in parts:
        for name, (ftype, _) in cols.items():
            types[name] = ftype
    out = {}
    for name, ftype in types.items():
        arrs = [cols[name][1] if name in cols else column_arrays(ftype, [None] * n) for n, cols in parts]
        if ftype != "keyword":
            out[name] = (ftype, {"v": np.concatenate([a["v"] for a in arrs])})
            continue
        dicts = [[str_at(a["dict"], a["dict_offs"], i) for i in range(a["dict_offs"].size - 1)] for a in arrs]
        words = sorted(set().union(*dicts))
        code = {w: i for i, w in enumerate(words)}
        codes = []
        for a, d in zip(arrs, dicts):
            remap = np.array([code[w] for w in d], np.int32) if d else np.zeros(0, np.int32)
            codes.append(remap[a["codes"]] if a["codes"].size else np.zeros(0, np.int32))
        blob, offs, _ = encode_strings(words)
        out[name] = (ftype, {"ptr": concat_offsets([a["ptr"] for a in arrs]),
                             "codes": np.concatenate(codes).astype(np.int32),
                             "list": np.concatenate([a["list"] for a in arrs]), "dict": blob, "dict_offs": offs})
    return out


def take_columns(cols: dict[str, tuple[str, dict[str, np.ndarray]]], rows: np.ndarray) -> dict[str, tuple[str, dict[str, np.ndarray]]]:
    out = {}
    for name, (ftype, a) in cols.items():
        if ftype != "keyword":
            out[name] = (ftype, {"v": np.asarray(a["v"])[rows]})
            continue
        ptr = np.asarray(a["ptr"])
        counts = ptr[rows + 1] - ptr[rows]
        newptr = np.zeros(rows.size + 1, np.int64)
        np.cumsum(counts, out=newptr[1:])
        if counts.sum():
            starts = np.repeat(ptr[rows] - newptr[:-1], counts)
            idx = starts + np.arange(newptr[-1])
            codes = np.asarray(a["codes"])[idx]
        else:
            codes = np.zeros(0, np.int32)
        out[name] = (ftype, {"ptr": newptr, "codes": codes.astype(np.int32), "list": np.asarray(a["list"])[rows],
                             "dict": np.asarray(a["dict"]), "dict_offs": np.asarray(a["dict_offs"])})
    return out
