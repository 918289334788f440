"""HTTPS image URLs through the vetted-address connection: the TCP connection goes to the
address the guard checked, while TLS still verifies the certificate against the URL's host name
(SNI and host-name check), so pinning the address never weakens TLS.

A TLS upstream on 127.0.0.1 serves a certificate made by a test CA (``trustme``); a patched
resolver (``fetch._getaddrinfo``) gives the host name a public address and a patched
``fetch._connect`` carries that address to the local server, as in ``test_url_guard.py``. The
test CA is trusted through ``SSL_CERT_FILE``, which the default HTTPS context reads per
connection."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading

import pytest

import stair_es.serve.fetch as fetch
from stair_es.errors import ImageError

from .conftest import png_bytes

trustme = pytest.importorskip("trustme", reason="the TLS tests need trustme (the 'serve-test' extra)")

PUBLIC = "93.184.215.14"  # a globally routable address; connections to it go to the local TLS upstream
BODY = png_bytes((30, 30, 220))


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *a):
        pass


@pytest.fixture
def ca():
    return trustme.CA()


def _tls_upstream(ca, name: str):
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(name).configure_cert(ctx)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.sni = []
    ctx.sni_callback = lambda sock, server_name, _ctx: srv.sni.append(server_name)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def net(monkeypatch):
    """``images.example`` resolves to a public address; connecting to it reaches ``state['port']``."""
    state = {"connects": [], "port": None}

    def resolve(host, port):
        if host != "images.example":
            raise OSError("unknown host")
        return [PUBLIC]

    def connect(addr, port, timeout, source_address=None):
        state["connects"].append(addr)
        assert addr == PUBLIC, f"connected to {addr}, an address that was never vetted"
        return socket.create_connection(("127.0.0.1", state["port"]), timeout)

    monkeypatch.setattr(fetch, "_getaddrinfo", resolve)
    monkeypatch.setattr(fetch, "_connect", connect)
    return state


def _serve(ca, net, cert_name):
    srv = _tls_upstream(ca, cert_name)
    net["port"] = srv.server_port
    return srv


def test_https_is_fetched_from_the_vetted_address_with_the_certificate_checked_for_the_url_host(ca, net, tmp_path,
                                                                                               monkeypatch):
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    srv = _serve(ca, net, "images.example")
    try:
        got = fetch.fetch_blocking(f"https://images.example:{srv.server_port}/blue.png", 1 << 20, 5.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert got == BODY
    assert net["connects"] == [PUBLIC]  # TCP to the checked address...
    assert srv.sni == ["images.example"]  # ...TLS to the URL's host name (SNI), verified against it


def test_a_certificate_for_another_host_is_refused(ca, net, tmp_path, monkeypatch):
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    srv = _serve(ca, net, "other.example")
    try:
        with pytest.raises(ImageError, match=r"image URL https://images\.example:\d+/blue\.png: cannot fetch it .*"
                                             r"(?i:certificate|hostname)"):
            fetch.fetch_blocking(f"https://images.example:{srv.server_port}/blue.png", 1 << 20, 5.0)
    finally:
        srv.shutdown()
        srv.server_close()
    assert net["connects"] == [PUBLIC]


def test_a_certificate_no_trusted_authority_signed_is_refused(ca, net, monkeypatch, tmp_path):
    other = trustme.CA()  # the client trusts this one; the server's certificate comes from ``ca``
    other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "other.pem"))
    srv = _serve(ca, net, "images.example")
    try:
        with pytest.raises(ImageError, match=r"(?i)certificate"):
            fetch.fetch_blocking(f"https://images.example:{srv.server_port}/blue.png", 1 << 20, 5.0)
    finally:
        srv.shutdown()
        srv.server_close()
