"""`stair-es serve`: learned sparse image search over HTTP.

:func:`create_app` (FastAPI) serves encode/search/explain, the results page and the
inference endpoints Elasticsearch and OpenSearch call; :class:`Service` is the same work
without HTTP. Needs the ``serve`` extra (``pip install 'stair-es[serve]'``).
"""

from .service import ServeConfig, Service


def create_app(*args, **kwargs):
    from .app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["ServeConfig", "Service", "create_app"]
