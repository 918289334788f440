"""stair_es: learned sparse image search on an embedded engine, Elasticsearch and OpenSearch.

Images and captions become sparse, non-negative weights over the 30,522 BERT WordPiece
tokens (STAIR); those token maps are indexed in an inverted index and searched by exact
dot product, combined with metadata filters and token whitelists/blacklists.
"""

__version__ = "0.1.0"

from .errors import StairError  # noqa: E402
from .query import (  # noqa: E402
    And, Exists, Filter, HasTokens, Not, Or, Range, SearchRequest, SparseClause, Term, Terms,
    blacklist, parse_token_expression, parse_where, whitelist,
)
from .schema import Document, Hit, IndexSchema, SearchResult  # noqa: E402
from .sparse import SparseVector  # noqa: E402
from .vocab import Vocabulary, default_vocabulary  # noqa: E402

__all__ = ["__version__", "StairError", "SparseVector", "Vocabulary", "default_vocabulary", "Document", "Hit",
           "IndexSchema", "SearchResult", "SearchRequest", "SparseClause", "Filter", "Term", "Terms", "Range", "Exists",
           "HasTokens", "And", "Or", "Not", "whitelist", "blacklist", "parse_token_expression", "parse_where",
           "get_backend", "get_encoder"]


def get_backend(name: str = "embedded", **options):
    # lazy: `import stair_es` stays light (the backends and encoders load on first use)
    from .backends.base import get_backend as _get

    return _get(name, **options)


def get_encoder(name: str = "default", **options):
    # lazy: `import stair_es` stays light (the backends and encoders load on first use)
    from .encoders.base import get_encoder as _get

    return _get(name, **options)
