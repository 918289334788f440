"""Bulk ingestion of an image catalog into any backend.

Pipeline per batch: read catalog entries -> skip ids already indexed (resume) -> decode
images (Pillow, in a small thread pool, one batch ahead so decoding overlaps the encoder;
JPEGs decoded at the smallest DCT scale the encoder can use) -> encode images and captions
-> ``backend.ingest``.
Every input ends in the returned :class:`IngestReport`: ingested, skipped (and why) or
failed (and why). A failure of one item never loses the others: a batch whose encoding
fails is retried item by item so the culprit is named.

Resuming is by document id: ids are deterministic (manifest id or relative path), ingest
is an upsert, and ids already in the index are skipped unless ``reindex=True``.
"""

from __future__ import annotations

import itertools
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from .backends.base import SearchBackend
from .catalog import CatalogEntry, CatalogItem, count_catalog, read_catalog
from .encoders.base import Encoder, get_encoder, tqdm_class
from .errors import IndexNotFoundError, InvalidInputError, StairError
from .schema import Document, IndexSchema, IngestReport, ItemResult
from .sparse import SparseVector

log = logging.getLogger(__name__)

EncoderFactory = Callable[[], Encoder]


@dataclass
class IngestOptions:
    batch_size: int = 32
    reindex: bool = False  # encode and write again even if the id exists
    encode_captions: bool = True
    progress: bool = False
    decode_threads: int = 2
    dense_model: str | None = None  # a `stair-es train --head dense` checkpoint: dense image vectors
    dense_dtype: str = "float16"  # how the embedded engine stores dense vectors (float16 or float32)


def _batches(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    it = iter(items)
    while batch := list(itertools.islice(it, n)):
        yield batch


def encoder_signature(config: dict[str, Any] | None) -> dict[str, Any] | None:
    """The part of an encoder config that must match between ingest and query (``query_idf``,
    ``grounding``, ``expansion_cap`` and ``similar_words`` only change how queries are weighted, never the
    stored vectors)."""
    if not config:
        return None
    return {k: v for k, v in config.items()
            if k not in ("device", "batch_size", "progress", "query_idf", "grounding", "expansion_cap", "similar_words")}


def index_encoder_factory(backend: SearchBackend, index: str, name: str, options: dict[str, Any] | None = None) -> EncoderFactory:
    """The encoder an ingest into ``index`` uses: for an index that already records encoder
    ``name``, that recorded config (updated with ``options``), so adding to an index encodes
    exactly as it was built even after stair_es's defaults change (e.g. the ``default``
    encoder gaining a token source); otherwise ``name`` with ``options``. Options that
    contradict the recorded config are refused by :func:`ensure_index` with a clear error."""
    from .search import query_encoder

    def make() -> Encoder:
        try:
            schema = backend.index_info(index).schema
        except IndexNotFoundError:
            schema = None
        if schema is not None and (schema.encoder or {}).get("name") == name:
            return query_encoder(schema, **(options or {}))  # the recorded config, updated with the options
        return get_encoder(name, **(options or {}))

    return make


def ensure_index(backend: SearchBackend, index: str, encoder_config: dict[str, Any] | None,
                 dense: Any = None, dense_required: bool = False) -> IndexSchema:
    """Open ``index`` or create it recording the encoder (and the dense field ``dense``, a
    :class:`~stair_es.dense.DenseSpec`); refuse to mix encoders or dense models in one index."""
    try:
        info = backend.index_info(index)
    except IndexNotFoundError:
        schema = IndexSchema(encoder=encoder_config, dense=dense.to_dict() if dense is not None else None)
        backend.create_index(index, schema)
        return schema
    schema = info.schema
    if dense is not None and dense_required:
        from .dense import DenseSpec

        have_d = DenseSpec.from_dict(schema.dense)
        if have_d is None:
            raise InvalidInputError(f"index {index!r} has no dense field, so --dense-model has nowhere to put its vectors: "
                                    "ingest into a new index (it is created with the model's dense field)")
        if have_d.dims != dense.dims:
            raise InvalidInputError(f"index {index!r} holds {have_d.dims}-dimensional dense vectors but the dense model "
                                    f"makes {dense.dims}: use the model the index was built with, or another index")
        if have_d.encoder and dict(have_d.encoder) != dict(dense.encoder or {}):
            raise InvalidInputError(f"index {index!r} was built with dense model {dict(have_d.encoder)}, not "
                                    f"{dict(dense.encoder or {})}: dense vectors of different models are not comparable")
    have, want = encoder_signature(schema.encoder), encoder_signature(encoder_config)
    if have and want and have.get("name") != "precomputed" and want.get("name") != "precomputed" and have != want:
        raise InvalidInputError(
            f"index {index!r} was built with encoder {have}, not {want}; vectors from different encoders "
            "are not comparable: use the same --encoder/--model or another index")
    return schema


def ingest_catalog(backend: SearchBackend, index: str, source: str | Path, encoder_factory: EncoderFactory | None,
                   options: IngestOptions | None = None,
                   on_items: Callable[[list[ItemResult]], None] | None = None) -> IngestReport:
    """Ingest a folder, glob or JSONL manifest into ``index`` (created if missing).

    A folder of Parquet shards written by ``stair-es encode-catalog`` is recognised and its
    already-encoded documents are ingested as they are (:mod:`stair_es.distributed.ingest_shards`).
    """
    opts = options or IngestOptions()
    if opts.batch_size < 1:
        raise InvalidInputError("batch size must be at least 1")
    from .distributed.shards import is_shard_folder

    if is_shard_folder(source):
        if opts.dense_model:
            raise InvalidInputError("--dense-model cannot add dense vectors to a shard folder's documents: "
                                    "ingest the original catalog with --dense-model instead")
        from .distributed.ingest_shards import ingest_shards

        return ingest_shards(backend, index, str(source), ensure_index=ensure_index, encoder_signature=encoder_signature,
                             reindex=opts.reindex, progress=opts.progress, on_items=on_items)
    # Stream the catalog (a million-line manifest is never held in memory); look ahead only to
    # the first usable entry to learn whether it needs an encoder or brings its own vectors.
    stream = read_catalog(source)
    head: list[CatalogItem] = []
    for item in stream:
        head.append(item)
        if isinstance(item, CatalogEntry):
            break
    entries = itertools.chain(head, stream)
    report = IngestReport()
    first = head[-1] if head and isinstance(head[-1], CatalogEntry) else None
    encoder: Encoder | None = None
    if first is not None and first.vectors is None:
        if encoder_factory is None:
            raise InvalidInputError("this catalog has images to encode: choose an --encoder")
        encoder = encoder_factory()
    dense_enc = None
    dense_spec = None
    if opts.dense_model:
        from .dense import DenseEncoder

        dense_enc = DenseEncoder(opts.dense_model)
        dense_spec = dense_enc.spec(opts.dense_dtype)
    elif first is not None and first.dense is not None and isinstance(first.dense, list) and first.dense:
        from .dense import DenseSpec

        dense_spec = DenseSpec(len(first.dense), "cosine", opts.dense_dtype)  # used only if the index is created here
    schema = ensure_index(backend, index, encoder.config() if encoder else {"name": "precomputed"}, dense_spec,
                          dense_required=dense_enc is not None)

    bar = tqdm_class()(total=count_catalog(source), desc=f"ingest {index}", unit="img", disable=not opts.progress)

    def emit(items: list[ItemResult]) -> None:
        report.extend(items)
        bar.update(len(items))
        if on_items:
            on_items(items)

    pool = ThreadPoolExecutor(max_workers=max(1, opts.decode_threads))

    def stage(batch: list[CatalogItem]) -> tuple[list[ItemResult], list[CatalogEntry], dict[str, Future]]:
        """Sort out one batch and start decoding its images in the pool.

        Called one batch ahead, so the pool decodes batch i+1 while batch i is encoded and
        written; at most two batches of pictures are in memory at once.
        """
        nonlocal encoder
        ready: list[CatalogEntry] = []
        done: list[ItemResult] = []
        for e in batch:
            (ready if isinstance(e, CatalogEntry) else done).append(e)
        if ready and not opts.reindex:
            existing = backend.existing_ids(index, [e.id for e in ready])
            if existing:
                done += [ItemResult(e.id, True, None, e.origin, "skip", "already indexed (use --reindex to encode it again)")
                         for e in ready if e.id in existing]
                ready = [e for e in ready if e.id not in existing]
        if encoder is None and any(e.vectors is None for e in ready):
            if encoder_factory is None:
                done += [ItemResult(e.id, False, "needs an encoder (no precomputed vectors): pass --encoder", e.origin)
                         for e in ready if e.vectors is None]
                ready = [e for e in ready if e.vectors is not None]
            else:
                encoder = encoder_factory()
        futures: dict[str, Future] = {}
        if encoder is not None or dense_enc is not None:
            load = safe_load(_image_loader(encoder))
            for e in ready:
                needs = (encoder is not None and "image" not in (e.vectors or {})) or (dense_enc is not None and e.dense is None)
                if e.path is not None and needs:
                    futures[e.id] = pool.submit(load, e.path)
        return done, ready, futures

    try:
        stages = map(stage, _batches(entries, opts.batch_size))  # lazy: each batch is staged when asked for
        staged = next(stages, None)
        while staged is not None:
            early, ready, futures = staged
            staged = next(stages, None)  # start decoding the next batch before this one is encoded
            if early:
                emit(early)
            if ready:
                docs, failed = build_documents(ready, encoder, schema, opts, futures, dense_enc)
                if failed:
                    emit(failed)
                if docs:
                    by_id = {e.id: e for e in ready}
                    result = backend.ingest(index, docs)
                    for item in result.items:  # say where each backend outcome came from
                        e = by_id.get(item.id)
                        if e is not None:
                            item.source = item.source or e.origin
                            item.warning = item.warning or e.warning
                    emit(result.items)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        bar.close()
    return report


def build_documents(entries: Sequence[CatalogEntry], encoder: Encoder | None, schema: IndexSchema, opts: IngestOptions,
                    decoded: dict[str, Future], dense_enc: Any = None) -> tuple[list[Document], list[ItemResult]]:
    """One batch of catalog entries as documents (token maps, image and caption vectors, dense
    vectors), and the entries that failed with their reasons; ``stair-es ingest`` and
    ``encode-catalog``'s workers (:mod:`stair_es.distributed.pipeline`) both build with it."""
    failed: list[ItemResult] = []
    vectors: dict[str, dict[str, SparseVector]] = {e.id: {} for e in entries}

    # 1. precomputed token maps
    for e in entries:
        if e.vectors is None:
            continue
        try:
            for fname, tmap in e.vectors.items():
                schema.check_sparse_field(fname)
                vectors[e.id][fname] = SparseVector.from_token_map(tmap)
        except StairError as err:
            failed.append(ItemResult(e.id, False, f"vectors: {err}", e.origin))
    bad = {f.id for f in failed}

    # 2. images: decoded in the pool (started one batch ahead), encoded in one batch
    to_encode = [e for e in entries if e.id not in bad and e.id in decoded]
    images, img_entries = [], []
    for e in to_encode:
        res = decoded[e.id].result()
        if isinstance(res, Exception):
            failed.append(ItemResult(e.id, False, str(res), e.origin))
            bad.add(e.id)
        else:
            images.append(res)
            img_entries.append(e)
    sparse_at = [i for i, e in enumerate(img_entries) if "image" not in (e.vectors or {})]
    if sparse_at and encoder is not None:
        ents = [img_entries[i] for i in sparse_at]
        for e, res in zip(ents, _encode_robust(_with_warnings(encoder), [images[i] for i in sparse_at], ents, failed, bad, "image")):
            if res is not None:
                vectors[e.id]["image"], warning = res
                if warning:  # e.g. OCR failed on this picture: indexed with its other tokens, and reported
                    e.warning = f"{e.warning}; {warning}" if e.warning else warning
    dense: dict[str, Any] = {e.id: e.dense for e in entries if e.dense is not None}
    dense_at = [i for i, e in enumerate(img_entries) if e.dense is None and e.id not in bad]
    if dense_at and dense_enc is not None:
        ents = [img_entries[i] for i in dense_at]
        encode = lambda ims: list(dense_enc.encode_images(ims))  # noqa: E731
        for e, vec in zip(ents, _encode_robust(encode, [images[i] for i in dense_at], ents, failed, bad, "dense image")):
            if vec is not None:
                dense[e.id] = vec

    # 3. captions (a caption vector is optional: failure to encode one is reported, the image is kept)
    cap_entries = [e for e in entries if e.id not in bad and e.caption and opts.encode_captions
                   and "caption" in schema.sparse_fields and "caption" not in vectors[e.id]]
    if cap_entries and encoder is not None and "text" in encoder.modalities:
        caps = [e.caption for e in cap_entries]
        for e, vec in zip(cap_entries, _encode_robust(encoder.encode_texts, caps, cap_entries, failed, bad, "caption")):
            if vec is not None and vec.nnz:
                vectors[e.id]["caption"] = vec

    # Validate metadata here, with the types inferred so far in this run, so that one bad
    # document is reported on its own whatever the backend does with a batch.
    check = IndexSchema(fields=dict(schema.fields), sparse_fields=schema.sparse_fields)
    docs = []
    for e in entries:
        if e.id in bad:
            continue
        try:
            _, new = check.normalize_metadata(e.metadata)
        except StairError as err:
            failed.append(ItemResult(e.id, False, str(err), e.origin))
            continue
        check.fields.update(new)
        if not vectors[e.id]:
            failed.append(ItemResult(e.id, False, "nothing to index: no image vector and no caption vector", e.origin))
            continue
        try:
            docs.append(Document(e.id, vectors[e.id], e.metadata, e.caption, str(e.path) if e.path else None,
                                 dense.get(e.id)))
        except StairError as err:
            failed.append(ItemResult(e.id, False, str(err), e.origin))
    return docs, failed


def _with_warnings(encoder: Encoder) -> Callable[[list[Any]], list[tuple[SparseVector, str | None]]]:
    """``encode_images`` giving ``(vector, warning)`` per image; an encoder reports per-image
    warnings of its last call in ``image_warnings`` (index -> text), e.g. a token source that
    failed on one picture while its other sources worked."""
    def run(images: list[Any]) -> list[tuple[SparseVector, str | None]]:
        vecs = encoder.encode_images(images)
        warnings = getattr(encoder, "image_warnings", None) or {}
        return [(v, warnings.get(i)) for i, v in enumerate(vecs)]
    return run


def _image_loader(encoder: Encoder | None) -> Callable[[Any], Any]:
    """``load_image`` decoding JPEGs at the smallest scale the encoder can use (``image_min_side``)."""
    from .images import load_image

    min_side = getattr(encoder, "image_min_side", None)
    return partial(load_image, min_side=min_side) if min_side else load_image


def safe_load(load: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``load`` that returns a failure as a StairError (one item's reason) instead of raising."""
    def run(path: Any) -> Any:
        try:
            return load(path)
        except StairError as e:
            return e
        except Exception as e:  # noqa: BLE001 - an unexpected decoder failure is one item's failure
            return InvalidInputError(f"cannot read image {path}: {type(e).__name__}: {e}")
    return run


def _encode_robust(fn, inputs, entries, failed, bad, what) -> list[SparseVector | None]:
    """Encode a batch; if the batch fails, encode one by one so only the culprit fails."""
    try:
        return list(fn(list(inputs)))
    except Exception as batch_err:  # noqa: BLE001
        log.warning("batch %s encoding failed (%s); retrying item by item", what, batch_err)
    out: list[SparseVector | None] = []
    for x, e in zip(inputs, entries):
        try:
            out.append(fn([x])[0])
        except Exception as err:  # noqa: BLE001
            failed.append(ItemResult(e.id, False, f"{what} encoding failed: {err}", e.origin))
            bad.add(e.id)
            out.append(None)
    return out
