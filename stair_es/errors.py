"""Typed errors raised by the stair_es library.

The library raises these; the CLI maps them to one-line messages and exit codes.
Every message says what is wrong and what the user can do about it.
"""

from __future__ import annotations


class StairError(Exception):
    """Base class of every error stair_es raises on purpose."""

    exit_code = 1


class InvalidInputError(StairError, ValueError):
    """The user gave a value stair_es cannot use (a bad weight, token, field, query...)."""

    exit_code = 2


class InvalidVectorError(InvalidInputError):
    """A token map or sparse vector is malformed (NaN, negative, unknown or special tokens...)."""


class EmptyQueryError(InvalidInputError):
    """A query has nothing left to score with (it tokenized to nothing or was pruned away)."""


class UnknownFieldError(InvalidInputError):
    """A filter or query names a field the index does not have."""


class UnknownNameError(InvalidInputError):
    """A registry lookup (encoder, backend, model config) failed; the message lists what exists."""


class UnsupportedError(InvalidInputError):
    """The backend cannot do what was asked (hybrid search, optimize, check, scan...); the message
    names the backend and says what to use instead."""


class EncoderVersionError(InvalidInputError):
    """An index records an encoder version (token map, weights) other than the installed one."""


class MissingDependencyError(StairError, ImportError):
    """An optional extra is not installed; the message says which `pip install` fixes it."""

    exit_code = 3

    def __init__(self, what: str, extra: str, package: str | None = None):
        hint = f"pip install 'stair-es[{extra}]'"
        if package:
            hint += f" (or: pip install {package})"
        super().__init__(f"{what} needs an optional dependency that is not installed: {hint}")
        self.extra = extra


def optional_import(module: str, what: str, extra: str, package: str | None = None):
    """``module`` imported where it is needed (an optional dependency: it may be missing, and
    importing it costs start-up time), or :class:`MissingDependencyError` saying ``what`` needs it
    and which extra (or ``package``) installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(what, extra, package) from None


class IndexError_(StairError):
    """Base for problems with an index (named with a trailing underscore to avoid the builtin)."""

    exit_code = 4


class IndexNotFoundError(IndexError_):
    pass


class IndexExistsError(IndexError_):
    pass


class IndexLockedError(IndexError_):
    """Another process holds the index's writer lock."""


class IncompatibleIndexError(IndexError_):
    """The index on disk was written by an incompatible stair_es version or is damaged."""


class DamagedIndexError(IncompatibleIndexError):
    """A file of an index is missing, unreadable or fails its checksum: never answered from."""


class IndexWriteError(IndexError_):
    """The operating system refused a write (disk full, read-only folder...); the last commit is intact."""


class DocumentNotFoundError(StairError, KeyError):
    exit_code = 4

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else "document not found"


class BackendError(StairError):
    """A search backend (Elasticsearch, OpenSearch) failed or refused a request."""

    exit_code = 5


class ConnectionFailedError(BackendError):
    """The cluster could not be reached; the message names the URL (never credentials)."""


class ImageError(InvalidInputError):
    """An image could not be used; the message says why (unreadable, truncated, too large...)."""


class ModelError(StairError):
    """A model checkpoint or config could not be loaded or does not match."""

    exit_code = 6
