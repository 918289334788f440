"""`stair-es rank-eval INDEX RATINGS`: rated queries in, P@k / MRR / nDCG / recall out (Elasticsearch's _rank_eval)."""

from __future__ import annotations

from dataclasses import replace

import click

from stair_es.errors import InvalidInputError

from .common import (backend_options, echo_json, encoder_kwargs, encoder_options, json_option, options, stderr_is_tty,
                     rerank_option, table)

#: Hits shown per query in the table (--json has the whole top k).
SHOWN_HITS = 5
#: Query tokens shown per query in the table.
SHOWN_TOKENS = 6


_config_options = options(
    click.option("--caption-weight", type=float, default=None,
                 help="Weight of the match against caption tokens, as in `stair-es search` [default: search's, 0.5]."),
    click.option("--image-weight", type=float, default=None,
                 help="Weight of the match against image tokens [default: search's, 1.0]."),
    click.option("--query-top-k", type=click.IntRange(min=1), help="Keep only the N strongest query tokens."),
    click.option("--min-weight", type=float, help="Drop query tokens weighing less than this."),
    click.option("--expand", type=click.IntRange(min=0), default=None, metavar="N",
                 help="Add each query token's N best image-token neighbours, as `stair-es search --expand`."),
    click.option("--force", is_flag=True, help="Evaluate even if the index was built with another encoder version."),
    click.option("--compare-encoder", metavar="NAME",
                 help="Compare with queries encoded by this encoder (configuration B; alone it starts from that "
                      "encoder's defaults, not A's options)."),
    click.option("--compare-model", metavar="PATH", help="Model for --compare-encoder (a local folder or a hub id)."),
    click.option("--compare-encoder-option", "compare_opts", multiple=True, metavar="KEY=VALUE",
                 help="Configuration B: this encoder option on top of A's (e.g. text=grounded); repeatable."),
    click.option("--compare-caption-weight", type=float, help="Configuration B: this --caption-weight."),
    click.option("--compare-image-weight", type=float, help="Configuration B: this --image-weight."),
    click.option("--compare-expand", type=click.IntRange(min=0), metavar="N", help="Configuration B: this --expand."),
    rerank_option("--rerank", "Re-rank each query's best 100 hits by meaning, as `stair-es search --rerank` does "
                              "(default: $STAIR_ES_RERANK, else auto)."),
    rerank_option("--compare-rerank", "Configuration B: this --rerank (e.g. off, to see what re-ranking changes)."),
)


@click.command("rank-eval")
@click.argument("index")
@click.argument("ratings", type=click.Path(exists=True, dir_okay=False))
@click.option("--queries", "queries_path", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="The query texts when RATINGS is TREC qrels: 'QID<TAB>text' lines or JSONL {\"id\", \"query\", \"where\"}.")
@click.option("--top-k", "-k", type=click.IntRange(min=10), default=10, show_default=True,
              help="Hits retrieved per query (at least 10: MRR@10, nDCG@10 and R@10 look at the top 10).")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Evaluate only the first N rated queries.")
@click.option("--show", type=click.IntRange(min=0), default=20, show_default=True, metavar="N",
              help="Queries listed in the table, worst (or, with a comparison, most changed) first; --json lists all.")
@click.option("--explain", "explain_words", is_flag=True,
              help="Under the table, how each listed query's words became tokens (grounding on the index's words, "
                   "as `stair-es search --explain` shows; --json always has it).")
@_config_options
@encoder_options(default=None)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr (default: when stderr is a terminal).")
@json_option
@backend_options
def rank_eval(index, ratings, queries_path, top_k, limit, show, explain_words, progress, as_json, backend, **config) -> None:
    """Evaluate INDEX's ranking on rated queries: P@1, P@5, MRR@10, nDCG@10, R@5, R@10.

    RATINGS is JSONL, one query a line (the equivalent of Elasticsearch's _rank_eval):

    \b
      {"query": "two dogs", "relevant": {"dog-1": 2, "dog-7": 1, "cat-3": 0}}
      {"id": "q2", "query": "red shoe", "where": ["brand=acme", "price<=50"], "relevant": ["shoe-9"]}

    Grades are whole numbers: 1 or more is relevant (higher is better: nDCG's gain is the grade),
    0 is judged non-relevant; a list of ids means grade 1. "where" holds `stair-es search --where`
    conditions. TREC qrels ('QID 0 DOCID GRADE') work too, with the texts in --queries FILE.

    Each query runs exactly as `stair-es search INDEX QUERY --where ...` would: the index's
    recorded encoder (or --encoder/--encoder-option), its IDF, search's defaults. The metrics are
    ir-measures' (trec_eval's definitions) over the hits in the order search returns them; a
    query with no hits scores 0. A rated document that is not in the index is warned about and
    counted as relevant but unretrievable, so that a missing ingest lowers recall instead of
    vanishing from it.

    Lines that cannot be used (not JSON, no rated documents, grades that are not numbers, a bad
    "where") are reported with their line number and the rest is evaluated; the exit status is
    non-zero only when no query could be evaluated. Examples:

    \b
      stair-es rank-eval photos ratings.jsonl
      stair-es rank-eval photos qrels.txt --queries topics.tsv --json
      stair-es rank-eval photos ratings.jsonl --compare-encoder-option text=grounded
      stair-es rank-eval photos ratings.jsonl --encoder-option text=bow --compare-encoder-option text=splade

    Any --compare-* option runs a second configuration (B) beside the first (A, the options
    above) on the same queries: the table shows both metric columns, then the queries ranked
    differently, most changed first, with their first relevant rank under A and B. Details,
    the tie rule and how this maps to _rank_eval: docs/rank-eval.md.
    """
    from stair_es.rankeval import QueryConfig, compare, evaluate, read_ratings

    rated = read_ratings(ratings, queries_path)
    queries = rated.queries[:limit] if limit else rated.queries
    # the --compare-* options describe configuration B; the others are QueryConfig's fields by name
    b = {k.removeprefix("compare_"): config.pop(k) for k in list(config) if k.startswith("compare_")}
    b["encoder_opts"] = b.pop("opts")
    encoder = config.pop("encoder")
    a_options = encoder_kwargs(config.pop("model"), config.pop("encoder_opts"))
    config_a = QueryConfig(encoder=encoder, encoder_options=a_options, label="A", **config)
    changed = {k: b[k] for k in ("caption_weight", "image_weight", "expand", "rerank") if b[k] is not None}
    show_bar = stderr_is_tty() if progress is None else progress
    if b["encoder"] or b["model"] or b["encoder_opts"] or changed:
        b_options = encoder_kwargs(b["model"], b["encoder_opts"])
        if not b["encoder"]:  # B is A with these options changed
            b_options = {**config_a.encoder_options, **b_options}
        config_b = replace(config_a, encoder=b["encoder"] or encoder, encoder_options=b_options, label="B", **changed)
        if config_b.describe() | {"label": "A"} == config_a.describe():
            raise InvalidInputError("the --compare-* options describe the same configuration as A: change the encoder, "
                                    "an encoder option or a weight")
        result = compare(backend, index, queries, config_a, config_b, top_k=top_k, progress=show_bar, problems=rated)
        evaluated, errors, show_result = len(result.a.results), result.a.errors, _print_comparison
    else:
        result = evaluate(backend, index, queries, config_a, top_k=top_k, progress=show_bar, problems=rated)
        evaluated, errors, show_result = len(result.results), result.errors, _print_evaluation
    if as_json:
        echo_json(result.to_dict())
    else:
        show_result(result, show, explain_words)
    if not evaluated:
        raise InvalidInputError(_nothing_evaluated(ratings, errors))


def _nothing_evaluated(path: str, errors) -> str:
    if not errors:
        return f"{path} holds no rated queries"
    messages = {p.message for p in errors}
    if len(messages) == 1:  # e.g. every query failed the same way
        return f"no query could be evaluated: {errors[0]}"
    return f"no query could be evaluated ({len(errors)} problems, listed above; the first: {errors[0]})"


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"


def _fmt_hits(result) -> str:
    """Top hits marked: + relevant (with its grade), - judged non-relevant, ? not rated."""
    def mark(h):
        if h.grade is None:
            return f"{h.id}?"
        return f"{h.id}+{h.grade}" if h.grade >= 1 else f"{h.id}-"

    hits = " ".join(mark(h) for h in result.top[:SHOWN_HITS])
    return hits or "(no hits)"


def _fmt_tokens(result) -> str:
    """The strongest query tokens, then (``+``) the strongest tokens --expand added."""
    added = sorted(result.expanded_tokens, key=lambda e: -e.get("weight", 0))[:3]
    own = [f"{t}:{w:.2f}" for t, w in list(result.query_tokens.items())[:SHOWN_TOKENS - len(added)]]
    return " ".join(own + [f"+{e['token']}:{e['weight']:.2f}" for e in added])


def _rank(result) -> str:
    r = result.first_relevant_rank
    return str(r) if r else "none"


def _print_notes(common, results) -> None:
    """Notes every query's search gave, then how many queries have notes of their own."""
    for note in common:
        click.echo(f"note: {note}")
    own = {r.query.id for r in results if set(r.notes) - set(common)}
    if own:
        click.echo(f"note: {len(own)} quer{'y has' if len(own) == 1 else 'ies have'} notes of their own "
                   "(`--json` lists them per query)")


def _print_problems(errors, warnings) -> None:
    for title, problems in (("not evaluated", errors), ("warnings", warnings)):
        if problems:
            click.echo(f"\n{title} ({len(problems)}):")
            for p in problems:
                click.echo(f"  {p}")


def _print_grounding(labelled) -> None:
    """``labelled``: (query, [(label, QueryResult)]) for each listed query."""
    blocks = [(q, [(label, r) for label, r in runs if r.grounding]) for q, runs in labelled]
    blocks = [(q, runs) for q, runs in blocks if runs]
    if not blocks:
        click.echo("\n(the query encoder reports no word grounding)")
        return
    click.echo("\nhow the query words became tokens:")
    for q, runs in blocks:
        click.echo(f"  {q.query!r}")
        for label, r in runs:
            for step in r.grounding:
                click.echo(f"    {label}{step.get('explain') or step}")


def _print_evaluation(ev, show: int, explain_words: bool = False) -> None:
    n = len(ev.results)
    click.echo(f"{ev.index}: {n} quer{'y' if n == 1 else 'ies'} evaluated, top {ev.top_k} hits each, run as "
               f"`stair-es search` runs them{_with(ev.config)}")
    click.echo(table([(k, _fmt(v)) for k, v in ev.metrics.items()], ["metric", "mean"]))
    worst = ev.worst_first()[:show]
    if worst:
        click.echo(f"\nworst queries first ({len(worst)} of {n}; hits: + relevant with grade, - judged non-relevant, "
                   "? not rated):")
        rows = [(_rank(r), r.metrics["nDCG@10"], r.query.query + _where_note(r), _fmt_tokens(r), _fmt_hits(r))
                for r in worst]
        click.echo(table(rows, ["1st rel", "nDCG@10", "query", "query tokens", f"top {SHOWN_HITS} hits"], max_width=56))
        if explain_words:
            _print_grounding([(r.query, [("", r)]) for r in worst])
    _print_notes(ev.notes, ev.results)
    _print_problems(ev.errors, ev.warnings)


def _with(config) -> str:
    summary = config.summary()
    return "" if summary == config.DEFAULT_SUMMARY else f" with {summary}"


def _where_note(r) -> str:
    return f" [{' '.join(r.query.where)}]" if r.query.where else ""


def _print_comparison(cmp, show: int, explain_words: bool = False) -> None:
    a, b = cmp.a, cmp.b
    n = len(a.results)
    click.echo(f"{a.index}: {n} quer{'y' if n == 1 else 'ies'} evaluated under two configurations, top {a.top_k} hits each")
    click.echo(f"  A: `stair-es search`{_with(a.config)}")
    click.echo(f"  B: `stair-es search`{_with(b.config)}")
    rows = [(k, _fmt(a.metrics[k]), _fmt(b.metrics[k]),
             "-" if cmp.delta[k] is None else f"{cmp.delta[k]:+.4f}") for k in a.metrics]
    click.echo(table(rows, ["metric", "A", "B", "B - A"]))
    differ = [p for p in cmp.changed_first() if cmp.ranked_differently(p)]
    changed = differ[:show]
    if n and not differ:
        click.echo("\nno query is ranked differently under B")
    if changed:
        click.echo(f"\nqueries ranked differently, most changed first ({len(changed)} shown of {len(differ)} changed, "
                   f"{n} evaluated; 1st rel = rank of the first relevant hit):")
        rows = [(_rank(ra), _rank(rb), ra.metrics["nDCG@10"], rb.metrics["nDCG@10"], ra.query.query + _where_note(ra),
                 _fmt_tokens(ra), _fmt_tokens(rb)) for ra, rb in changed]
        click.echo(table(rows, ["A 1st rel", "B 1st rel", "A nDCG@10", "B nDCG@10", "query", "A query tokens",
                                "B query tokens"], max_width=44))
        if explain_words:
            _print_grounding([(ra.query, [("A: ", ra), ("B: ", rb)]) for ra, rb in changed])
    _print_notes([*a.notes, *(x for x in b.notes if x not in a.notes)], [*a.results, *b.results])
    _print_problems(a.errors, a.warnings)
