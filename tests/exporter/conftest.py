"""A real exporter (root + BPF), started once per test module that needs one
running: the attacks on its server and the deployment's dashboard."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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


@pytest.fixture(scope="module")  # gone before another module counts the programs in the kernel
def live_exporter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveExporter]:
    port = free_port()
    log = tmp_path_factory.mktemp("live-exporter") / "exporter.log"
    args = [sys.executable, "-m", "kernmlops.exporter", "--listen", f"127.0.0.1:{port}"]
    args += [x for s in LIVE_SETS for x in ("-c", s)]
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    live = LiveExporter(proc, port)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"exporter exited {proc.returncode}: {log.read_text()}")
            try:
                urllib.request.urlopen(live.url, timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"exporter not serving: {log.read_text()}") from None
                time.sleep(0.2)
        yield live
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
