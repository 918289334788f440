"""`stair-es encode-catalog SOURCE OUT_DIR`: encode a catalog into Parquet shards on a process pool or Ray."""

from __future__ import annotations

import click

from stair_es.errors import InvalidInputError, UnknownNameError

from .common import echo_json, encoder_kwargs, encoder_options, json_option, jsonl_report, stderr_is_tty, table


@click.command("encode-catalog")
@click.argument("source")
@click.argument("out_dir")
@encoder_options(default="default")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool on this machine (no Ray needed); ray: Ray actors on a local Ray or "
                   "the cluster at --address.")
@click.option("--address", metavar="ADDR", help="Ray cluster to join (e.g. auto, ray://head:10001); default: start a "
                                                "local Ray. Only with --engine ray.")
@click.option("--workers", default=1, show_default=True, help="Worker processes (local) or actors (ray); each loads "
                                                              "the encoder once.")
@click.option("--cpus-per-worker", type=int, help="CPUs each worker uses (ONNX Runtime threads; Ray reserves them). "
                                                 "Default: cores / workers (local), 1 (ray).")
@click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
              help="GPUs each Ray actor requests (needs onnxruntime-gpu with its CUDA provider on the workers).")
@click.option("--batch-size", default=32, show_default=True, help="Images encoded together inside a worker.")
@click.option("--shard-size", default=1024, show_default=True, help="Inputs per Parquet shard: the unit of work of a worker and of resuming (a catalog "
                   "smaller than workers x shard size leaves workers idle).")
@click.option("--max-retries", default=2, show_default=True, type=click.IntRange(min=0),
              help="How many times a shard whose worker process or actor dies (killed, out of memory) is tried again; "
                   "then its inputs are reported as failed with the reason and the run goes on.")
@click.option("--pin-workers", is_flag=True,
              help="local: run worker i on core i only (with no more workers than cores). Steadier on a machine of "
                   "your own; leave it off when other jobs share the cores.")
@click.option("--no-captions", is_flag=True, help="Do not encode captions into the caption field.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False),
              help="Write one JSON line per input that could not be used (with the reason) to this file.")
@click.option("--allow-failures", is_flag=True, help="Exit 0 even if some inputs or shards failed.")
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal).")
@json_option
def encode_catalog(source, out_dir, encoder, model, encoder_opts, no_captions, report_path, allow_failures, progress,
                   as_json, **options) -> None:
    """Encode the images (and captions) of SOURCE into Parquet shards in OUT_DIR, on several
    processes or a Ray cluster; then `stair-es ingest INDEX OUT_DIR` puts them in an index.

    SOURCE is a folder, a quoted glob or a JSONL manifest (as `stair-es ingest` reads them), or
    a Parquet/CSV/JSONL list with a `path` or `url` column (optional `id`, `caption`,
    `metadata`), local or on s3:// / gs://; images may be local, http(s)://, s3:// or gs://. Each shard holds id, source, caption, metadata and every sparse
    field as token ids + weights, with the encoder config in its metadata; inputs that could
    not be used are written to failures-NNNNN.parquet with the reason.

    Running the same command again after a crash (of this process or of a worker) skips the
    shards already finished and encodes the rest; no id is ever written twice. A shard whose
    worker dies is tried again up to --max-retries times, then its inputs are reported as
    failed with the reason (exit status 1) and the other shards go on.
    Needs the `distributed` extra (pyarrow; Ray for --engine ray). See docs/distributed.md.
    """
    from stair_es.distributed.pipeline import EncodeCatalogOptions, encode_catalog as run, encoder_factory
    from stair_es.encoders.base import list_encoders

    if options["address"] and options["engine"] != "ray":
        raise InvalidInputError("--address is for --engine ray")
    if options["pin_workers"] and options["engine"] != "local":
        raise InvalidInputError("--pin-workers is for --engine local (Ray places its actors itself)")
    if encoder not in list_encoders():  # here, before any worker starts
        raise UnknownNameError(f"unknown encoder {encoder!r}; available: {', '.join(list_encoders())}")
    kwargs = encoder_kwargs(model, encoder_opts)
    # the options named as EncodeCatalogOptions' fields go in as they are
    progress = stderr_is_tty() if progress is None else progress
    opts = EncodeCatalogOptions(encode_captions=not no_captions, progress=progress, **options)
    with jsonl_report(report_path) as write:
        def on_shard(entry):
            write([{**item, "shard": entry["shard"]} for item in entry.get("failed_items", [])])

        report = run(source, out_dir, encoder_factory(encoder, **kwargs), opts, on_shard=on_shard if write else None)
    summary = report.summary()
    if as_json:
        echo_json({"summary": summary, "failures": report.failures, "failed_shards": report.failed_shards})
    else:
        if report.failures:
            click.echo(f"{len(report.failures)} input(s) could not be used:")
            click.echo(table([(f["id"] or "-", f["origin"] or "", f["reason"]) for f in report.failures[:50]],
                             ["id", "from", "reason"], max_width=90))
            if len(report.failures) > 50:
                click.echo(f"... and {len(report.failures) - 50} more (all in {out_dir}/failures-*.parquet)")
        for s in report.failed_shards:
            click.echo(f"shard {s['shard']} not written: {s['error']}")
        click.echo(f"{summary['written']} shard(s) written now, {summary['resumed']} finished before, "
                   f"{summary['failed_shards']} failed; in the new shards {summary['documents']} documents, "
                   f"{summary['failed']} input(s) failed, {summary['skipped']} skipped; {summary['images_per_s'] or 0} "
                   f"inputs/s ({opts.engine}, {opts.workers} worker(s)) -> {out_dir}")
    if (report.failures or report.failed_shards) and not allow_failures:
        raise click.exceptions.Exit(1)
