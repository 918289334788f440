"""The benchmark's OpenSearch system against the osmem-server emulator: same top-10 as brute force."""

from __future__ import annotations

import pytest

from benchmarks import run

pytestmark = pytest.mark.process


@pytest.fixture
def opensearch_url():
    osmem = pytest.importorskip("osmem_server", reason="osmem-server (the emulators extra) is not installed")
    try:
        server = osmem.OsmemServer.start()
    except Exception as e:  # noqa: BLE001 - any start failure is a reason to skip
        pytest.skip(f"osmem-server did not start: {e}")
    yield server.url
    server.process.terminate()
    server.process.wait(timeout=10)


def test_opensearch_agrees_with_brute_force(opensearch_url, tmp_path, monkeypatch):
    monkeypatch.setenv("STAIR_BENCH_OS_URL", opensearch_url)
    cfg = run.load_config("emulators")
    cfg["corpus"] |= {"sizes": [150], "n_queries": 10}
    cfg["measure"] |= {"latency_queries": 10, "min_queries": 5}
    cfg["systems"] = [s for s in cfg["systems"] if s["kind"] in ("bruteforce", "opensearch")]
    result = run.run_config(cfg, tmp_path / "out", cache_dir=tmp_path / "cache")
    os_row = next(r for r in result["results"] if r["system"] == "opensearch")
    assert os_row["status"] == "ok", os_row.get("reason")
    assert os_row["settings"][0]["recall@10"] >= 0.95  # 9-bit stored weights may swap near-ties
