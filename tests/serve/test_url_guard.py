"""Image URL fetches cannot reach inside (`--allow-image-urls` without `--allow-private-urls`).

Host names are resolved by a patched resolver (``fetch._getaddrinfo``), never real DNS; a
"public" address is connected to a local server by a patched ``fetch._connect``, so the whole
path (resolve once, check every address, connect to the address checked, every redirect hop)
runs against 127.0.0.1 only."""

from __future__ import annotations

import http.server
import threading

import pytest
from fastapi.testclient import TestClient

import stair_es.serve.fetch as fetch
from stair_es.serve.app import create_app
from stair_es.serve.fetch import address_rule

from .conftest import make_config, png_bytes

PUBLIC = "93.184.215.14"  # a globally routable address; connections to it go to the local upstream


@pytest.mark.parametrize("addr, rule", [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("10.0.0.7", "private"), ("172.16.3.4", "private"),
    ("192.168.1.1", "private"), ("169.254.169.254", "link-local"), ("0.0.0.0", "unspecified"),
    ("224.0.0.251", "multicast"), ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"),
    ("100.64.0.1", "not globally routable"), ("::1", "loopback"), ("::", "unspecified"),
    ("::ffff:127.0.0.1", "loopback"), ("::ffff:10.1.2.3", "private"), ("::ffff:169.254.169.254", "link-local"),
    ("fe80::1%eth0", "link-local"), ("fc00::5", "private"), ("ff02::1", "multicast"),
    ("2002:7f00:1::", "loopback"),  # 6to4 around 127.0.0.1
    ("8.8.8.8", None), (PUBLIC, None), ("2606:4700:4700::1111", None), ("::ffff:8.8.8.8", None),
])
def test_every_internal_address_kind_is_named(addr, rule):
    got = address_rule(addr)
    assert (got is None) if rule is None else (rule in got), (addr, got)


class _Upstream(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.server.paths.append(self.path)
        if self.path.startswith("/redirect?to="):
            self.send_response(302)
            self.send_header("Location", self.path.split("=", 1)[1])
            self.end_headers()
            return
        body = png_bytes((220, 30, 30))
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def upstream():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    srv.paths = []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def net(monkeypatch, upstream):
    """A fake DNS (``names``) and a fake network: the public address reaches the local upstream;
    a connection to any other address fails the test (nothing internal may be connected to)."""
    state = {"names": {}, "lookups": [], "connects": []}

    def resolve(host, port):
        state["lookups"].append(host)
        answer = state["names"].get(host)
        if answer is None:
            raise OSError("unknown host")
        return answer(state["lookups"].count(host)) if callable(answer) else list(answer)

    def connect(addr, port, timeout, source_address=None):
        state["connects"].append(addr)
        if addr != PUBLIC:
            raise AssertionError(f"connected to {addr}, an address that was refused or never vetted")
        import socket

        return socket.create_connection(("127.0.0.1", upstream.server_port), timeout)

    monkeypatch.setattr(fetch, "_getaddrinfo", resolve)
    monkeypatch.setattr(fetch, "_connect", connect)
    return state


def _client(home, image_root, **kw):
    return TestClient(create_app(make_config(home, image_root, allow_image_urls=True, load_encoder_at_start=False,
                                             **kw)))


def _encode(c, url):
    return c.post("/v1/encode", json={"inputs": [{"image": {"url": url}}]})


def _refused(r, rule):
    assert r.status_code == 400, r.text
    e = r.json()["error"]
    assert e["type"] == "UrlRefusedError" and rule in e["message"] and "--allow-private-urls" in e["message"]
    return e["message"]


def test_urls_to_internal_addresses_are_refused_by_default(home, image_root, upstream, net):
    port = upstream.server_port
    with _client(home, image_root) as c:
        _refused(_encode(c, f"http://127.0.0.1:{port}/red.png"), "loopback")
        _refused(_encode(c, "http://10.0.0.7/red.png"), "private")
        _refused(_encode(c, "http://169.254.169.254/latest/meta-data/iam/"), "link-local")
        _refused(_encode(c, f"http://[::1]:{port}/red.png"), "loopback")
        _refused(_encode(c, f"http://[::ffff:127.0.0.1]:{port}/red.png"), "loopback")
        # credentials and query strings of a refused URL are never echoed
        msg = _refused(_encode(c, "http://alice:s3cret@10.0.0.7/x.png?token=t0ken"), "private")
        assert "s3cret" not in msg and "alice" not in msg and "t0ken" not in msg
        # a search by image URL is refused the same way, before any work
        r = c.post("/v1/search", json={"image": {"url": f"http://127.0.0.1:{port}/red.png"}, "top_k": 1})
        _refused(r, "loopback")
    assert upstream.paths == [] and net["connects"] == []  # nothing internal was ever connected to


def test_a_name_resolving_inside_is_refused_without_disclosing_its_address(home, image_root, upstream, net):
    net["names"].update({"intranet.example": ["10.20.30.40"], "both.example": [PUBLIC, "127.0.0.1"]})
    with _client(home, image_root) as c:
        msg = _refused(_encode(c, "http://intranet.example/x.png"), "resolves to a private address")
        assert "10.20.30.40" not in msg and "intranet.example" in msg
        _refused(_encode(c, "http://both.example/x.png"), "loopback")  # one internal answer is enough
    assert net["connects"] == []


def test_every_redirect_hop_is_checked_and_connected_as_vetted(home, image_root, upstream, net):
    port = upstream.server_port
    net["names"].update({"cdn.example": [PUBLIC], "internal.example": ["10.0.0.7"]})
    with _client(home, image_root) as c:
        ok = _encode(c, f"http://cdn.example:{port}/red.png")
        assert ok.status_code == 200, ok.text  # a public host is fetched, through the address it was vetted at
        assert net["lookups"] == ["cdn.example"] and net["connects"] == [PUBLIC]
        msg = _refused(_encode(c, f"http://cdn.example:{port}/redirect?to=http://internal.example:{port}/secret"),
                       "private")
        assert "internal.example" in msg
        _refused(_encode(c, f"http://cdn.example:{port}/redirect?to=http://127.0.0.1:{port}/secret"), "loopback")
        _refused(_encode(c, f"http://cdn.example:{port}/redirect?to=http://[::ffff:127.0.0.1]:{port}/x"), "loopback")
    assert not any(p.startswith("/secret") for p in upstream.paths)
    assert set(net["connects"]) == {PUBLIC}


def test_dns_rebinding_cannot_move_the_connection(home, image_root, upstream, net):
    """The name is resolved once per hop and the connection goes to the address checked: a
    resolver that answers public first and loopback afterwards never gets a second question."""
    port = upstream.server_port
    net["names"]["rebind.example"] = lambda nth: [PUBLIC] if nth == 1 else ["127.0.0.1"]
    with _client(home, image_root) as c:
        assert _encode(c, f"http://rebind.example:{port}/red.png").status_code == 200
    assert net["lookups"] == ["rebind.example"] and net["connects"] == [PUBLIC]


def test_a_hung_resolver_costs_the_deadline_not_the_fetch_slot(home, image_root, monkeypatch):
    release = threading.Event()
    asked = []

    def hang(host, port):
        asked.append(host)
        release.wait(30)
        raise OSError("gave up")

    monkeypatch.setattr(fetch, "_getaddrinfo", hang)
    try:
        with _client(home, image_root, url_timeout=0.5, max_url_fetches=1) as c:
            first = _encode(c, "http://slow-dns.example/x.png")
            second = _encode(c, "http://slow-dns.example/y.png")  # the one fetch slot was free again
            assert not release.is_set() and len(asked) == 2  # both answered while the lookups still hung
            fetcher = c.app.state.runtime.fetcher
            assert fetcher.in_progress == 0
            for r in (first, second):
                assert r.status_code == 422, r.text
                assert "not fetched within 0.5 s" in r.json()["error"]["message"]
            assert c.post("/v1/encode", json={"inputs": [{"text": "red"}]}).status_code == 200
    finally:
        release.set()


def test_allow_private_urls_lets_a_trusted_network_through(home, image_root, upstream):
    with _client(home, image_root, allow_private_urls=True) as c:
        assert _encode(c, f"http://127.0.0.1:{upstream.server_port}/red.png").status_code == 200
        assert c.get("/readyz").json()["allow_private_urls"] is True


def test_cli_allow_private_urls_and_its_environment_twin(tmp_path, monkeypatch):
    import uvicorn
    from click.testing import CliRunner

    from stair_es.cli.main import cli

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app.state.config))
    monkeypatch.delenv("STAIR_ES_SERVE_API_KEY", raising=False)
    monkeypatch.delenv("STAIR_ES_SERVE_ALLOW_PRIVATE_URLS", raising=False)
    base = ["serve", "--home", str(tmp_path), "--encoder", "bow", "--allow-image-urls"]
    assert CliRunner().invoke(cli, base).exit_code == 0
    assert CliRunner().invoke(cli, base + ["--allow-private-urls"]).exit_code == 0
    r = CliRunner().invoke(cli, base, env={"STAIR_ES_SERVE_ALLOW_PRIVATE_URLS": "1"})
    assert r.exit_code == 0, r.output
    assert [c.allow_private_urls for c in started] == [False, True, True]
    r = CliRunner().invoke(cli, ["serve", "--home", str(tmp_path), "--encoder", "bow", "--allow-private-urls"])
    assert r.exit_code == 0 and "no effect without --allow-image-urls" in r.output
