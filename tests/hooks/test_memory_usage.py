"""parse_meminfo on recorded text and on the real file; MemoryUsageHook's rate."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
from pydantic import ValidationError

from kernmlops.hooks.base import HookOptions
from kernmlops.hooks.memory_usage import MemoryUsageHook, meminfo_row
from kernmlops.host.meminfo import meminfo_column, parse_meminfo
from kernmlops.tables import UPTIME_TIMESTAMP
from tests.conftest import skip_here
from tests.rows import polled

#: samples on a grid, none missed
pytestmark = pytest.mark.quiet

SAMPLE = """\
MemTotal:       24684084 kB
MemFree:        23607628 kB
SwapCached:            0 kB
Active(anon):       1520 kB
Inactive(file):   695428 kB
KReclaimable:      83524 kB
SUnreclaim:        24716 kB
NFS_Unstable:          0 kB
Committed_AS:      54360 kB
VmallocTotal:   34359738367 kB
AnonHugePages:      2048 kB
HugePages_Total:      16
HugePages_Free:        3
Hugepagesize:       2048 kB
DirectMap4k:       26624 kB
DirectMap2M:     2070528 kB
DirectMap1G:    25165824 kB
not a line
Broken:          x kB
"""


def test_parse_meminfo_sample_exact() -> None:
    assert parse_meminfo(SAMPLE) == {
        "mem_total_bytes": 24684084 * 1024,
        "mem_free_bytes": 23607628 * 1024,
        "swap_cached_bytes": 0,
        "active_anon_bytes": 1520 * 1024,
        "inactive_file_bytes": 695428 * 1024,
        "k_reclaimable_bytes": 83524 * 1024,
        "s_unreclaim_bytes": 24716 * 1024,
        "nfs_unstable_bytes": 0,
        "committed_as_bytes": 54360 * 1024,
        "vmalloc_total_bytes": 34359738367 * 1024,
        "anon_huge_pages_bytes": 2048 * 1024,
        "hugepages_total": 16,
        "hugepages_free": 3,
        "hugepage_size_bytes": 2048 * 1024,
        "direct_map_4k_bytes": 26624 * 1024,
        "direct_map_2m_bytes": 2070528 * 1024,
        "direct_map_1g_bytes": 25165824 * 1024,
    }


#: KernMLOps' memory_usage schema (its data_schema), in its order
KERNMLOPS_MEMORY_USAGE = [
    "ts_uptime_us", "mem_total_bytes", "mem_free_bytes", "mem_available_bytes",
    "buffers_bytes", "cached_bytes", "swap_total_bytes", "swap_free_bytes", "dirty_bytes",
    "writeback_bytes", "anon_pages_total_bytes", "anon_hugepages_total_bytes",
    "mapped_total_bytes", "shmem_total_bytes", "hugepages_total", "hugepages_free",
    "hugepages_reserved", "hugepage_size_bytes", "hardware_corrupted_bytes",
]  # fmt: skip


def test_kernmlops_column_names_beside_ours() -> None:
    """KernMLOps names five meminfo fields otherwise (anon_pages_total_bytes, ...);
    its code read our table and found none of them. A field this kernel lacks
    (HardwareCorrupted without CONFIG_MEMORY_FAILURE) is null, not 0."""
    text = (
        "MemTotal:        2000000 kB\nAnonPages:         51200 kB\nMapped:            20480 kB\n"
        "Shmem:              4096 kB\nAnonHugePages:      6144 kB\nHugePages_Total:       8\n"
        "HugePages_Rsvd:        2\nHardwareCorrupted:     12 kB\n"
    )
    row = meminfo_row(text)
    assert row["anon_pages_total_bytes"] == row["anon_pages_bytes"] == 51200 * 1024
    assert row["mapped_total_bytes"] == 20480 * 1024
    assert row["shmem_total_bytes"] == 4096 * 1024
    assert row["anon_hugepages_total_bytes"] == 6144 * 1024
    assert row["hugepages_reserved"] == 2  # a count, as hugepages_total is
    assert row["hardware_corrupted_bytes"] == 12 * 1024
    assert meminfo_row("MemTotal: 2000000 kB\n")["hardware_corrupted_bytes"] is None


@pytest.mark.parametrize(
    ("key", "unit", "column"),
    [
        ("MemTotal", "kB", "mem_total_bytes"),
        ("Active(anon)", "kB", "active_anon_bytes"),
        ("HugePages_Total", None, "hugepages_total"),
        ("HugePages_Rsvd", None, "hugepages_rsvd"),
        ("ShmemPmdMapped", "kB", "shmem_pmd_mapped_bytes"),
    ],
)
def test_meminfo_column(key: str, unit: str | None, column: str) -> None:
    assert meminfo_column(key, unit) == column


def test_parse_real_meminfo_matches_psutil() -> None:
    with open("/proc/meminfo") as f:
        fields = parse_meminfo(f.read())
    total = psutil.virtual_memory().total
    assert abs(fields["mem_total_bytes"] - total) <= total * 0.01
    assert fields["swap_total_bytes"] == psutil.swap_memory().total
    assert "hugepages_total" in fields
    assert all(isinstance(v, int) and v >= 0 for v in fields.values())
    # Every name is a valid snake_case column.
    assert all(k == k.lower() and "(" not in k and " " not in k for k in fields)


def test_options_are_validated() -> None:
    assert MemoryUsageHook.Options().poll_hz == 10
    for bad in (0, -1, 1001):
        with pytest.raises(ValidationError):
            MemoryUsageHook.Options(poll_hz=bad)
    with pytest.raises(ValidationError):
        MemoryUsageHook.Options(poll_hz=10, rate=3)  # unknown key


def test_default_options_from_base() -> None:
    hook = MemoryUsageHook(HookOptions())
    assert hook.options.poll_hz == 10


def _poll_for(hook: MemoryUsageHook, seconds: float) -> list[pl.DataFrame]:
    frames: list[pl.DataFrame] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for table, frame in polled(hook.poll()):
            assert table == "memory_usage"
            frames.append(frame)
        time.sleep(0.01)  # the session's poll interval
    return frames


def _now_us() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def test_sample_rate_and_rows() -> None:
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    before_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    hook.start()
    try:
        frames = _poll_for(hook, 0.5)
        frames += [frame for _, frame in polled(hook.stop())]  # sampled after the last poll
    finally:
        hook.close()
    after_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    rows = pl.concat(frames)
    # a sample at start, then one every 50 ms until the stop (polling takes ~0.5 s,
    # more where the first table waits for pyarrow's import)
    ticks = (after_us - before_us) // 50_000 + 1
    assert rows.height >= 9 and ticks - 1 <= rows.height <= ticks
    ts = rows[UPTIME_TIMESTAMP]
    assert ts.is_sorted()
    assert before_us <= ts.min() and ts.max() <= after_us
    # Samples sit 50 ms apart on average (one late poll may shorten one gap).
    mean_gap_us = (ts.max() - ts.min()) / (rows.height - 1)
    assert 40_000 <= mean_gap_us <= 60_000
    assert rows.columns[0] == UPTIME_TIMESTAMP
    assert {"mem_total_bytes", "mem_free_bytes", "hugepages_total"} <= set(rows.columns)
    # KernMLOps' users read it by its schema's names
    assert set(KERNMLOPS_MEMORY_USAGE) <= set(rows.columns), set(KERNMLOPS_MEMORY_USAGE) - set(
        rows.columns
    )
    assert all(dtype == pl.Int64 for dtype in rows.schema.values())
    assert hook.status.attached and hook.status.events == rows.height


def test_poll_yields_nothing_between_samples() -> None:
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=1))
    hook.start()
    try:
        first = list(polled(hook.poll()))
        assert len(first) == 1 and first[0][1].height == 1
        assert list(polled(hook.poll())) == []
    finally:
        hook.close()


def test_a_flush_takes_every_sample_taken() -> None:
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    began = _now_us()
    hook.start()
    try:
        assert sum(f.height for _, f in polled(hook.poll())) == 1  # the first sample
        time.sleep(0.33)
        assert list(polled(hook.poll())) == []  # the next hand-over is seconds away
        # every 50-ms tick since the first sample, as long as the sleep really was
        due = (_now_us() - began) // 50_000 - 1  # the start may follow `began` a little
        flushed = sum(f.height for _, f in polled(hook.flushing()))
        ticks = (_now_us() - began) // 50_000
        assert ticks >= 6 and due <= flushed <= ticks, (due, flushed, ticks)
        assert list(polled(hook.flushing())) == []
    finally:
        hook.close()


def test_poll_before_start_and_stop_twice() -> None:
    hook = MemoryUsageHook()
    assert list(polled(hook.poll())) == []
    hook.start()
    assert sum(f.height for _, f in polled(hook.stop())) == 1
    assert list(polled(hook.stop())) == []
    hook.close()


def test_sampling_is_not_starved_by_a_busy_poll_loop() -> None:
    """The sampler has a thread of its own: a poll loop that does not come back for
    0.6 s (an event storm) loses no sample."""
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    began = _now_us()
    hook.start()
    try:
        time.sleep(0.6)  # no poll at all
        due = (_now_us() - began) // 50_000  # the first sample at once; the start may
        rows = pl.concat([f for _, f in polled(hook.stop())])  # follow `began` a little
    finally:
        hook.close()
    ticks = (_now_us() - began) // 50_000 + 1
    assert ticks >= 12 and due <= rows.height <= ticks, (due, rows.height, ticks)
    assert hook.status.drops == 0


def test_missed_intervals_are_counted_as_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that cannot be taken in time is a drop, not a silent gap (Python's
    sampler, where the native one is not built; its lock held keeps it from sampling)."""
    monkeypatch.setattr(MemoryUsageHook, "native_files", lambda self: None)
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    hook.start()
    assert hook.status.sampler == {}
    try:
        time.sleep(0.12)
        with hook._lock:  # the sampler cannot sample for 0.5 s: about 10 intervals
            held = _now_us()
            time.sleep(0.5)
            held = _now_us() - held
        time.sleep(0.12)
        rows = pl.concat([f for _, f in polled(hook.stop())])
    finally:
        hook.close()
    gaps = rows[UPTIME_TIMESTAMP].diff().drop_nulls()
    # the gap the lock made is ~0.5 s, and every 50 ms slot in it is a drop
    assert gaps.max() >= 450_000
    assert held // 50_000 - 2 <= hook.status.drops <= held // 50_000 + 1, (held, hook.status)
    assert abs(hook.status.drops - (round(gaps.max() / 50_000) - 1)) <= 1


def test_the_native_sampler_keeps_its_grid_under_a_storm_of_more_tasks_than_cpus() -> None:
    """Where the library is built, /proc/meminfo is read by the native sampler's
    thread (no GIL, SCHED_FIFO as root): a switch storm of twice as many runnable
    tasks as CPUs (which kept Python's sampler from most of its ticks) leaves it
    every tick, on time, and the rows are the file's as psutil reads it."""
    import shutil
    import subprocess

    from kernmlops.ebpf import sampler

    assert sampler.available(), "the native library is built with the objects (make bpf)"
    if shutil.which("stress-ng") is None:
        skip_here("stress-ng is not installed")
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    cpus = len(os.sched_getaffinity(0))
    hook.start()
    try:
        assert hook.status.sampler["native"]
        storm = subprocess.run(["stress-ng", "--switch", str(cpus), "-t", "3"],
                               capture_output=True, text=True)  # fmt: skip
        assert storm.returncode == 0, storm.stderr
        rows = pl.concat([f for _, f in polled(hook.stop())])
    finally:
        hook.close()
    assert hook.status.drops == 0
    gaps = rows[UPTIME_TIMESTAMP].diff().drop_nulls()
    assert rows.height >= 3 * 20 and gaps.max() < 75_000, gaps.describe()  # 50 ms a tick
    assert hook.status.events == rows.height
    total = psutil.virtual_memory().total
    assert (rows["mem_total_bytes"] == total).all()


def test_a_read_the_native_sampler_cannot_make_is_named_and_its_ticks_are_drops(
    tmp_path: Path,
) -> None:
    # /proc/meminfo's fd made a folder's under the running sampler: its read fails
    # (EISDIR), the rows so far stay, the error is in the hook's status, and every
    # tick from then to the stop is a drop, never a silent gap.
    hook = MemoryUsageHook(MemoryUsageHook.Options(poll_hz=20))
    hook.start()
    folder = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert hook.status.sampler["native"]
        time.sleep(0.12)
        assert hook._file is not None
        os.dup2(folder, hook._file.fileno())
        time.sleep(0.1)
        early = [f for _, f in polled(hook.flushing())]  # meets the error
        time.sleep(0.3)
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        rows = pl.concat(early + [f for _, f in polled(hook.stop())])
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    finally:
        hook.close()
        os.close(folder)
    assert hook.status.sampler["read_error"] == os.strerror(errno.EISDIR)
    assert 3 <= rows.height <= 4  # the samples before the fd changed
    # every 50-ms tick from the last sample to the stop
    last = rows[UPTIME_TIMESTAMP].max()
    assert (before - last) // 50_000 <= hook.status.drops <= (after - last) // 50_000
