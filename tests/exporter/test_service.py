"""What a running exporter says of itself for a collection's manifest (no root: an
exporter with no set, served by the real server on loopback)."""

from __future__ import annotations

import base64
import http.client
import threading
import time

import pytest

from kernmlops.exporter.core import Exporter
from kernmlops.exporter.server import MetricsServer
from kernmlops.exporter.service import RunningExporter
from kernmlops.exporter.webconfig import WebConfig
from tests.exporter.conftest import hash_password

pytestmark = pytest.mark.quiet

PASSWORD = "right"


def _request(port: int, method: str, path: str, password: str | None) -> int:
    """One request on a connection of its own; the status the client received, after
    reading the whole body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        headers = {}
        if password is not None:
            token = base64.b64encode(f"prometheus:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def test_the_manifests_scrapes_are_the_metrics_responses_a_client_received() -> None:
    """``scrapes`` counts the /metrics pages served in full to a GET, whatever else
    the clients asked: not the 401s of a wrong or missing password, not / or an
    unknown path, not a HEAD (no metrics in it), and once per client when concurrent
    scrapes share one render. ``renders`` counts the reads of the maps apart."""
    exporter = Exporter([])
    exporter.start()
    calls: list[int] = []

    def render() -> bytes:
        calls.append(1)
        time.sleep(0.3)  # slow: concurrent scrapes arrive during it and share it
        return exporter.render()

    web = WebConfig(users=(("prometheus", hash_password(PASSWORD).encode()),))
    statuses: list[int] = []
    lock = threading.Lock()

    def made(method: str, path: str, password: str | None) -> None:
        status = _request(server.port, method, path, password)
        with lock:
            statuses.append(status if method == "GET" and path == "/metrics" else -status)

    server = MetricsServer(render, "127.0.0.1", 0, web_config=web).start()
    running = RunningExporter(exporter, server)
    try:
        threads = [
            threading.Thread(target=made, args=("GET", "/metrics", PASSWORD)) for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        made("GET", "/metrics", PASSWORD)  # alone
        made("GET", "/metrics", "wrong")
        made("GET", "/metrics", None)
        made("GET", "/", PASSWORD)
        made("GET", "/nothing", PASSWORD)
        made("HEAD", "/metrics", PASSWORD)
        summary = running.summary()
    finally:
        running.close()
    got = sorted(statuses)
    assert got == [-404, -200, -200, *[200] * 7, 401, 401], got  # unknown, HEAD, /; 401s
    scraped = statuses.count(200)  # what the client received: 7 pages of metrics
    assert summary["scrapes"] == scraped == 7
    # the maps were read fewer times (shared by the concurrent six), HEAD's included
    assert summary["renders"] == len(calls) < scraped
