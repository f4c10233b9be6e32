"""The tests of test_data_import.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from kernmlops import data_import as di
from tests.test_data_import import READ_BYTES, READS, WRITE_BYTES, WRITES


def _sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def loop_disk(tmp_path: Path) -> Iterator[tuple[Path, Path, int, int]]:
    """A loop device of our own on a file with data (nothing else does I/O on it), and
    a second node of it: writes through that node end with no udev probe (udev
    watches /dev/loopN's inode), so the disk's statistics count only our requests.
    Yields the device's stat file, the node, major and minor."""
    for tool in ("losetup", "dd", "udevadm"):
        if not shutil.which(tool):
            pytest.fail(f"{tool} not found (util-linux / coreutils / udev)")
    image = tmp_path / "image"
    image.write_bytes(os.urandom(4 << 20))
    loop = _sh("losetup", "--find", "--show", str(image))
    try:
        rdev = os.stat(loop).st_rdev
        major, minor = os.major(rdev), os.minor(rdev)
        node = tmp_path / "disk"
        os.mknod(node, 0o600 | 0o060000, rdev)  # S_IFBLK
        subprocess.run(["udevadm", "settle", "-t", "10"], check=False)
        stat = Path(f"/sys/dev/block/{major}:{minor}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().split()[8] != "0":  # in flight: udev's probe of the attach
            assert time.monotonic() < deadline, "the loop device never went idle"
            time.sleep(0.01)
        yield stat, node, major, minor
    finally:
        subprocess.run(["losetup", "-d", loop], check=False)


@pytest.mark.bpf
def test_kernmlops_block_io_of_a_collection_against_diskstats(
    tmp_path: Path, loop_disk: tuple[Path, Path, int, int]
) -> None:
    """`collect --hooks block_io -- dd ...` (direct I/O, one request at a time), read by
    KernMLOps' call: its tables hold every request the kernel counted in
    /sys/block/<dev>/stat, the bytes, and the time it counted reading and writing;
    each request was alone in flight, so the queue lengths are its own size."""
    from tests.e2e.conftest import run_collect

    stat, node, major, minor = loop_disk
    script = (
        f"dd if={node} of=/dev/null bs={READ_BYTES} count={READS} iflag=direct status=none"
        f" && dd if=/dev/zero of={node} bs={WRITE_BYTES} count={WRITES} oflag=direct"
        " conv=notrunc status=none"
    )
    before = [int(v) for v in stat.read_text().split()]
    proc, _ = run_collect(tmp_path / "out", "--hooks", "block_io", "--", "sh", "-c", script)
    after = [int(v) for v in stat.read_text().split()]
    assert proc.returncode == 0, proc.stderr
    delta = [a - b for a, b in zip(after, before, strict=False)]
    r = di.read_parquet_dir(tmp_path / "out")
    io = r["block_io"].filter(pl.col("device") == (major << 20 | minor))
    for op, n, size, (count, sectors, ms) in (
        # completed, sectors, ms: the stat file's fields 1, 3, 4 and 5, 7, 8
        ("Read", READS, READ_BYTES, (delta[0], delta[2], delta[3])),
        ("Write", WRITES, WRITE_BYTES, (delta[4], delta[6], delta[7])),
    ):
        rows = io.filter(pl.col("block_io_flags_string").str.ends_with(op))
        total_ms = int(rows["block_latency_us"].sum()) / 1000
        issue_ms = int(rows["block_io_latency_us"].sum()) / 1000
        print(f"{op}: {rows.height} rows, kernel {count}; {total_ms:.2f} ms from the")
        print(f"  allocation ({issue_ms:.2f} from the issue), kernel {ms} ms")
        assert rows.height == count == n
        assert int(rows["block_io_bytes"].sum()) == sectors * 512 == n * size
        assert (rows["block_io_bytes"] == size).all()
        # alone in flight: the device's queue is the request itself
        assert (rows["queue_length_4k_ios"] == size // 4096).all()
        assert (rows["queue_length_segment_ios"] == rows["segments"]).all()
        assert (rows["inflight"] == 1).all()
        # the kernel counts from the same start (in ms, its sum in ns truncated), to
        # its own clock reading just after the tracepoint's
        assert ms - 1 - n * 0.02 <= total_ms <= ms + 1, (total_ms, ms)
        assert (rows["block_latency_us"] >= rows["block_io_latency_us"]).all()
    assert io.height == READS + WRITES
    assert (io["measured_latency_us"] == io["finish_ts_uptime_us"] - io["ts_uptime_us"]).all()
    assert io["ts_uptime_us"].is_sorted()
    assert io["cpu"].is_between(0, os.cpu_count() - 1).all()  # type: ignore[operator]
    for table in ("block_io_queue_length", "block_io_latency"):
        mine = r[table].filter(pl.col("device") == (major << 20 | minor))
        assert mine.height == io.height, table
