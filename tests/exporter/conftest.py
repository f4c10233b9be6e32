"""A real exporter (root + BPF), started once per test module that needs one
running: the attacks on its server and the deployment's dashboard; certificates for
--web.config.file's TLS (made by the openssl command) and bcrypt hashes for its basic
auth."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest

from tests.conftest import skip_here

#: what deploy/ runs: the dashboard's sets (run-queue latency, I/O and syscalls per job)
LIVE_SETS = ("runqlat", "biojobs", "syscalls_comm", "oncpu")


@dataclass
class LiveExporter:
    proc: subprocess.Popen
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def usage_us(cgroup: Path) -> int:
    """A cgroup's CPU time, its cpu.stat's usage_usec: the scheduler's own account."""
    stat = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())
    return int(stat["usage_usec"])


@contextmanager
def scratch_cgroup(name: str) -> Iterator[Path]:
    """A cgroup v2 folder of the test's own (``name``-PID at the hierarchy's root),
    removed at the end with any it holds."""
    from kernmlops.exporter.decoders import cgroup2_mount

    mount = cgroup2_mount()
    assert mount is not None, "the test needs a cgroup v2 hierarchy"
    root = mount / f"{name}-{os.getpid()}"
    root.mkdir()
    try:
        yield root
    finally:
        for _ in range(50):  # a member's exit is reaped asynchronously
            with contextlib.suppress(OSError):
                for sub in root.iterdir():
                    if sub.is_dir():
                        sub.rmdir()
                root.rmdir()
                break
            time.sleep(0.1)


def wait_serving(proc: subprocess.Popen, url: str, log: Path, timeout: float = 90) -> bytes:
    """The first page ``proc`` serves at ``url`` (an exporter's start takes seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.read()
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"not serving at {url}: {log.read_text()}") from None
            time.sleep(0.2)


def wait_logged(log: Path, text: str, timeout: float = 20) -> str:
    """``log``'s text once it holds ``text``: the exporter answers as soon as its
    server starts, and says "serving ... at" a moment after."""
    deadline = time.monotonic() + timeout
    while text not in (got := log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def stop(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` s; reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def exporter_process(log: Path, *args: str) -> Iterator[subprocess.Popen]:
    """``python -m kernmlops.exporter ARGS``, its output in ``log``; stopped at the end."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernmlops.exporter", *args],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        yield proc
    finally:
        stop(proc)


@pytest.fixture(scope="module")  # gone before another module counts the programs in the kernel
def live_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveExporter]:
    port = free_port()
    log = tmp_path_factory.mktemp("live-exporter") / "exporter.log"
    args = ["--listen", f"127.0.0.1:{port}", *(x for s in LIVE_SETS for x in ("-c", s))]
    with exporter_process(log, *args) as proc:
        live = LiveExporter(proc, port)
        wait_serving(proc, live.url, log)
        yield live


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    if shutil.which("openssl") is None:
        skip_here("openssl not installed (make test installs it)")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", d / "ca.key", "-out", d / "ca.crt",
             "-subj", "/CN=kmo test CA", "-days", "2")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl("req", *ec, "-keyout", d / f"{name}.key", "-out", d / f"{name}.csr",
                 "-subj", f"/CN=kmo {name}")  # fmt: skip
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", d / f"{name}.csr", "-CA", d / "ca.crt",
                 "-CAkey", d / "ca.key", "-CAcreateserial", "-days", "2",
                 "-extfile", d / f"{name}.ext", "-out", d / f"{name}.crt")  # fmt: skip
    return d


def hash_password(password: str, prefix: bytes = b"$2b$") -> str:
    # rounds=4: the cheapest cost bcrypt allows, so that the test is quick
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4))
    return (prefix + hashed[4:]).decode()


def client_context(pki: Path, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))  # verifies name and chain
    if cert:
        ctx.load_cert_chain(pki / "client.crt", pki / "client.key")
    return ctx
