"""The tests of test_redis.py that need root and BPF (the main lane): a run through the CLI
checked against the client's syscalls, Ctrl+C, and the server traced with its client;
apart from the others so that those run beside it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from tests.benchmarks.collect_util import (
    collect,
    collect_and_interrupt,
    execs,
    leftovers,
    results,
)
from tests.benchmarks.test_redis import needs_redis


@pytest.mark.bpf
@needs_redis
def test_redis_through_collect(tmp_path: Path) -> None:
    """Through the CLI: a row per requested test with plausible numbers, one
    sendto(2) per request from the client (syscalls hook), the server gone."""
    tests, requests, clients = ["set", "get", "incr"], 2000, 5
    began = time.time()
    proc, col = collect(
        tmp_path,
        "redis",
        {"tests": tests, "requests": requests, "clients": clients},
        "--hooks",
        "process_trace,quanta_runtime,syscalls",
    )
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    for test in tests:
        assert got[(test, "requests_per_s")] > 0
        lat = [got[(test, f"latency_{p}_ms")] for p in ("min", "p50", "p99", "max")]
        assert lat == sorted(lat) and lat[-1] > 0
    client = execs(col, "redis-benchmark")
    assert client.height == 1
    sc = col["syscalls"].filter(pl.col("tgid") == client["tgid"][0])
    sends = sc.filter(pl.col("syscall") == "sendto")["count"].sum()
    assert len(tests) * requests <= sends <= len(tests) * requests + 3 * clients + 10
    assert col.manifest["results_error"] is None
    alive = [
        p.pid
        for p in psutil.process_iter(["name", "create_time"])
        if p.info["name"] == "redis-server" and p.info["create_time"] >= began - 1
    ]
    assert alive == []


@pytest.mark.bpf
@needs_redis
def test_ctrl_c_stops_client_and_server_and_removes_data(tmp_path: Path) -> None:
    def cwd(p: psutil.Process) -> str | None:
        return p.cwd() if p.name() == "redis-server" else None

    run = collect_and_interrupt(
        tmp_path,
        "redis",
        {"tests": ["set"], "requests": 50_000_000, "clients": 4},
        running="redis-benchmark",
        probe=cwd,
    )
    assert run.returncode == 130
    assert {"redis-server", "redis-benchmark"} <= set(run.seen.values())
    assert leftovers(run, {"redis-server", "redis-benchmark"}) == []
    data_dirs = [d for d in run.facts.values() if d]
    assert data_dirs and not any(os.path.exists(d) for d in data_dirs)
    assert run.collection is not None
    assert run.collection.manifest["ended_by"] == "interrupted"


@pytest.mark.bpf
@needs_redis
def test_server_is_traced_with_its_client(tmp_path: Path) -> None:
    """Benchmark.tracked_pids(): the server started in setup() is in the tree
    filter, so its syscalls are collected: one reply written per request."""
    requests = 3000
    proc, col = collect(
        tmp_path, "redis", {"tests": ["set", "get"], "requests": requests, "clients": 5},
        "--hooks", "process_trace,quanta_runtime,syscalls",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    client = execs(col, "redis-benchmark")["tgid"][0]
    sc = col["syscalls"]
    server = sc.filter((pl.col("tgid") != client) & (pl.col("syscall") == "write"))
    assert server["tgid"].n_unique() == 1  # the server, and nothing else
    sends = sc.filter((pl.col("tgid") == client) & (pl.col("syscall") == "sendto"))["count"].sum()
    assert 2 * requests <= server["count"].sum() <= sends
    assert col["quanta_runtime"].filter(pl.col("tgid") == server["tgid"][0]).height > 0
