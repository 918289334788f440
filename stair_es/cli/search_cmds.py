"""`stair-es search` and `stair-es explain`: text or token-map queries with filters and token clauses."""

from __future__ import annotations

from typing import Any, Callable

import click

from stair_es.search import QuerySpec, make_request

from .common import (backend_options, display_value, echo_json, encoder_kwargs, encoder_options, json_option, options,
                     RERANK_AUTO_WHEN, rerank_option, table)

query_options = options(
    click.option("--tokens", "token_map", metavar="JSON",
                 help='Query with a given token map instead of text, e.g. \'{"dog": 1.2, "beach": 0.4}\'.'),
    click.option("--image", "image_path", type=click.Path(dir_okay=False), metavar="FILE",
                 help="Query by example: the image's own tokens (encoded as the index's images are) are the query."),
    click.option("--where", "wheres", multiple=True, metavar="COND",
                 help="Metadata filter, repeatable (ANDed): FIELD=VALUE, FIELD=A|B, FIELD!=VALUE, FIELD<N, "
                      "FIELD>=N (numbers, dates), 'FIELD exists', prefix ! to negate."),
    click.option("--require", "requires", multiple=True, metavar="WORD",
                 help="Whitelist: documents must contain WORD's tokens (any of the --require words; "
                      "all with --require-all). Quote an exact token: '\"##s\"'."),
    click.option("--require-all", is_flag=True, help="Documents must contain every --require word."),
    click.option("--exclude", "excludes", multiple=True, metavar="WORD",
                 help="Index-side blacklist: drop documents containing WORD's tokens."),
    click.option("--exclude-query", "query_excludes", multiple=True, metavar="WORD",
                 help="Query-side blacklist: remove WORD's tokens from the query."),
    click.option("--expr", metavar="EXPR", help="Boolean token filter, e.g. 'dog AND (beach OR park) NOT cat'."),
    click.option("--token-field", default="image", show_default=True,
                 help="Sparse field that --require/--exclude/--expr look at."),
    click.option("--caption-weight", default=0.5, show_default=True, type=float,
                 help="Weight of the match against caption tokens (0 = images only)."),
    click.option("--image-weight", default=1.0, show_default=True, type=float,
                 help="Weight of the match against image tokens."),
    click.option("--top-k", "-k", default=10, show_default=True, help="Number of hits."),
    click.option("--query-top-k", type=int, help="Keep only the N strongest query tokens."),
    click.option("--min-weight", type=float, help="Drop query tokens weighing less than this."),
    click.option("--expand", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
                 help="Add each query token's N best image-token neighbours by PPMI (co-occurrence of caption "
                      "words and image tokens in this index; see `stair-es neighbours`), weighted "
                      "--expand-weight x query weight x NPMI."),
    click.option("--expand-weight", type=click.FloatRange(min=0, min_open=True), default=0.5, show_default=True,
                 help="Weight of an expansion token whose PPMI is maximal (NPMI = 1), relative to its query token."),
    click.option("--expand-min-count", type=click.IntRange(min=1), default=2, show_default=True,
                 help="Expansion neighbours must share at least this many captioned documents with the token."),
    click.option("--force", is_flag=True,
                 help="Search even if the index was built with another version of its encoder "
                      "(token map, weights); results may be poorer until you re-ingest."),
)


hybrid_options = options(
    click.option("--hybrid", is_flag=True,
                 help="Hybrid search: fuse the learned sparse ranking with BM25 over the documents' caption and "
                      "keyword metadata (needs TEXT), and with dense vectors if --retrievers names them."),
    click.option("--retrievers", metavar="LIST",
                 help="Which retrievers --hybrid fuses, comma-separated, from sparse, bm25, dense "
                      "(e.g. sparse,bm25,dense; implies --hybrid) [default: sparse,bm25]. dense needs an index "
                      "with dense vectors; its query is TEXT through the index's dense model, or --vector-file."),
    click.option("--vector-file", type=click.Path(dir_okay=False), metavar="FILE",
                 help="The dense retriever's query vector: a JSON list of numbers (or {\"vector\": [...]}) or a .npy file."),
    click.option("--fusion", type=click.Choice(["rrf", "linear"]), default="rrf", show_default=True,
                 help="How --hybrid fuses the rankings: reciprocal rank fusion, or min-max normalised weighted sum."),
    click.option("--rrf-k", type=int, default=60, show_default=True, help="RRF rank constant k: score = sum 1/(k + rank)."),
    click.option("--weights", default=None, metavar="W1,W2[,W3]",
                 help="Weights of the normalised scores for --fusion linear, one per retriever in --retrievers "
                      "order (scaled to sum to 1) [default: equal]."),
    click.option("--window", type=int, help="Candidates taken from each retriever before fusion [default: max(100, top-k)]."),
)


_HYBRID_KEYS = ("hybrid", "retrievers", "vector_file", "fusion", "rrf_k", "weights", "window")


def _hybrid_opts(text, q):
    """(HybridOptions, dense query vector or None) from the --hybrid options, taken out of the
    command's keyword arguments ``q``; (None, None) without a hybrid search."""
    hybrid, retrievers, vector_file, fusion, rrf_k, weights, window = (q.pop(k) for k in _HYBRID_KEYS)
    if not (hybrid or retrievers or vector_file):
        return None, None
    from stair_es.fusion import parse_weights
    from stair_es.hybrid import DEFAULT_RETRIEVERS, HybridOptions, parse_retrievers

    names = parse_retrievers(retrievers) if retrievers else DEFAULT_RETRIEVERS
    if "bm25" in names and not text:
        raise click.UsageError("--hybrid needs a query TEXT for its bm25 retriever (BM25 searches the documents' text); or leave bm25 out of --retrievers")
    if "dense" in names and not text and not vector_file:
        raise click.UsageError("the dense retriever needs a query TEXT (encoded by the index's dense model) or --vector-file")
    if vector_file and "dense" not in names:
        raise click.UsageError("--vector-file is the dense retriever's query: add dense to --retrievers, e.g. --retrievers sparse,dense")
    vector = None
    if vector_file:
        from stair_es.dense import read_vector_file

        vector = read_vector_file(vector_file)
    w = parse_weights(weights, len(names), names) if weights else None
    return HybridOptions(fusion, rrf_k, w, window, retrievers=names), vector


def _make_request(backend, index, text, *, token_map=None, image_path=None, model=None, encoder_opts=(), **spec):
    """The CLI's query options as one :class:`stair_es.search.QuerySpec` (the options named as its
    fields go in as they are), turned into a request by the library."""
    spec = QuerySpec(text=text or None, tokens=token_map or None, image=image_path or None,
                     encoder_options=encoder_kwargs(model, encoder_opts), **spec)
    return make_request(backend, index, spec)


@click.command("search")
@click.argument("index")
@click.argument("text", required=False)
@query_options
@click.option("--explain", "explain_hits", is_flag=True,
              help="Show each hit's per-token contributions (with --hybrid: also each retriever's rank and score) and, "
                   "on the embedded engine, which exact strategy searched each segment and why.")
@hybrid_options
@rerank_option("--rerank", "Re-rank the best 100 hits of a text query by meaning (a sentence model, all-MiniLM-L6-v2): "
               f"auto (the default, or $STAIR_ES_RERANK) {RERANK_AUTO_WHEN} (on a cluster: when the query encoder read "
               "its document frequencies, which are a scan there), semantic to require it on any index, off for the "
               "plain sparse order. Not with --hybrid.")
@encoder_options(default=None)
@json_option
@backend_options
def search(index, text, explain_hits, rerank, as_json, backend, **q) -> None:
    """Search INDEX with TEXT (or --tokens), filters and token clauses.

    The score is the dot product of the query's token weights with each document's image
    tokens (plus --caption-weight times its caption tokens). Examples:

    \b
      stair-es search samples "a cat"
      stair-es search samples "space" --where kind=photo --exclude rocket
      stair-es search samples "animal" --require cat --explain
      stair-es search samples "coffee" --expr 'cup OR espresso' --json
      stair-es search samples --image my-cat.jpg        # query by example image
      stair-es search samples "a giraffe" --explain       # how each word was grounded
      stair-es search samples "a red car" --hybrid --fusion rrf --explain
      stair-es search samples "coffee cup" --hybrid --fusion linear --weights 0.7,0.3
      stair-es search shop "a red shoe" --retrievers sparse,bm25,dense

    A query word the index does not hold is searched through its WordNet relatives that it
    does hold ("giraffe" -> mammal), never as WordPiece fragments; the lines "grounding: ..."
    say how (every word with --explain; "grounding" in --json). --encoder-option
    grounding=off searches the words as they are.

    A text query's best 100 hits are re-ranked by what it means when the sentence model is
    installed (--rerank; the "meaning" columns show the cosine and its rank, "sparse" the dot
    product): better first hits for queries whose words the index lacks.

    With --hybrid, the ranking fuses the sparse scores above with BM25 over each document's
    caption and keyword metadata, and with dense vectors when --retrievers names them (RRF, or a
    min-max normalised weighted sum).
    """
    opts, vector = _hybrid_opts(text, q)
    if opts is None and text:
        from stair_es.rerank import prepare

        prepare(rerank)  # the sentence model loads while the query is encoded and searched
    request, qvec = _make_request(backend, index, text, **q)
    if opts is not None:
        from stair_es.hybrid import hybrid_search

        result = hybrid_search(backend, index, request, text, opts, explain=explain_hits, vector=vector)
    else:
        from stair_es.rerank import search as reranked_search

        result = reranked_search(backend, index, request, text, rerank=rerank)
    explanations = {h.id: backend.explain(index, h.id, request) for h in result.hits} if explain_hits else {}
    if as_json:
        data = {**result.to_dict(), "query_tokens": qvec.to_token_map(50), "grounding": request.grounding}
        if getattr(result, "plan", None) is not None:  # the embedded engine: each segment's strategy and why
            data["plan"] = result.plan.to_dict()
        if request.expansion:
            data["expanded_tokens"] = list(request.expansion.values())
        for h in data["hits"]:
            if h["id"] in explanations:
                h["explanation"] = explanations[h["id"]].to_dict()
                for c in h["explanation"]["contributions"]:
                    _mark_expansion(c, request.expansion)
        echo_json(data)
        return
    shown = [(t, w) for t, w in request.clauses[0].vector.top(12 + len(request.expansion)) if t not in request.expansion]
    click.echo(f"query tokens: {_fmt_tokens(shown[:12])}")
    _print_grounding(request.grounding, every_word=explain_hits)
    if request.expansion:
        click.echo(f"expanded tokens: {_fmt_expansion(request.expansion)}")
    for n in result.notes:
        click.echo(f"note: {n}")
    if not result.hits:
        click.echo("no hits")
        return
    if any(h.retrievers for h in result.hits):
        def part(h, r, key):
            v = (h.retrievers or {}).get(r, {}).get(key)
            return "-" if v is None else v

        names = [r for r in ("sparse", "bm25", "dense", "meaning") if any(r in (h.retrievers or {}) for h in result.hits)]
        rows = [(i + 1, h.id, h.score, *[part(h, r, key) for r in names for key in ("rank", "score")], h.caption or "")
                for i, h in enumerate(result.hits)]
        click.echo(table(rows, ["#", "id", "fused", *[f"{r} {c}" for r in names for c in ("#", "score")], "caption"],
                         max_width=40))
    else:
        rows = [(i + 1, h.id, h.score, h.caption or "", _fmt_meta(h.metadata)) for i, h in enumerate(result.hits)]
        click.echo(table(rows, ["#", "id", "score", "caption", "metadata"], max_width=48))
    source_of = _token_sources(backend.index_info(index).schema) if explanations else None
    for h in result.hits:
        if h.id in explanations:
            click.echo("")
            _print_explanation(explanations[h.id], limit=8, source_of=source_of, expansion=request.expansion)
    if explain_hits and getattr(result, "plan", None) is not None:
        click.echo("")
        for line in result.plan.lines():
            click.echo(f"searched {line}")
    total = "" if result.total is None else f"{result.total} matching, "
    click.echo(f"({total}{result.took_ms:.1f} ms)")


@click.command("explain")
@click.argument("index")
@click.argument("doc_id")
@click.argument("text", required=False)
@query_options
@click.option("--limit", default=20, show_default=True, help="Rows to show.")
@hybrid_options
@encoder_options(default=None)
@json_option
@backend_options
def explain(index, doc_id, text, limit, as_json, backend, **q) -> None:
    """Why DOC_ID scores what it does for TEXT (or --tokens); without a query, its top tokens.

    Each row is one token: query weight x document weight = contribution; the rows sum to the score.
    With --hybrid, also the document's rank and score in each retriever and in the fused ranking.
    """
    if not text and not q.get("token_map") and not q.get("image_path"):
        doc = backend.get(index, doc_id)
        data = {f: v.to_token_map(limit) for f, v in doc.vectors.items()}
        if as_json:
            echo_json({"id": doc.id, "top_tokens": data, "metadata": doc.metadata, "caption": doc.caption})
            return
        for f, tm in data.items():
            click.echo(f"{f} tokens of {doc.id!r} ({doc.vectors[f].nnz} non-zero):")
            click.echo("  " + _fmt_tokens(tm.items()))
        return
    opts, vector = _hybrid_opts(text, q)
    request, _ = _make_request(backend, index, text, **q)
    exp = backend.explain(index, doc_id, request)
    fused = None
    if opts is not None:
        from dataclasses import replace

        from stair_es.hybrid import hybrid_search

        win = opts.window or max(100, request.top_k)
        opts = replace(opts, window=win)
        res = hybrid_search(backend, index, replace(request, top_k=win), text, opts, explain=True, vector=vector)
        rank = next((i for i, h in enumerate(res.hits, start=1) if h.id == doc_id), None)
        hit = res.hits[rank - 1] if rank else None
        fused = {"rank": rank, "score": hit.score if hit else None,
                 "retrievers": hit.retrievers if hit else {r: {"rank": None, "score": None} for r in opts.retrievers},
                 "window": win, "notes": res.notes}
    source_of = _token_sources(backend.index_info(index).schema)
    if as_json:
        data = {**exp.to_dict(), "grounding": request.grounding}
        if fused is not None:
            data["hybrid"] = fused
        for c in data.get("contributions", []):
            if c.get("field") == "image" and source_of(c.get("token", "")):
                c["sources"] = source_of(c["token"])
            _mark_expansion(c, request.expansion)
        echo_json(data)
        return
    if fused is not None:
        def fmt(r):
            return "not in its top %d" % fused["window"] if r.get("rank") is None else f"rank {r['rank']} (score {r['score']:.4f})"

        where = (f"fused rank {fused['rank']} (score {fused['score']:.4f})" if fused["rank"]
                 else f"not in the fused top {fused['window']}")
        parts = "; ".join(f"{r}: {fmt(v)}" for r, v in fused["retrievers"].items())
        click.echo(f"hybrid: {where}; {parts}")
    _print_grounding(request.grounding, every_word=True)
    _print_explanation(exp, limit=limit, source_of=source_of, expansion=request.expansion)


def _print_grounding(grounding: list, every_word: bool) -> None:
    """How the query's words became tokens on this index (stair_es.encoders.grounding): the
    words the index lacks always, every word with --explain."""
    for step in grounding:
        if every_word or step.get("action") != "kept":
            click.echo(f"grounding: {step['explain']}")


def _is_expanded(field: str, token: str, expansion: dict) -> bool:
    return field == "image" and token in expansion


def _mark_expansion(c: dict, expansion: dict) -> None:
    """JSON: each contribution says whether it comes from the query or from expansion (and which token)."""
    if _is_expanded(c.get("field", ""), c.get("token", ""), expansion):
        c["kind"], c["expanded_from"] = "expanded", expansion[c["token"]]["from"]
    else:
        c["kind"] = "query"


def _fmt_expansion(expansion: dict) -> str:
    return " ".join(f"{e['token']}:{e['weight']:.2f}(<-{e['from']})" for e in expansion.values())


def _token_sources(schema) -> Callable[[str], list[str]]:
    """token -> the image token sources that can produce it (``imagenet``, ``colour``), from the
    index's recorded encoder; an empty list when the encoder has no named sources."""
    config = dict(schema.encoder or {})
    if config.pop("name", None) != "default":
        return lambda token: []
    from stair_es.encoders import get_encoder
    from stair_es.errors import StairError

    try:
        enc = get_encoder("default", **{**config, "text": "bow", "allow_version_mismatch": True})
    except (StairError, TypeError):
        return lambda token: []
    return enc.token_sources


def _print_explanation(exp, limit: int, source_of: Callable[[str], list[str]] | None = None,
                       expansion: dict | None = None) -> None:
    if expansion:
        _print_expanded_explanation(exp, limit, expansion)
        return
    status = "" if exp.matched_filter else "  (does NOT pass the filter)"
    click.echo(f"{exp.doc_id}: score {exp.score:.4f} = sum of {len(exp.contributions)} token contributions{status}")
    shown = exp.contributions[:limit]
    if source_of is not None and any(c.field == "image" and source_of(c.token) for c in shown):
        rows = [(c.field, c.token, "+".join(source_of(c.token)) if c.field == "image" else "", c.query_weight,
                 c.doc_weight, c.contribution) for c in shown]
        click.echo(table(rows, ["field", "token", "source", "query w", "doc w", "contribution"]))
    elif shown:
        rows = [(c.field, c.token, c.query_weight, c.doc_weight, c.contribution) for c in shown]
        click.echo(table(rows, ["field", "token", "query w", "doc w", "contribution"]))
    if len(exp.contributions) > limit:
        rest = sum(c.contribution for c in exp.contributions[limit:])
        click.echo(f"... {len(exp.contributions) - limit} more tokens contribute {rest:.4f}")
    for n in exp.notes:
        click.echo(f"note: {n}")


def _print_expanded_explanation(exp, limit: int, expansion: dict) -> None:
    """The query's own tokens and the expansion tokens in two tables, each with its subtotal."""
    status = "" if exp.matched_filter else "  (does NOT pass the filter)"
    ranked = sorted(exp.contributions, key=lambda c: -c.contribution)
    own = [c for c in ranked if not _is_expanded(c.field, c.token, expansion)]
    added = [c for c in ranked if _is_expanded(c.field, c.token, expansion)]
    click.echo(f"{exp.doc_id}: score {exp.score:.4f} = {sum(c.contribution for c in own):.4f} from {len(own)} query "
               f"tokens + {sum(c.contribution for c in added):.4f} from {len(added)} expanded tokens{status}")
    for title, rows in (("query tokens", own), ("expanded tokens", added)):
        if not rows:
            click.echo(f"  {title}: none match")
            continue
        click.echo(f"  {title}:")
        shown = rows[:limit]
        if rows is added:
            cells = [(c.token, expansion[c.token]["from"], expansion[c.token]["ppmi"], c.query_weight, c.doc_weight,
                      c.contribution) for c in shown]
            out = table(cells, ["token", "from", "ppmi", "query w", "doc w", "contribution"])
        else:
            out = table([(c.field, c.token, c.query_weight, c.doc_weight, c.contribution) for c in shown],
                        ["field", "token", "query w", "doc w", "contribution"])
        click.echo("\n".join("  " + line for line in out.splitlines()))
        if len(rows) > limit:
            click.echo(f"  ... {len(rows) - limit} more contribute {sum(c.contribution for c in rows[limit:]):.4f}")
    for n in exp.notes:
        click.echo(f"note: {n}")


def _fmt_tokens(items) -> str:
    return " ".join(f"{t}:{w:.2f}" for t, w in items)


def _fmt_meta(meta: dict[str, Any]) -> str:
    return " ".join(f"{k}={display_value(v)}" for k, v in sorted(meta.items()))
