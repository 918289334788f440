"""`stair-es rank-eval` on the Elasticsearch (noida-db) and OpenSearch (osmem-server) emulators:
the same ratings give the same figures as on the embedded engine (the tiny corpus's weights keep
their order under the engines' 9-bit stored precision). Evidence, not proof: the emulators were
written by others.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from stair_es.backends.base import get_backend
from stair_es.cli.main import cli

pytest.importorskip("ir_measures", reason="rank-eval needs the 'eval' extra (ir-measures)")

from test_rank_eval import DOCS, MEAN, RATINGS, build, write  # noqa: E402  (tests/ is on the path)

pytestmark = pytest.mark.process

INDEX = "stair-rank-eval"


@pytest.fixture
def cluster_index(cluster):
    from stair_es.schema import Document, IndexSchema
    from stair_es.sparse import SparseVector

    name, url = cluster
    backend = get_backend(name, urls=url, timeout=60)
    try:
        backend.delete_index(INDEX)
    except Exception:  # noqa: BLE001 - absent
        pass
    backend.create_index(INDEX, IndexSchema(fields={"kind": "keyword"}, encoder={"name": "bow"}))
    docs = []
    for doc_id, (image, caption, kind) in DOCS.items():
        vectors = {"image": SparseVector.from_token_map(image)}
        if caption:
            vectors["caption"] = SparseVector.from_token_map(caption)
        docs.append(Document(doc_id, vectors, {"kind": kind}))
    assert not backend.ingest(INDEX, docs).failures
    yield name, url
    backend.delete_index(INDEX)
    backend.close()


def test_rank_eval_on_a_cluster_agrees_with_the_embedded_engine(cluster_index, tmp_path):
    name, url = cluster_index
    ratings = write(tmp_path / "r.jsonl", [*RATINGS, {"query": "boat", "relevant": {"boat-photo": 1}, "id": "boat"},
                                           "not json"])
    r = CliRunner().invoke(cli, ["rank-eval", INDEX, str(ratings), "--json", "--backend", name, "--url", url])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [e["line"] for e in out["errors"]] == [5] and [w["line"] for w in out["warnings"]] == [3]
    # the three hand-checked queries give the hand-worked figures; the boat photo (caption) comes first
    by_id = {q["id"]: q for q in out["queries"]}
    assert by_id["boat"]["first_relevant_rank"] == 1
    three = [by_id[i]["metrics"] for i in ("line-1", "cats", "line-3")]
    assert {k: sum(m[k] for m in three) / 3 for k in MEAN} == pytest.approx(MEAN, abs=1e-9)
    home = tmp_path / "home"
    build(home, INDEX)
    embedded = json.loads(CliRunner().invoke(cli, ["rank-eval", INDEX, str(ratings), "--json", "--home", str(home)]).stdout)
    assert out["metrics"] == pytest.approx(embedded["metrics"], abs=1e-9)
    for c, e in zip(out["queries"], embedded["queries"]):
        assert [h["id"] for h in c["top"]] == [h["id"] for h in e["top"]]
        assert set(c["query_tokens"]) == set(e["query_tokens"])

    r = CliRunner().invoke(cli, ["rank-eval", INDEX, str(ratings), "--compare-caption-weight", "0", "--json",
                                 "--backend", name, "--url", url])
    assert r.exit_code == 0, r.output
    cmp = json.loads(r.stdout)
    first = cmp["queries"][0]
    assert first["id"] == "boat" and (first["A"]["first_relevant_rank"], first["B"]["first_relevant_rank"]) == (1, 2)
