"""Re-ranking by meaning (stair_es.rerank, stair_es.encoders.sentence).

The fusion is checked with a sentence encoder whose embeddings are chosen by hand (so that which
picture "means" the query is known); the real encoder class is checked on a tiny BERT made here
(random weights, the shipped vocabulary): loading a folder, the ONNX export, the cached word table.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from stair_es import rerank
from stair_es.backends.embedded import EmbeddedBackend
from stair_es.cli.main import cli
from stair_es.errors import InvalidInputError
from stair_es.schema import Document, IndexSchema
from stair_es.search import QuerySpec, make_request
from stair_es.sparse import SparseVector
from stair_es.vocab import default_vocabulary

V = default_vocabulary()
#: what each word "means" in the hand-made embedding space: 4 directions
MEANING = {"sunset": 0, "dusk": 0, "volcano": 0, "orange": 0, "cat": 1, "animal": 1, "kitten": 1,
           "car": 2, "road": 2, "sky": 3, "cloud": 3}
DOCS = {
    "beach": {"beach": 2.0, "sea": 1.5, "sky": 1.0},       # carries "sky", a word of the query
    "volcano": {"volcano": 2.0, "orange": 1.0},            # carries no query word, but means "sunset"
    "cat": {"cat": 2.0, "animal": 1.0},
    "car": {"car": 2.0, "road": 1.0, "sky": 0.3},
    "dog": {"dog": 2.0, "animal": 1.0},
}


def unit(i: int, dims: int = 4) -> np.ndarray:
    v = np.zeros(dims, np.float32)
    v[i] = 1.0
    return v


class HandMadeSentences:
    """The sentence encoder's interface with chosen embeddings: a text means the direction of its
    first word that MEANING knows; every vocabulary word in MEANING has its direction, others none."""

    version = "hand-made"
    made = True  # its tower and word table are in the model cache (SentenceEncoder.prepared)

    def prepared(self):
        return self.made

    def embed(self, texts, batch_size=256):
        out = []
        for t in texts:
            dirs = [MEANING[w] for w in t.lower().split() if w in MEANING]
            out.append(unit(dirs[0]) if dirs else np.full(4, 0.5, np.float32))
        return np.stack(out)

    def word_table(self, vocab=None):
        words = sorted((V.id(w), w) for w in MEANING)
        ids = np.array([i for i, _ in words], np.int64)
        return ids, np.stack([unit(MEANING[w]) for _, w in words]).astype(np.float16)


@pytest.fixture
def home(tmp_path):
    backend = EmbeddedBackend(tmp_path / "home")
    backend.create_index("pics", IndexSchema(encoder={"name": "bow"}))
    assert not backend.ingest("pics", [Document(k, {"image": SparseVector.from_token_map(v)}) for k, v in DOCS.items()]).failures
    backend.close()
    return tmp_path / "home"


@pytest.fixture
def hand_made(monkeypatch):
    enc = HandMadeSentences()
    monkeypatch.setattr(rerank, "semantic_encoder", lambda mode, model=None: None if mode == "off" else enc)
    return enc


def ranked(backend, text, rerank_mode):
    request, _ = make_request(backend, "pics", QuerySpec(text=text, top_k=4))
    return rerank.search(backend, "pics", request, text, rerank=rerank_mode)


def test_a_picture_that_means_the_query_is_found_when_the_index_lacks_its_word(home, hand_made):
    backend = EmbeddedBackend(home)
    # no picture carries "sunset": plain search finds only what its grounding reaches
    assert "volcano" not in [h.id for h in ranked(backend, "sunset", "off").hits]
    result = ranked(backend, "sunset", "semantic")
    # the picture that means it (volcano, orange) became a candidate through the nearest words the index
    # holds, and with no query word in the index the meaning leads
    assert result.hits[0].id == "volcano"
    assert result.hits[0].retrievers["meaning"] == {"rank": 1, "score": 1.0}


def test_a_picture_that_means_the_query_moves_up(home, hand_made):
    backend = EmbeddedBackend(home)
    plain = ranked(backend, "sunset sky", "off")
    assert [h.id for h in plain.hits] == ["beach", "car"]  # only the pictures carrying "sky" match
    assert plain.hits[0].retrievers is None
    result = ranked(backend, "sunset sky", "semantic")
    order = [h.id for h in result.hits]
    assert order == ["beach", "volcano", "car"]  # third in sparse order (its candidate words weigh little), second now
    volcano = result.hits[1].retrievers
    assert volcano["sparse"]["rank"] == 3 and volcano["meaning"]["rank"] == 1
    assert any("re-ranked the best 3 hits" in n and "50% of the query's words" in n for n in result.notes)
    # the sparse scores shown are the query's own (what `explain` sums to), not the widened search's:
    # volcano carries no word of "sunset sky", so its own score is 0
    own = {h.id: h.score for h in plain.hits}
    assert {h.id: h.retrievers["sparse"]["score"] for h in result.hits} == pytest.approx({**own, "volcano": 0.0},
                                                                                         abs=1e-6)


def test_when_every_query_word_is_in_the_index_the_sparse_order_mostly_stands(home, hand_made):
    backend = EmbeddedBackend(home)
    result = ranked(backend, "cat", "semantic")
    assert result.hits[0].id == "cat" and result.hits[0].retrievers["sparse"]["rank"] == 1
    assert any("weight 0.10" in n for n in result.notes)


def test_auto_never_makes_the_model_behind_a_search_and_says_so(home, hand_made):
    """Making the int8 tower and word table takes PyTorch and about 20 s: `auto` leaves the hits in
    sparse order until `stair-es encoders export` has made them; `semantic` uses the model anyway."""
    backend = EmbeddedBackend(home)
    hand_made.made = False
    plain = ranked(backend, "sunset sky", "auto")
    assert plain.hits[0].retrievers is None
    assert any("not prepared in this data home" in n and "stair-es encoders export" in n for n in plain.notes)
    assert ranked(backend, "sunset sky", "semantic").hits[0].retrievers is not None


def test_rerank_off_is_the_backends_own_search(home, hand_made):
    backend = EmbeddedBackend(home)
    request, _ = make_request(backend, "pics", QuerySpec(text="sunset sky", top_k=4))
    assert [h.id for h in rerank.search(backend, "pics", request, "sunset sky", rerank="off").hits] == \
        [h.id for h in backend.search("pics", request).hits]


def test_auto_leaves_large_indices_in_sparse_order(home, hand_made, monkeypatch):
    monkeypatch.setattr(rerank, "AUTO_MAX_DOCS", 3)
    result = ranked(EmbeddedBackend(home), "sunset sky", "auto")
    assert [h.id for h in result.hits] == ["beach", "car"]
    assert any("not re-ranked by meaning" in n and "--rerank semantic" in n for n in result.notes)


def test_fused_order_weighs_meaning_by_the_share_of_words_the_index_lacks():
    meaning = np.array([0.1, 0.2, 0.9])  # the sparse order is 0, 1, 2; meaning prefers 2
    assert list(rerank.fused_order(meaning, held=1.0)[0]) == [0, 1, 2]
    assert rerank.fused_order(meaning, held=0.0)[0][0] == 2
    # equal sparse scores share their rank: the meaning decides between them
    assert list(rerank.fused_order(np.array([0.1, 0.9]), 1.0, np.array([3.0, 3.0]))[0]) == [1, 0]


def test_held_share_counts_kept_and_lemma_words():
    steps = [{"action": "kept"}, {"action": "lemma"}, {"action": "grounded"}, {"action": "not found"}]
    assert rerank.held_share(steps) == 0.5
    assert rerank.held_share([]) == 1.0


def test_candidate_words_stay_below_every_query_token(hand_made):
    vec = SparseVector.from_token_map({"sky": 2.0})
    from stair_es.query import SearchRequest, SparseClause

    req = SearchRequest([SparseClause("image", vec)], top_k=3)
    df = np.zeros(len(V), np.int64)
    df[[V.id("volcano"), V.id("sky"), V.id("cat")]] = 1
    wide = rerank.widened(req, hand_made.embed(["sunset"])[0], df, hand_made.word_table())
    got = dict(wide.clauses[0].vector.to_token_map())
    assert wide.top_k == rerank.WINDOW and got["sky"] == 2.0
    assert 0 < got["volcano"] <= rerank.CANDIDATE_WEIGHT * 2.0  # held and near "sunset"
    assert "cat" not in got and "orange" not in got  # far from the meaning / not in the index


def test_bad_rerank_values_are_refused():
    with pytest.raises(InvalidInputError, match="rerank must be one of auto, semantic, off"):
        rerank.check_rerank("maybe")


def test_semantic_without_the_model_says_what_to_install(monkeypatch, tmp_path):
    from stair_es.encoders import sentence

    monkeypatch.setenv("STAIR_ES_SENTENCE_MODEL", str(tmp_path / "nowhere"))
    with pytest.raises(Exception, match="not a sentence-transformers model folder"):
        rerank.semantic_encoder("semantic")
    monkeypatch.delenv("STAIR_ES_SENTENCE_MODEL")
    monkeypatch.setattr(sentence, "_package_folder", lambda: None)
    assert rerank.semantic_encoder("auto") is None  # auto never downloads behind a search


def test_cli_search_and_rank_eval_show_and_compare_the_reranking(home, hand_made, tmp_path):
    r = CliRunner().invoke(cli, ["search", "pics", "sunset sky", "--rerank", "semantic", "--json", "--home", str(home)],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["hits"][1]["id"] == "volcano" and out["hits"][1]["retrievers"]["meaning"]["rank"] == 1
    table = CliRunner().invoke(cli, ["search", "pics", "sunset sky", "--rerank", "semantic", "--home", str(home)],
                               catch_exceptions=False).output
    assert "meaning #" in table and "sparse score" in table
    ratings = tmp_path / "r.jsonl"
    ratings.write_text(json.dumps({"query": "sunset sky", "relevant": {"volcano": 1}}) + "\n")
    r = CliRunner().invoke(cli, ["rank-eval", "pics", str(ratings), "--rerank", "semantic", "--compare-rerank", "off",
                                 "--json", "--home", str(home)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["metrics"]["A"]["MRR@10"] == 0.5 and out["metrics"]["B"]["MRR@10"] == 0.0
    assert out["configs"]["B"]["rerank"] == "off"


# --- the real encoder class on a tiny BERT ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from stair_es.vocab import hf_tokenizer

    folder = tmp_path_factory.mktemp("tiny-minilm")
    cfg = transformers.BertConfig(vocab_size=len(V), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=80)
    transformers.BertModel(cfg).save_pretrained(folder, safe_serialization=True)
    hf_tokenizer(V).save(str(folder / "tokenizer.json"))
    return folder


def test_a_sentence_model_folder_gives_unit_embeddings_and_a_cached_word_table(tiny_model, monkeypatch, tmp_path):
    from stair_es.encoders.sentence import SentenceEncoder

    monkeypatch.setenv("STAIR_ES_MODEL_CACHE", str(tmp_path / "cache"))
    enc = SentenceEncoder(str(tiny_model))
    assert not enc.prepared()  # nothing made yet: `--rerank auto` would leave hits in sparse order
    e = enc.embed(["a cat on a sofa", "sunset", "a cat on a sofa"])
    assert e.shape == (3, 16) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert np.allclose(e[0], e[2]) and not np.allclose(e[0], e[1])
    torch_side = SentenceEncoder(str(tiny_model), runtime="torch").embed(["a cat on a sofa"])
    assert float(torch_side[0] @ e[0]) > 0.99  # the int8 ONNX tower computes nearly what PyTorch does
    assert enc.version.endswith("-int8") and list((tmp_path / "cache").glob("sentence-minilm-int8-*.onnx"))
    ids, table = enc.word_table()
    assert table.shape == (ids.size, 16) and V.id("sunset") in set(ids.tolist())
    assert list((tmp_path / "cache").glob("sentence-words-*.npy"))

    def no_second_computation(texts, batch_size=256):
        raise AssertionError("the word table was computed again")

    again = SentenceEncoder(str(tiny_model))
    assert again.prepared()  # tower and word table made: usable under `auto`
    monkeypatch.setattr(again, "embed", no_second_computation)
    assert np.array_equal(again.word_table()[1], table)


def test_vectors_of_reads_the_hits_tokens_back_on_every_backend(home, memory_backend):
    embedded = EmbeddedBackend(home)
    got = embedded.vectors_of("pics", ["volcano", "gone", "cat"], "image")
    assert got[1] is None
    assert got[0] == embedded.get("pics", "volcano").vectors["image"] and got[2].to_token_map() == pytest.approx(DOCS["cat"])
    memory_backend.create_index("pics", IndexSchema())  # a backend with the base class's way (one get per id)
    memory_backend.ingest("pics", [Document("cat", {"image": SparseVector.from_token_map(DOCS["cat"])})])
    assert memory_backend.vectors_of("pics", ["cat", "gone"], "image") == [got[2], None]


def test_auto_reranks_indices_elsewhere_with_the_frequencies_the_query_was_encoded_with(home, hand_made,
                                                                                       memory_backend, monkeypatch):
    """On a backend that is not this machine's (a cluster: document frequencies are a scan there),
    `auto` re-ranks when the query encoder already read them, and does not ask again."""
    memory_backend.create_index("pics", IndexSchema(encoder={"name": "bow"}))
    memory_backend.ingest("pics", [Document(k, {"image": SparseVector.from_token_map(v)}) for k, v in DOCS.items()])
    request, _ = make_request(memory_backend, "pics", QuerySpec(text="sunset sky", top_k=4))
    assert request.doc_freqs is not None  # the bow encoder grounds its words on them
    asked = []
    real = memory_backend.doc_freqs
    monkeypatch.setattr(memory_backend, "doc_freqs", lambda *a: asked.append(a) or real(*a))
    result = rerank.search(memory_backend, "pics", request, "sunset sky", rerank="auto")
    assert [h.id for h in result.hits] == [h.id for h in ranked(EmbeddedBackend(home), "sunset sky", "auto").hits]
    assert result.hits[1].retrievers["meaning"]["rank"] == 1 and not asked
    # a request that carries none (its encoder needed no frequencies) stays in sparse order there
    plain = rerank.search(memory_backend, "pics", dataclasses.replace(request, doc_freqs=None), "sunset sky", rerank="auto")
    assert all(h.retrievers is None for h in plain.hits) and not asked
    assert any("--rerank semantic re-ranks anyway" in n for n in plain.notes)


def _served(home, **config):
    from fastapi.testclient import TestClient

    from stair_es.serve.app import create_app
    from stair_es.serve.service import ServeConfig

    cfg = ServeConfig(backend="embedded", backend_options={"home": str(home)}, encoder="bow", default_index="pics",
                      allowed_hosts=["testserver"], **config)
    return TestClient(create_app(cfg))


@pytest.mark.parametrize("batching", ["on", "off"])
def test_serve_grounds_and_reranks_text_searches_as_the_cli_does(home, hand_made, batching):
    """`POST /v1/search` answers a text query with the CLI's hits in the CLI's order: its words
    grounded on the index's (grounding steps in the answer), its best hits re-ranked by meaning."""
    cli_hits = ranked(EmbeddedBackend(home), "sunset sky", "semantic").hits
    with _served(home, rerank="semantic", batching=batching) as c:
        r = c.post("/v1/search", json={"text": "sunset sky", "top_k": 4})
        assert r.status_code == 200, r.text
        data = r.json()
        assert [h["id"] for h in data["hits"]] == [h.id for h in cli_hits] == ["beach", "volcano", "car"]
        assert data["hits"][1]["retrievers"]["meaning"]["rank"] == 1
        assert [h["score"] for h in data["hits"]] == pytest.approx([h.score for h in cli_hits])
        assert {s["word"]: s["action"] for s in data["grounding"]}["sky"] == "kept"
        assert any(s["word"] == "sunset" and s["action"] != "kept" for s in data["grounding"])
        assert any("re-ranked the best 3 hits" in n for n in data["notes"])
        # a request may ask for the sparse order; explain scores the sparse request either way
        plain = c.post("/v1/search", json={"text": "sunset sky", "top_k": 4, "rerank": "off"}).json()
        assert [h["id"] for h in plain["hits"]] == ["beach", "car"] and "retrievers" not in plain["hits"][0]
        exp = c.post("/v1/explain", json={"text": "sunset sky", "id": "beach"}).json()
        assert exp["score"] == pytest.approx(plain["hits"][0]["score"])
        assert c.post("/v1/search", json={"text": "sky", "rerank": "sometimes"}).status_code == 422


def test_serve_leaves_token_queries_and_large_indices_in_sparse_order(home, hand_made, monkeypatch):
    with _served(home, rerank="auto") as c:
        tokens = c.post("/v1/search", json={"tokens": {"sky": 1.0}, "top_k": 4}).json()
        assert [h["id"] for h in tokens["hits"]] == ["beach", "car"] and not any("re-ranked" in n for n in tokens["notes"])
        monkeypatch.setattr(rerank, "AUTO_MAX_DOCS", 3)
        big = c.post("/v1/search", json={"text": "sunset sky", "top_k": 4}).json()
        assert [h["id"] for h in big["hits"]] == ["beach", "car"]
        assert any("not re-ranked by meaning" in n and "--rerank semantic" in n for n in big["notes"])


def test_serve_answers_each_text_of_a_batch_alone_when_one_has_nothing_to_search(home, hand_made):
    """A batch's texts are encoded in one call; a text with nothing to search in the index (no
    word it holds, no relative) gets its 400 alone, and the others their hits."""
    from stair_es.serve.service import Service, ServeConfig

    svc = Service(ServeConfig(backend="embedded", backend_options={"home": str(home)}, default_index="pics",
                              rerank="off"))
    out = svc.search_many([{"text": "sky", "top_k": 4}, {"text": "zzxqv", "top_k": 4}, {"text": "cat", "top_k": 4}])
    assert [h["id"] for h in out[0]["hits"]][:1] == ["beach"] and [h["id"] for h in out[2]["hits"]][:1] == ["cat"]
    assert isinstance(out[1], InvalidInputError) and "no searchable tokens" in str(out[1])


def test_serve_on_a_backend_without_commits_counts_document_frequencies_once_a_minute(hand_made, memory_backend,
                                                                                      monkeypatch):
    """On a cluster, document frequencies are a scan of the index: the server's text searches (IDF,
    grounding, re-ranking) use one count for a minute instead of scanning for every query."""
    from stair_es.serve import service as service_module
    from stair_es.serve.service import Service, ServeConfig

    memory_backend.create_index("pics", IndexSchema(encoder={"name": "bow"}))
    memory_backend.ingest("pics", [Document(k, {"image": SparseVector.from_token_map(v)}) for k, v in DOCS.items()])
    asked = []
    real = memory_backend.doc_freqs
    monkeypatch.setattr(memory_backend, "doc_freqs", lambda *a: asked.append(a) or real(*a))
    svc = Service(ServeConfig(backend="memory", default_index="pics", rerank="semantic"), backend=memory_backend)
    clock = [1000.0]
    monkeypatch.setattr(service_module.time, "monotonic", lambda: clock[0])
    first = svc.search({"text": "sunset sky", "top_k": 4})
    assert [h["id"] for h in first["hits"]] == ["beach", "volcano", "car"]
    svc.search({"text": "cat", "top_k": 4})
    assert len(asked) == 1
    clock[0] += service_module.UNVERSIONED_TTL_S
    svc.search({"text": "cat", "top_k": 4})
    assert len(asked) == 2


def test_each_query_is_embedded_alone_so_its_hits_do_not_depend_on_its_batch(home, hand_made, monkeypatch):
    """The int8 sentence model quantises a call's activations with one scale, so a text embedded
    with others gets another embedding: a batch of searches embeds each text alone."""
    calls = []
    real = hand_made.embed

    def spy(texts, batch_size=256):
        calls.append((len(texts), batch_size))
        return real(texts, batch_size)

    monkeypatch.setattr(hand_made, "embed", spy)
    backend = EmbeddedBackend(home)
    queries = [("pics", make_request(backend, "pics", QuerySpec(text=t, top_k=4))[0], t, "semantic")
               for t in ("sunset sky", "cat", "car road")]
    plans = rerank.plan_many(backend, queries)
    assert all(p.reranking is not None for p in plans)
    assert calls and all(batch_size == 1 for _, batch_size in calls)
