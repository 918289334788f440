"""Connection settings: precedence, secrets never shown, clear errors for bad connections."""

import logging
import socket
import sys

import pytest

from stair_es.backends.cluster.config import ClusterConfig, redact_url
from stair_es.backends.base import get_backend
from stair_es.errors import BackendError, ConnectionFailedError, InvalidInputError, MissingDependencyError

from .fake_cluster import FakeCluster

SECRETS = ("s3cr3t-pass", "k3y-value", "t0ken-value")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_flags_beat_environment_beat_config_file(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('url = "http://file:9200"\nusername = "fileuser"\ntimeout = 7\n[opensearch]\nurl = "http://os-file:9200"\n')
    c = ClusterConfig.resolve("elasticsearch", cfg)
    assert c.urls == ["http://file:9200"] and c.username == "fileuser" and c.timeout == 7
    assert ClusterConfig.resolve("opensearch", cfg).urls == ["http://os-file:9200"]
    monkeypatch.setenv("STAIR_ES_URL", "http://env1:9200, http://env2:9200")
    assert ClusterConfig.resolve("elasticsearch", cfg).urls == ["http://env1:9200", "http://env2:9200"]
    assert ClusterConfig.resolve("elasticsearch", cfg, urls=["http://flag:9200"]).urls == ["http://flag:9200"]


def test_toml_config_on_a_python_without_tomllib(tmp_path, monkeypatch):
    # Python 3.10 has no tomllib: the tomli backport reads the file, and without it the error
    # says what to install or to use JSON
    import types

    cfg = tmp_path / "c.toml"
    cfg.write_text('url = "http://file:9200"\n')
    monkeypatch.setitem(sys.modules, "tomllib", None)
    fake = types.ModuleType("tomli")
    fake.loads = lambda text: {"url": "http://from-tomli:9200"}
    monkeypatch.setitem(sys.modules, "tomli", fake)
    assert ClusterConfig.resolve("elasticsearch", cfg).urls == ["http://from-tomli:9200"]
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(InvalidInputError, match="pip install tomli, or write the settings as a .json file"):
        ClusterConfig.resolve("elasticsearch", cfg)


def test_json_config_and_default_location(tmp_path, monkeypatch):
    (tmp_path / "c.json").write_text('{"urls": ["http://j:1"], "verify_certs": false}')
    c = ClusterConfig.resolve("elasticsearch", tmp_path / "c.json")
    assert c.urls == ["http://j:1"] and c.verify_certs is False
    d = tmp_path / ".config" / "stair-es"
    d.mkdir(parents=True)
    (d / "config.toml").write_text('url = "http://home:9200"\n')
    assert ClusterConfig.resolve("elasticsearch").urls == ["http://home:9200"]
    with pytest.raises(InvalidInputError, match="does not exist; give the path of a TOML or JSON file"):
        ClusterConfig.resolve("elasticsearch", tmp_path / "missing.toml")


@pytest.mark.parametrize("name, text, where", [("c.toml", 'url = "http://h:9200"\napi_key = s3cr3t-key\n', "line 2 column 11"),
                                               ("c.json", '{"url": "http://h:9200",\n "api_key": s3cr3t-key}', "line 2 column 13")])
def test_a_config_file_that_does_not_parse_says_where_but_not_what(tmp_path, name, text, where):
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidInputError, match=f"Error at {where}\\); check its syntax") as e:
        ClusterConfig.resolve("elasticsearch", tmp_path / name)
    assert "s3cr3t" not in str(e.value)


def test_bad_settings_are_input_errors():
    with pytest.raises(InvalidInputError, match="invalid cluster URL"):
        ClusterConfig.resolve("elasticsearch", urls="localhost:9200")
    with pytest.raises(InvalidInputError, match="without a username"):
        ClusterConfig.resolve("elasticsearch", password="x")


def test_secrets_never_appear_in_reprs(flavor):
    b = get_backend(flavor, urls=["http://u:s3cr3t-pass@127.0.0.1:1"], api_key="k3y-value", password="s3cr3t-pass",
                    username="u", bearer_token="t0ken-value")
    for text in (repr(b), repr(b.config), str(b.config), b.config.display_urls):
        assert not any(s in text for s in SECRETS), text
    assert redact_url("https://u:p@h:9200/x") == "https://h:9200/x"


def test_unreachable_cluster_names_the_url_without_credentials(flavor, caplog):
    port = free_port()
    b = get_backend(flavor, urls=[f"http://elastic:s3cr3t-pass@127.0.0.1:{port}"], password="s3cr3t-pass",
                    username="elastic", timeout=2, max_retries=0)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ConnectionFailedError) as ei:
        b.list_indices()
    msg = str(ei.value)
    assert f"127.0.0.1:{port}" in msg and "s3cr3t" not in msg
    assert ei.value.__cause__ is None and ei.value.__suppress_context__
    assert not any(s in caplog.text for s in SECRETS)


def test_wrong_credentials_give_a_clear_error(flavor, caplog):
    caplog.set_level(logging.DEBUG)
    with FakeCluster(flavor, auth="ApiKey right") as c:
        b = get_backend(flavor, urls=c.url, api_key="k3y-value")
        with pytest.raises(BackendError, match="refused the credentials") as ei:
            b.list_indices()
        assert "k3y-value" not in str(ei.value)
        assert c.seen_headers[-1]["authorization"] == "ApiKey k3y-value"
    assert not any(s in caplog.text for s in SECRETS)


def test_basic_and_bearer_auth_headers_are_sent(flavor):
    with FakeCluster(flavor) as c:
        get_backend(flavor, urls=c.url, username="u", password="s3cr3t-pass").list_indices()
        assert c.seen_headers[-1]["authorization"].startswith("Basic ")
        get_backend(flavor, urls=c.url, bearer_token="t0ken-value").list_indices()
        assert c.seen_headers[-1]["authorization"] == "Bearer t0ken-value"


def test_wrong_product_is_reported(flavor):
    other = "opensearch" if flavor == "elasticsearch" else "elasticsearch"
    with FakeCluster(other) as c:
        with pytest.raises(BackendError, match="--backend"):
            get_backend(flavor, urls=c.url).list_indices()


def test_tls_to_a_plain_http_port_is_a_backend_error(flavor):
    with FakeCluster(flavor) as c:
        b = get_backend(flavor, urls=c.url.replace("http://", "https://"), timeout=2, max_retries=0)
        with pytest.raises(BackendError) as ei:
            b.list_indices()
        assert "127.0.0.1" in str(ei.value)


@pytest.mark.parametrize("name,module", [("elasticsearch", "elasticsearch"), ("opensearch", "opensearchpy")])
def test_missing_client_names_the_extra(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingDependencyError, match=f"stair-es\\[{name}\\]"):
        get_backend(name)


def test_a_backend_takes_a_config_and_a_bulk_policy_or_the_same_flat_options(flavor):
    from stair_es.backends.base import backend_class
    from stair_es.backends.cluster import BulkPolicy

    cfg = ClusterConfig.resolve(flavor, urls="http://127.0.0.1:1", field_type="sparse_vector", max_clauses=64)
    b = backend_class(flavor)(cfg, BulkPolicy(chunk_docs=7, max_retries=1))
    flat = get_backend(flavor, urls="http://127.0.0.1:1", field_type="sparse_vector", max_clauses=64, chunk_docs=7,
                       max_retries=1)
    assert repr(b.config) == repr(flat.config) and b.bulk_policy == flat.bulk_policy
    assert b.config.field_type == "sparse_vector" and b.config.max_clauses == 64 and b.bulk_policy.chunk_docs == 7
    assert backend_class(flavor)("http://127.0.0.1:2").config.urls == ["http://127.0.0.1:2"]  # URLs first, as before
    with pytest.raises(InvalidInputError, match="expected a ClusterConfig"):
        backend_class(flavor)(42)


@pytest.mark.parametrize("opts, msg", [
    ({"chunk_size": 10}, "unknown .* option.*chunk_size.*chunk_docs"),
    ({"field_type": "dense"}, "field type must be"), ({"refresh": "later"}, "refresh must be"),
    ({"chunk_docs": 0}, "chunk_docs must be"), ({"max_retries": "many"}, "max_retries must be a number"),
])
def test_bad_backend_options_are_input_errors(flavor, opts, msg):
    with pytest.raises(InvalidInputError, match=msg):
        get_backend(flavor, urls="http://127.0.0.1:1", **opts)
