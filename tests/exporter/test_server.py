"""The /metrics server under hostile or careless clients, in this process (no
root): a whole-request deadline, idle connections closed first to make room,
busy ones never, one render shared by concurrent scrapes, and clients that
hang up or stop reading leave no traceback. The same attacks against a real
running exporter are in test_attack_bpf.py."""

from __future__ import annotations

import errno
import http.client
import re
import socket
import struct
import threading
import time

import pytest

from kernmlops.errors import ConfigError
from kernmlops.exporter.server import ListenError, MetricsServer, hold_listen

#: deadlines of 1-2 s
pytestmark = pytest.mark.quiet

BODY = b"# HELP x_total x\n# TYPE x_total counter\nx_total 1.0\n"


def _read_to_eof(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _get(port: int, timeout: float = 5, host: str = "127.0.0.1") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_whole_request_deadline() -> None:
    timeout_s = 1.0
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, timeout_s=timeout_s) as server:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setblocking(False)
        started, sent = time.monotonic(), 0
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: y\r\n" * 100
        closed_at = None
        while time.monotonic() - started < timeout_s + 3:
            try:
                if sock.recv(1) == b"":
                    closed_at = time.monotonic() - started
                    break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(request[sent : sent + 1])  # a byte every 50 ms: never idle
            except OSError:
                closed_at = time.monotonic() - started
                break
            time.sleep(0.05)
        sock.close()
        # an idle timer would never fire; the deadline does, at timeout_s
        assert closed_at is not None, "the trickling client was never closed"
        assert timeout_s - 0.1 <= closed_at < timeout_s + 1, closed_at
        assert sent >= 10
        assert server.stats.closed["deadline"] == 1
        assert _get(server.port)[0] == 200


def test_idle_connections_are_closed_oldest_first_to_make_room_for_scrapes() -> None:
    slots, clients = 8, 60
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, max_connections=slots) as server:
        socks = []
        for _ in range(clients):
            socks.append(socket.create_connection(("127.0.0.1", server.port)))
            time.sleep(0.002)  # an order of arrival the eviction can follow
        try:
            # every scrape is answered although the idle ones fill every slot
            for _ in range(10):
                status, body = _get(server.port)
                assert status == 200 and body.startswith(BODY)
            # the ones that arrived first were closed (EOF, no 503): the newest still wait
            open_now = []
            for sock in socks:
                sock.settimeout(0.2)
                try:
                    if sock.recv(1) != b"":
                        raise AssertionError("an idle connection got data")
                except TimeoutError:
                    open_now.append(sock)
            assert len(open_now) <= slots - 1
            assert all(s in socks[-slots:] for s in open_now)
            assert server.stats.closed["evicted"] >= clients - slots
            assert server.stats.closed.get("refused", 0) == 0
        finally:
            for sock in socks:
                sock.close()


def test_when_every_connection_is_busy_a_new_one_gets_503_not_a_wait() -> None:
    release, started = threading.Event(), threading.Semaphore(0)

    def render() -> bytes:
        started.release()
        release.wait(5)
        return BODY

    results: list[int] = []
    with MetricsServer(render, "127.0.0.1", 0, max_connections=2) as server:
        # one render is shared: both busy scrapes wait on it
        threads = [
            threading.Thread(target=lambda: results.append(_get(server.port)[0])) for _ in range(2)
        ]
        for t in threads:
            t.start()
        assert started.acquire(timeout=5)
        deadline = time.monotonic() + 5
        while server.stats.open < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # the second one connected (a loaded machine may be slow)
        time.sleep(0.2)  # and joined the render
        t0 = time.monotonic()
        status, _ = _get(server.port)
        assert status == 503 and time.monotonic() - t0 < 1
        release.set()
        for t in threads:
            t.join()
        assert results == [200, 200]
        assert server.stats.closed["refused"] == 1


def test_concurrent_scrapes_share_one_render() -> None:
    calls = 0

    def render() -> bytes:
        nonlocal calls
        calls += 1
        time.sleep(0.3)  # the maps of a big set take this long to read
        return BODY

    scrapers = 20
    barrier = threading.Barrier(scrapers)
    results: list[int] = []

    def scrape() -> None:
        barrier.wait()
        results.append(_get(server.port, timeout=10)[0])

    with MetricsServer(render, "127.0.0.1", 0) as server:
        threads = [threading.Thread(target=scrape) for _ in range(scrapers)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - t0
    assert results == [200] * scrapers
    # one render for the lot (a late one may start a second): not twenty in a row
    assert calls <= 3, calls
    assert took < 2.0, took


def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    with MetricsServer(lambda: BODY, "127.0.0.1", 0) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            for path, code in (("/metrics", 200), ("/", 200), ("/nope", 404), ("/metrics", 200)):
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                assert resp.status == code
            conn.request("POST", "/metrics", body=b"x")
            assert conn.getresponse().status == 405
        finally:
            conn.close()
        assert server.stats.open <= 1


def test_clients_that_hang_up_or_stop_reading_leave_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    body = b"x_total 1.0\n" * 2_000_000  # 24 MB: far more than the socket buffers hold
    with MetricsServer(lambda: body, "127.0.0.1", 0, timeout_s=1.0) as server:
        for _ in range(3):  # reset mid-response
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            sock.settimeout(5)
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # the response is under way
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        # asks and never reads: closed when the response's deadline passes
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(2.0)
        assert server.stats.closed["deadline"] == 1
        assert server.stats.open == 0
        sock.close()
        status, got = _get(server.port, timeout=10)
        assert status == 200 and got.startswith(body)  # and the server still serves
    _, err = capfd.readouterr()
    assert err == ""


def test_hold_listen_refuses_a_busy_port_in_one_line_and_keeps_a_free_one_for_the_server() -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(ListenError) as info:
            hold_listen(f"127.0.0.1:{port}")
    # the reason alone: not create_server's "(while attempting to bind on address ...)"
    assert str(info.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"

    hold_listen(f"127.0.0.1:{port}")
    # held: nobody else takes the port before the server starts
    with pytest.raises(OSError) as taken:
        socket.create_server(("127.0.0.1", port)).close()
    assert taken.value.errno == errno.EADDRINUSE
    server = MetricsServer(lambda: BODY, "127.0.0.1", port).start()
    try:
        assert server.port == port and _get(port)[0] == 200
    finally:
        server.stop()
    # the held socket was the server's, and went with it: the port is free again
    socket.create_server(("127.0.0.1", port)).close()


def _has_ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


def _answers(host: str, port: int) -> bool:
    try:
        return _get(port, timeout=3, host=host)[0] == 200
    except OSError:  # refused: nothing listens on that family
        return False


def test_every_interface_is_ipv4_and_ipv6_as_gos_listen_has_it() -> None:
    """``:PORT`` (--web.listen-address, as Go's net.Listen reads it) and ``[::]:PORT``
    serve IPv4 and IPv6 from one socket; ``0.0.0.0:PORT`` names IPv4 and serves it
    alone."""
    v6 = _has_ipv6_loopback()
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    host, got = hold_listen(f":{port}", flag="--web.listen-address", any_host=True)
    assert (host, got) == ("", port)
    with MetricsServer(lambda: BODY, host, port) as server:
        assert server.port == port
        assert _answers("127.0.0.1", port)
        if v6:
            assert server.url == f"http://[::]:{port}/metrics"
            assert _answers("::1", port)
    for host, ipv6 in (("::", True), ("0.0.0.0", False)):
        if host == "::" and not v6:
            continue
        with MetricsServer(lambda: BODY, host, 0) as server:
            assert _answers("127.0.0.1", server.port)
            if v6:
                assert _answers("::1", server.port) is ipv6, host
    # the empty host is refused where the flag does not take it (--listen: say the host)
    with pytest.raises(ListenError, match=r"^--listen ':9435': give the host"):
        hold_listen(":9435")


def test_every_interface_is_ipv4_alone_where_the_machine_has_no_ipv6(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "has_dualstack_ipv6", lambda: False)
    with MetricsServer(lambda: BODY, "", 0) as server:
        assert server.url == f"http://0.0.0.0:{server.port}/metrics"
        assert _answers("127.0.0.1", server.port)
        if _has_ipv6_loopback():
            assert not _answers("::1", server.port)


def test_an_idle_keep_alive_connection_is_closed_as_idle_not_as_a_missed_deadline() -> None:
    """A scraper keeps its connection between scrapes (15 s apart, more than the
    timeout): the close is ``idle``; ``deadline`` is kept for a request begun and not
    complete in time, so that it still tells slow clients."""
    timeout_s = 1.0
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, timeout_s=timeout_s) as server:
        kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        kept.request("GET", "/metrics")  # HTTP/1.1: kept alive after its response
        assert kept.getresponse().read().startswith(BODY)
        silent = socket.create_connection(("127.0.0.1", server.port))  # never asks
        partial = socket.create_connection(("127.0.0.1", server.port))
        partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # no blank line: unfinished
        try:
            for sock in (kept.sock, silent, partial):
                assert _read_to_eof(sock, timeout_s + 3) == b""  # each closed by the server
        finally:
            kept.close()
            silent.close()
            partial.close()
        assert server.stats.closed == {"idle": 2, "deadline": 1}
        text = server.stats.text().decode()
        assert 'kernmlops_exporter_http_connections_closed_total{reason="idle"} 2.0' in text
        assert 'kernmlops_exporter_http_connections_closed_total{reason="deadline"} 1.0' in text
        assert "idle (no request began within the timeout" in text


def test_the_metrics_are_served_at_the_telemetry_path_given() -> None:
    """ebpf_exporter's --web.telemetry-path: the metrics there, / links to it, and
    /metrics is then a 404 that says where to look."""
    with MetricsServer(lambda: BODY, "127.0.0.1", 0, metrics_path="/ebpf/metrics") as server:
        assert server.url.endswith(f":{server.port}/ebpf/metrics")
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        try:
            for path, code, body in (
                ("/ebpf/metrics", 200, BODY),
                ("/", 200, b'<a href="/ebpf/metrics">'),
                ("/metrics", 404, b"not found: try /ebpf/metrics\n"),
            ):
                conn.request("GET", path)
                resp = conn.getresponse()
                got = resp.read()
                assert resp.status == code and body in got, (path, resp.status, got)
        finally:
            conn.close()
    for bad in ("/", "metrics", "/a b", "/m?x=1", "/%41"):
        with pytest.raises(ConfigError, match=rf"^--web.telemetry-path {re.escape(repr(bad))}:"):
            MetricsServer(lambda: BODY, "127.0.0.1", 0, metrics_path=bad)


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [
        (b"gzip", True),
        (b"deflate, GZIP;q=0.5", True),
        (b"identity, *", True),
        (b"gzip;q=0", False),
        (b"*;q=0.1, gzip;q=0", False),
        (b"deflate", False),
        (b"", False),
        (b"gzip;q=x", False),
    ],
)
def test_accept_encoding_is_read_as_rfc_9110_says(header: bytes, gzipped: bool) -> None:
    from kernmlops.exporter.server import accepts_gzip

    assert accepts_gzip(header) is gzipped


def test_a_scraper_that_takes_gzip_gets_the_same_page_gzipped() -> None:
    import gzip

    page = b"".join(b'x_total{n="%d"} %d\n' % (i, i) for i in range(20_000))

    def get(port: int, encoding: str | None) -> tuple[dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            asked = {"Accept-Encoding": encoding} if encoding else {}
            conn.request("GET", "/metrics", headers=asked)
            resp = conn.getresponse()
            return {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    with MetricsServer(lambda: page, "127.0.0.1", 0) as server:
        plain_headers, plain = get(server.port, None)
        zipped_headers, zipped = get(server.port, "gzip")
        refused_headers, refused = get(server.port, "gzip;q=0")
    assert "content-encoding" not in plain_headers and plain.startswith(page)
    assert zipped_headers["content-encoding"] == "gzip"
    assert int(zipped_headers["content-length"]) == len(zipped) < len(page) // 3
    # the server's own lines after the page differ from scrape to scrape
    assert gzip.decompress(zipped).startswith(page)
    assert "content-encoding" not in refused_headers and refused.startswith(page)
    assert plain_headers["vary"] == zipped_headers["vary"] == "Accept-Encoding"
