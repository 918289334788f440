"""numba's on-disk cache of the kernel package is stamped with all of its sources at once: an
edit of one kernel module must recompile the kernels that call it (numba alone keys each
function on its own file)."""

from __future__ import annotations

import pytest

from stair_es.engine import kernels as K
from stair_es.engine.kernels import _cache


def test_every_kernel_is_stamped_with_the_whole_package():
    if not _cache.install():
        pytest.skip("this numba release keeps its cache locators elsewhere: per-file stamps (a warning said so)")
    for fn in (K.search_segment, K.taat._taat_segment, K.blockmax._blockmax_segment, K.build.build_postings):
        locator = fn._cache._impl.locator
        assert type(locator).__name__.startswith("StairEsKernels"), type(locator)
        assert locator.get_source_stamp() == _cache.package_stamp()


def test_the_stamp_covers_every_kernel_module_and_the_layout():
    names = {p.name for p in _cache.SOURCES}
    assert {"taat.py", "blockmax.py", "search.py", "heap.py", "verify.py", "layout.py"} <= names
