"""The stair-es model store: pretrained models fetched once and carried into air-gapped machines.

A search engineer with internet runs ``stair-es models pull ID``; an encoder given
``model=ID`` then finds the files with :func:`resolve_model`, and an index records
:func:`model_record` so that a query encoded with another model is refused. A cluster with
no internet gets the model carried in: ``models export ID DIR`` on a machine that has it,
``models import DIR`` on the machine that needs it.

The store
---------
``$STAIR_ES_MODEL_STORE`` or ``<data home>/_models/store`` (data home: ``$STAIR_ES_HOME`` or
``~/.local/share/stair-es``). One folder per model id and revision,
``<org>--<name>/<revision>/``, holding the snapshot's files and ``stair-es-model.json``: the
id, the revision (the hub commit when known), the requested revision, the encoder kind, every
file with its sha256 and size, and when and how the entry got there.

An entry is never used half-written: a pull or an import fills a temporary folder inside the
store (``.tmp-*``), checks every file, writes ``stair-es-model.json`` last and renames the
folder into place (one atomic rename). A per-id lock (``filelock``) keeps two processes from
installing the same model at once; an interrupted pull leaves only a ``.tmp-*`` folder, which
lookups never read and the next pull of that id removes. The files themselves are downloaded
by ``huggingface_hub.snapshot_download`` into the Hugging Face cache, which resumes partial
downloads, then hard-linked (copied across file systems) into the store.

Bundles
-------
``export`` writes a folder (or a ``.tar``/``.tar.gz``) with ``MANIFEST.json`` (sha256 and size
of every file), ``model/`` (the store entry) and ``cache/`` (what the model's encoder derives
from it and needs at run time without torch: ONNX towers, a vocabulary matrix, tokenizer
files, as listed by the encoder's ``artifacts()``; they live in
:func:`stair_es.encoders.runtime.model_cache_dir`, keyed by the weights' sha256). ``import``
unpacks into a temporary folder, checks every file against the manifest *before* installing
anything (links, absolute paths and ``..`` in a tarball are refused), then moves ``cache/``
into the model cache and the entry into the store.

This package knows where models live and how they travel; it must not know what any model
computes (the encoders do). One job a module: :mod:`.catalog` (the models stair_es knows),
:mod:`.store` (the store on disk: entries, installing, listing, verifying), :mod:`.download`
(:func:`resolve_model` and :func:`pull`), :mod:`.bundle` (export and import).
"""

from .bundle import encoder_artifacts, export, import_bundle
from .catalog import CATALOG, DEFAULT_PATTERNS, CatalogEntry, catalog_entry
from .download import model_config, pull, resolve_model
from .store import (BUNDLE_FORMAT, ENTRY_FILE, ENTRY_FORMAT, FORMAT_VERSION, MANIFEST_FILE, MODEL_FILE_SUFFIXES,
                    Progress, StoreEntry, carry_hint, check_id, check_revision, data_home, entries, files_digest,
                    find_entry, listing, model_files, model_record, offline, remove, split_model, store_dir, verify)

__all__ = ["BUNDLE_FORMAT", "CATALOG", "DEFAULT_PATTERNS", "ENTRY_FILE", "ENTRY_FORMAT", "FORMAT_VERSION",
           "MANIFEST_FILE", "MODEL_FILE_SUFFIXES", "CatalogEntry", "Progress", "StoreEntry", "carry_hint",
           "catalog_entry", "check_id", "check_revision", "data_home", "encoder_artifacts", "entries", "export",
           "files_digest", "find_entry", "import_bundle", "listing", "model_config", "model_files", "model_record",
           "offline", "pull", "remove", "resolve_model", "split_model", "store_dir", "verify"]
