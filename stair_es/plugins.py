"""Installed plugins (backends, encoders) registered as package entry points.

``importlib.metadata`` scans every installed distribution, tens of milliseconds that a
command using only built-in backends and encoders should not pay, so it is imported here
only when a plugin is actually looked for.
"""

from __future__ import annotations

from typing import Any


def entry_points(group: str) -> Any:
    """The entry points of ``group`` (e.g. ``stair_es.backends``)."""
    # lazy: entry points are read only when a plugin name is looked up
    from importlib.metadata import entry_points as _entry_points

    return _entry_points(group=group)
