"""Encoder options as dataclasses: one per encoder names its keyword options, their defaults
and meaning, so constructors take ``**options`` instead of a long parameter list.

``get_encoder(name, **config)`` rebuilds an encoder from an index's recorded config and the CLI
passes ``--encoder-option KEY=VALUE`` by name, so a name the encoder does not know (a typo, a
config written for another encoder) is refused here with the list of valid names.

This module must not know about any particular encoder.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, TypeVar

from ..errors import InvalidInputError

_O = TypeVar("_O", bound="EncoderOptions")


def refuse_unknown(options: dict[str, Any], valid: list[str], encoder: str) -> None:
    """An InvalidInputError naming ``encoder``, the names in ``options`` it does not take and the
    ``valid`` ones, when there are any."""
    unknown = [k for k in options if k not in valid]
    if unknown:
        raise InvalidInputError(f"the {encoder!r} encoder does not take the option{'s' * (len(unknown) > 1)} "
                                f"{', '.join(unknown)}; its options are {', '.join(valid)}")


class EncoderOptions:
    """Base of the per-encoder option dataclasses (subclasses are ``@dataclass``es)."""

    #: names the constructor takes itself besides the fields (a positional ``model``)
    positional: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_kwargs(cls: type[_O], options: dict[str, Any], encoder: str) -> _O:
        """The options named in ``options``, the defaults for the rest; an InvalidInputError
        naming ``encoder`` and listing the valid names when one is unknown."""
        refuse_unknown(options, [*cls.positional, *(f.name for f in fields(cls))], encoder)  # type: ignore[arg-type]
        return cls(**options)
