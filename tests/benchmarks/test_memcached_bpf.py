"""The tests of test_memcached.py that need root and BPF (the main lane): a run through
`kernmlops collect`; apart from the others so that those run beside it."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import psutil
import pytest

from tests.benchmarks.collect_util import collect, execs, results
from tests.benchmarks.test_memcached import needs_memcached


@pytest.mark.bpf
@needs_memcached
def test_memcached_through_collect(tmp_path: Path) -> None:
    began = time.time()
    proc, col = collect(
        tmp_path, "memcached", {"operation_count": 5000}, "--hooks", "process_trace,syscalls"
    )
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    # memaslap splits the count evenly over its 16 clients (rounding down)
    ops = 5000 // 16 * 16
    assert got[("total", "ops")] == ops and got[("total", "ops_per_s")] > 0
    assert got[("get", "operations")] + got[("set", "operations")] == ops
    # the server runs as a service of the benchmark, traced with its client
    client = execs(col, "memcaslap")["tgid"][0]
    sc = col["syscalls"]
    sends = sc.filter(pl.col("syscall") == "sendmsg")
    server = sends.filter(pl.col("tgid") != client)
    assert server["tgid"].n_unique() == 1  # the server, and nothing else
    # one request sent per operation by the client, one reply by the server
    assert sends.filter(pl.col("tgid") == client)["count"].sum() == ops
    assert server["count"].sum() == ops
    assert col.manifest["results_error"] is None
    alive = [
        p.pid
        for p in psutil.process_iter(["name", "create_time"])
        if p.info["name"] == "memcached" and p.info["create_time"] >= began - 1
    ]
    assert alive == []
