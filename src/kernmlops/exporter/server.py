"""The /metrics server, on loopback unless told otherwise, safe beside hostile
clients.

It runs an asyncio event loop in a thread of its own, so ``kernmlops export``
and a collection (``collect --export``) both run it beside their own work.
A connection costs a socket and a little memory, not a thread, and each is
bounded in time and in number:

- **a whole-request deadline**: a request must arrive complete within
  ``timeout_s`` of the connection becoming ready for it (a client sending a
  byte a second is closed when the deadline passes, however many bytes it
  sent); the response must be taken within ``timeout_s`` too. Both count as
  closed by ``deadline``; a connection that sent no byte of a request in that
  time (a kept-alive one between scrapes 15 s apart) is counted ``idle``;
- **a bounded pool, idle ones closed first**: at ``max_connections`` a new
  connection closes the one that has waited longest for a request; only when
  every connection is busy answering is the new one refused (503);
- **one render for concurrent scrapes**: a scrape arriving while the maps are
  being read shares that reading instead of queueing behind it.

TLS and basic auth come from a ``--web.config.file`` (see webconfig.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import gzip
import ipaddress
import itertools
import re
import socket
import sys
import termios
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus

import h11
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from kernmlops.errors import EXIT_TEMPORARY, ConfigError
from kernmlops.exporter.webconfig import BasicAuth, WebConfig
from kernmlops.host.fdlimit import raise_fd_limit

DEFAULT_LISTEN = "127.0.0.1:9435"


class ListenError(ConfigError):
    """--listen is not HOST:PORT (a user error, exit 2), or the address cannot be
    bound (:class:`CannotListen`)."""


class CannotListen(ListenError):
    """The address is well formed but cannot be bound now: busy, not (yet) this
    machine's, its name not resolved. Often transient at boot, so not a user error's
    status: :data:`~kernmlops.errors.EXIT_TEMPORARY`, which a service manager retries."""

    exit_code = EXIT_TEMPORARY


#: a metrics path: characters that need no escaping in a URL or in HTML
_PATH = re.compile(r"/[A-Za-z0-9._~/-]*")


def check_metrics_path(path: str, flag: str = "--web.telemetry-path") -> str:
    """``path`` if the metrics can be served there (not ``/``, the index page).

    Raises:
        ConfigError: it cannot.
    """
    if path == "/" or not _PATH.fullmatch(path):
        raise ConfigError(
            f"{flag} {path!r}: give a path below / of letters, digits and /._~-, e.g. /metrics"
        )
    return path


def parse_listen(text: str, *, flag: str = "--listen", any_host: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); errors name ``flag``.

    The host must be given, unless ``any_host``: then ``:PORT`` is accepted, as Go's
    ``net.Listen`` takes it (every interface, IPv4 and IPv6), and the host is ``""``.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        example = DEFAULT_LISTEN + (" or :9435" if any_host else "")
        raise ListenError(f"{flag} {text!r}: expected HOST:PORT, e.g. {example}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ListenError(f"{flag} {text!r}: port {port} is out of range 0-65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host and not any_host:
        raise ListenError(
            f"{flag} {text!r}: give the host, 127.0.0.1:{port} (this machine only) or "
            f"[::]:{port} (every interface, IPv4 and IPv6)"
        )
    return host, port


def _family(host: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: resolve it
        try:
            infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except socket.gaierror as err:
            why = f"cannot listen on {host}: cannot resolve it: {err.strerror}"
            raise CannotListen(why) from None
        return infos[0][0]


def shown(host: str, port: int) -> str:
    """``host``:``port`` as --listen takes it (``[v6]:PORT``, ``:PORT``)."""
    if not host:
        return f":{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host``:``port``, as the server binds it.

    Every interface, as Go's ``net.Listen("tcp", ...)`` takes it: an empty host, or
    ``::``, is one IPv6 socket that takes IPv4 too (IPV6_V6ONLY off), where the machine
    has IPv6; an empty host falls back to IPv4 alone where it has not. ``0.0.0.0``
    names IPv4 and is IPv4 alone (Go would serve IPv6 there too).

    Raises:
        CannotListen: the address cannot be bound (in use, not this machine's, ...).
    """
    try:
        if not host or host == "::":
            if socket.has_dualstack_ipv6():
                try:
                    return socket.create_server(
                        ("::", port), family=socket.AF_INET6, backlog=1024, dualstack_ipv6=True
                    )
                except OSError as err:
                    if host or err.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                        raise
            if not host:  # no IPv6 here: every IPv4 interface
                return socket.create_server(("0.0.0.0", port), backlog=1024)
        return socket.create_server(
            (host, port), family=_family(host), backlog=1024, reuse_port=False
        )
    except OSError as err:
        # create_server adds "(while attempting to bind on address ...)": the line has it
        reason = (err.strerror or str(err)).split(" (while attempting")[0]
        raise CannotListen(f"cannot listen on {shown(host, port)}: {reason}") from None


#: sockets bound ahead of their server (hold_listen), by the address asked for
_held: dict[tuple[str, int], socket.socket] = {}
_held_lock = threading.Lock()


def hold_listen(text: str, *, flag: str = "--listen", any_host: bool = False) -> tuple[str, int]:
    """Bind ``HOST:PORT`` now and keep it for the :class:`MetricsServer` that asks for
    that address later in this process: ``collect --export`` and ``export`` refuse a
    busy port before they set anything up, and no other process can take the port
    while the probes attach (connections wait in the backlog until the server serves
    them). Returns the (host, port) to give the server; ``flag`` and ``any_host`` are
    :func:`parse_listen`'s.

    Raises:
        ListenError: ``text`` is not HOST:PORT.
        CannotListen: the address cannot be bound.
    """
    host, port = parse_listen(text, flag=flag, any_host=any_host)
    with _held_lock:
        if (host, port) not in _held:
            _held[(host, port)] = _listening(host, port)
    return host, port


def _take_held(host: str, port: int) -> socket.socket | None:
    """The socket :func:`hold_listen` keeps for this address, no longer kept."""
    with _held_lock:
        return _held.pop((host, port), None)


def release_listen(host: str, port: int) -> None:
    """Close the socket :func:`hold_listen` keeps for this address, if it still does."""
    held = _take_held(host, port)
    if held is not None:
        held.close()


def _bound(host: str, port: int) -> socket.socket:
    """The socket hold_listen keeps for this address, else a new one."""
    held = _take_held(host, port)
    return held if held is not None else _listening(host, port)


def accepts_gzip(value: bytes) -> bool:
    """Whether an Accept-Encoding header value takes gzip: ``gzip`` (or ``x-gzip``)
    with a q above 0, else ``*`` with a q above 0 (RFC 9110, case-insensitive)."""
    qs: dict[str, float] = {}
    for item in value.decode("latin-1").lower().split(","):
        coding, _, params = item.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            name, _, v = param.strip().partition("=")
            if name.strip() == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        qs[coding.strip()] = q
    for coding in ("gzip", "x-gzip", "*"):
        if coding in qs:
            return qs[coding] > 0
    return False


#: Seconds a request may take to arrive whole, and a response to be taken; also
#: how long a kept-alive connection may wait for its next request. Prometheus'
#: default scrape timeout is 10 s: a scrape never needs longer.
REQUEST_TIMEOUT_S = 10.0
#: Connections held at once (idle ones are closed first to make room). Each
#: costs one file descriptor; the limit is lowered to fit RLIMIT_NOFILE.
MAX_CONNECTIONS = 1024
#: File descriptors kept for everything else (BPF objects, maps, files).
_FD_RESERVE = 128
#: A request line and headers larger than this are refused (a scrape's are < 1 KiB).
_MAX_HEAD_BYTES = 16 * 1024
#: Responses are written in pieces this large: what a slow reader makes us buffer.
_CHUNK = 256 * 1024


class ScrapeLog:
    """The scrapes served: GETs of the metrics answered 200 with the whole page
    written to the client's socket (not a 401, a 404, a HEAD, a failed render or a
    client gone before the page was written), counted, and when they began
    (monotonic seconds), for the interval a scraper keeps and for waiting until one
    more scrape has been answered."""

    def __init__(self, keep: int = 16) -> None:
        self._cond = threading.Condition()
        self._starts: list[float] = []
        self._keep = keep
        self.last_start = float("-inf")
        #: scrapes served since the server started
        self.count = 0

    def served(self, started: float) -> None:
        """A scrape that began at ``started`` was sent in full."""
        with self._cond:
            self._starts = [*self._starts[-(self._keep - 1) :], started]
            self.last_start = max(self.last_start, started)
            self.count += 1
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


@dataclass
class ServerStats:
    """The server's own counts, served with the metrics (its health under load)."""

    open: int = 0
    responses: dict[int, int] = field(default_factory=dict)
    #: connections closed by the server: deadline (a request begun and not complete in
    #: time, or a response not taken), idle (no request within the timeout: a kept-alive
    #: connection between scrapes), evicted (idle, to make room), refused (full of busy
    #: ones), bad_request
    closed: dict[str, int] = field(default_factory=dict)

    def text(self) -> bytes:
        """The counts in the text exposition format."""
        from prometheus_client.exposition import generate_latest

        return generate_latest(self)  # type: ignore[arg-type]

    def collect(self) -> list:
        """prometheus_client's collector protocol."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        prefix = "kernmlops_exporter_http"
        conns = GaugeMetricFamily(f"{prefix}_connections", "connections open now")
        conns.add_metric([], float(self.open))
        resp = CounterMetricFamily(
            f"{prefix}_responses", "HTTP responses sent, by status code", labels=["code"]
        )
        for code, n in sorted(self.responses.items()):
            resp.add_metric([str(code)], float(n))
        closed = CounterMetricFamily(
            f"{prefix}_connections_closed",
            "connections the server closed: deadline (a request begun and not complete in "
            "time, or its response not taken in time), idle (no request began within the "
            "timeout, e.g. a kept-alive connection between scrapes), evicted (idle, to make "
            "room), refused (every slot busy), bad_request",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], float(self.closed.get(reason, 0)))
        return [conns, resp, closed]


#: why the server closes a connection (ServerStats.closed's keys)
CLOSE_REASONS = ("deadline", "idle", "evicted", "refused", "bad_request")


class _Idle(Exception):
    """No byte of a request arrived within the timeout (not a slow request)."""


#: A connection this young whose request waits unread is not evicted: a real
#: scraper sends its request at once, and is read within milliseconds.
_YOUNG_S = 1.0


class _Conn:
    __slots__ = ("born", "busy", "fd", "key", "task")

    def __init__(self, key: int, task: asyncio.Task | None, fd: int, now: float) -> None:
        self.key = key
        self.task = task
        self.fd = fd
        self.born = now
        self.busy = False  # answering a request: not to be evicted

    def has_input(self) -> bool:
        """Bytes wait in the kernel for us (a request we have not read yet)."""
        buf = bytearray(4)
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, buf)
        except OSError:
            return False
        return int.from_bytes(buf, sys.byteorder) > 0


class MetricsServer:
    """Serves ``render()`` at ``metrics_path`` (/metrics; and a pointer to it at /).

    ``timeout_s``: the whole-request deadline (and the response's);
    ``max_connections``: connections held at once, idle ones closed first;
    ``web_config``: TLS and basic auth (see webconfig.py)."""

    def __init__(
        self,
        render: Callable[[], bytes],
        host: str = "127.0.0.1",
        port: int = 9435,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
        web_config: WebConfig | None = None,
        metrics_path: str = "/metrics",
    ):
        self._render_fn = render
        self.metrics_path = check_metrics_path(metrics_path)
        self._path = metrics_path.encode()
        self.timeout_s = timeout_s
        self.max_connections = max(1, min(max_connections, raise_fd_limit() - _FD_RESERVE))
        self.web = web_config or WebConfig()
        self._auth = BasicAuth(self.web.users) if self.web.users else None
        self.scrapes = ScrapeLog()
        self.stats = ServerStats()
        # bound here (or by hold_listen, earlier), while the caller may still be privileged
        self._sock = _bound(host, port)
        # every interface (an empty host): the address bound, "::" or "0.0.0.0"
        self.host = host or self._sock.getsockname()[0]
        self.port = self._sock.getsockname()[1]
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        #: in the order they began waiting for a request, the longest-waiting first
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count()
        self._inflight: asyncio.Future[bytes] | None = None
        self._render_pool: ThreadPoolExecutor | None = None
        self._auth_pool: ThreadPoolExecutor | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.web.scheme}://{host}:{self.port}{self.metrics_path}"

    def start(self) -> MetricsServer:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._main(ready),), name="kernmlops-metrics", daemon=True
        )
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        """Stop serving, close every connection and the socket (idempotent)."""
        if self._thread is not None:
            assert self._loop is not None and self._stop is not None
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join()
            self._thread = None
        self._sock.close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the event loop ----------------------------------------------------------------
    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._render_pool = ThreadPoolExecutor(1, thread_name_prefix="kernmlops-render")
        self._auth_pool = ThreadPoolExecutor(1, thread_name_prefix="kernmlops-auth")
        try:
            server = await asyncio.start_server(
                self._accepted, sock=self._sock, limit=_MAX_HEAD_BYTES, backlog=1024
            )
        except BaseException:
            ready.set()
            raise
        ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            tasks = [c.task for c in self._conns.values() if c.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        self._render_pool.shutdown(wait=True)
        self._auth_pool.shutdown(wait=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._conns) >= self.max_connections and not self._evict_idle():
            self._count_closed("refused")
            await self._refuse(writer)
            return
        key = next(self._ids)
        sock = writer.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        now = asyncio.get_running_loop().time()
        conn = self._conns[key] = _Conn(key, asyncio.current_task(), fd, now)
        self.stats.open = len(self._conns)
        try:
            await self._serve(conn, reader, writer)
        except _Idle:
            self._count_closed("idle")
        except TimeoutError:
            self._count_closed("deadline")
        except asyncio.CancelledError:
            pass  # evicted, or the server stops
        except (ConnectionError, OSError, EOFError):
            pass  # the client hung up: nothing to report
        except Exception as err:  # a bug must not end the server
            print(f"kernmlops export: error serving a client: {err!r}", file=sys.stderr)
        finally:
            del self._conns[key]
            self.stats.open = len(self._conns)
            writer.transport.abort()

    def _evict_idle(self) -> bool:
        """Close the connection that has waited longest for a request. Busy ones
        are passed over, and so are young ones whose request has arrived but is
        not read yet (a scrape accepted in one burst with many idle connections);
        other young ones only when no older one is left."""
        young = asyncio.get_running_loop().time() - _YOUNG_S
        fallback = None
        for conn in self._conns.values():
            if conn.busy or conn.task is None:
                continue
            if conn.born > young:
                if fallback is None and not conn.has_input():
                    fallback = conn
                continue
            victim = conn
            break
        else:
            if fallback is None:
                return False
            victim = fallback
        victim.busy = True  # not chosen twice
        assert victim.task is not None
        victim.task.cancel()
        self._count_closed("evicted")
        return True

    async def _refuse(self, writer: asyncio.StreamWriter) -> None:
        if self.web.ssl_context is None:  # a TLS client would not read plain text
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n"
                b"Connection: close\r\n\r\n"
            )
        self._count_response(503)
        writer.close()

    def _count_closed(self, reason: str) -> None:
        self.stats.closed[reason] = self.stats.closed.get(reason, 0) + 1

    def _count_response(self, code: int) -> None:
        self.stats.responses[code] = self.stats.responses.get(code, 0) + 1

    async def _serve(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        # one deadline from accept: the TLS handshake and the first request within it
        deadline = loop.time() + self.timeout_s
        if self.web.ssl_context is not None:
            if await self._plain_http(writer, deadline):
                await self._tell_plain_http(reader, writer, deadline)
                return
            async with asyncio.timeout_at(deadline):
                await writer.start_tls(self.web.ssl_context)
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD_BYTES)
        while True:
            conn.busy = False
            self._conns[conn.key] = self._conns.pop(conn.key)  # waits from now: the newest
            try:
                async with asyncio.timeout_at(deadline):  # the whole request, not per byte
                    request = await self._read_request(http, reader)
            except TimeoutError:
                if http.their_state is h11.IDLE and not http.trailing_data[0]:
                    raise _Idle from None  # not a byte of a request: waiting, not slow
                raise
            except h11.RemoteProtocolError as err:
                self._count_closed("bad_request")
                await self._send_error(http, writer, err.error_status_hint)
                return
            if request is None:
                return  # closed between requests
            conn.busy = True
            await self._respond(http, writer, request)
            if http.our_state is h11.MUST_CLOSE or http.their_state is not h11.DONE:
                return
            http.start_next_cycle()
            deadline = loop.time() + self.timeout_s

    async def _plain_http(self, writer: asyncio.StreamWriter, deadline: float) -> bool:
        """Whether the client's first bytes, on the TLS port, are plain HTTP (a letter:
        a TLS record begins with its type, 0x14-0x18, or 0x80 for SSLv2's hello). They
        are peeked at, not read: the TLS layer reads them next. :class:`_Idle` when no
        byte came within the deadline."""
        loop = asyncio.get_running_loop()
        sock = writer.get_extra_info("socket")
        if sock is None:
            return False
        writer.transport.pause_reading()  # start_tls resumes it
        # a descriptor of our own to wait on: asyncio keeps the transport's for itself
        with sock.dup() as peek:
            ready = loop.create_future()
            loop.add_reader(peek.fileno(), lambda: ready.done() or ready.set_result(None))
            try:
                async with asyncio.timeout_at(deadline):
                    await ready
            except TimeoutError:
                raise _Idle from None
            finally:
                loop.remove_reader(peek.fileno())
            try:
                first = peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
        return first.isalpha()

    async def _tell_plain_http(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, deadline: float
    ) -> None:
        """Answer plain HTTP on the TLS port as Go's servers do (400, and why), after
        reading the request's head: a close with unread bytes would reset the
        connection, and the client lose the answer."""
        writer.transport.resume_reading()
        with contextlib.suppress(
            TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError
        ):
            async with asyncio.timeout_at(deadline):
                await reader.readuntil(b"\r\n\r\n")
        body = b"Client sent an HTTP request to an HTTPS server.\n"
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._count_response(400)
        self._count_closed("bad_request")
        async with asyncio.timeout(self.timeout_s):
            await writer.drain()

    async def _read_request(
        self, http: h11.Connection, reader: asyncio.StreamReader
    ) -> h11.Request | None:
        request = None
        while True:
            event = http.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(8192)
                if not data and (request or http.trailing_data[0]):
                    raise EOFError  # the client went away mid-request: not a bad request
                http.receive_data(data)
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                if request is None:
                    return None
                raise EOFError  # closed mid-request
            # h11.Data: a GET has no body; any is read and dropped

    async def _respond(
        self, http: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request
    ) -> None:
        path = request.target.split(b"?", 1)[0]
        headers = dict(request.headers)
        if request.method not in (b"GET", b"HEAD"):
            await self._send(http, writer, 405, b"only GET\n", [(b"Allow", b"GET, HEAD")])
            return
        if self._auth is not None and not await self._authorized(headers.get(b"authorization")):
            challenge = [(b"WWW-Authenticate", b'Basic realm="kernmlops exporter"')]
            await self._send(http, writer, 401, b"Unauthorized\n", challenge)
            return
        head = request.method == b"HEAD"
        if path == self._path:
            started = time.monotonic()
            try:
                body = await self._rendered()
            except Exception as err:  # a scrape error must not end the server
                print(f"kernmlops export: scrape failed: {err}", file=sys.stderr)
                await self._send(http, writer, 500, f"scrape failed: {err}\n".encode())
                return
            body += self.stats.text()
            extra = [(b"Content-Type", CONTENT_TYPE_PLAIN_0_0_4.encode())]
            extra.append((b"Vary", b"Accept-Encoding"))
            if accepts_gzip(headers.get(b"accept-encoding", b"")):
                # Prometheus asks for it: a page of many series shrinks several-fold
                loop = asyncio.get_running_loop()
                body = await loop.run_in_executor(None, gzip.compress, body, 1)
                extra.append((b"Content-Encoding", b"gzip"))
            await self._send(http, writer, 200, body, extra, head=head)
            if not head:  # a HEAD took no values: neither a scrape nor the final ones
                self.scrapes.served(started)
        elif path == b"/":
            page = b'<html><body><a href="%s">metrics</a></body></html>\n' % self._path
            await self._send(http, writer, 200, page, [(b"Content-Type", b"text/html")], head=head)
        else:
            await self._send(http, writer, 404, b"not found: try %s\n" % self._path)

    async def _authorized(self, header: bytes | None) -> bool:
        assert self._auth is not None
        text = header.decode("latin-1") if header is not None else None
        known = self._auth.cached(text)
        if known is not None:
            return known
        # bcrypt takes tens of ms: off the event loop, one at a time
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._auth_pool, self._auth.check, text)

    async def _rendered(self) -> bytes:
        """The maps read once for every scrape that arrives while they are read."""
        if self._inflight is None:
            loop = asyncio.get_running_loop()
            fut = loop.run_in_executor(self._render_pool, self._render_fn)
            self._inflight = fut

            def done(_: object) -> None:
                self._inflight = None

            fut.add_done_callback(done)
        return await asyncio.shield(self._inflight)

    async def _send(
        self,
        http: h11.Connection,
        writer: asyncio.StreamWriter,
        code: int,
        body: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
        *,
        head: bool = False,
    ) -> None:
        headers = [(b"Content-Length", str(len(body)).encode())]
        headers += extra or [(b"Content-Type", b"text/plain; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in self.web.headers]
        self._count_response(code)
        async with asyncio.timeout(self.timeout_s):  # a client that does not read is closed
            reason = HTTPStatus(code).phrase.encode()
            writer.write(http.send(h11.Response(status_code=code, headers=headers, reason=reason)))
            if not head:  # h11 knows a HEAD response has no body
                view = memoryview(body)
                for i in range(0, len(view), _CHUNK):
                    writer.write(http.send(h11.Data(data=view[i : i + _CHUNK])))
                    await writer.drain()
            writer.write(http.send(h11.EndOfMessage()))
            await writer.drain()

    async def _send_error(
        self, http: h11.Connection, writer: asyncio.StreamWriter, code: int
    ) -> None:
        if http.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        with contextlib.suppress(h11.LocalProtocolError, TimeoutError, ConnectionError):
            await self._send(http, writer, code, b"bad request\n", [(b"Connection", b"close")])
