"""`stair-es serve --debug-stats`: where a request's time went, off by default."""

from __future__ import annotations

from fastapi.testclient import TestClient

from stair_es.serve.app import create_app

from .conftest import API_KEY, make_config


def _timing(header: str) -> dict[str, float]:
    out = {}
    for part in header.split(","):
        name, *params = [p.strip() for p in part.split(";")]
        out[name] = next(float(p[4:]) for p in params if p.startswith("dur="))
    return out


def test_every_search_answer_says_where_its_time_went(client):
    r = client.post("/v1/search", json={"text": "red", "top_k": 2})
    assert r.status_code == 200
    t = _timing(r.headers["server-timing"])
    assert {"pre", "queue", "prepare", "wait", "search", "engine", "engine_cpu", "answer", "answer_cpu", "deliver",
            "app"} <= set(t)
    assert all(v >= 0 for v in t.values())
    assert t["search"] + 0.05 >= t["engine"] + t["answer"] - 0.05  # the thread's run holds its engine and answer parts
    assert t["app"] >= t["search"]


def test_debug_stats_is_off_by_default(client):
    assert client.get("/debug/stats").status_code == 404


def test_debug_stats_summarises_searches_sheds_and_the_event_loop(home, image_root):
    app = create_app(make_config(home, image_root, debug_stats=True, api_key=API_KEY))
    key = {"X-API-Key": API_KEY}
    with TestClient(app) as c:
        assert c.get("/debug/stats").status_code == 401  # behind the key, like every route but the probes
        for q in ("red", "blue", "green"):
            assert c.post("/v1/search", json={"text": q}, headers=key).status_code == 200
        s = c.get("/debug/stats", headers=key).json()
        assert s["search"]["n"] == 3
        phases = s["search"]["phases"]
        assert {"pre", "queue", "engine", "engine_cpu", "answer", "deliver", "post", "total"} <= set(phases)
        assert phases["total"]["max_ms"] >= phases["engine"]["max_ms"]
        assert set(s["search"]["slowest_1pct_mean_ms"]) == set(phases)
        assert s["loop_lag"]["n"] >= 0 and s["admission"]["admitted"] == 0
        # what start-up built is frozen, out of the collector's way; collections are timed
        assert s["gc"]["frozen_objects"] > 1000
        import gc

        gc.collect()
        s = c.get("/debug/stats", headers=key).json()
        assert s["gc"]["generation_2"]["n"] >= 1 and s["gc"]["generation_2"]["max_ms"] >= 0
        s = c.get("/debug/stats?reset=true", headers=key).json()
        assert s["search"]["n"] == 3
        assert c.get("/debug/stats", headers=key).json()["search"]["n"] == 0
