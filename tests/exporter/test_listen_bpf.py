"""`kernmlops export`'s listening address as an operator gives it, on a real
exporter (root + BPF): ebpf_exporter's `--web.listen-address=:PORT` serves IPv4
and IPv6, as Go's net.Listen does."""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.exporter.conftest import exporter_process, free_port, wait_logged, wait_serving
from tests.exporter.test_server import _has_ipv6_loopback

pytestmark = pytest.mark.bpf

#: one small set: what is tested is the server, not the sets
SET = "pagefaults"


@contextmanager
def exporter(log: Path, *args: str) -> Iterator[subprocess.Popen]:
    with exporter_process(log, "-c", SET, *args) as proc:
        yield proc


def test_web_listen_address_colon_port_serves_ipv4_and_ipv6(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "exporter.log"
    with exporter(log, f"--web.listen-address=:{port}") as proc:
        assert b"kernmlops_page_faults" in wait_serving(
            proc, f"http://127.0.0.1:{port}/metrics", log
        )
        if _has_ipv6_loopback():
            with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=5) as resp:
                assert resp.status == 200
        said = wait_logged(log, "serving ")
        assert f"at http://[::]:{port}/metrics" in said or not _has_ipv6_loopback()
