"""`stair-es models list | pull | export | import | verify | rm`: the pretrained-model store."""

from __future__ import annotations

from pathlib import Path

import click

from stair_es import models as store

from .common import echo_json, human_size, json_option, stderr_is_tty, table

_WHERE = ("The store is $STAIR_ES_MODEL_STORE or <data home>/_models/store, derived files (ONNX towers...) "
          "live in $STAIR_ES_MODEL_CACHE or <data home>/_models; the data home is $STAIR_ES_HOME or "
          "~/.local/share/stair-es.")


def _entry_json(entry: store.StoreEntry) -> dict:
    return {"id": entry.id, "revision": entry.revision, "requested_revision": entry.meta.get("requested_revision"),
            "kind": entry.kind, "sha256": entry.meta["sha256"], "files": len(entry.meta["files"]), "size": entry.size,
            "folder": str(entry.folder), "installed": entry.meta.get("installed"), "pulled": entry.meta.get("pulled")}


@click.group("models", help=f"""Pretrained models: see what is known, pull once, carry to machines with no internet.

\b
With internet:      stair-es models pull vsearch/vdr-cross-modal
                    stair-es models export vsearch/vdr-cross-modal vdr.tar
Without internet:   stair-es models import vdr.tar
                    stair-es ingest photos ./photos --encoder vdr --model vsearch/vdr-cross-modal

Encoders given --model ID find it in the store; an ID that is not there is pulled on first use
unless HF_HUB_OFFLINE=1 or STAIR_ES_OFFLINE=1. {_WHERE}""")
def models_group() -> None:
    pass


@models_group.command("list")
@json_option
def list_cmd(as_json: bool) -> None:
    """The models stair_es knows (what each is for, download size, licence, the revision a
    pull asks for) and every model in the store, with the revisions (commits) installed."""
    rows = store.listing()
    if as_json:
        echo_json({"store": str(store.store_dir()), "models": rows})
        return
    body = []
    for r in rows:
        here = ", ".join(f"{i['revision'][:12]} ({human_size(i['size'], '')})" for i in r["installed"]) or "no"
        body.append((r["id"], r["kind"] or "?", r["download_size"] or "", r["licence"] or "", r["revision"] or "",
                     here, r["purpose"]))
    click.echo(table(body, ["model", "encoder", "download", "licence", "pull revision", "in store", "for"], max_width=70))
    click.echo(f"\nstore: {store.store_dir()}")


@models_group.command("pull")
@click.argument("model_id", metavar="ID")
@click.option("--revision", help="Branch, tag or commit to pull (default: the 'pull revision' of `models list` "
                                 "for a catalog model, else main).")
@click.option("--encoder", "kind", help="Encoder the model is for, for ids not in the catalog (e.g. vdr, clip-vocab).")
@click.option("--refresh", is_flag=True,
              help="Ask the hub what the revision (a branch such as main) points at now and pull that commit if it "
                   "is new (the revisions already in the store stay; indices record the one they were built with).")
@json_option
def pull_cmd(model_id: str, revision: str | None, kind: str | None, refresh: bool, as_json: bool) -> None:
    """Download model ID from the Hugging Face hub once into the store (sha256 of every file
    recorded). An interrupted pull resumes when run again. A gated model needs `hf auth login`
    (or HF_TOKEN) first. With HF_HUB_OFFLINE=1 or STAIR_ES_OFFLINE=1 the files are taken from
    the Hugging Face cache only."""
    entry = store.pull(model_id, revision=revision, kind=kind, refresh=refresh,
                       progress=stderr_is_tty() and not as_json, local_only=store.offline())
    if as_json:
        echo_json(_entry_json(entry))
        return
    click.echo(f"{entry.id} at revision {entry.revision} is in the store: {entry.folder} "
               f"({len(entry.meta['files'])} files, {human_size(entry.size, '')})")


@models_group.command("export")
@click.argument("model", metavar="ID")
@click.argument("dest", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--tar", is_flag=True, help="Write DIR.tar (a DIR ending in .tar, .tar.gz or .tgz also makes a tarball; "
              "weights barely compress, so .tar.gz mostly costs time).")
@click.option("--weights-only", is_flag=True,
              help="Leave out the derived files (ONNX towers, vocabulary matrix); the other machine then needs torch.")
@json_option
def export_cmd(model: str, dest: Path, tar: bool, weights_only: bool, as_json: bool) -> None:
    """Write model ID (ORG/NAME or ORG/NAME@REVISION) from the store as a self-contained bundle:
    the model's files, the files its encoder derives and needs at run time without torch, and
    MANIFEST.json with the sha256 of every file. Derived files not made yet are made first
    (this needs the encoder's dependencies, e.g. torch)."""
    manifest = store.export(model, dest, tar=tar, weights_only=weights_only, progress=stderr_is_tty() and not as_json)
    if as_json:
        echo_json(manifest)
        return
    derived = sum(1 for r in manifest["files"] if r.startswith("cache/"))
    click.echo(f"exported {manifest['id']} at revision {manifest['revision']} to {manifest['path']} "
               f"({len(manifest['files'])} files, {derived} derived, {human_size(manifest['size'], '')})")
    if manifest["weights_only"]:
        click.echo("note: no derived files in the bundle; the importing machine needs torch to make them", err=True)
    click.echo(f"on the other machine: stair-es models import {Path(manifest['path']).name}")


@models_group.command("import")
@click.argument("source", metavar="DIR_OR_TAR", type=click.Path(path_type=Path))
@json_option
def import_cmd(source: Path, as_json: bool) -> None:
    """Install a bundle written by `stair-es models export` (a folder or tarball). Every file is
    checked against MANIFEST.json before anything is installed; links, absolute paths and '..'
    in a tarball are refused. No network is used."""
    entry = store.import_bundle(source, progress=stderr_is_tty() and not as_json)
    if as_json:
        echo_json(_entry_json(entry))
        return
    click.echo(f"imported {entry.id} at revision {entry.revision} into {entry.folder} "
               f"({len(entry.meta['files'])} files, {human_size(entry.size, '')}); use it with "
               f"--encoder {entry.kind or 'ENCODER'} --model {entry.id}")


@models_group.command("verify")
@click.argument("model", metavar="ID")
@json_option
def verify_cmd(model: str, as_json: bool) -> None:
    """Re-check the sha256 of every file of model ID in the store."""
    entry = store.verify(model, progress=stderr_is_tty() and not as_json)
    if as_json:
        echo_json({**_entry_json(entry), "ok": True})
        return
    click.echo(f"{entry.id} at revision {entry.revision}: all {len(entry.meta['files'])} files match their checksums")


@models_group.command("rm")
@click.argument("model_id", metavar="ID")
@click.option("--revision", help="Remove only this revision (default: every revision of ID).")
@json_option
def rm_cmd(model_id: str, revision: str | None, as_json: bool) -> None:
    """Remove model ID from the store (derived files in the model cache are kept)."""
    gone = store.remove(model_id, revision)
    if as_json:
        echo_json({"removed": [{"id": e.id, "revision": e.revision, "folder": str(e.folder)} for e in gone]})
        return
    for e in gone:
        click.echo(f"removed {e.id} at revision {e.revision}")
