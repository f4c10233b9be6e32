"""The /metrics server under hostile or careless clients: idle connections time
out, the threads serving them are bounded, and clients that hang up mid-response
leave no traceback. No root needed."""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
import urllib.request

import pytest

from kernmlops.exporter.server import MetricsServer

BODY = b"# HELP x_total x\n# TYPE x_total counter\nx_total 1.0\n"


def _read_to_eof(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _wait_for_threads(at_most: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while threading.active_count() > at_most and time.monotonic() < deadline:
        time.sleep(0.02)
    return threading.active_count()


def test_idle_connections_are_bounded_and_closed_after_the_timeout() -> None:
    base = threading.active_count()
    timeout_s, slots, clients = 2.0, 4, 60
    with MetricsServer(
        lambda: BODY, "127.0.0.1", 0, timeout_s=timeout_s, max_connections=slots
    ) as server:
        # connect() succeeds for all (the kernel's backlog); the server serves `slots`
        socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(clients)]
        try:
            started = time.monotonic()
            # the refused ones are answered at once; the served ones wait for a request
            pending, replies = set(socks), {}
            while len(replies) < clients - slots and time.monotonic() < started + timeout_s / 2:
                readable, _, _ = select.select(list(pending), [], [], 0.05)
                for sock in readable:
                    replies[sock] = _read_to_eof(sock, 1.0)
                    pending.discard(sock)
            busy = list(pending)
            # one thread per served connection, plus the accept loop: not one per client
            peak = threading.active_count()
            assert peak <= base + 1 + slots, (base, peak)
            assert len(busy) == slots
            assert len(replies) == clients - slots
            assert {r[:34] for r in replies.values()} == {b"HTTP/1.0 503 Service Unavailable\r\n"}
            # the served ones are closed by the server once silent for timeout_s
            for sock in busy:
                assert _read_to_eof(sock, timeout_s + 5) == b""
            elapsed = time.monotonic() - started
            assert timeout_s - 0.1 <= elapsed < timeout_s + 3, elapsed
        finally:
            for sock in socks:
                sock.close()
        assert _wait_for_threads(base + 1) <= base + 1
        # every slot came back: more scrapes than slots, one after another
        for _ in range(slots * 3):
            with urllib.request.urlopen(server.url, timeout=5) as resp:
                assert resp.status == 200 and resp.read() == BODY
    assert _wait_for_threads(base) <= base


def test_a_client_that_hangs_up_mid_response_leaves_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    body = b"x_total 1.0\n" * 2_000_000  # 24 MB: far more than the socket buffers hold
    rendered = threading.Semaphore(0)

    def render() -> bytes:
        rendered.release()
        return body

    base = threading.active_count()
    with MetricsServer(render, "127.0.0.1", 0, timeout_s=5) as server:
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", server.port))
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert rendered.acquire(timeout=5)
            assert sock.recv(64).startswith(b"HTTP/1.0 200")  # the response is under way
            # reset, not a polite close: the server's next write fails at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        assert _wait_for_threads(base + 1) <= base + 1  # every handler has finished
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert len(resp.read()) == len(body)  # and the server still serves
    _, err = capfd.readouterr()
    assert err == ""
