"""`stair-es neighbours`: IMAGINATOR-style co-occurrence (PPMI) neighbours of a token in an index."""

from __future__ import annotations

import click

from stair_es.neighbours import neighbours as find_neighbours

from .common import backend_options, echo_json, json_option, table


@click.command("neighbours")
@click.argument("index")
@click.argument("token")
@click.option("--top", "-n", default=10, show_default=True, type=click.IntRange(min=1), help="Neighbours to show.")
@click.option("--min-count", default=1, show_default=True, type=click.IntRange(min=1),
              help="Only pairs sharing at least this many documents (one shared document is mostly chance).")
@json_option
@backend_options
def neighbours(index, token, top, min_count, as_json, backend) -> None:
    """The image tokens that go with TOKEN in INDEX, by PPMI over its documents.

    Two lists: TOKEN as a caption word -> image tokens of the same documents (what the query
    expansion of `stair-es search --expand N` adds), and TOKEN as an image token -> other image
    tokens. PPMI = max(0, log(c * N / (n_token * n_neighbour))) with c the documents holding
    both; NPMI = PPMI / -log(c / N). On the embedded engine the statistics are stored with the
    index (neighbours.stats), kept current by ingest and delete, and recomputed from a scan when
    out of date; on a cluster they come from a scan (docs/neighbours.md).

    \b
      stair-es neighbours samples cat
      stair-es neighbours samples cat --top 5 --min-count 1 --json
    """
    rep = find_neighbours(backend, index, token, top=top, min_count=min_count)
    if as_json:
        echo_json(rep.to_dict())
        return
    click.echo(f"{rep.token!r} in {rep.index!r}: {rep.n_docs} documents, {rep.n_captioned} with captions; "
               f"in {rep.word_docs} captions, in {rep.image_docs} image vectors")
    headers = ["neighbour", "ppmi", "npmi", "both", "token", "neighbour docs"]
    for title, rows in ((f"as a caption word -> image tokens (of {rep.n_captioned} captioned documents)", rep.as_word),
                        (f"as an image token -> image tokens (of {rep.n_docs} documents)", rep.as_image)):
        click.echo(f"\n{title}:")
        if rows:
            from stair_es.vocab import default_vocabulary

            vocab = default_vocabulary()
            click.echo(table([(vocab.token(n.token_id), n.ppmi, n.npmi, n.count, n.count_x, n.count_y) for n in rows],
                             headers))
        else:
            click.echo("  none")
    for n in rep.notes:
        click.echo(f"note: {n}")
