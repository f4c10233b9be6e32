"""page_faults hook: faults of a workload vs the workload's own getrusage."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from kernmlops.hooks.page_faults import (
    COUNTER_ALL,
    COUNTER_NOT_BY_TGID,
    COUNTS_TABLE,
    KINDS,
    TABLE,
    PageFaultsHook,
    kind_counter,
)
from tests.hooks.conftest import build_c, run_gated
from tests.rows import polled

pytestmark = pytest.mark.bpf

PAGES = 20000  # written by the workload: user-mode faults
KERNEL_PAGES = 2000  # filled by read() from /dev/zero: kernel-mode faults

WORKLOAD = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/resource.h>

static long faults(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt + ru.ru_majflt;
}

static long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

/* After a line on stdin: write to N fresh pages, then have the kernel fill K
 * more (read from /dev/zero); print the faults getrusage counted meanwhile, the
 * CLOCK_MONOTONIC window (us) around the work, and its faults since it began. */
int main(int argc, char **argv)
{
	long n = atol(argv[1]), k = atol(argv[2]), page = sysconf(_SC_PAGESIZE), f0, f1;
	long long t0, t1;
	char line[8], *p, *q;
	int zero = open("/dev/zero", O_RDONLY);

	if (argc < 4 && !fgets(line, sizeof(line), stdin)) /* a 3rd argument: no gate */
		return 2;
	t0 = now_us();
	f0 = faults();
	p = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 3;
	madvise(p, n * page, MADV_NOHUGEPAGE); /* one fault per page, not per 2 MiB */
	for (long i = 0; i < n; i++)
		p[i * page] = 1;
	q = mmap(NULL, k * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (q == MAP_FAILED)
		return 3;
	madvise(q, k * page, MADV_NOHUGEPAGE);
	if (read(zero, q, k * page) != k * page)
		return 4;
	f1 = faults();
	t1 = now_us();
	printf("%ld %lld %lld %ld\n", f1 - f0, t0, t1, f1);
	return 0;
}
"""


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "w", WORKLOAD)


#: faults the workload makes after its last getrusage: printf to a pipe and exit
#: (a few pages of stdio and the exit path; measured 0-3)
AFTER_LAST = 64


def _run(
    hook: PageFaultsHook, workload: Path, final: dict[str, pl.DataFrame] | None = None
) -> tuple[pl.DataFrame, int, int, int, int]:
    """Trace the workload; return its rows, rusage faults, window, faults seen. The
    manifest's counters (status.counters, read at close) are checked against the
    workload's own getrusage on the way: at least the faults of its window (traced
    from the gate), at most all it made since it began (it joined the filter
    before the gate, maybe after its first faults) and AFTER_LAST more. Tables other
    than page_faults made at the stop go into ``final``."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    flt = ProcessFilter(follow_children=True)
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        frames, said, pid = run_gated(hook, flt, [str(workload), str(PAGES), str(KERNEL_PAGES)])
        rusage, t0, t1, lifetime = map(int, said.split())
        seen = hook.faults_seen()
        for table, f in polled(hook.stop()):
            if table == TABLE:
                frames.append(f)
            elif final is not None:
                final[table] = f
    finally:
        hook.close()
        flt.close()
    df = pl.concat(frames)
    assert set(df["tgid"].unique()) == {pid}  # the filter held
    if final is not None:
        final["pid"] = pl.DataFrame({"pid": [pid]})
    counters = hook.status.counters
    assert counters[COUNTER_ALL] == sum(counters[kind_counter(k)] for k in KINDS) == seen
    assert rusage <= counters[COUNTER_ALL] <= lifetime + AFTER_LAST, (counters, rusage, lifetime)
    assert PAGES <= counters[kind_counter("user")] <= lifetime + AFTER_LAST - KERNEL_PAGES
    assert KERNEL_PAGES <= counters[kind_counter("kernel")] <= 1.05 * KERNEL_PAGES
    return df, rusage, t0, t1, seen


def test_faults_match_getrusage(workload: Path) -> None:
    hook = PageFaultsHook()
    df, rusage, t0, t1, seen = _run(hook, workload)
    window = df.filter(pl.col("ts_uptime_us").is_between(t0, t1))
    assert rusage >= PAGES + KERNEL_PAGES
    assert abs(len(window) - rusage) <= 0.05 * rusage, (len(window), rusage)
    assert seen == len(df)  # unsampled: every fault seen is a row
    user = window.filter(pl.col("kind") == "user")
    kernel = window.filter(pl.col("kind") == "kernel")
    assert len(user) + len(kernel) == len(window)
    assert PAGES <= len(user) <= 1.05 * PAGES
    assert KERNEL_PAGES <= len(kernel) <= 1.05 * KERNEL_PAGES
    # x86 error code: writes to absent pages have the write bit (2); from user
    # mode the user bit (4) too, from kernel mode not.
    assert (user["error_code"] & 6 == 6).mean() > 0.95
    assert (kernel["error_code"] & 6 == 2).mean() > 0.95
    assert (user["address"] > 0).all() and (user["ip"] > 0).all()
    assert (kernel["ip"] >= 1 << 63).all()  # kernel text is in the upper half
    assert hook.status.drops == 0


def test_sampling_keeps_one_in_n(workload: Path) -> None:
    n = 10
    hook = PageFaultsHook(PageFaultsHook.Options(sample_every=n))
    df, rusage, _, _, seen = _run(hook, workload)
    # Each CPU keeps every n-th fault it sees: at most n-1 per CPU are left over.
    ncpu = os.cpu_count() or 1
    assert seen // n - ncpu <= len(df) <= seen // n + ncpu
    assert abs(len(df) * n - rusage) <= 0.05 * rusage + n * ncpu, (len(df), rusage)


def test_count_by_tgid_is_exact_however_sampled(workload: Path) -> None:
    """The workload's own faults in page_fault_counts, 1 in 10 rows kept: its
    process's count is what the manifest counted (it is the only traced process)
    and so what getrusage saw (the _run bounds), whatever rows x 10 says."""
    n = 10
    hook = PageFaultsHook(PageFaultsHook.Options(sample_every=n, count_by_tgid=True))
    final: dict[str, pl.DataFrame] = {}
    df, _, _, _, seen = _run(hook, workload, final)
    counts = final[COUNTS_TABLE]
    assert counts["tgid"].to_list() == final["pid"]["pid"].to_list()
    counters = hook.status.counters
    assert counters[COUNTER_NOT_BY_TGID] == 0
    for kind in KINDS:
        assert counts[kind_counter(kind)].to_list() == [counters[kind_counter(kind)]]
    assert sum(counts[kind_counter(k)].item() for k in KINDS) == seen
    ncpu = os.cpu_count() or 1
    assert seen // n - ncpu <= len(df) <= seen // n + ncpu  # the rows still 1 in n
