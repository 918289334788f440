"""The request and response models of `stair-es serve`: the OpenAPI contract (``/docs``).

Unknown fields are refused (``extra="forbid"``), so a misspelt option never goes unnoticed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ImageRef(_Strict):
    """Exactly one of: a path relative to an image root, base64 bytes (or a data: URI), an http(s) URL
    (only if the server allows URLs)."""

    path: str | None = Field(None, max_length=4096)
    base64: str | None = None
    url: str | None = Field(None, max_length=4096)


class EncodeInput(_Strict):
    text: str | None = None
    image: ImageRef | None = None


class EncodeRequest(_Strict):
    inputs: list[EncodeInput] = Field(..., min_length=1)
    top_k: int | None = Field(50, ge=1, le=30522, description="Tokens returned per input (null: all).")


class EncodeResult(BaseModel):
    kind: Literal["text", "image"]
    nnz: int
    tokens: dict[str, float]


class EncodeResponse(BaseModel):
    encoder: str
    results: list[EncodeResult]


class SearchBody(_Strict):
    index: str | None = Field(None, description="Index to search (default: the server's --index).")
    text: str | None = None
    tokens: dict[str, float] | None = Field(None, description="A token map instead of text.")
    image: ImageRef | None = Field(None, description="Query by example image.")
    where: list[str] = Field(default_factory=list, description="Metadata filters as in `stair-es search --where`.")
    require: list[str] = Field(default_factory=list)
    require_all: bool = False
    exclude: list[str] = Field(default_factory=list)
    exclude_query: list[str] = Field(default_factory=list)
    expr: str | None = None
    token_field: str = "image"
    caption_weight: float = Field(0.5, ge=0)
    image_weight: float = Field(1.0, ge=0)
    top_k: int = Field(10, ge=1)
    query_top_k: int | None = Field(None, ge=1)
    min_weight: float | None = None
    explain: bool = Field(False, description="Add each hit's per-token contributions.")
    force: bool = False
    rerank: Literal["auto", "semantic", "off"] | None = Field(
        None, description="Re-rank a text query's best 100 hits by meaning, as `stair-es search --rerank` "
                          "(default: the server's --rerank).")


class ExplainBody(SearchBody):
    id: str = Field(..., min_length=1)
