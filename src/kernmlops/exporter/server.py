"""A small HTTP server for /metrics, on loopback unless told otherwise.

It serves from a thread, so ``kernmlops export`` and a collection
(``collect --export``) both run it beside their own work; between scrapes it
only waits in select().
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class MetricsServer:
    """Serves ``render()`` at /metrics (and a pointer to it at /)."""

    def __init__(self, render: Callable[[], bytes], host: str = "127.0.0.1", port: int = 9435):
        family = _family(host)

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True
            allow_reuse_address = True

        handler = _handler(render)
        try:
            self._httpd = Server((host, port), handler)
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


def _handler(render: Callable[[], bytes]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kernmlops-exporter"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                try:
                    body = render()
                except Exception as err:  # a scrape error must not kill the server
                    self._send(500, f"scrape failed: {err}\n".encode(), "text/plain")
                    print(f"kernmlops export: scrape failed: {err}", file=sys.stderr)
                    return
                self._send(200, body, CONTENT_TYPE_PLAIN_0_0_4)
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
