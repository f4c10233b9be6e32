"""memcached: a throw-away memcached on 127.0.0.1 and memaslap as the load generator.

setup() starts Debian's memcached on a free port (contained like the benchmark, see
``Benchmark.start_service``) and waits until it answers ``version``; the launched
process is memaslap (Debian's libmemcached-tools names it ``memcaslap``) with a
get/set mix written as its configuration file; its report is parsed into operations
per second and the latency of gets and sets (µs). The option names follow KernMLOps'
memcached benchmark (``operation_count``, ``read_proportion``, ``update_proportion``).
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, model_validator

from kernmlops.benchmarks._served import HOST, LocalServer
from kernmlops.benchmarks._tools import require_tool
from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")

SERVER = "memcached"
CLIENT = "memcaslap"  # memaslap, as Debian's libmemcached-tools installs it
INSTALL = "apt-get install memcached libmemcached-tools"
_BLOCK = re.compile(r"^(Get|Set|Total) Statistics \((\d+) events\)")
_STAT = re.compile(r"^\s+(Min|Max|Avg|Geo|Std):\s+([\d.]+)")
_SUMMARY = re.compile(r"Run time: ([\d.]+)s Ops: (\d+) TPS: (\d+)")
_COUNT = re.compile(r"^(cmd_get|cmd_set|get_misses): (\d+)")


class MemcachedOptions(BenchmarkOptions):
    operation_count: int = Field(100000, ge=1, description="gets and sets in all (memaslap -x)")
    read_proportion: float = Field(0.99, ge=0, le=1, description="share of gets")
    update_proportion: float = Field(0.01, ge=0, le=1, description="share of sets")
    # KernMLOps' YCSB mix: memaslap has gets and sets only
    insert_proportion: float = Field(0.0, ge=0, le=0, description="must be 0")
    rmw_proportion: float = Field(0.0, ge=0, le=0, description="must be 0")
    scan_proportion: float = Field(0.0, ge=0, le=0, description="must be 0")
    delete_proportion: float = Field(0.0, ge=0, le=0, description="must be 0")
    key_size: int = Field(64, ge=16, le=250, description="key bytes")
    value_size: int = Field(1024, ge=1, le=1 << 20, description="value bytes")
    threads: int = Field(2, ge=1, le=256, description="client threads (memaslap -T)")
    concurrency: int = Field(
        16, ge=1, le=65536, description="simulated clients over the threads (memaslap -c)"
    )
    server_threads: int = Field(4, ge=1, le=256, description="memcached worker threads (-t)")
    memory_mb: int = Field(256, ge=8, description="memcached's item memory (-m)")
    startup_timeout_s: float = Field(10, gt=0, le=600, description="longest wait for it")

    @model_validator(mode="after")
    def _mix(self) -> MemcachedOptions:
        total = self.read_proportion + self.update_proportion
        if abs(total - 1) > 1e-6:
            raise ValueError(f"read_proportion + update_proportion must be 1 (got {total:g})")
        if self.concurrency < self.threads:
            raise ValueError("concurrency must be at least threads (memaslap's rule)")
        return self


class MemcachedBenchmark(Benchmark[MemcachedOptions]):
    """memaslap against a memcached of its own."""

    name: ClassVar[str] = "memcached"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: MemcachedOptions | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        self.served = LocalServer(self, SERVER)
        self.workdir: Path | None = None

    @property
    def port(self) -> int:
        return self.served.port

    @property
    def server(self) -> subprocess.Popen[bytes] | None:
        return self.served.proc

    def check(self) -> None:
        require_tool("memcached", SERVER, INSTALL)
        require_tool("memcached", CLIENT, INSTALL)

    def server_argv(self) -> list[str]:
        o = self.options
        return [SERVER, "-l", HOST, "-p", str(self.port), "-U", "0", "-u", "root",
                "-t", str(o.server_threads), "-m", str(o.memory_mb)]  # fmt: skip

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir
        (workdir / "memaslap.cfg").write_text(self.client_config())
        self.served.start(
            self.server_argv(),
            cwd=workdir,
            log=workdir / "memcached.log",
            answers=lambda: memcached_command(self.port, "version").startswith(b"VERSION"),
            question="version",
            timeout_s=self.options.startup_timeout_s,
        )

    def client_config(self) -> str:
        """memaslap's -F file: fixed key and value sizes, the set/get mix."""
        o = self.options
        return (
            f"key\n{o.key_size} {o.key_size} 1\n"
            f"value\n{o.value_size} {o.value_size} 1\n"
            f"cmd\n0 {o.update_proportion:g}\n1 {o.read_proportion:g}\n"
        )

    def tracked_pids(self) -> list[int]:
        return self.served.pids()

    def server_stats(self) -> dict[str, int]:
        """memcached's own counters (``stats``): cmd_get, cmd_set, get_hits, ..."""
        text = memcached_command(self.port, "stats", until=b"END\r\n").decode(errors="replace")
        out: dict[str, int] = {}
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "STAT" and parts[2].isdigit():
                out[parts[1]] = int(parts[2])
        return out

    def teardown(self) -> None:
        self.served.stop()

    def launch(self) -> Launch | None:
        o = self.options
        cfg = self.workdir / "memaslap.cfg" if self.workdir else Path("memaslap.cfg")
        argv = [
            CLIENT,
            "-s", f"{HOST}:{self.port}",
            "-x", str(o.operation_count),
            "-T", str(o.threads),
            "-c", str(o.concurrency),
            "-F", str(cfg),
            # one statistics report with latencies, at the end (the run is shorter)
            "-S", "1d",
        ]  # fmt: skip
        return Launch(argv=argv, capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        rows = parse_memaslap(run.stdout_path.read_text(errors="replace"))
        return result_frame(rows) if rows else None


def memcached_command(port: int, command: str, *, until: bytes = b"\r\n",
                      timeout_s: float = 1.0) -> bytes:  # fmt: skip
    """Send one text-protocol command, return the reply up to ``until``."""
    with socket.create_connection((HOST, port), timeout=timeout_s) as s:
        s.sendall(command.encode() + b"\r\n")
        reply = b""
        while not reply.endswith(until):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    return reply


def parse_memaslap(text: str) -> list[tuple[str, str, float, str]]:
    """``(key, metric, value, unit)`` rows from memaslap's report: ops/s and the
    latency (µs) of gets, sets and all, and its counts."""
    rows: list[tuple[str, str, float, str]] = []
    block: str | None = None
    names = {"Min": "latency_min_us", "Max": "latency_max_us", "Avg": "latency_avg_us",
             "Geo": "latency_geomean_us", "Std": "latency_std_us"}  # fmt: skip
    for line in text.splitlines():
        if m := _BLOCK.match(line):
            block = m.group(1).lower()
            rows.append((block, "operations", float(m.group(2)), "1"))
        elif block and (m := _STAT.match(line)):
            rows.append((block, names[m.group(1)], float(m.group(2)), "us"))
        elif m := _COUNT.match(line):
            rows.append(("total", m.group(1), float(m.group(2)), "1"))
        elif m := _SUMMARY.search(line):
            rows.append(("total", "run_time_s", float(m.group(1)), "s"))
            rows.append(("total", "ops", float(m.group(2)), "1"))
            rows.append(("total", "ops_per_s", float(m.group(3)), "1/s"))
        elif not line.strip():
            block = None
    return rows
