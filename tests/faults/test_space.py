"""Free space watched while the benchmark runs: a filesystem that fills mid-run (the
collection's, or the tmpfs under the spool's first MiB) stops the benchmark within
2 s, keeps the spool for ``kernmlops recover`` and names the filesystem that filled.
Real small filesystems, filled by a neighbour while a context-switch storm runs."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kernmlops.collect.manifest import read_manifest
from kernmlops.collect.output import filesystem
from kernmlops.spool import memory as memory_module
from tests.faults.conftest import (
    EVENT_WAIT_S,
    assert_no_benchmark_left,
    parquet_rows,
    read_everything,
    recover,
    start_collect,
    wait_until,
)
from tests.faults.test_output import tmpfs
from tests.switches import spooled_switches

#: the promise: the benchmark is stopped this soon after its filesystem filled
STOP_WITHIN_S = 2.0
#: what the neighbour leaves free: below the tests' collector.min_free_mb (1 MiB)
LEFT_BYTES = 256 << 10
#: a storm light enough that its spool is made into rows in a second or two
STORM = ["stress-ng", "--switch", "1", "--switch-freq", "50000", "-t", "60", "--quiet"]


#: the storm's rows each test asserts, once recovered (it fills the disk once they are
#: copied)
ROWS = 1000


def copied(collection: Path, *memory: Path) -> int:
    """The storm's quanta_runtime rows the collector has so far, at least: of the
    switches in its spool (on disk, and in ``memory``, the spool's tmpfs folders), or
    in the collection's finished parts (a segment goes once its rows are in them)."""
    spool = collection / ".spool"
    live = spooled_switches(spool, spool / "mem", *memory, live=True)
    return max(live.rows["quanta_runtime"], parquet_rows(collection).get("quanta_runtime", 0))


def fill(folder: Path) -> int:
    """Take all but LEFT_BYTES of ``folder``'s filesystem, as a neighbour would (at a
    real-time priority: under the storm a normal fallocate takes seconds); the
    CLOCK_MONOTONIC µs just before (the filling starts then)."""
    at = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    for _ in range(10):  # the spool may take what was free in between: ask again
        st = os.statvfs(folder)
        size = st.f_bavail * st.f_frsize - LEFT_BYTES
        argv = ["chrt", "-f", "20", "fallocate", "-l", str(size), str(folder / "fill")]
        if subprocess.run(argv, stderr=subprocess.DEVNULL).returncode == 0:
            return at
    raise AssertionError(f"could not fill {folder}")


def test_filesystem_names_the_mount_point_and_type(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "a disk", "1m") as disk:  # a space: escaped in mountinfo
        assert filesystem(disk / "not" / "there") == f"{disk} (tmpfs)"
    assert filesystem(Path("/dev/shm/x")) == "/dev/shm (tmpfs)"


@pytest.mark.bpf
def test_the_output_filling_mid_run_stops_the_benchmark_and_recover_keeps_the_rows(
    tmp_path: Path, bpf_baseline
) -> None:
    """Before: the storm ran on to its end with the disk full. Now it stops within 2 s,
    exit 2 with one line naming the filesystem, and recover makes the kept rows."""
    with tmpfs(tmp_path / "full", "32m") as full:
        run = start_collect(full / "out", "--hooks", "quanta_runtime", "--", *STORM)
        run.wait_for("probes attached")
        col = run.collection()
        # the rows asserted below copied (not a fixed second of storm: fewer on a busy
        # machine), however long that takes; the collector's end would end the wait
        wait_until(lambda: run.proc.poll() is not None or copied(col) > ROWS, EVENT_WAIT_S)
        filled_at = fill(full)
        code, err = run.finish(timeout_s=60)
        assert code == 2, err
        assert "Traceback" not in err
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, err
        assert f"free on {full} (tmpfs)" in lines[0], lines[0]
        # the watch saw the space fall below min_free_mb, or a write hit ENOSPC first
        # (the filler is fast; the spool's or a part's write): either way one line
        # naming the filesystem and recover
        said = lines[0]
        ways = ("below collector.min_free_mb", "cannot write to", "the disk is full: 0 B free",
                "cannot write the spool in")  # fmt: skip
        assert any(way in said for way in ways), said
        assert "kernmlops recover" in said
        col = run.collection()
        manifest = read_manifest(col)
        assert manifest.state == "disk_full" and manifest.exit_code == 2
        stopped = manifest.benchmark.stopped_uptime_us
        assert stopped is not None and stopped - filled_at < STOP_WITHIN_S * 1e6
        assert_no_benchmark_left(run.marker)
        assert (col / ".spool").is_dir()  # kept for recover
        (full / "fill").unlink()  # room again
        recover(col)
        rows = read_everything(col)
    assert rows["quanta_runtime"] > ROWS


@pytest.mark.bpf
def test_a_neighbour_filling_the_spools_tmpfs_stops_the_benchmark_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bpf_baseline
) -> None:
    """The tmpfs under the spool's first MiB (/dev/shm; here a small one in its place)
    fills while the spool still writes there: the benchmark stops within 2 s, the
    message names that tmpfs, not the collection's disk, and recover makes the rows."""
    from kernmlops.collect.session import Session
    from kernmlops.config import load_config
    from kernmlops.errors import OutputError

    with tmpfs(tmp_path / "shm", "32m") as shm:
        monkeypatch.setattr(memory_module, "SHM", shm)
        config = load_config(
            {
                "collector": {"output_dir": str(tmp_path / "out"), "progress": False,
                              "hooks": ["quanta_runtime"], "min_free_mb": 1,
                              "warn_free_mb": 0},
                "benchmark": {"name": "command", "command": {"argv": STORM}},
            }
        )  # fmt: skip
        filled: list[int] = []

        session = Session(config)

        def neighbour() -> None:
            # once the spool writes in the tmpfs, and the rows asserted below are copied
            def spooled() -> bool:
                return any(f.stat().st_size for f in shm.glob("kernmlops-spool-*/*.ring"))

            if wait_until(spooled, 30) and wait_until(
                lambda: copied(session.path, *shm.glob("kernmlops-spool-*")) > ROWS,
                EVENT_WAIT_S,
            ):
                filled.append(fill(shm))

        filler = threading.Thread(target=neighbour)
        filler.start()
        try:
            with pytest.raises(OutputError) as caught:
                session.run()
        finally:
            filler.join()
        message = str(caught.value)
        assert filled, message
        # the space watch's line, or the copier's ENOSPC if it came first: either
        # names the tmpfs, not the collection's disk
        assert f"free on {shm} (tmpfs)" in message, message
        assert "kernmlops recover" in message
        manifest = read_manifest(session.path)
        assert manifest.state == "disk_full"
        stopped = manifest.benchmark.stopped_uptime_us
        assert stopped is not None and stopped - filled[0] < STOP_WITHIN_S * 1e6
        (shm / "fill").unlink()
        # in this process: the stand-in for /dev/shm is patched here only, and a
        # `kernmlops recover` child would not take the link to it for the spool's own
        # (under load every row can still be in that memory spool)
        from kernmlops.collect.recovery import recover as recover_here

        result = recover_here(session.path)
        assert not result.lost, result.lost
        rows = read_everything(session.path)
    assert rows["quanta_runtime"] > ROWS
