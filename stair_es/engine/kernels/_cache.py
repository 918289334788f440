"""One freshness stamp for the whole kernel package in numba's on-disk cache.

numba keys a cached function on its own source file only, and compiles the kernels it calls
(and module-level arrays such as :data:`..layout.F16_TABLE`) into its machine code. Split over
several modules, an edit of ``taat.py`` would leave ``search.py``'s cached ``search_segment``
running the old TAAT (seen while this package was written: 0.86 ms a query instead of 0.33).
So every kernel of this package is stamped with a hash of all of its modules and of
``layout.py``: any change recompiles them all, as when they were one file.

This subclasses numba's cache locators (private classes: if a numba release renames them, the
package falls back to numba's own per-file stamps, and says so in a warning).
"""

from __future__ import annotations

import functools
import hashlib
import os
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = tuple(sorted(HERE.glob("*.py"))) + (HERE.parent / "layout.py",)


@functools.lru_cache(maxsize=8)
def _stamp(mtimes: tuple) -> bytes:
    h = hashlib.sha256()
    for p in SOURCES:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.digest()


def package_stamp() -> bytes:
    """A hash of every source the package's compiled code depends on (re-read when one changes)."""
    return _stamp(tuple((os.stat(p).st_mtime_ns, os.stat(p).st_size) for p in SOURCES))


def _stamped(base):
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != HERE:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return package_stamp()

    Locator.__name__ = Locator.__qualname__ = f"StairEsKernels{base.__name__.lstrip('_')}"
    return Locator


def install() -> bool:
    """Put the package-stamped locators first in numba's list (once); False if numba's
    internals are not the expected ones."""
    try:
        from numba.core import caching

        impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
        bases = [getattr(caching, n, None) or getattr(caching, "_" + n)
                 for n in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]
    except (ImportError, AttributeError):
        warnings.warn("stair_es: numba's cache locators are not where expected; the kernels' on-disk cache "
                      "falls back to per-file freshness (after editing a kernel module, clear its __pycache__)",
                      RuntimeWarning, stacklevel=2)
        return False
    if any(getattr(c, "__name__", "").startswith("StairEsKernels") for c in impl._locator_classes):
        return True
    impl._locator_classes = [_stamped(b) for b in bases] + list(impl._locator_classes)
    return True
