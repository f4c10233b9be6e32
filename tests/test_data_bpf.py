"""The tests of test_data.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest

from kernmlops.data import (
    read_collection,
)
from tests.conftest import skip_here
from tests.test_data import STAMP


@pytest.mark.bpf
def test_wall_clock_places_a_row_at_the_time_it_was_made(tmp_path: Path) -> None:
    """The benchmark's exit, stamped by the kernel on CLOCK_MONOTONIC, converted with the
    manifest's clock pairs, lands within a few ms after the wall-clock time the process
    wrote just before exiting (boot_time_unix alone is off by up to a second)."""
    stamp = tmp_path / "stamp"
    cmd = [sys.executable, "-m", "kernmlops", "collect", "--no-progress", "-o",
           str(tmp_path / "data"), "--hooks", "process_trace", "--",
           sys.executable, "-c", STAMP, str(stamp)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        skip_here(proc.stderr)
    [folder] = (tmp_path / "data").glob("curated/benchmark=command/collection_id=*")
    col = read_collection(folder)
    clock = col.manifest.clock
    assert clock is not None and clock.start is not None and clock.stop is not None
    for pair in (clock.start, clock.stop):
        assert 0 < pair.uncertainty_ns < 1_000_000  # back to back: well under a ms
    # the pairs are the collection's own: started_at and stopped_at are near them
    started = datetime.fromisoformat(col.manifest.started_at)
    assert abs(clock.start.realtime_ns / 1e9 - started.timestamp()) < 0.5
    written = datetime.fromtimestamp(int(stamp.read_text()) / 1e9, UTC)
    pid = col.manifest.benchmark.pid
    rows = col["process_trace"].filter(pl.col("pid") == pid)
    at = dict(rows.select("kind", col.wall_clock()).iter_rows())
    assert at["exec"] < written < at["exit"]
    assert (at["exit"] - written).total_seconds() < 0.02, (at["exit"], written)
