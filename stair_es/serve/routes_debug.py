"""Route ``GET /debug/stats`` (only with ``--debug-stats``): where the recent requests' time
went (:mod:`.stats`); ``?reset=true`` starts a new count after answering."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from .runtime import ParsedJSONRoute, Runtime, require_key, runtime

router = APIRouter(route_class=ParsedJSONRoute, tags=["debug"], dependencies=[Depends(require_key)])


@router.get("/debug/stats")
async def stats(reset: bool = False, rt: Runtime = Depends(runtime)):
    """Percentiles of the recent searches' phases, of the shed answers and of the event loop's
    stalls, and the mean phases of the slowest 1 % of searches (``--debug-stats`` only)."""
    out = rt.stats.summary()
    out["admission"] = {"admitted": rt.admission.admitted, "shed": rt.admission.shed,
                        "timed_out": rt.admission.timed_out}
    if reset:
        rt.stats.reset()
    return out
