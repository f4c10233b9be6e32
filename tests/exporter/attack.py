"""Hostile clients against a /metrics server, and a scraper beside them that
counts what it got. Used by the server tests; also a command, to measure a
running exporter:

    python tests/exporter/attack.py http://127.0.0.1:9435/metrics [seconds]

Attacks (each while one scraper scrapes every 0.25 s with a 10 s timeout, as
Prometheus would): slowloris (20 clients sending a request a byte a second,
reconnecting when closed), idle (connections that send nothing, reconnected
when closed), parallel (20 scrapers at once, back to back): first at the
sizes that silenced the old server, then with 1,000 clients.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: attacker\r\nUser-Agent: slow\r\n\r\n"


@dataclass
class Tally:
    """Status codes (0: no answer in time / connection error) and the slowest answer."""

    codes: Counter = field(default_factory=Counter)
    slowest_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, code: int, took: float) -> None:
        with self.lock:
            self.codes[code] += 1
            self.slowest_s = max(self.slowest_s, took)

    @property
    def total(self) -> int:
        return sum(self.codes.values())

    @property
    def ok(self) -> int:
        return self.codes[200]

    def __str__(self) -> str:
        codes = ", ".join(f"{c or 'error'}: {n}" for c, n in sorted(self.codes.items()))
        return f"{self.ok}/{self.total} answered 200 ({codes}); slowest {self.slowest_s:.2f} s"


def scrape(
    url: str,
    timeout: float = 10.0,
    *,
    context: ssl.SSLContext | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """One GET on a fresh connection: (status, body); (0, b'') on any failure."""
    u = urllib.parse.urlsplit(url)
    if u.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            u.hostname, u.port, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("GET", u.path or "/", headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    except (OSError, http.client.HTTPException):
        return 0, b""
    finally:
        conn.close()


def _address(url: str) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    return u.hostname or "127.0.0.1", u.port or 80


def _connect(addr: tuple[str, int]) -> socket.socket | None:
    try:
        sock = socket.create_connection(addr, timeout=2)
    except OSError:
        return None
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""  # EOF; data (a 503) also means it is done with us
    except BlockingIOError:
        return False
    except OSError:
        return True


def slowloris(url: str, stop: threading.Event, clients: int = 20, every_s: float = 1.0) -> None:
    """Each client sends the request a byte every ``every_s``; reconnects when closed."""
    addr = _address(url)
    socks: list[tuple[socket.socket | None, int]] = [(_connect(addr), 0) for _ in range(clients)]
    try:
        while not stop.wait(every_s):
            for i, (sock, sent) in enumerate(socks):
                if sock is None or _closed(sock) or sent >= len(REQUEST) - 1:
                    if sock is not None:
                        sock.close()
                    sock, sent = _connect(addr), 0
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.send(REQUEST[sent : sent + 1])
                        sent += 1
                socks[i] = (sock, sent)
    finally:
        for sock, _ in socks:
            if sock is not None:
                sock.close()


def idle(url: str, stop: threading.Event, clients: int = 1000) -> None:
    """``clients`` connections that send nothing; each one closed is opened again."""
    addr = _address(url)
    socks = [_connect(addr) for _ in range(clients)]
    try:
        while not stop.wait(0.2):
            for i, sock in enumerate(socks):
                if sock is None or _closed(sock):
                    if sock is not None:
                        sock.close()
                    socks[i] = _connect(addr)
    finally:
        for sock in socks:
            if sock is not None:
                sock.close()


def parallel(url: str, stop: threading.Event, tally: Tally, scrapers: int = 20, **kw) -> None:
    """``scrapers`` threads scraping back to back until ``stop``."""

    def one() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            code, _ = scrape(url, **kw)
            tally.add(code, time.monotonic() - t0)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def under_attack(
    url: str,
    attack: str,
    seconds: float,
    settle_s: float = 1.0,
    *,
    clients: int = 20,
    scrapers: int = 20,
    **kw,
) -> Tally:
    """Run ``attack`` for ``seconds``; a Prometheus-like scraper (every 0.25 s,
    10 s timeout) starts after ``settle_s`` (the attack holds its connections)
    and its answers are returned. For ``parallel``, the tally is every scraper's."""
    stop = threading.Event()
    tally = Tally()
    target: threading.Thread | subprocess.Popen
    if attack == "parallel":
        target = threading.Thread(target=parallel, args=(url, stop, tally, scrapers), kwargs=kw)
        target.start()
    else:  # the attacker in a process of its own: its loop does not hold our GIL
        target = subprocess.Popen(
            [sys.executable, __file__, "--hold", attack, url, str(clients)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert target.stdout is not None and target.stdout.readline() == "holding\n"
    try:
        time.sleep(settle_s)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            code, _ = scrape(url, **kw)
            tally.add(code, time.monotonic() - t0)
            time.sleep(max(0.0, 0.25 - (time.monotonic() - t0)))
    finally:
        stop.set()
        if isinstance(target, subprocess.Popen):
            target.communicate(timeout=30)  # closes its stdin: it lets go
        else:
            target.join()
    return tally


#: (attack, its size) as main() runs them: the issue's figures, then 1,000 of each
PLAN = (
    ("slowloris", {"clients": 20}),
    ("idle", {"clients": 500}),
    ("parallel", {"scrapers": 20}),
    ("slowloris", {"clients": 1000}),
    ("idle", {"clients": 1000}),
)


def hold(attack: str, url: str, clients: int) -> None:
    """Run one attack in this process until stdin closes (the test's or the
    measurement's scraper runs in another process, as a real one would)."""
    stop = threading.Event()
    fn = {"slowloris": slowloris, "idle": idle}[attack]
    t = threading.Thread(target=fn, args=(url, stop, clients), daemon=True)
    t.start()
    print("holding", flush=True)
    sys.stdin.read()
    stop.set()
    t.join()


def main(argv: list[str]) -> int:
    if argv[1] == "--hold":
        hold(argv[2], argv[3], int(argv[4]))
        return 0
    url = argv[1]
    seconds = float(argv[2]) if len(argv) > 2 else 12.0
    for attack, size in PLAN:
        tally = under_attack(url, attack, seconds, **size)
        print(f"{attack} {size}: {tally}", flush=True)
        time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
