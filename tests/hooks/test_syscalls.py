"""syscalls hook: exact counts for a C program making a known number of calls."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.hooks.syscalls import (
    HIST,
    SyscallsHook,
    parse_unistd,
    subtract_previous,
    syscall_table,
)
from tests.hooks.conftest import build_c
from tests.rows import polled

GETPPID_PHASES = (6000, 6345)  # 12345 in all, in two phases a pause apart
FAILING_CLOSES = 777

WORKLOAD = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

/* Waits for a line on stdin (the collector is ready), then makes a known
 * number of calls: getppid in two phases, then close(-1), which fails. */
int main(int argc, char **argv)
{
	char line[8];
	struct timespec pause = { 0, 200 * 1000 * 1000 };

	printf("%d %d\n", SYS_getppid, SYS_close);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 2;
	for (int i = 0; i < atoi(argv[1]); i++)
		syscall(SYS_getppid);
	nanosleep(&pause, NULL);
	for (int i = 0; i < atoi(argv[2]); i++)
		syscall(SYS_getppid);
	for (int i = 0; i < atoi(argv[3]); i++)
		syscall(SYS_close, -1);
	return 0;
}
"""


def test_parse_unistd_numbers_and_aliases() -> None:
    text = """
#define __NR_read 0
#define __NR_write 1
#define __NR3264_fcntl 25
#define __NR_fcntl __NR3264_fcntl
#define __NR_syscalls 451
#undef __NR_foo
"""
    assert parse_unistd(text) == {0: "read", 1: "write", 25: "fcntl"}


def test_table_of_this_machine_has_the_basics() -> None:
    table = syscall_table()
    assert table, "no uapi unistd header (Debian: apt-get install linux-libc-dev)"
    assert "getppid" in table.values() and "exit_group" in table.values()


def test_subtract_previous_keeps_new_keys_whole() -> None:
    dt = np.dtype([("count", "<u8"), ("h", "<u8", (2,))])
    prev_keys = np.array([1, 5], np.uint64)
    prev = np.array([(10, (1, 2)), (3, (0, 0))], dt)
    keys = np.array([1, 4, 5], np.uint64)
    cur = np.array([(12, (1, 3)), (7, (7, 0)), (3, (0, 0))], dt)
    delta = subtract_previous(prev_keys, prev, keys, cur)
    assert delta["count"].tolist() == [2, 7, 0]
    assert delta["h"].tolist() == [[0, 1], [7, 0], [0, 0]]


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "w", WORKLOAD)


@pytest.mark.bpf
def test_counts_errors_and_latency_are_exact(workload: Path) -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    flt = ProcessFilter(follow_children=True)
    hook = SyscallsHook(SyscallsHook.Options(interval_s=0.05))
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        args = [str(n) for n in (*GETPPID_PHASES, FAILING_CLOSES)]
        proc = subprocess.Popen(
            [str(workload), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None and proc.stdin is not None
        nr_getppid, nr_close = map(int, proc.stdout.readline().split())
        flt.add(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        while proc.poll() is None:  # the session's poll loop, in small
            frames += [f for _, f in polled(hook.poll())]
            time.sleep(0.01)
        assert proc.wait() == 0
        time.sleep(0.06)
        frames += [f for _, f in polled(hook.poll())]
        # The process is gone: its keys left the map after their last read.
        assert hook.obj is not None
        left = {int.from_bytes(k[:4], "little") for k in hook.obj.map("syscall_stats")}
        assert proc.pid not in left
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()

    df = pl.concat(frames)
    assert df.schema[HIST] == pl.List(pl.Int64)
    mine = df.filter(pl.col("tgid") == proc.pid)
    assert set(df["tgid"].unique()) == {proc.pid}  # the filter held
    by_id = mine.group_by("syscall_id", "syscall").agg(
        pl.col("count", "errors", "completed", "total_latency_ns").sum(),
        pl.len().alias("rows"),
        pl.col(HIST).list.sum().sum().alias("hist_sum"),
    )
    getppid = by_id.filter(pl.col("syscall_id") == nr_getppid).row(0, named=True)
    close = by_id.filter(pl.col("syscall_id") == nr_close).row(0, named=True)
    assert getppid["syscall"] == "getppid" and close["syscall"] == "close"
    assert getppid["count"] == sum(GETPPID_PHASES)
    assert getppid["completed"] == sum(GETPPID_PHASES)
    assert getppid["errors"] == 0
    assert getppid["rows"] >= 2, "the two phases a pause apart fall in different intervals"
    assert close["count"] == FAILING_CLOSES
    assert close["errors"] == FAILING_CLOSES
    # Histogram and total agree with the count of completed calls.
    assert getppid["hist_sum"] == getppid["completed"]
    assert 0 < getppid["total_latency_ns"] < getppid["completed"] * 1_000_000
    exit_group = by_id.filter(pl.col("syscall") == "exit_group")
    assert exit_group["count"].sum() == 1 and exit_group["completed"].sum() == 0
    assert hook.status.drops == 0


@pytest.mark.bpf
def test_calls_lost_to_a_full_map_are_drops_per_cpu(
    workload: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full (tgid, syscall) map: each of the workload's calls is one drop, counted
    per CPU at close (close once raised on them: the hook has no ring, so its
    per-CPU sum was over no slot; and a call lost at entry was lost again at exit)."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf import libbpf
    from kernmlops.ebpf.build import build
    from kernmlops.ebpf.objects import BpfObject
    from kernmlops.hooks.base import HookContext

    build()
    load = BpfObject.load

    def small_map(obj: BpfObject) -> None:  # 16 keys: filled here before the calls
        if "syscall_stats" in obj.maps:
            obj.map("syscall_stats").max_entries = 16
        load(obj)

    monkeypatch.setattr(BpfObject, "load", small_map)
    flt = ProcessFilter(follow_children=True)
    hook = SyscallsHook(SyscallsHook.Options(interval_s=3600))
    calls = 300
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        assert hook.obj is not None and hook._key is not None and hook._value is not None
        stats = hook.obj.map("syscall_stats")
        zero = bytes(hook._value.itemsize * libbpf.num_possible_cpus())
        key = np.zeros(1, hook._key.dtype)
        for i in range(16):  # keys of no process (tgids above pid_max's ceiling)
            key["tgid"], key["syscall_id"] = 1 << 30 | i, 0
            stats.update(key.tobytes(), zero)
        proc = subprocess.Popen(
            [str(workload), str(calls), "0", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdout.readline()
        flt.add(proc.pid)
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait() == 0
    finally:
        hook.close()
        flt.close()
    # the getppid calls, then the few the workload makes to end (nanosleep, exit):
    # each once; at entry and exit both, they would be twice the calls
    assert calls <= hook.status.drops <= calls + 10, hook.status.drops
    assert len(hook.status.drops_by_cpu) == libbpf.num_possible_cpus()
    assert sum(hook.status.drops_by_cpu) == hook.status.drops
