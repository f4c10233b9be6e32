"""The tests of test_fio.py that need root and BPF (the main lane): a run through the CLI
checked against block_io, and Ctrl+C; apart from the others so that those run beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from kernmlops.benchmarks.fio import FioBenchmark
from tests.benchmarks.collect_util import (
    collect,
    collect_and_interrupt,
    execs,
    leftovers,
    results,
)
from tests.benchmarks.test_fio import MiB, _disk_sectors, needs_fio


@pytest.mark.bpf
@needs_fio
def test_fio_through_collect(tmp_path: Path) -> None:
    """Through the CLI: fio's byte counts equal the block layer's for fio's
    processes (block_io), fio's exec is traced, its JSON is kept."""
    size = 8 * MiB
    options = {"profiles": ["seqwrite", "seqread", "randread"], "size": "8M", "iodepth": 4}
    before = _disk_sectors(FioBenchmark().target_path().parent)
    proc, col = collect(
        tmp_path, "fio", options, "--hooks", "process_trace,quanta_runtime,block_io"
    )
    after = _disk_sectors(FioBenchmark().target_path().parent)
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    for key in ("seqwrite.write", "seqread.read", "randread.read"):
        assert got[(key, "io_bytes")] == size
        assert got[(key, "total_ios")] == size // 4096
        assert got[(key, "iops")] > 0 and got[(key, "bw_bytes")] > 0
        assert 0 < got[(key, "lat_p50_us")] <= got[(key, "lat_p99_us")]
    exec_rows = execs(col, "fio")
    assert exec_rows.height >= 1
    # The disk's own counters (all processes) saw at least what fio says it did:
    # direct I/O bypasses the page cache.
    assert (after[0] - before[0]) * 512 >= 2 * size
    assert (after[1] - before[1]) * 512 >= size
    # The block layer's requests from fio's processes (block_io, tree filter),
    # fio's 4 KiB blocks only: with a cold page cache, fio's exec also reads its
    # binary and libraries (larger read-ahead requests), and under memory pressure
    # (a CI lane beside it) it pages them in again a page at a time: 1.2 MiB of
    # such 4 KiB reads once, so the reads' slack is fio's binary and libraries'
    # few MiB. A row twice would be +16 MiB; a loss shows below.
    bio = col["block_io"].filter((pl.col("comm") == "fio") & (pl.col("bytes") == 4096))
    by_op = dict(bio.group_by("op").agg(pl.col("bytes").cast(pl.UInt64).sum()).iter_rows())
    assert 0.97 * 2 * size <= by_op["READ"] <= 2 * size + 4 * MiB
    assert 0.97 * size <= by_op["WRITE"] <= size + MiB
    report = json.loads((col.path / "benchmark_output" / "stdout.txt").read_text())
    assert [j["jobname"] for j in report["jobs"]] == ["seqwrite", "seqread", "randread"]
    fio_file = report["global options"]["filename"]
    assert not os.path.exists(fio_file)  # the default target file is removed


@pytest.mark.bpf
@needs_fio
def test_ctrl_c_stops_fio_and_removes_its_file(tmp_path: Path) -> None:
    files: list[str] = []

    def target(p) -> None:
        files.extend(a.split("=", 1)[1] for a in p.cmdline() if a.startswith("--filename="))

    run = collect_and_interrupt(
        tmp_path,
        "fio",
        {"profiles": ["randread"], "size": "16M", "runtime_s": 30, "time_based": True},
        running="fio",
        probe=target,
    )
    assert run.returncode == 130
    assert "fio" in run.seen.values()
    assert leftovers(run, {"fio"}) == []
    assert files and not any(os.path.exists(f) for f in files)
    assert run.collection is not None
    assert run.collection.manifest["ended_by"] == "interrupted"
