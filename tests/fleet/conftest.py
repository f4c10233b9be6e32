"""Collections for the fleet tests, written by the collector's own sink (several parts per
table), and an S3 server: moto's (``moto[server]`` from PyPI, the closest to an object
store that installs from the project's package sources), started once per session."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.parquet import ParquetSink

#: CLOCK_MONOTONIC of a synthetic collection's first event, µs
T0 = 7_000_000_000
COMMS = {100: "bench", 101: "worker", 7: "kworker/0:1"}


def tables(seed: int, quanta: int, lb: int = 0) -> dict[str, pl.DataFrame]:
    """Tables shaped as the hooks write them, with values the tests recompute."""
    rng = np.random.default_rng(seed)
    pids = np.array(list(COMMS), np.uint32)
    pid = rng.choice(pids, quanta)
    ts = T0 + np.sort(rng.integers(0, 2_000_000, quanta)).astype(np.int64)
    out = {
        "process_trace": pl.DataFrame(
            {
                "ts_uptime_us": np.array([T0 - 10, T0 - 5, T0 - 1], np.int64),
                "pid": pids,
                "tgid": pids,
                "ppid": np.array([1, 100, 2], np.uint32),
                "kind": ["exec", "fork", "fork"],
                "comm": list(COMMS.values()),
            }
        ),
        "quanta_runtime": pl.DataFrame(
            {
                "ts_uptime_us": ts,
                "quanta_run_length_us": rng.integers(1, 5000, quanta).astype(np.int64),
                "cpu": rng.integers(0, 2, quanta).astype(np.uint32),
                "pid": pid,
                "tgid": pid,
            }
        ),
        "quanta_queued_time": pl.DataFrame(
            {
                "ts_uptime_us": ts,
                "quanta_queued_time_us": rng.integers(0, 900, quanta).astype(np.int64),
                "cpu": rng.integers(0, 2, quanta).astype(np.uint32),
                "pid": pid,
                "tgid": pid,
            }
        ),
        "page_faults": pl.DataFrame(
            {
                "ts_uptime_us": ts[: quanta // 3],
                # kernel addresses: full-range unsigned, as kmo_full_u64 columns are written
                "address": np.full(quanta // 3, 0xFFFF_8880_0000_1000, np.uint64),
                "pid": pid[: quanta // 3],
                "tgid": pid[: quanta // 3],
                "kind": rng.choice(["user", "kernel"], quanta // 3),
            }
        ),
        "block_io": pl.DataFrame(
            {
                "ts_uptime_us": ts[:50],
                "bytes": np.full(50, 4096, np.uint32),
                "op": ["READ", "WRITE"] * 25,
                "queue_to_issue_us": rng.integers(0, 20, 50).astype(np.int64),
                "issue_to_complete_us": rng.integers(50, 5000, 50).astype(np.int64),
                "pid": pid[:50],
                "tgid": pid[:50],
                "comm": [COMMS[int(p)] for p in pid[:50]],
            }
        ),
    }
    if lb:
        from kernmlops.lb.dataset import synthetic_decisions

        out["lb_decisions"] = synthetic_decisions(lb, seed=seed).drop("collection_id")
    return out


def make_collection(
    root: Path,
    cid: str,
    *,
    benchmark: str = "faux",
    host: str = "node-a",
    seed: int = 0,
    quanta: int = 3000,
    lb: int = 0,
    state: str | None = "completed",
    **extra: object,
) -> Path:
    """A finished collection under ``root/benchmark=<b>/collection_id=<cid>``."""
    folder = root / f"benchmark={benchmark}" / f"collection_id={cid}"
    with ParquetSink(folder, cid, row_group_rows=256, rows_per_file=1000) as sink:
        for name, frame in tables(seed, quanta, lb).items():
            sink.write(name, frame)
    rows = sink.close()
    files = sink.files_written()
    manifest = {
        "collection_id": cid,
        "state": state,
        "benchmark": {"name": benchmark},
        "started_at": f"2026-11-0{1 + seed % 9}T10:00:00+00:00",
        "stopped_at": f"2026-11-0{1 + seed % 9}T10:00:02+00:00",
        "duration_s": 2.0,
        "exit_code": 0,
        "system": {"hostname": host, "kernel_release": f"6.1.0-{host}",
                   "cpu_model": f"CPU of {host}", "logical_cpus": 2},
        "versions": {"kernmlops": "0.1.0"},
        "tables": {t: {"rows": n, "files": files[t]} for t, n in rows.items()},
        **extra,
    }  # fmt: skip
    write_manifest(folder, manifest)
    return folder


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A local root with three finished collections on two hosts."""
    root = tmp_path / "data" / "curated"
    make_collection(root, "c1", host="node-a", seed=1)
    make_collection(root, "c2", host="node-b", seed=2, quanta=1500)
    make_collection(root, "c3", benchmark="stress-ng", host="node-a", seed=3, quanta=2200)
    return root


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: moto's S3 server, for the module's tests. Not for
    the session: a module that runs beside the kernel lab (tests/conftest.py) would
    start it early, and every later test that counts its children would find it."""
    pytest.importorskip("moto", reason="moto[server] is not installed (make setup installs it)")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # its imports take long at the idle lane's policy
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("moto's S3 server did not start")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


#: what the S3 client reads: the test server, fixed keys (moto accepts any)
SECRET = "kmo-test-secret-Zq81"


@pytest.fixture
def s3(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, object]]:
    """A fresh bucket on the server: (bucket name, a boto3 client for checking)."""
    import boto3

    env = {
        "AWS_ACCESS_KEY_ID": "kmo-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_server)
    bucket = f"fleet-{os.getpid()}-{time.monotonic_ns()}"
    client.create_bucket(Bucket=bucket)
    yield bucket, client
