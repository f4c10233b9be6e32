"""`kernmlops export`'s listening address as an operator gives it, on a real
exporter (root + BPF): ebpf_exporter's `--web.listen-address=:PORT` serves IPv4
and IPv6, as Go's net.Listen does."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.exporter.conftest import free_port
from tests.exporter.test_server import _has_ipv6_loopback

pytestmark = pytest.mark.bpf

#: one small set: what is tested is the server, not the sets
SET = "pagefaults"


@contextmanager
def exporter(log: Path, *args: str) -> Iterator[subprocess.Popen]:
    cmd = [sys.executable, "-m", "kernmlops.exporter", "-c", SET, *args]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _serving(proc: subprocess.Popen, url: str, log: Path) -> bytes:
    deadline = time.monotonic() + 90
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"exporter exited {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return resp.read()
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"not serving at {url}: {log.read_text()}") from None
            time.sleep(0.2)


def test_web_listen_address_colon_port_serves_ipv4_and_ipv6(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "exporter.log"
    with exporter(log, f"--web.listen-address=:{port}") as proc:
        assert b"kernmlops_page_faults" in _serving(proc, f"http://127.0.0.1:{port}/metrics", log)
        if _has_ipv6_loopback():
            with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as resp:
                assert resp.status == 200
        assert f"at http://[::]:{port}/metrics" in log.read_text() or not _has_ipv6_loopback()
