"""redis: a throw-away redis-server on 127.0.0.1 and redis-benchmark as the client.

setup() starts the server on a free port with its data folder in the run's
workdir and no persistence, and waits until it answers PING; the launched
process is redis-benchmark (its --csv report is captured and parsed into
requests/s and latencies per test); teardown() shuts the server down
(SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL) and removes its data folder.
The server's pid is offered through ``tracked_pids()`` so a session can trace
it along with the client's tree.
"""

from __future__ import annotations

import csv
import io
import math
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator

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


SERVER = "redis-server"
CLIENT = "redis-benchmark"
#: Test names redis-benchmark -t selects (7.0); "ping" and "lrange" select a family.
KNOWN_TESTS = (
    "ping", "ping_inline", "ping_mbulk", "set", "get", "incr", "lpush", "rpush", "lpop",
    "rpop", "sadd", "hset", "spop", "zadd", "zpopmin", "lrange", "lrange_100", "lrange_300",
    "lrange_500", "lrange_600", "mset",
)  # fmt: skip
#: the largest count redis-benchmark reads (a C int; a larger one wraps)
INT_MAX = (1 << 31) - 1
#: CSV column -> (metric, unit)
_COLUMNS = {
    "rps": ("requests_per_s", "1/s"),
    "avg_latency_ms": ("latency_avg_ms", "ms"),
    "min_latency_ms": ("latency_min_ms", "ms"),
    "p50_latency_ms": ("latency_p50_ms", "ms"),
    "p95_latency_ms": ("latency_p95_ms", "ms"),
    "p99_latency_ms": ("latency_p99_ms", "ms"),
    "max_latency_ms": ("latency_max_ms", "ms"),
}


class RedisOptions(BenchmarkOptions):
    tests: list[str] = Field(
        ["set", "get"],
        min_length=1,
        description=f"redis-benchmark tests (-t): {', '.join(KNOWN_TESTS)}",
    )
    clients: int = Field(50, ge=1, le=10000, description="parallel connections (-c)")
    # redis-benchmark reads -n and -r with atoi: 2**32 + 1 ran one request
    requests: int = Field(100000, ge=1, le=INT_MAX, description="requests per test (-n)")
    pipeline: int = Field(1, ge=1, le=10000, description="requests pipelined per round (-P)")
    data_size: int = Field(3, ge=1, le=1 << 26, description="SET/GET value bytes (-d)")
    keyspace: int | None = Field(
        None,
        ge=1,
        le=INT_MAX,
        description="random keys from this many (-r); null: one key per test",
    )
    threads: int | None = Field(
        None, ge=1, le=256, description="client threads (--threads); null: one"
    )
    server_args: list[str] = Field(
        default_factory=list,
        description="more redis-server options, e.g. ['--io-threads', '2']",
    )
    extra_args: list[str] = Field(
        default_factory=list, description="more redis-benchmark arguments, appended"
    )
    startup_timeout_s: float = Field(
        10, gt=0, le=600, description="longest wait for the server to answer PING"
    )

    @field_validator("tests")
    @classmethod
    def _known(cls, tests: list[str]) -> list[str]:
        out = [t.strip().lower() for t in tests]
        unknown = [t for t in out if t not in KNOWN_TESTS]
        if unknown:
            # redis-benchmark silently skips names it does not know.
            raise ValueError(f"unknown test(s) {unknown}; known: {', '.join(KNOWN_TESTS)}")
        return list(dict.fromkeys(out))


class RedisBenchmark(Benchmark[RedisOptions]):
    """redis-benchmark against a redis-server of its own."""

    name: ClassVar[str] = "redis"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: RedisOptions | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        self.served = LocalServer(self, SERVER)
        self.data_dir: Path | None = None

    @property
    def port(self) -> int:
        """The server's port: picked once, when first needed (launch() may come
        before setup())."""
        return self.served.port

    @property
    def server(self) -> subprocess.Popen[bytes] | None:
        return self.served.proc

    def check(self) -> None:
        install = "apt-get install redis-server redis-tools"
        require_tool("redis", SERVER, install)
        require_tool("redis", CLIENT, install)

    # -- server --------------------------------------------------------------
    def server_argv(self) -> list[str]:
        assert self.data_dir is not None
        return [
            SERVER,
            "--port", str(self.port),
            "--bind", HOST,
            "--protected-mode", "yes",
            "--daemonize", "no",
            # no persistence: nothing written, nothing to load
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.data_dir),
            *self.options.server_args,
        ]  # fmt: skip

    def setup(self, workdir: Path) -> None:
        self.data_dir = workdir / "redis"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Its own session and cgroup: a Ctrl+C at the terminal reaches the collector,
        # which stops the client first and then this server.
        self.served.start(
            self.server_argv(),
            cwd=self.data_dir,
            log=self.data_dir / "server.log",
            answers=lambda: redis_command(self.port, "PING", timeout_s=0.5) == b"+PONG",
            question="PING",
            timeout_s=self.options.startup_timeout_s,
        )

    def tracked_pids(self) -> list[int]:
        """Processes started in setup() that a tree filter should follow too."""
        return self.served.pids()

    def teardown(self) -> None:
        # SHUTDOWN closes the connection instead of answering.
        self.served.stop(lambda: redis_command(self.port, "SHUTDOWN", "NOSAVE", timeout_s=2.0))
        if self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    # -- client --------------------------------------------------------------
    def launch(self) -> Launch | None:
        o = self.options
        argv = [
            CLIENT,
            "-h", HOST,
            "-p", str(self.port),
            "-c", str(o.clients),
            "-n", str(o.requests),
            "-P", str(o.pipeline),
            "-d", str(o.data_size),
            "-t", ",".join(o.tests),
            "--csv",
        ]  # fmt: skip
        if o.keyspace is not None:
            argv += ["-r", str(o.keyspace)]
        if o.threads is not None:
            argv += ["--threads", str(o.threads)]
        return Launch(argv=[*argv, *o.extra_args], capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        rows = parse_csv(run.stdout_path.read_text(errors="replace"))
        return result_frame(rows) if rows else None


def redis_command(port: int, *args: str, timeout_s: float = 1.0, host: str = HOST) -> bytes:
    """Send one command (RESP array) and return the first reply line without
    CRLF (b"" when the server closed the connection, as SHUTDOWN does)."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(payload)
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.split(b"\r\n", 1)[0]


def result_key(name: str) -> str:
    """Result key of a CSV test name: "LRANGE_100 (first 100 elements)" ->
    "lrange_100"; the LPUSH that fills the list for LRANGE -> "lpush_for_lrange"
    (not to be confused with the lpush test)."""
    head, _, rest = name.strip().partition(" ")
    key = head.lower()
    if "needed to benchmark" in rest.lower():
        target = rest.lower().rsplit(" ", 1)[-1].strip("()")
        key = f"{key}_for_{target}"
    return key


def parse_csv(text: str) -> list[tuple[str, str, float, str]]:
    """``(test, metric, value, unit)`` rows from redis-benchmark --csv output."""
    rows: list[tuple[str, str, float, str]] = []
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    for rec in csv.DictReader(io.StringIO("\n".join(lines))):
        test = rec.get("test")
        if not test:
            continue
        for column, (metric, unit) in _COLUMNS.items():
            value = rec.get(column)
            if value in (None, ""):
                continue
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):  # "-nan" when a test did not run long enough
                rows.append((result_key(test), metric, number, unit))
    return rows
