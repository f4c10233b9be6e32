"""mm_rss_stat hook: the last counter values vs the workload's /proc/self/status."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import polars as pl
import pytest

from kernmlops.ebpf.build import build, object_path
from kernmlops.ebpf.spec import ring_layouts
from kernmlops.hooks.mm_rss_stat import MmRssStatHook
from tests.hooks.conftest import run_gated
from tests.rows import polled

MIB = 1 << 20
ANON_MIB, FILE_MIB, SHMEM_MIB = 64, 16, 16
FORMAT = Path("/sys/kernel/tracing/events/kmem/rss_stat/format")

pytestmark = pytest.mark.bpf  # root: tracefs and the kernel

WORKLOAD = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

static char *map(long bytes, int flags, int fd)
{
	char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);

	if (p == MAP_FAILED)
		exit(3);
	return p;
}

/* After a line on stdin: grow each RSS counter (anon, file, shmem), then
 * print /proc/self/status's Rss lines and the CLOCK_MONOTONIC time (us). */
int main(int argc, char **argv)
{
	long page = sysconf(_SC_PAGESIZE), mib = 1 << 20, sum = 0;
	long anon = atol(argv[1]) * mib, file = atol(argv[2]) * mib, shmem = atol(argv[3]) * mib;
	char line[256], *a, *f, *s;
	struct timespec ts;
	FILE *status;
	int fd = open(argv[4], O_RDONLY);

	if (fd < 0 || !fgets(line, sizeof(line), stdin))
		return 2;
	a = map(anon, MAP_PRIVATE | MAP_ANONYMOUS, -1);
	memset(a, 1, anon);
	f = mmap(NULL, file, PROT_READ, MAP_PRIVATE, fd, 0);
	if (f == MAP_FAILED)
		return 3;
	for (long i = 0; i < file; i += page)
		sum += f[i];
	s = map(shmem, MAP_SHARED | MAP_ANONYMOUS, -1);
	memset(s, 1, shmem);
	status = fopen("/proc/self/status", "r");
	while (fgets(line, sizeof(line), status))
		if (!strncmp(line, "VmRSS", 5) || !strncmp(line, "Rss", 3))
			fputs(line, stdout);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	printf("t_us: %lld %ld\n", ts.tv_sec * 1000000LL + ts.tv_nsec / 1000, sum);
	return 0;
}
"""


def test_member_labels_are_the_kernels() -> None:
    """The column labels name the same counters as the tracepoint's own format."""
    assert FORMAT.exists(), f"{FORMAT} missing: mount tracefs (make tracefs)"
    kernel = {
        int(v): n for v, n in re.findall(r'\{\s*(\d+),\s*"(MM_\w+)"\s*\}', FORMAT.read_text())
    }
    assert kernel, FORMAT.read_text()
    build()
    labels = ring_layouts(object_path("mm_rss_stat"))["mm_rss_stat_rb"].enums["member"]
    expected = {"MM_FILEPAGES": "file", "MM_ANONPAGES": "anon", "MM_SWAPENTS": "swap"}
    expected["MM_SHMEMPAGES"] = "shmem"
    assert {v: expected[n] for v, n in kernel.items()} == labels


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("mm_rss_stat")
    (d / "w.c").write_text(WORKLOAD)
    subprocess.run(["gcc", "-O1", "-o", str(d / "w"), str(d / "w.c")], check=True)
    (d / "data").write_bytes(os.urandom(FILE_MIB * MIB))
    return d / "w", d / "data"


def test_last_values_match_proc_status(workload: tuple[Path, Path]) -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.base import HookContext

    build()
    program, data = workload
    flt = ProcessFilter(follow_children=True)
    hook = MmRssStatHook(MmRssStatHook.Options())
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        args = [str(program), str(ANON_MIB), str(FILE_MIB), str(SHMEM_MIB), str(data)]
        frames, said, pid = run_gated(hook, flt, args)
        status = dict(re.findall(r"^(\w+):\s+(\d+)", said, re.MULTILINE))
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()

    df = pl.concat(frames).filter(pl.col("mm_tgid") == pid)
    assert (df["size_pages"] * os.sysconf("SC_PAGE_SIZE") == df["size_bytes"]).all()
    t_us = int(status["t_us"])
    # The counters as the workload read its status: the last value of each.
    last = dict(
        df.filter(pl.col("ts_uptime_us") <= t_us)
        .sort("ts_uptime_us")
        .group_by("member")
        .agg(pl.col("size_bytes").last())
        .iter_rows()
    )
    kib = {m: int(status[f"Rss{m.capitalize()}"]) * 1024 for m in ("anon", "file", "shmem")}
    for member, mib in (("anon", ANON_MIB), ("file", FILE_MIB), ("shmem", SHMEM_MIB)):
        assert last[member] >= mib * MIB, (member, last)
        assert abs(last[member] - kib[member]) <= 0.10 * kib[member], (member, last, kib)
    rss = last["anon"] + last["file"] + last["shmem"]
    vm_rss = int(status["VmRSS"]) * 1024
    assert abs(rss - vm_rss) <= 0.10 * vm_rss, (rss, vm_rss)
    # While running, the workload changed its own mm (curr). At exit the mm is
    # torn down after current->mm is cleared: curr is off, but the rows are
    # still attributed through mm_id, and every counter ends at 0.
    t = pl.col("ts_uptime_us")
    before, after = df.filter(t <= t_us), df.filter(t > t_us)
    assert before["curr"].all() and (before["tgid"] == pid).all()
    teardown = after.filter(~pl.col("curr"))
    # The last mmput may run in another task (e.g. a /proc reader holding a
    # reference): the mm's owner is mm_tgid, not the task that happened to run.
    assert len(teardown) and (teardown["mm_tgid"] == pid).all()
    final = after.sort("ts_uptime_us").group_by("member").agg(pl.col("size_bytes").last())
    assert final["size_bytes"].to_list() == [0] * len(final)
    assert hook.status.drops == 0


FORKER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

/* After a line on stdin: fork N children one after the other, each touching
 * 1 MiB of anonymous memory before it exits; print each child's pid. With
 * "exec", first touch 1 MiB and exec itself (the forks then follow the
 * teardown of the old mm). */
int main(int argc, char **argv)
{
	int n = atoi(argv[1]);
	char line[16];

	if (argc < 3 || strcmp(argv[2], "run")) {
		if (!fgets(line, sizeof(line), stdin))
			return 2;
	}
	if (argc > 2 && !strcmp(argv[2], "exec")) {
		char *p = malloc(1 << 20);

		memset(p, 1, 1 << 20);
		execl(argv[0], argv[0], argv[1], "run", (char *)NULL);
		return 4;
	}
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid == 0) {
			char *p = malloc(1 << 20);

			memset(p, 1, 1 << 20);
			_exit(p[4096] - 1);
		}
		if (pid < 0 || waitpid(pid, NULL, 0) != pid)
			return 3;
		printf("%d\n", pid);
	}
	return 0;
}
"""


def test_an_mm_freed_and_reused_is_not_the_old_owners(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The tracepoint names an mm by a hash of its address, and a freed mm_struct
    is soon another process's: the traced process execs and forks children that
    exit, then a process outside the filter forks as many on the same CPU (the
    slab hands their mm the freed addresses). None of that process's rows (its
    fork copies, its children's own and their teardown) is the traced
    process's, nor collected; nor is the traced process's fork copy into the
    address its mm had before the exec."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.base import HookContext
    from tests.hooks.conftest import build_c

    build()
    forker = build_c(tmp_path_factory, "forker", FORKER)
    cpu = min(os.sched_getaffinity(0))

    def pinned() -> None:
        os.sched_setaffinity(0, {cpu})

    def run(flt: ProcessFilter | None) -> tuple[int, set[int]]:
        args = [str(forker), "200"] + (["exec"] if flt is not None else [])
        proc = subprocess.Popen(args, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, preexec_fn=pinned)  # fmt: skip
        if flt is not None:
            flt.add(proc.pid)
        out, _ = proc.communicate("go\n")
        assert proc.returncode == 0, out
        return proc.pid, {int(p) for p in out.split()}

    flt = ProcessFilter(follow_children=True)
    hook = MmRssStatHook(MmRssStatHook.Options())
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        traced, traced_children = run(flt)
        outsider, outsider_children = run(None)
        frames += [f for _, f in polled(hook.poll())]
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()

    df = pl.concat(frames)
    # the traced tree was collected (every child's own mm, attributed to it)
    assert set(df.filter(pl.col("curr"))["mm_tgid"].unique()) >= traced_children
    outside = df.filter(pl.col("tgid").is_in([outsider, *outsider_children]))
    assert outside.is_empty(), (
        f"{len(outside)} rows of untraced tasks, attributed to "
        f"{sorted(set(outside['mm_tgid']))[:5]}: {outside.head(5)}"
    )
    # The traced process's own rows without curr are its teardowns (its exec's,
    # its exit's), which only lower counters: not the fork copies it fills in
    # its children's new mms (at the address its old mm had).
    own = (
        df.filter(pl.col("mm_tgid") == traced)
        .sort("ts_uptime_us", maintain_order=True)
        .with_columns(before=pl.col("size_bytes").shift(1).over("mm_id", "member"))
        .filter(~pl.col("curr") & (pl.col("size_bytes") > pl.col("before")))
    )
    assert own.is_empty(), own
    assert hook.status.drops == 0
