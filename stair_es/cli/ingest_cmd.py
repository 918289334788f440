"""`stair-es ingest INDEX SOURCE`: bulk-ingest a folder, glob or JSONL manifest."""

from __future__ import annotations

import click

from stair_es.errors import InvalidInputError

from stair_es.ingest import IngestOptions, index_encoder_factory, ingest_catalog

from .common import (backend_options, echo_json, encoder_kwargs, encoder_options, json_option, jsonl_report,
                     stderr_is_tty, table)


@click.command("ingest")
@click.argument("index")
@click.argument("source")
@encoder_options(default="default")
@click.option("--batch-size", default=32, show_default=True, help="Images encoded and committed together.")
@click.option("--reindex", is_flag=True, help="Encode and write documents whose id is already indexed (default: skip them, "
                                            "which is how an interrupted ingest resumes).")
@click.option("--no-captions", is_flag=True, help="Do not encode captions into the caption field.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write one JSON line per input (ok, skipped or failed, with the reason) to this file.")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even if some items failed.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal).")
@click.option("--dense-model", metavar="PATH",
              help="Also store each image's dense vector from this checkpoint (trained with `stair-es train --head "
                   "dense`) for hybrid search's dense retriever; a new index gets the model's dense field.")
@click.option("--dense-dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="How a new embedded index stores dense vectors.")
@click.option("--vectors", "vectors_only", is_flag=True,
              help="SOURCE must be a folder of Parquet shards written by `stair-es encode-catalog` (recognised "
                   "without this flag too): ingest its already-encoded documents, encoding nothing.")
@json_option
@backend_options
@click.pass_context
def ingest(ctx, index, source, encoder, model, encoder_opts, no_captions, report_path, allow_failures, progress,
           vectors_only, as_json, backend, **options) -> None:
    """Encode the images of SOURCE and add them to INDEX (created if missing).

    SOURCE is a folder (recursively; NAME.txt / NAME.json beside NAME.jpg give its caption and
    metadata), a quoted glob such as 'photos/**/*.jpg', or a JSONL manifest with one
    {"id", "path", "caption", "metadata"} object per line (paths relative to the manifest; an
    optional "dense": [numbers] gives the document's dense vector).

    SOURCE may also be an OUT_DIR of `stair-es encode-catalog` (Parquet shards): its documents
    are already encoded and go in as they are; shards of another encoder than the index's are
    refused with the reason (docs/distributed.md).

    Adding to an existing index encodes as the index was built (its recorded encoder
    config, plus any --encoder-option), even if stair_es's defaults have changed since.
    Ids already in the index are skipped, so running the same command again after an
    interruption resumes without duplicates. Every input that cannot be used is reported with
    its reason; the exit status is 1 if any item failed (unless --allow-failures).
    """
    from stair_es.distributed.shards import is_shard_folder

    if is_shard_folder(source):
        given = [f"--{p.replace('_opts', '-option').replace('_', '-')}" for p in ("encoder", "model", "encoder_opts")
                 if ctx.get_parameter_source(p) is click.core.ParameterSource.COMMANDLINE]
        if given:
            raise InvalidInputError(f"{source} holds already-encoded shards, which carry their encoder: leave out "
                                    f"{', '.join(given)}")
    elif vectors_only:
        raise InvalidInputError(f"{source} is not a folder of shards written by `stair-es encode-catalog` "
                                "(it has no _stair_shards.json); leave out --vectors to encode it")
    kwargs = encoder_kwargs(model, encoder_opts)
    progress = stderr_is_tty() if progress is None else progress
    # the options named as IngestOptions' fields (batch size, reindex, dense model and type) go in as they are
    opts = IngestOptions(encode_captions=not no_captions, progress=progress, **options)
    # The report file is written as items finish, so an interrupted run still says what it did.
    with jsonl_report(report_path) as write:
        on_items = (lambda items: write([i.to_dict() for i in items])) if write else None
        report = ingest_catalog(backend, index, source, index_encoder_factory(backend, index, encoder, kwargs), opts,
                                on_items=on_items)
    summary = report.summary()
    if as_json:
        echo_json({"summary": summary, "failures": [i.to_dict() for i in report.failures],
                   "warnings": [i.to_dict() for i in report.warnings]})
    else:
        if report.failures:
            click.echo(f"{len(report.failures)} item(s) could not be used:")
            click.echo(table([(i.id or "-", i.source or "", i.error) for i in report.failures[:50]],
                             ["id", "from", "reason"], max_width=90))
            if len(report.failures) > 50:
                click.echo(f"... and {len(report.failures) - 50} more" + ("" if report_path else " (use --report FILE for all)"))
        notes = [i for i in report.warnings if i.action != "skip" or not i.warning.startswith("already indexed")]
        if notes:
            click.echo(f"{len(notes)} note(s):")
            click.echo(table([(i.id or "-", i.warning) for i in notes[:50]], ["id", "note"], max_width=90))
        click.echo(f"ingested {summary['ok']}, skipped {summary['skipped']}, failed {summary['failed']} "
                   f"of {summary['total']} inputs into {index!r} ({backend.name})")
    if report.failures and not allow_failures:
        raise click.exceptions.Exit(1)
