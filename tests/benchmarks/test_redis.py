"""RedisBenchmark: options, argv, CSV parsing, the server's life (start, PING,
no persistence, shutdown, data removed, failures explained) and a real run (through
the CLI, Ctrl+C: test_redis_bpf.py)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import _tools
from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.redis import (
    RedisBenchmark,
    parse_csv,
    redis_command,
    result_key,
)
from kernmlops.errors import BenchmarkError
from tests.conftest import needs_tools

needs_redis = needs_tools("redis-server", "redis-benchmark")
SAMPLE_CSV = """\
"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","90909.09","0.071","0.016","0.063","0.199","0.303","0.423"
"LPUSH (needed to benchmark LRANGE)","66666.66","0.046","0.016","0.047","0.071","0.103","0.111"
"LRANGE_100 (first 100 elements)","40000.00","0.088","0.024","0.079","0.167","0.231","0.455"
"MSET (10 keys)","0.00","-nan","0.016","0.071","0.231","2.383","2.407"
"""


def _bench(**options: object) -> RedisBenchmark:
    return RedisBenchmark(RedisBenchmark.Options(**options))


def _reply(port: int, *args: str) -> list[bytes]:
    """Every line of the reply to one command (small replies only)."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        b"$%d\r\n%s\r\n" % (len(a), a.encode()) for a in args
    )
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(payload)
        time.sleep(0.05)
        data = s.recv(65536)
    return data.split(b"\r\n")[:-1]


def test_class_facts() -> None:
    assert RedisBenchmark.name == "redis"
    assert RedisBenchmark.default_filter == "tree"
    o = RedisBenchmark.Options()
    assert (o.tests, o.clients, o.requests, o.pipeline, o.data_size) == (
        ["set", "get"], 50, 100000, 1, 3,
    )  # fmt: skip
    for name, field in RedisBenchmark.Options.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"tests": ["set", "sett"]}, r"unknown test\(s\) \['sett'\]"),
        ({"tests": []}, "at least 1"),
        ({"clients": 0}, "greater than or equal to 1"),
        ({"pipeline": 0}, "greater than or equal to 1"),
        ({"requests": 0}, "greater than or equal to 1"),
        # redis-benchmark's atoi: 2**32 + 1 requests ran one ("rps" inf)
        ({"requests": 2**32 + 1}, "less than or equal to 2147483647"),
        ({"keyspace": 2**31}, "less than or equal to 2147483647"),
        ({"port": 6379}, "Extra inputs"),
    ],
)
def test_bad_options(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        RedisBenchmark.Options(**bad)


def test_tests_are_normalised() -> None:
    assert RedisBenchmark.Options(tests=["SET", " get", "set"]).tests == ["set", "get"]


def test_argv() -> None:
    bench = _bench(
        tests=["set", "lrange_100"], clients=7, requests=500, pipeline=16, data_size=64,
        keyspace=1000, threads=2, extra_args=["--precision", "3"],
    )  # fmt: skip
    launch = bench.launch()
    assert launch is not None and launch.capture_output
    assert launch.argv == [
        "redis-benchmark", "-h", "127.0.0.1", "-p", str(bench.port), "-c", "7", "-n", "500",
        "-P", "16", "-d", "64", "-t", "set,lrange_100", "--csv", "-r", "1000",
        "--threads", "2", "--precision", "3",
    ]  # fmt: skip
    assert bench.launch().argv == launch.argv  # the port is picked once
    assert 1024 <= bench.port <= 65535


def test_result_keys_and_csv() -> None:
    assert result_key("SET") == "set"
    assert result_key("LRANGE_600 (first 600 elements)") == "lrange_600"
    assert result_key("MSET (10 keys)") == "mset"
    assert result_key("LPUSH (needed to benchmark LRANGE)") == "lpush_for_lrange"
    rows = {(k, m): (v, u) for k, m, v, u in parse_csv("noise\n" + SAMPLE_CSV)}
    assert rows[("set", "requests_per_s")] == (90909.09, "1/s")
    assert rows[("set", "latency_p99_ms")] == (0.303, "ms")
    assert rows[("lpush_for_lrange", "latency_max_ms")] == (0.111, "ms")
    assert rows[("lrange_100", "latency_p50_ms")] == (0.079, "ms")
    assert ("mset", "latency_avg_ms") not in rows  # "-nan" is left out
    assert rows[("mset", "latency_p95_ms")] == (0.231, "ms")
    assert len(rows) == 7 + 7 + 7 + 6
    assert parse_csv("") == []


def test_check_missing_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tools.shutil, "which", lambda name: None)
    with pytest.raises(BenchmarkError, match="apt-get install redis-server redis-tools"):
        _bench().check()


@needs_redis
def test_server_lifecycle(tmp_path: Path) -> None:
    bench = _bench()
    bench.check()
    bench.setup(tmp_path)
    try:
        server = bench.server
        assert server is not None and server.poll() is None
        assert bench.tracked_pids() == [server.pid]
        data_dir = tmp_path / "redis"
        assert bench.data_dir == data_dir
        assert psutil.Process(server.pid).cwd() == str(data_dir)
        assert redis_command(bench.port, "PING") == b"+PONG"
        assert redis_command(bench.port, "SET", "k", "v") == b"+OK"
        # No persistence: no RDB snapshots, no append-only file.
        assert _reply(bench.port, "CONFIG", "GET", "save")[-1] == b""
        assert _reply(bench.port, "CONFIG", "GET", "appendonly")[-1] == b"no"
        assert _reply(bench.port, "CONFIG", "GET", "bind")[-1] == b"127.0.0.1"
        assert _reply(bench.port, "CONFIG", "GET", "dir")[-1] == str(data_dir).encode()
    finally:
        bench.teardown()
    assert server.returncode == 0  # SHUTDOWN NOSAVE: a clean exit, not a kill
    assert not data_dir.exists()
    assert bench.tracked_pids() == []
    with pytest.raises(OSError):
        redis_command(bench.port, "PING", timeout_s=0.5)
    # its cgroup's watchdog is dismissed too: nothing of the server is left
    assert psutil.Process().children(recursive=True) == []
    bench.teardown()  # twice is harmless


@needs_redis
def test_server_that_cannot_start_is_explained(tmp_path: Path) -> None:
    bench = _bench(server_args=["--no-such-directive", "1"])
    try:
        with pytest.raises(BenchmarkError, match=r"redis-server exited with status 1 .*no-such"):
            bench.setup(tmp_path)
    finally:
        bench.teardown()
    assert not (tmp_path / "redis").exists()


@needs_redis
def test_busy_port_is_explained(tmp_path: Path) -> None:
    bench = _bench()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", bench.port))
        taken.listen()
        try:
            with pytest.raises(BenchmarkError, match=r"exited .*(in use|bind)"):
                bench.setup(tmp_path)
        finally:
            bench.teardown()


@needs_redis
def test_real_benchmark_run(tmp_path: Path) -> None:
    bench = _bench(tests=["ping_mbulk", "set", "lrange_100"], requests=500, clients=4)
    bench.setup(tmp_path)
    try:
        out = tmp_path / "stdout.txt"
        with out.open("wb") as f:
            done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE, timeout=60)
        assert done.returncode == 0, done.stderr
        frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    finally:
        bench.teardown()
    assert frame is not None
    rps_rows = frame.filter(pl.col("metric") == "requests_per_s").select("key", "value")
    rps = dict(rps_rows.iter_rows())
    assert set(rps) == {"ping_mbulk", "set", "lpush_for_lrange", "lrange_100"}
    assert all(v > 0 for v in rps.values())
