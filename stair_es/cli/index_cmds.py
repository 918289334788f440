"""`stair-es index create|list|stats|delete`."""

from __future__ import annotations

import click

from stair_es.errors import InvalidInputError
from stair_es.schema import FIELD_TYPES, DenseSpec, IndexSchema

from stair_es.encoders.base import get_encoder

from .common import backend_options, echo_json, encoder_kwargs, encoder_options, human_size, json_option, table


@click.group("index")
def index_group() -> None:
    """Create, list, inspect and delete indices."""


@index_group.command("create")
@click.argument("name")
@click.option("--field", "fields", multiple=True, metavar="NAME=TYPE",
              help=f"Declare a metadata field; TYPE is one of {', '.join(FIELD_TYPES)}. Undeclared fields are "
                   "inferred from the first document (strings -> keyword: declare dates here).")
@click.option("--sparse-field", "sparse_fields", multiple=True,
              help="Sparse (token-weight) fields; default: image and caption.")
@click.option("--exist-ok", is_flag=True, help="Succeed if the index already exists.")
@click.option("--dense-dims", type=int, metavar="N",
              help="Give the index a dense vector field of N dimensions (for hybrid search's dense retriever); "
                   "vectors come from --dense-model at ingest or a \"dense\" array per JSONL line.")
@click.option("--dense-model", metavar="PATH",
              help="A checkpoint trained with `stair-es train --head dense`: its size sets --dense-dims, and it "
                   "encodes query texts for the dense retriever.")
@click.option("--dense-similarity", type=click.Choice(["cosine", "dot_product"]), default="cosine", show_default=True,
              help="How dense vectors are compared (cosine: normalised to unit length at ingest and query).")
@click.option("--dense-dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="How the embedded engine stores dense vectors (the clusters store float32).")
@encoder_options(default="default")
@backend_options
def create(name: str, fields: tuple[str, ...], sparse_fields: tuple[str, ...], exist_ok: bool, dense_dims: int | None,
           dense_model: str | None, dense_similarity: str, dense_dtype: str,
           encoder: str, model: str | None, encoder_opts: tuple[str, ...], backend) -> None:
    """Create an empty index NAME.

    The index records its encoder (--encoder, default `default`): ingest refuses another one,
    and text queries are encoded with it. Use --encoder none for an index of precomputed
    token maps (queries then need --encoder or --tokens).
    """
    declared = {}
    for spec in fields:
        fname, sep, ftype = spec.partition("=")
        if not sep:
            raise InvalidInputError(f"--field {spec!r}: use NAME=TYPE, e.g. taken=date")
        declared[fname.strip()] = ftype.strip()
    enc_config = None if encoder == "none" else get_encoder(encoder, **encoder_kwargs(model, encoder_opts)).config()
    dense = None
    if dense_model:
        from stair_es.dense import DenseEncoder

        enc = DenseEncoder(dense_model)
        if dense_dims is not None and dense_dims != enc.dims:
            raise InvalidInputError(f"--dense-dims {dense_dims} does not match the dense model, which makes {enc.dims}-dimensional vectors")
        dense = DenseSpec(enc.dims, dense_similarity, dense_dtype, enc.config()).to_dict()
    elif dense_dims is not None:
        dense = DenseSpec(dense_dims, dense_similarity, dense_dtype).to_dict()
    schema = IndexSchema(fields=declared, encoder=enc_config, dense=dense,
                         **({"sparse_fields": sparse_fields} if sparse_fields else {}))
    backend.create_index(name, schema, exist_ok=exist_ok)
    click.echo(f"created index {name!r} ({backend.name})")


@index_group.command("list")
@json_option
@backend_options
def list_(as_json: bool, backend) -> None:
    """List indices with their document counts."""
    infos = [backend.index_info(n) for n in backend.list_indices()]
    if as_json:
        echo_json([i.to_dict() for i in infos])
        return
    if not infos:
        click.echo("no indices (create one with `stair-es index create NAME` or `stair-es ingest NAME SOURCE`)")
        return
    click.echo(table([(i.name, i.doc_count, human_size(i.size_bytes), (i.schema.encoder or {}).get("name", ""))
                      for i in infos], ["index", "docs", "size", "encoder"]))


@index_group.command("stats")
@click.argument("name")
@json_option
@backend_options
def stats(name: str, as_json: bool, backend) -> None:
    """Show an index's schema, encoder and size figures."""
    info = backend.index_info(name)
    if as_json:
        echo_json(info.to_dict())
        return
    rows = [("docs", info.doc_count), ("size", human_size(info.size_bytes)),
            ("sparse fields", ", ".join(info.schema.sparse_fields)),
            ("metadata fields", ", ".join(f"{k}:{v}" for k, v in sorted(info.schema.fields.items())) or "-"),
            ("encoder", info.schema.encoder or "-")]
    rows += [(k, v) for k, v in info.extra.items()]
    click.echo(table(rows, ["property", "value"], max_width=100))


@index_group.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@backend_options
def delete(name: str, yes: bool, backend) -> None:
    """Delete index NAME and all its documents."""
    backend.index_info(name)  # fail early, with the backend's message, if it does not exist
    if not yes:
        click.confirm(f"Delete index {name!r} and all its documents?", abort=True)
    backend.delete_index(name)
    click.echo(f"deleted index {name!r}")


@index_group.command("optimize")
@click.argument("name")
@click.option("--max-segments", type=click.IntRange(min=1), default=None,
              help="Merge into at most this many segments instead of one (a segment is never split). "
                   "Merges are streamed, so a 10M index fits in about 1 GB of memory either way.")
@backend_options
def optimize(name: str, max_segments: int | None, backend) -> None:
    """Merge an embedded index's segments into one, or into at most --max-segments (ingest also
    merges as it goes). Deleted documents are dropped."""
    backend.optimize(name, max_segments=max_segments)  # a cluster backend says it merges segments itself
    info = backend.index_info(name)
    click.echo(f"optimized {name!r}: {info.doc_count} docs in {info.extra.get('segments', '?')} segment(s)")


@index_group.command("check")
@click.argument("name")
@click.option("--repair", is_flag=True,
              help="Drop damaged segments from a new commit (their documents are lost and listed).")
@json_option
@backend_options
def check(name: str, repair: bool, as_json: bool, backend) -> None:
    """Verify every file of the embedded index NAME (checksums, structure, counts).

    Like Lucene's CheckIndex: the manifest, each segment and each tombstone file are read
    and checked, and a report per segment is printed. Nothing is changed unless --repair,
    which commits the index without its damaged segments and lists the documents lost
    (re-ingest them to get them back), or, when the manifest itself is damaged or missing,
    rolls back to the previous commit (manifest.prev.json, kept with all its files).

    \b
    Exit status: 0 healthy (or repaired), 1 damage found and not repaired, 4 not an index
    or the repair could not run.
    """
    report = backend.check(name, repair=repair)  # a cluster backend says it checks its own files
    dense = report.get("dense")
    if as_json:
        echo_json(report)
    else:
        if report["manifest"]:
            click.echo(f"manifest: DAMAGED - {report['manifest']}")
            if report.get("rolled_back_to") is not None:
                click.echo(f"repaired: rolled back to the previous commit (generation {report['rolled_back_to']}); "
                           "the last commit is lost: run its ingest or delete again")
            elif report.get("previous_generation") is not None and not repair:
                click.echo(f"the previous commit (generation {report['previous_generation']}) is intact: "
                           "--repair rolls back to it")
        rows = [(s["name"], s["docs"], s["deleted"], "yes" if s["checksummed"] else "no (old format)",
                 "ok" if not s["error"] else f"DAMAGED: {s['error']}") for s in report["segments"]]
        if rows:
            click.echo(table(rows, ["segment", "docs", "deleted", "checksum", "status"], max_width=90))
        if report["orphans"]:
            click.echo(f"unreferenced files (removed by the next writer): {', '.join(report['orphans'])}")
        if dense is not None:
            drows = [(f["file"], "-" if f["rows"] is None else f["rows"], "ok" if not f["error"] else f"DAMAGED: {f['error']}")
                     for f in dense["files"]]
            if drows:
                click.echo(table(drows, ["dense vector file", "vectors", "status"], max_width=90))
            if dense["repaired"]:
                lost = dense.get("docs_without_vector", [])
                click.echo(f"repaired: removed the damaged dense vector files; {len(lost)} documents have no dense vector now"
                           + (f": {', '.join(lost[:20])}{' ...' if len(lost) > 20 else ''}" if lost else "")
                           + " (ingest them again with --reindex)")
        if report["repaired"] and report.get("rolled_back_to") is None:
            ids = report["lost_ids"]
            click.echo(f"repaired: dropped the damaged segments; {report['lost_docs']} documents lost"
                       + (f": {', '.join(ids[:20])}{' ...' if len(ids) > 20 else ''}" if ids else " (ids unreadable)"))
        repaired = report["repaired"] or bool(dense and dense["repaired"])
        click.echo("ok: no damage found" if report["ok"] else
                   ("the index was repaired" if repaired else
                    "damage found; nothing was changed (see --repair, or restore from a backup)"))
    if not report["ok"] and not (report["repaired"] or (dense and dense["repaired"])):
        raise click.exceptions.Exit(1)
