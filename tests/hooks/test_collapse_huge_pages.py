"""collapse_huge_pages hook: madvise/munmap ranges exactly as a program made
them; huge page collapses as the program's own smaps shows them."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from kernmlops.hooks.collapse_huge_pages import (
    COLLAPSE_TABLE,
    RANGES_TABLE,
    CollapseHugePagesHook,
    syscall_numbers,
    syscall_tracepoints_exist,
)
from tests.hooks.conftest import build_c
from tests.rows import polled

MIB = 1 << 20
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")

WORKLOAD = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
#define MIB (1UL << 20)
#define HUGE (2 * MIB)

static void wait_line(void)
{
	char line[8];

	if (!fgets(line, sizeof(line), stdin))
		exit(2);
}

/* 66 MiB anonymous; in the 64 MiB that start on a huge page boundary: small
 * pages first (NOHUGEPAGE while touching), then HUGEPAGE and a synchronous
 * collapse of the first 8 MiB; then DONTNEED, a bad advice, two munmaps.
 * Prints what it used, and stops at two points for the test. */
int main(void)
{
	size_t len = 66 * MIB, region = 64 * MIB;
	char *base, *p;
	int rc;

	base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (base == MAP_FAILED)
		return 3;
	p = (char *)(((unsigned long)base + HUGE - 1) & ~(HUGE - 1));
	printf("%lu %lu %d %d %d %d\n", (unsigned long)base, (unsigned long)p,
		MADV_NOHUGEPAGE, MADV_HUGEPAGE, MADV_COLLAPSE, MADV_DONTNEED);
	fflush(stdout);
	wait_line();
	madvise(p, region, MADV_NOHUGEPAGE);
	for (size_t i = 0; i < region; i += 4096)
		p[i] = 1;
	madvise(p, region, MADV_HUGEPAGE);
	rc = madvise(p, 8 * MIB, MADV_COLLAPSE);
	printf("%d %d\n", rc, rc ? errno : 0);
	fflush(stdout);
	wait_line(); /* the test reads /proc/<pid>/smaps */
	madvise(p + 16 * MIB, 4 * MIB, MADV_DONTNEED);
	madvise(p, 4096, 9999); /* EINVAL, but entered all the same */
	munmap(p + 60 * MIB, 4 * MIB);
	munmap(base, len);
	return 0;
}
"""


def test_syscall_numbers_of_this_architecture() -> None:
    import platform

    nrs = syscall_numbers()
    if platform.machine() == "x86_64":
        assert nrs == {"madvise": 28, "munmap": 11}
    assert set(nrs) == {"madvise", "munmap"}


def thp_mode() -> str | None:
    try:
        found = re.search(r"\[(\w+)\]", THP_ENABLED.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def anon_huge_kib(pid: int, start: int) -> int:
    """AnonHugePages of the mapping that starts at ``start``, from smaps."""
    inside = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = int(line.split("-", 1)[0], 16) == start
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError(f"no mapping at {start:#x} in /proc/{pid}/smaps")


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "w", WORKLOAD)


@pytest.mark.bpf
@pytest.mark.parametrize("syscall_tracepoints", [True, False], ids=["syscalls", "raw_syscalls"])
def test_ranges_exact_and_collapses_match_smaps(workload: Path, syscall_tracepoints: bool) -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    flt = ProcessFilter(follow_children=False)
    opts = CollapseHugePagesHook.Options(syscall_tracepoints=syscall_tracepoints)
    hook = CollapseHugePagesHook(opts)
    frames: dict[str, list[pl.DataFrame]] = {COLLAPSE_TABLE: [], RANGES_TABLE: []}
    proc = subprocess.Popen(
        [str(workload)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        base, p, nohuge, huge, collapse, dontneed = map(int, proc.stdout.readline().split())
        flt.add(proc.pid)  # after start-up: only the calls below are the program's
        proc.stdin.write("go\n")
        proc.stdin.flush()
        rc, errno = map(int, proc.stdout.readline().split())
        huge_kib = anon_huge_kib(proc.pid, p)
        smaps_us = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        for table, frame in polled(hook.stop()):
            frames[table].append(frame)
        flt.close()
    assert hook.status.drops == 0
    if syscall_tracepoints and syscall_tracepoints_exist():
        assert hook.status.variant == "syscalls"
        assert "tracepoint/syscalls/sys_enter_madvise" in hook.status.programs
    else:
        assert hook.status.variant in ("btf", "raw")
        assert f"{'tp_btf' if hook.status.variant == 'btf' else 'raw_tp'}/sys_enter" in (
            hook.status.programs
        )

    ranges = pl.concat(frames[RANGES_TABLE]).sort("ts_uptime_us")
    assert ranges["pid"].unique().to_list() == [proc.pid]
    assert ranges["tgid"].unique().to_list() == [proc.pid]
    got = ranges.select("syscall", "start", "length_bytes", "advice", "advice_name").rows()
    assert got == [
        ("madvise", p, 64 * MIB, nohuge, "nohugepage"),
        ("madvise", p, 64 * MIB, huge, "hugepage"),
        ("madvise", p, 8 * MIB, collapse, "collapse"),
        ("madvise", p + 16 * MIB, 4 * MIB, dontneed, "dontneed"),
        ("madvise", p, 4096, 9999, None),
        ("munmap", p + 60 * MIB, 4 * MIB, -1, None),
        ("munmap", base, 66 * MIB, -1, None),
    ]

    # Collapses: only where THP is on and MADV_COLLAPSE succeeded (it may
    # fail for want of memory); then every huge page smaps shows in the
    # region was made by a collapse this hook saw.
    mode = thp_mode()
    if mode not in ("always", "madvise") or rc != 0:
        print(f"THP {mode}, MADV_COLLAPSE rc {rc} errno {errno}: collapses not compared")
        return
    events = pl.concat(frames[COLLAPSE_TABLE]).filter(pl.col("ts_uptime_us") <= smaps_us)
    assert events.height, "MADV_COLLAPSE succeeded but no huge_memory event was seen"
    assert events["tgid"].unique().to_list() == [proc.pid]
    assert events["mm"].n_unique() == 1
    own = events.filter(pl.col("actor_tgid") == proc.pid)
    assert own["actor_comm"].unique().to_list() == ["w"]
    # One scan per huge page of the 8 MiB, each collapsed now or before (by khugepaged).
    scans = own.filter(pl.col("kind") == "scan_pmd")
    assert scans.height == 4
    assert set(scans["result"].to_list()) <= {"succeed", "pmd_mapped"}
    done = events.filter((pl.col("kind") == "collapse") & (pl.col("result") == "succeed"))
    assert huge_kib == 2048 * done.height
    assert huge_kib >= 8 * 1024
    assert (done["isolated"] == 1).all()
    # Each collapse isolated its pages first; the isolate row carries the mm.
    isolated = events.filter((pl.col("kind") == "isolate") & (pl.col("result") == "succeed"))
    assert isolated.height >= done.height
    assert isolated["mm"].to_list() == [events["mm"][0]] * isolated.height


def test_unreadable_tracefs_means_no_syscall_tracepoints(monkeypatch: pytest.MonkeyPatch) -> None:
    # tracefs is root's only (mode 700): a user's `kernmlops doctor` must not crash on it
    from kernmlops.hooks import collapse_huge_pages as chp

    def refuse(self: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(self))

    assert chp.syscall_tracepoints_exist()  # this kernel has them (root here)
    monkeypatch.setattr(Path, "is_dir", refuse)
    assert chp.syscall_tracepoints_exist() is False
