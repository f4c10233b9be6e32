"""A killed collection's spool, damaged the ways a disk or a hand does: `recover`
recovers every intact frame, names what it could not read, keeps the spool and exits
non-zero, and never shows a traceback; two recovers never run at once."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.ebpf.spool import FRAME, ZSTD_MAGIC
from tests.faults.conftest import kill_collector, read_everything, start_collect

pytestmark = pytest.mark.bpf

STORM = ["--", "stress-ng", "--switch", "1", "--switch-freq", "50000", "-t", "60", "--quiet"]


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A collection killed in a storm with every record still in its spool: on disk,
    in zstd frames (no memory spool, rows never made during the run)."""
    out = tmp_path_factory.mktemp("killed")
    config = "  spool_spare_cpus: 1000\n  spool_memory_mib: 0\n"
    run = start_collect(out, *STORM, more_config=config)
    run.wait_for("probes attached")
    time.sleep(2.5)
    kill_collector(run)
    subprocess.run(["pkill", "-f", "stress-ng --switch 1 --switch-freq 50000"], check=False)
    return run.collection()


def _copy(killed: Path, tmp_path: Path) -> Path:
    col = tmp_path / "curated" / "benchmark=command" / killed.name
    shutil.copytree(killed, col, symlinks=True)
    return col


def _recover(col: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "recover", str(col)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _quanta_segment(col: Path) -> Path:
    (seg,) = [p for p in (col / ".spool").glob("quanta_switch.*.ring") if p.stat().st_size]
    return seg


def _frame_starts(data: bytes) -> list[int]:
    starts, at = [], 0
    while at + FRAME.size <= len(data):
        size, _ = FRAME.unpack_from(data, at)
        assert data[at + FRAME.size : at + FRAME.size + 4] == ZSTD_MAGIC
        starts.append(at)
        at += FRAME.size + size
    return starts


def _quanta(col: Path) -> pl.DataFrame:
    return pl.read_parquet(sorted((col / "quanta_runtime").glob("part-*.parquet")))


@pytest.fixture(scope="module")
def whole(killed: Path, tmp_path_factory: pytest.TempPathFactory) -> pl.DataFrame:
    """What an undamaged copy recovers (and that the spool then goes)."""
    col = _copy(killed, tmp_path_factory.mktemp("whole"))
    done = _recover(col)
    assert done.returncode == 0, done.stderr
    assert not (col / ".spool").exists()
    assert read_everything(col)["quanta_runtime"] > 50_000
    return _quanta(col)


def test_a_flipped_data_byte_costs_its_frame_and_is_named(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    data = bytearray(seg.read_bytes())
    starts = _frame_starts(bytes(data))
    assert len(starts) >= 2, "the storm made one frame: too little to damage one of several"
    data[starts[0] + FRAME.size + 200] ^= 0x40  # inside the first frame's zstd data
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    assert f"lost: {seg}" in done.stderr and "doesn't match checksum) at byte 0" in done.stderr
    assert (col / ".spool").exists()  # kept for another try
    got = _quanta(col)
    assert 0 < got.height < whole.height
    assert got.join(whole, on=got.columns, how="anti").height == 0  # no wrong value


def test_a_damaged_frame_header_loses_that_frame_and_reading_goes_on(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    data = bytearray(seg.read_bytes())
    starts = _frame_starts(bytes(data))
    data[starts[0] + 3] ^= 0x7F  # the first frame's size: it now runs past the file
    seg.write_bytes(bytes(data))
    done = _recover(col)
    assert done.returncode == 2
    assert "a damaged frame header at byte 0; reading went on" in done.stderr
    got = _quanta(col)
    assert 0 < got.height < whole.height  # the frames after the damaged one
    assert got.join(whole, on=got.columns, how="anti").height == 0


def test_a_lost_description_is_named_with_its_bytes_and_the_spool_kept(
    killed: Path, tmp_path: Path
) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    (col / ".spool" / "quanta_switch.json").unlink()
    done = _recover(col)
    assert done.returncode == 2
    assert f"lost: {seg}: {seg.stat().st_size:,} bytes not recovered" in done.stderr
    assert "quanta_switch.json is missing" in done.stderr
    assert seg.exists()  # nothing deleted: the rows are still there for a later try


def test_damaged_jsons_are_one_line_each(killed: Path, tmp_path: Path) -> None:
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    seg.with_suffix(".json").write_text("{not json")
    (col / ".spool" / "quanta_switch.json").write_text(json.dumps(["a list"]))
    done = _recover(col)
    assert done.returncode == 2
    assert "quanta_switch.json is damaged" in done.stderr
    assert done.stderr.count("error:") == 1


def test_two_recovers_never_run_at_once(killed: Path, tmp_path: Path) -> None:
    col = _copy(killed, tmp_path)
    lock = os.open(col / ".spool" / "recover.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        os.write(lock, b"4242")
        done = _recover(col)
    finally:
        os.close(lock)
    assert done.returncode != 0
    assert "another `kernmlops recover` (pid 4242) is recovering" in done.stderr
    assert _quanta_segment(col).exists()
    assert _recover(col).returncode == 0  # once the first is done


def test_a_segment_cut_short_after_a_flush_is_named_with_what_it_lost(
    killed: Path, whole: pl.DataFrame, tmp_path: Path
) -> None:
    # Each flush notes every segment's size in its json: a file found shorter than
    # that lost bytes the collector had written (a disk's damage, a copy cut short),
    # which a kill's own cut end (after the last flush) cannot explain.
    col = _copy(killed, tmp_path)
    seg = _quanta_segment(col)
    noted = json.loads(seg.with_suffix(".json").read_text())["bytes"]
    assert 0 < noted <= seg.stat().st_size
    keep = noted // 3
    os.truncate(seg, keep)
    done = _recover(col)
    assert done.returncode == 2
    assert f"cut short: {noted - keep:,} bytes fewer than it held" in done.stderr
    assert 0 < _quanta(col).height < whole.height
