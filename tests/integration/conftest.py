"""Session fixtures that start the Elasticsearch and OpenSearch emulators on loopback.

``noida-db`` (imitates Elasticsearch 8.15) and ``osmem-server`` (imitates OpenSearch 3.x) are
optional test dependencies (extra ``stair-es[emulators]``). A fixture skips, saying why, when
its emulator is not installed or does not answer within 30 s. ``STAIR_ES_TEST_URL`` /
``STAIR_OS_TEST_URL`` point the ``cluster`` tests at a real cluster instead.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

STARTUP_SECONDS = 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with code {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                json.loads(r.read())
                return None
        except Exception as e:  # noqa: BLE001
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    return f"no answer within {seconds:.0f} s ({last})"


def _noida_binary() -> str | None:
    exe = Path(sys.executable).parent / "noida-db"
    if exe.exists():
        return str(exe)
    return shutil.which("noida-db")


@pytest.fixture(scope="session")
def es_url(tmp_path_factory):
    """URL of a noida-db Elasticsearch emulator started for this session."""
    exe = _noida_binary()
    if exe is None:
        pytest.skip("noida-db is not installed (pip install 'stair-es[emulators]')")
    port = _free_port()
    data = tmp_path_factory.mktemp("noida")
    log = open(data / "noida.log", "wb")
    proc = subprocess.Popen(
        [exe, "start", "--only", "elasticsearch", "--elasticsearch-port", str(port), "--data-dir", str(data / "d")],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    err = _wait_http(url + "/", proc, STARTUP_SECONDS)
    if err:
        _stop(proc)
        pytest.skip(f"noida-db did not start: {err}; see {data / 'noida.log'}")
    yield url
    _stop(proc)
    log.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="session")
def os_url():
    """URL of an osmem-server OpenSearch emulator started for this session."""
    try:
        from osmem_server import OsmemError, OsmemServer
    except ImportError:
        pytest.skip("osmem-server is not installed (pip install 'stair-es[emulators]')")
    try:
        server = OsmemServer.start(japanese=False, startup_timeout=STARTUP_SECONDS)
    except (OsmemError, OSError) as e:
        pytest.skip(f"osmem-server did not start: {e}")
    yield server.url
    server.close()


@pytest.fixture(params=["elasticsearch", "opensearch"])
def cluster(request):
    """(backend name, URL) for each emulator."""
    if request.param == "elasticsearch":
        return "elasticsearch", request.getfixturevalue("es_url")
    return "opensearch", request.getfixturevalue("os_url")
