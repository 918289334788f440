"""`stair-es serve` (the HTTP service) and the cluster set-up groups `stair-es es ...` and
`stair-es opensearch ...` that make Elasticsearch/OpenSearch call it as their sparse model."""

from __future__ import annotations

import functools
import os
import time
from typing import Any, Callable

import click

from stair_es.errors import BackendError, InvalidInputError, MissingDependencyError

from .common import (CONNECTION_KEYS, backend_options, cluster_connection_options, echo_json, encoder_kwargs, encoder_options,
                     make_backend, options, RERANK_AUTO_WHEN, rerank_option)


# --- stair-es serve ----------------------------------------------------------------------------
def _queue_timeout(value: Any) -> float | str | None:
    """--queue-timeout-ms: milliseconds, auto or off (0: off)."""
    from stair_es.serve.admission import queue_timeout_setting

    try:
        return queue_timeout_setting(value)
    except InvalidInputError as e:
        raise click.BadParameter(str(e), param_hint="'--queue-timeout-ms'") from None


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback requires an API key.")
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--image-root", "image_roots", multiple=True, type=click.Path(file_okay=False),
              help="Folder whose images clients may name by relative path (and whose files thumbnails show); repeatable.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Another Host name clients reach the server by (repeatable); besides it only the bind address, "
                   "localhost, 127.0.0.1 and [::1] (any port) are answered, others get 400 (DNS rebinding). "
                   "'*' answers any.")
@click.option("--public-docs", is_flag=True,
              help="With an API key: serve /docs, /redoc and /openapi.json without it (otherwise only /healthz and "
                   "/readyz are public).")
@click.option("--allow-image-urls", is_flag=True, help="Fetch http(s) image URLs given by clients (off by default).")
@click.option("--allow-private-urls", is_flag=True, envvar="STAIR_ES_SERVE_ALLOW_PRIVATE_URLS", show_envvar=True,
              help="With --allow-image-urls: also fetch from hosts that resolve to loopback, private, link-local, "
                   "multicast, reserved or unspecified addresses (refused by default, at every redirect; only on a "
                   "trusted network).")
@click.option("--api-key-file", type=click.Path(dir_okay=False),
              help="File whose first line is the API key clients must send (Authorization: Bearer KEY). "
                   "[env: STAIR_ES_SERVE_API_KEY]")
@click.option("--index", "default_index", help="Index searched when a request names none (and shown first on the page).")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Encode/search calls run at once (threads). Fewer than the machine's cores leaves one to the "
                   "thread that accepts and refuses: on 2 cores, --workers 1 refused every excess request within "
                   "about 5 ms, at 60 % of the searches per second (docs/serve.md).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(0, 10000),
              help="Requests that may wait for a worker, first come first served; more get 429 at once, with "
                   "Retry-After (seconds) and Retry-After-Ms.")
@click.option("--max-queue-ms", default=0.0, show_default=True, type=click.FloatRange(0, 3_600_000),
              help="Also answer 429 at once when the requests ahead would take longer than this to drain (requests "
                   "ahead x mean service time / workers): the queue follows the server's speed of the moment "
                   "(0: off, only --max-queue counts).")
@click.option("--queue-timeout-ms", default="auto", show_default=True, metavar="MS|auto|off",
              envvar="STAIR_ES_SERVE_QUEUE_TIMEOUT_MS", show_envvar=True,
              callback=lambda ctx, param, value: _queue_timeout(value),
              help="Answer 429 (with Retry-After) instead of running a request that has waited longer than this in "
                   "the queue when its turn comes, and refuse at once one expected to wait longer, so that latency "
                   "stays bounded under overload and after a stall. auto: 20 ms, or 4 mean service times of its kind "
                   "(searches, thumbnails and heatmaps, other work) when longer, at the door; one the door let in is "
                   "refused from the queue only past twice that; off or 0: no limit (only --max-queue counts).")
@click.option("--request-timeout", default=30.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds to an answer: beyond, 504, and work still queued is dropped (0: no limit).")
@click.option("--max-in-flight", type=click.IntRange(1, 1000000),
              help="HTTP requests in progress at once on any route but /healthz; more get 429. "
                   "[default: workers + max-queue + 64]")
@click.option("--max-url-fetches", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Image URL fetches at once (with --allow-image-urls), on threads of their own, never the workers.")
@click.option("--url-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 600),
              help="Seconds for one image URL fetch in total: connecting, redirects and every byte.")
@click.option("--header-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds a client may take to send a request's headers; the connection is closed beyond.")
@click.option("--worker-nice", default=5, show_default=True, type=click.IntRange(0, 19),
              help="Run the worker threads this many nice steps below the thread that accepts, sheds and answers "
                   "requests (Linux), so shedding stays fast while the workers use every core.")
@click.option("--loop-nice", default=0, show_default=True, type=click.IntRange(-20, 19), envvar="STAIR_ES_SERVE_LOOP_NICE",
              show_envvar=True, help="Nice value of the thread that accepts, sheds and answers requests (Linux); the "
                                     "workers run --worker-nice steps above it. Negative puts it ahead of the machine's "
                                     "other processes and needs root or CAP_SYS_NICE (else a warning, and it runs unchanged).")
@click.option("--loop-realtime", is_flag=True, envvar="STAIR_ES_SERVE_LOOP_REALTIME", show_envvar=True,
              help="Run the thread that accepts, sheds and answers requests in the real-time class (SCHED_FIFO 1, "
                   "Linux), so it runs at once when it wakes instead of after the next scheduler tick while searches "
                   "hold every core; needs root or CAP_SYS_NICE (else a warning, and it runs unchanged). Off by default.")
@click.option("--batching", default="auto", show_default=True, type=click.Choice(["auto", "on", "off"]),
              help="Serve /v1/search from one first-come-first-served queue: requests prepared in batches (query "
                   "texts encoded in one call), then searched on --workers threads. auto: on for the embedded "
                   "engine; off serves each search as its own task in the worker pool.")
@click.option("--max-batch", default=16, show_default=True, type=click.IntRange(1, 1024),
              help="Searches prepared together at most.")
@click.option("--batch-window-ms", default=0.0, show_default=True, type=click.FloatRange(0, 1000),
              help="How long a batch's first search waits for others (0: a batch is whatever waits).")
@rerank_option("--rerank", "Re-rank the best 100 hits of a text search by meaning, as `stair-es search --rerank` does: "
               f"auto (the default, or $STAIR_ES_RERANK) {RERANK_AUTO_WHEN}, semantic on any index, off for the sparse "
               "order. A request's \"rerank\" field overrides it.")
@click.option("--max-body-mb", default=16.0, show_default=True, type=click.FloatRange(0.01, 1024),
              help="Largest request body accepted (413 beyond).")
@click.option("--max-image-mb", default=10.0, show_default=True, type=click.FloatRange(0.01, 1024),
              help="Largest image accepted (file, base64 or URL).")
@click.option("--max-inputs", default=64, show_default=True, type=click.IntRange(1, 100000),
              help="Inputs per encode call.")
@click.option("--max-filters", default=64, show_default=True, type=click.IntRange(0, 100000),
              envvar="STAIR_ES_SERVE_MAX_FILTERS", show_envvar=True, help="`where` conditions per search (400 beyond).")
@click.option("--max-clause-tokens", default=1024, show_default=True, type=click.IntRange(0, 1000000),
              envvar="STAIR_ES_SERVE_MAX_CLAUSE_TOKENS", show_envvar=True, help="require + exclude + exclude_query tokens per search.")
@click.option("--max-query-tokens", default=2048, show_default=True, type=click.IntRange(1, 1000000),
              envvar="STAIR_ES_SERVE_MAX_QUERY_TOKENS", show_envvar=True, help="Tokens in a query token map.")
@click.option("--max-top-k", default=1000, show_default=True, type=click.IntRange(1, 1000000),
              envvar="STAIR_ES_SERVE_MAX_TOP_K", show_envvar=True, help="Hits per search.")
@click.option("--max-explain-hits", default=100, show_default=True, type=click.IntRange(1, 1000000),
              envvar="STAIR_ES_SERVE_MAX_EXPLAIN_HITS", show_envvar=True, help="Hits one `explain: true` search may explain.")
@click.option("--max-text-chars", default=4096, show_default=True, type=click.IntRange(1, 10000000),
              envvar="STAIR_ES_SERVE_MAX_TEXT_CHARS", show_envvar=True, help="Characters of a query, encode input or expr.")
@click.option("--body-timeout", default=15.0, show_default=True, type=click.FloatRange(0.1, 3600),
              help="Seconds a client may take to send its request body (408 beyond).")
@click.option("--warm", is_flag=True,
              help="Make each embedded index's first queries as fast as its hundredth: map its pages, verify its "
                   "checksums and load the search kernels when it is opened (about 0.5 s per million documents at "
                   "start; the same as STAIR_ES_WARM=1).")
@click.option("--debug-stats", is_flag=True,
              help="Keep where each recent request's time went and answer it at GET /debug/stats (the phases of "
                   "searches, shed answers, event-loop stalls; behind the API key when one is set). Off by default.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@encoder_options(default="default")
@backend_options
def serve(host, port, image_roots, allowed_hosts, api_key_file, max_queue_ms, queue_timeout_ms, request_timeout,
          max_body_mb, max_image_mb, warm, log_level, encoder, model, encoder_opts, backend, **same) -> None:
    """Serve encode, search and explain over HTTP, a results page at /, and the inference
    endpoints Elasticsearch and OpenSearch call (see `stair-es es` and `stair-es opensearch`).

    Binds 127.0.0.1 by default; any other address needs an API key (--api-key-file or
    $STAIR_ES_SERVE_API_KEY), compared in constant time. Image paths from clients are
    confined to the --image-root folders. The OpenAPI document is at /docs.

    \b
      stair-es serve --image-root ./photos --index photos
      stair-es serve --host 0.0.0.0 --api-key-file ~/.config/stair-es/serve.key --image-root /data/img
    """
    try:
        import uvicorn

        from stair_es.serve.app import create_app
        from stair_es.serve.protocol import header_deadline_protocol
        from stair_es.serve.security import check_bind, load_api_key
        from stair_es.serve.service import ServeConfig, Service
    except ModuleNotFoundError as e:
        raise MissingDependencyError("stair-es serve", "serve", e.name) from None

    api_key = load_api_key(api_key_file)
    check_bind(host, api_key)
    if same["allow_private_urls"] and not same["allow_image_urls"]:
        click.echo("warning: --allow-private-urls has no effect without --allow-image-urls (no image URL is fetched)",
                   err=True)
    if warm:  # read by every embedded index reader this process opens (EngineIndex.open)
        os.environ["STAIR_ES_WARM"] = "1"
    # the options named as ServeConfig's fields go in as they are
    config = ServeConfig(backend=backend.name, encoder=encoder, encoder_options=encoder_kwargs(model, encoder_opts),
                         image_roots=list(image_roots), allowed_hosts=list(allowed_hosts), api_key=api_key,
                         max_queue_ms=max_queue_ms or None, queue_timeout_ms=queue_timeout_ms or None,
                         request_timeout=request_timeout or None, max_body_bytes=int(max_body_mb * 1024 * 1024),
                         max_image_bytes=int(max_image_mb * 1024 * 1024), bind_host=host, **same)
    service = Service(config, backend=backend)
    app = create_app(config, service=service)
    d = config.describe()
    click.echo(f"stair-es serve on http://{host}:{port} (backend {d['backend']}, encoder {d['encoder']}, "
               f"{config.workers} workers, search batching {config.batching}, "
               f"API key {'required' if api_key else 'off'}, image roots: {', '.join(d['image_roots']) or 'none'}); "
               "OpenAPI at /docs", err=True)
    # uvicorn's access log shows method, path and status only: never headers (where the key travels).
    # No limit_concurrency: the app's own gate answers 429 with Retry-After instead of uvicorn's bare 503.
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_keep_alive=5, server_header=False,
                http=header_deadline_protocol(config.header_timeout, stamp=config.debug_stats),
                h11_max_incomplete_event_size=16 * 1024)


# --- cluster set-up ---------------------------------------------------------------------------
def cluster_options(engine: str) -> Callable:
    """Connection flags of one engine (the same meaning as `--backend {engine}` elsewhere)."""
    def deco(f: Callable) -> Callable:
        f = options(*cluster_connection_options(engine),
                    click.option("--print", "dry_run", is_flag=True,
                                 help="Print the request(s) as JSON (secrets redacted) instead of sending them."))(f)

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            conn = {k: kwargs.pop(k) for k in CONNECTION_KEYS}
            conn["backend"] = engine

            @functools.cache  # connected on the first request, if any
            def get_cluster():
                return make_backend(dict(conn))

            kwargs["cluster"] = get_cluster
            try:
                return f(*args, **kwargs)
            finally:
                if get_cluster.cache_info().currsize:
                    get_cluster().close()

        return wrapper
    return deco


def _send(cluster, dry_run: bool, method: str, path: str, body: Any, what: str) -> Any:
    from stair_es.serve.integrations import cluster_call, redact

    if dry_run:
        echo_json({"method": method, "path": path, "body": redact(body)})
        return None
    return cluster_call(cluster(), method, path, body, what)


def _send_and_show(cluster, dry_run: bool, method: str, path: str, body: Any, what: str) -> None:
    """:func:`_send`, then the cluster's answer printed as JSON (the request itself with --dry-run)."""
    res = _send(cluster, dry_run, method, path, body, what)
    if res is not None:
        echo_json(res)


_SERVE_URL = click.option("--serve-url", required=True, metavar="URL",
                          help="Base URL of `stair-es serve` as the cluster's nodes reach it, e.g. http://10.0.0.5:8080.")
_SERVE_KEY = click.option("--serve-api-key-file", type=click.Path(dir_okay=False),
                          help="The server's API key file (stored in the cluster as a secret). [env: STAIR_ES_SERVE_API_KEY]")


@click.group("es")
def es_group() -> None:
    """Set Elasticsearch up to call `stair-es serve` as a sparse model (inference `custom` service,
    ingest pipeline, semantic_text / sparse_vector mappings). Needs Elasticsearch 8.19+ or 9.x."""


@es_group.command("register-inference")
@click.argument("inference_id")
@_SERVE_URL
@_SERVE_KEY
@click.option("--documents", type=click.Choice(["text", "image"]), default="image", show_default=True,
              help="What the cluster ingests: image references (paths under the server's image root, data: URIs) or "
                   "text. Queries are text either way.")
@click.option("--batch-size", type=int, help="Inputs per call the cluster sends (the service's default is 10).")
@cluster_options("elasticsearch")
def es_register_inference(inference_id, serve_url, serve_api_key_file, documents, batch_size, dry_run, cluster) -> None:
    """PUT _inference/sparse_embedding/INFERENCE_ID with the `custom` service pointing at stair-es serve."""
    from stair_es.serve.integrations import es_inference_endpoint, redact
    from stair_es.serve.security import load_api_key

    body = es_inference_endpoint(serve_url, documents=documents, api_key=load_api_key(serve_api_key_file),
                                 batch_size=batch_size)
    res = _send(cluster, dry_run, "PUT", f"/_inference/sparse_embedding/{inference_id}", body, "register the inference endpoint")
    if res is not None:
        echo_json(redact(res))


@es_group.command("create-pipeline")
@click.argument("pipeline_id")
@click.option("--inference-id", required=True, help="The endpoint made by `stair-es es register-inference`.")
@click.option("--input-field", default="image_ref", show_default=True, help="Field holding the image reference or text.")
@click.option("--output-field", default="image", show_default=True, help="sparse_vector field to fill.")
@cluster_options("elasticsearch")
def es_create_pipeline(pipeline_id, inference_id, input_field, output_field, dry_run, cluster) -> None:
    """PUT _ingest/pipeline/PIPELINE_ID with the `inference` processor."""
    from stair_es.serve.integrations import es_ingest_pipeline

    _send_and_show(cluster, dry_run, "PUT", f"/_ingest/pipeline/{pipeline_id}",
                   es_ingest_pipeline(inference_id, input_field, output_field), "create the ingest pipeline")


@es_group.command("create-index")
@click.argument("index")
@click.option("--inference-id", required=True, help="Endpoint used at ingest (and at search unless --search-inference-id).")
@click.option("--search-inference-id", help="semantic_text: another endpoint for queries.")
@click.option("--field-type", type=click.Choice(["semantic_text", "sparse_vector"]), default="semantic_text",
              show_default=True)
@click.option("--field", default="image", show_default=True)
@cluster_options("elasticsearch")
def es_create_index(index, inference_id, search_inference_id, field_type, field, dry_run, cluster) -> None:
    """PUT INDEX with a semantic_text (or sparse_vector) field fed by the inference endpoint."""
    from stair_es.serve.integrations import es_mappings

    body = es_mappings(field_type, inference_id=inference_id, search_inference_id=search_inference_id, field=field)
    _send_and_show(cluster, dry_run, "PUT", f"/{index}", body, "create the index")


@click.group("opensearch")
def opensearch_group() -> None:
    """Set OpenSearch up to call `stair-es serve` as a remote sparse model (ml-commons HTTP connector,
    sparse_encoding pipeline, neural_sparse). Needs OpenSearch 2.11+ with ml-commons and neural-search."""


@opensearch_group.command("register-model")
@_SERVE_URL
@_SERVE_KEY
@click.option("--kind", type=click.Choice(["text", "image"]), default="image", show_default=True,
              help="What the model encodes: image references (documents) or text (queries). Register one of each.")
@click.option("--keys", type=click.Choice(["token", "id"]), default="token", show_default=True,
              help="Token strings (rank_features) or token ids (the 3.3+ seismic sparse_vector).")
@click.option("--name", help="Model name (default: stair-es-KIND).")
@click.option("--model-group-id", help="ml-commons model group.")
@click.option("--deploy/--no-deploy", default=True, show_default=True)
@click.option("--wait", default=60.0, show_default=True, help="Seconds to wait for the register task.")
@cluster_options("opensearch")
def os_register_model(serve_url, serve_api_key_file, kind, keys, name, model_group_id, deploy, wait, dry_run,
                      cluster) -> None:
    """Create the connector, register the remote model and deploy it; prints the model id."""
    from stair_es.serve.integrations import os_connector, os_register_model as reg_body
    from stair_es.serve.security import load_api_key

    name = name or f"stair-es-{kind}"
    connector = os_connector(serve_url, kind=kind, keys=keys, api_key=load_api_key(serve_api_key_file), name=name)
    res = _send(cluster, dry_run, "POST", "/_plugins/_ml/connectors/_create", connector, "create the ml-commons connector")
    connector_id = (res or {}).get("connector_id", "<connector_id>")
    if res is not None and not res.get("connector_id"):
        raise BackendError(f"OpenSearch did not return a connector_id: {res}")
    res = _send(cluster, dry_run, "POST", "/_plugins/_ml/models/_register",
                reg_body(connector_id, name=name, model_group_id=model_group_id), "register the model")
    model_id = (res or {}).get("model_id")
    if res is not None and not model_id:
        task = res.get("task_id")
        if not task:
            raise BackendError(f"OpenSearch returned neither model_id nor task_id: {res}")
        deadline = time.monotonic() + wait
        while True:
            t = _send(cluster, False, "GET", f"/_plugins/_ml/tasks/{task}", None, "read the register task")
            if t.get("state") == "COMPLETED" and t.get("model_id"):
                model_id = t["model_id"]
                break
            if t.get("state") in ("FAILED", "CANCELLED") or time.monotonic() > deadline:
                raise BackendError(f"registering the model did not complete: {t.get('state')} {t.get('error', '')}")
            time.sleep(1)
    model_id = model_id or "<model_id>"
    if deploy:
        _send(cluster, dry_run, "POST", f"/_plugins/_ml/models/{model_id}/_deploy", None, "deploy the model")
    if not dry_run:
        echo_json({"connector_id": connector_id, "model_id": model_id, "deployed": deploy, "kind": kind, "keys": keys})


@opensearch_group.command("create-pipeline")
@click.argument("pipeline_id")
@click.option("--model-id", required=True, help="The image model from `stair-es opensearch register-model --kind image`.")
@click.option("--input-field", default="image_ref", show_default=True)
@click.option("--output-field", default="image", show_default=True)
@click.option("--prune-type", type=click.Choice(["none", "max_ratio", "alpha_mass", "top_k", "abs_value"]), default="none",
              show_default=True, help="sparse_encoding pruning of document tokens.")
@click.option("--prune-ratio", type=float, help="Ratio for --prune-type (required with it).")
@cluster_options("opensearch")
def os_create_pipeline(pipeline_id, model_id, input_field, output_field, prune_type, prune_ratio, dry_run, cluster) -> None:
    """PUT _ingest/pipeline/PIPELINE_ID with the sparse_encoding processor."""
    from stair_es.serve.integrations import os_ingest_pipeline

    try:
        body = os_ingest_pipeline(model_id, input_field, output_field, prune_type=prune_type, prune_ratio=prune_ratio)
    except ValueError as e:
        raise InvalidInputError(f"{e}; pass --prune-ratio") from None
    _send_and_show(cluster, dry_run, "PUT", f"/_ingest/pipeline/{pipeline_id}", body, "create the ingest pipeline")


@opensearch_group.command("create-search-pipeline")
@click.argument("pipeline_id")
@click.option("--prune-ratio", default=0.4, show_default=True, help="Query tokens below this share of the top weight wait for phase two.")
@click.option("--expansion-rate", default=5.0, show_default=True, help="Phase two rescores top_k x this many hits.")
@click.option("--max-window-size", default=10000, show_default=True)
@cluster_options("opensearch")
def os_create_search_pipeline(pipeline_id, prune_ratio, expansion_rate, max_window_size, dry_run, cluster) -> None:
    """PUT /_search/pipeline/PIPELINE_ID with the neural_sparse two-phase processor."""
    from stair_es.serve.integrations import os_two_phase_pipeline

    _send_and_show(cluster, dry_run, "PUT", f"/_search/pipeline/{pipeline_id}",
                   os_two_phase_pipeline(prune_ratio, expansion_rate, max_window_size), "create the search pipeline")


@opensearch_group.command("create-index")
@click.argument("index")
@click.option("--pipeline", help="Default ingest pipeline (from `stair-es opensearch create-pipeline`).")
@click.option("--keys", type=click.Choice(["token", "id"]), default="token", show_default=True,
              help="token: rank_features; id: the 3.3+ seismic sparse_vector.")
@click.option("--field", default="image", show_default=True)
@cluster_options("opensearch")
def os_create_index(index, pipeline, keys, field, dry_run, cluster) -> None:
    """PUT INDEX with the sparse field the pipeline fills."""
    from stair_es.serve.integrations import os_mappings

    body = os_mappings(field=field, keys=keys)
    if pipeline:
        body.setdefault("settings", {}).setdefault("index", {})["default_pipeline"] = pipeline
    _send_and_show(cluster, dry_run, "PUT", f"/{index}", body, "create the index")


COMMANDS = [serve, es_group, opensearch_group]
