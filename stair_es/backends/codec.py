"""The one token <-> feature-name codec of the Elasticsearch/OpenSearch backends.

Elasticsearch (8.7+) rejects dots in ``rank_features`` feature names, and a feature name
also appears inside field paths (``image.<feature>``) where ``*`` and ``?`` are wildcards
and ``,`` separates field lists. So every character outside a small safe set is written
as ``%XX`` (its UTF-8 bytes, upper-case hex), ``%`` itself included, which makes the
scheme reversible and injective. Letters of any script, digits, ``#``, ``_`` and ``-``
stay as they are, so ``dog`` and ``##s`` are readable in the cluster and in Kibana/Dashboards:

=========  ==========
token      feature
=========  ==========
``dog``    ``dog``
``##s``    ``##s``
``.``      ``%2E``
``...``    ``%2E%2E%2E``
``u.s``    ``u%2Es``
=========  ==========

The OpenSearch 3.3+ ``sparse_vector`` (seismic) field wants integer token ids as keys;
:func:`feature_map` with ``keys="id"`` gives those.

This module also owns the engines' stored precision: Lucene's ``FeatureField`` keeps the
float32's bits shifted right by 15 in 16 bits: the sign bit (always 0 for a valid weight) is
dropped, leaving 8 exponent bits and the top 8 fraction bits (9 significant bits with the
implicit one), and the rest is truncated. :func:`stored_value`
reproduces that, so explain can show exactly what the engine multiplies with.

This module must not import any client library.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from ..errors import InvalidVectorError
from ..sparse import SparseVector
from ..vocab import Vocabulary, default_vocabulary

_SAFE_PUNCT = frozenset("#_-")
FLOAT32_MIN_NORMAL = float(np.finfo(np.float32).tiny)  # 1.1754944e-38


def _safe(ch: str) -> bool:
    return ch.isalnum() or ch in _SAFE_PUNCT


def encode_token(token: str) -> str:
    """Feature name for a vocabulary token (reversible with :func:`decode_token`)."""
    if not token:
        raise InvalidVectorError("an empty string is not a token")
    return "".join(c if _safe(c) else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in token)


def decode_token(name: str) -> str:
    """Inverse of :func:`encode_token`."""
    if "%" not in name:
        return name
    out = bytearray()
    i = 0
    while i < len(name):
        c = name[i]
        if c == "%":
            hexpart = name[i + 1 : i + 3]
            if len(hexpart) != 2:
                raise InvalidVectorError(f"malformed feature name {name!r}: truncated %-escape")
            try:
                out.append(int(hexpart, 16))
            except ValueError:
                raise InvalidVectorError(f"malformed feature name {name!r}: bad %-escape") from None
            i += 3
        else:
            out.extend(c.encode("utf-8"))
            i += 1
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidVectorError(f"malformed feature name {name!r}: escapes are not UTF-8") from None


def stored_value(weight: float | np.ndarray) -> float | np.ndarray:
    """The weight as Lucene's FeatureField stores it: float32 truncated to 9 significant bits.

    The relative error is below 2**-8 (about 0.4%), always downwards.
    """
    arr = np.asarray(weight, dtype=np.float32)
    bits = arr.view(np.uint32) & np.uint32(0xFFFF8000)
    out = bits.view(np.float32)
    return float(out) if np.ndim(weight) == 0 else out


def check_weights(vector: SparseVector, what: str = "vector") -> None:
    """Raise :class:`InvalidVectorError` unless every weight is a positive, finite, normal float32."""
    w = vector.weights
    if not w.size:
        return
    bad = ~np.isfinite(w) | (w < FLOAT32_MIN_NORMAL)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        tok = vector.vocab.tokens[int(vector.ids[i])]
        raise InvalidVectorError(
            f"{what}: weight {float(w[i])!r} of token {tok!r} cannot be stored by Elasticsearch/OpenSearch "
            f"(weights must be finite and at least {FLOAT32_MIN_NORMAL:.3g}); drop or rescale it")


def feature_map(vector: SparseVector, keys: str = "token") -> dict[str, float]:
    """``{feature name: weight}`` for a document or query.

    ``keys="token"``: codec names (``rank_features``, ES ``sparse_vector``, ``neural_sparse``
    on rank features); ``keys="id"``: decimal token ids (OpenSearch ``sparse_vector``/seismic).
    """
    check_weights(vector)
    tokens = vector.vocab.tokens
    # float(str(float32)) gives the shortest decimal that round-trips to the same float32
    if keys == "id":
        return {str(int(i)): float(str(w)) for i, w in zip(vector.ids, vector.weights)}
    if keys != "token":
        raise ValueError(f"keys must be 'token' or 'id', got {keys!r}")
    return {encode_token(tokens[int(i)]): float(str(w)) for i, w in zip(vector.ids, vector.weights)}


def vector_from_features(features: Mapping[str, float], vocab: Vocabulary | None = None, keys: str = "token") -> SparseVector:
    """Inverse of :func:`feature_map` (used by ``get`` and ``explain``)."""
    vocab = vocab or default_vocabulary()
    ids, weights = [], []
    for name, w in features.items():
        if keys == "id":
            try:
                i = int(name)
            except ValueError:
                raise InvalidVectorError(f"feature key {name!r} is not a token id") from None
        else:
            tok = decode_token(name)
            i = vocab.get(tok)
            if i is None:
                raise InvalidVectorError(f"stored feature {name!r} (token {tok!r}) is not in the {vocab.name} vocabulary")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise InvalidVectorError(f"stored feature {name!r} has a non-numeric weight {w!r}")
        ids.append(i)
        weights.append(float(w))
    return SparseVector.from_arrays(ids, weights, vocab)
