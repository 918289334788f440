"""A thread's CPU time for `stair-es serve`, read without holding the GIL.

The search threads time their own work (``engine_cpu`` and ``answer_cpu`` in ``Server-Timing``).
``time.thread_time()`` is a system call made while holding the GIL, right after the engine's
kernel, which ran without the GIL for milliseconds: on a loaded machine the search thread,
niced below the event loop (``--worker-nice``), was often switched out at that call with the
GIL in its hands, and the event loop, which answers and sheds, slept until it ran again (py-spy
``--gil`` at 1.5·S on 1M documents: about 30 % of the search threads' GIL samples were on that
line; docs/serve.md, "What held the door"). :func:`thread_cpu_s` makes the same system call
through ctypes, which releases the GIL meanwhile.

This module knows the C library and Python's clocks, nothing of serving.
"""

from __future__ import annotations

import ctypes
import time

_CLOCK = getattr(time, "CLOCK_THREAD_CPUTIME_ID", None)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc_clock_gettime():
    """The C library's ``clock_gettime`` as a ctypes function (a ``CDLL`` call releases the GIL), or None."""
    if _CLOCK is None:
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).clock_gettime
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Timespec)]
    fn.restype = ctypes.c_int
    return fn


_clock_gettime = _libc_clock_gettime()


def thread_cpu_s() -> float:
    """Seconds of CPU the calling thread has used (``time.thread_time()``), read with the GIL
    released where the C library allows it; ``time.thread_time()`` elsewhere."""
    fn = _clock_gettime
    if fn is not None:
        ts = _Timespec()
        if fn(_CLOCK, ctypes.byref(ts)) == 0:
            return ts.tv_sec + ts.tv_nsec * 1e-9
    return time.thread_time()
