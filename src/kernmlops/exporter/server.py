"""A small HTTP server for /metrics, on loopback unless told otherwise.

It serves from a thread, so ``kernmlops export`` and a collection
(``collect --export``) both run it beside their own work; between scrapes it
only waits in select().
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import socket
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from kernmlops.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9435"


class ListenError(ConfigError):
    """--listen is not HOST:PORT, or the address cannot be bound."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port). The host must be
    given: an empty one would mean every interface."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ListenError(f"--listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ListenError(f"--listen {text!r}: port {port} is out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ListenError(
            f"--listen {text!r}: give the host, 127.0.0.1:{port} (this machine only) or "
            f"0.0.0.0:{port} (every interface)"
        )
    return host, port


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: resolve it
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            raise ListenError(f"--listen: cannot resolve {host!r}: {err.strerror}") from None
        return infos[0][0]


#: Seconds a connection may stay silent (before its request, or while a response is
#: read) before it is closed: an idle client must not hold a thread forever.
IDLE_TIMEOUT_S = 10.0
#: Connections served at once; Prometheus keeps one per scraper. More get a 503.
MAX_CONNECTIONS = 16
#: What a client that hangs up (or stops reading and times out) raises; not our error.
_CLIENT_GONE = (ConnectionError, TimeoutError)
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them; errors from
    clients that went away are not printed."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's listen backlog is 5: a burst beyond it is half-opened by the
    # kernel and then dropped without an answer; a longer one gets each its 503.
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], handler: type, max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Full: refuse at once rather than queue behind idle connections.
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, _CLIENT_GONE):
            return  # the client hung up or went silent: nothing to report
        host = client_address[0] if client_address else "?"
        print(
            f"kernmlops export: error serving {host}: {type(err).__name__}: {err}",
            file=sys.stderr,
        )


class ScrapeLog:
    """When /metrics responses began (monotonic seconds), for the interval a
    scraper keeps and for waiting until one more scrape has been answered."""

    def __init__(self, keep: int = 16) -> None:
        self._cond = threading.Condition()
        self._starts: list[float] = []
        self._keep = keep
        self.last_start = float("-inf")

    def served(self, started: float) -> None:
        """A /metrics response that began at ``started`` was sent in full."""
        with self._cond:
            self._starts = [*self._starts[-(self._keep - 1) :], started]
            self.last_start = max(self.last_start, started)
            self._cond.notify_all()

    def interval_s(self) -> float | None:
        """Median seconds between scrapes, from the last few; None before two."""
        with self._cond:
            starts = sorted(self._starts)
        if len(starts) < 2:
            return None
        gaps = sorted(b - a for a, b in itertools.pairwise(starts))
        return gaps[len(gaps) // 2]

    def wait_after(self, since: float, timeout_s: float) -> bool:
        """Until a response that began after ``since`` has been sent (True), or
        ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.last_start < since:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True


class MetricsServer:
    """Serves ``render()`` at /metrics (and a pointer to it at /).

    ``timeout_s``: a connection silent this long is closed; ``max_connections``:
    connections served at once (one thread each), more are answered 503."""

    def __init__(
        self,
        render: Callable[[], bytes],
        host: str = "127.0.0.1",
        port: int = 9435,
        *,
        timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ):
        family = _family(host)

        class Server(_Server):
            address_family = family

        self.scrapes = ScrapeLog()
        handler = _handler(render, timeout_s, self.scrapes)
        try:
            self._httpd = Server((host, port), handler, max_connections)
        except OSError as err:
            raise ListenError(f"cannot listen on {host}:{port}: {err.strerror}") from None
        self.host = host
        self.port = self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> MetricsServer:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="kernmlops-metrics", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _handler(
    render: Callable[[], bytes], timeout_s: float, scrapes: ScrapeLog
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kernmlops-exporter"
        timeout = timeout_s  # socketserver sets it on the connection

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                started = time.monotonic()
                try:
                    body = render()
                except Exception as err:  # a scrape error must not kill the server
                    self._send(500, f"scrape failed: {err}\n".encode(), "text/plain")
                    print(f"kernmlops export: scrape failed: {err}", file=sys.stderr)
                    return
                self._send(200, body, CONTENT_TYPE_PLAIN_0_0_4)
                self.wfile.flush()
                scrapes.served(started)
            elif path == "/":
                page = b'<html><body><a href="/metrics">metrics</a></body></html>\n'
                self._send(200, page, "text/html")
            else:
                self._send(404, b"not found: try /metrics\n", "text/plain")

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape is noise

    return Handler
