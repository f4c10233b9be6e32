"""process_trace hook: forks, execs and exits of a workload vs the pids and
thread ids it reports itself (children by fork's return, threads by gettid)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from kernmlops.hooks.process_trace import ProcessTraceHook
from tests.hooks.conftest import build_c, run_gated
from tests.rows import polled

pytestmark = pytest.mark.bpf

CHILDREN = 5  # fork and _exit
EXECS = 2  # fork and exec /bin/true
THREADS = 3

WORKLOAD = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static long long now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static void *thread(void *arg)
{
	*(long *)arg = syscall(SYS_gettid);
	return NULL;
}

/* After a line on stdin: fork children that exit, children that exec
 * /bin/true, and threads; print "kind id" per task and the CLOCK_MONOTONIC
 * window (us) around it all. */
int main(int argc, char **argv)
{
	int children = atoi(argv[1]), execs = atoi(argv[2]), threads = atoi(argv[3]);
	long tids[16];
	pthread_t t[16];
	long long t0, t1;
	char line[8];

	if (!fgets(line, sizeof(line), stdin) || threads > 16)
		return 2;
	t0 = now_us();
	for (int i = 0; i < children + execs; i++) {
		pid_t c = fork();

		if (c == 0) {
			if (i >= children)
				execl("/bin/true", "true", (char *)NULL);
			_exit(0);
		}
		printf("%s %d\n", i >= children ? "exec" : "child", c);
		waitpid(c, NULL, 0);
	}
	for (int i = 0; i < threads; i++)
		pthread_create(&t[i], NULL, thread, &tids[i]);
	for (int i = 0; i < threads; i++) {
		pthread_join(t[i], NULL);
		printf("thread %ld\n", tids[i]);
	}
	t1 = now_us();
	printf("window %lld %lld\n", t0, t1);
	return 0;
}
"""


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_c(tmp_path_factory, "ptw", WORKLOAD)


def test_rows_match_the_workloads_own_pids_and_tids(workload: Path) -> None:
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    flt = ProcessFilter(follow_children=True)
    hook = ProcessTraceHook()
    frames: list[pl.DataFrame] = []
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        frames, said, pid = run_gated(
            hook, flt, [str(workload), str(CHILDREN), str(EXECS), str(THREADS)]
        )
        report = [line.split() for line in said.splitlines()]
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()
    df = pl.concat(frames)
    ids = {kind: [int(x) for k, x, *_ in report if k == kind] for kind in ("child", "exec")}
    tids = [int(x) for k, x, *_ in report if k == "thread"]
    t0, t1 = next(map(int, rest) for k, *rest in report if k == "window")
    main = pid
    assert len(ids["child"]) == CHILDREN and len(ids["exec"]) == EXECS and len(tids) == THREADS

    forks = df.filter(pl.col("kind") == "fork")
    exits = df.filter(pl.col("kind") == "exit")
    execs = df.filter(pl.col("kind") == "exec")
    processes = ids["child"] + ids["exec"]
    # One fork row per task the workload made, and nothing else.
    assert sorted(forks["pid"]) == sorted(processes + tids)
    for row in forks.iter_rows(named=True):
        thread = row["pid"] in tids
        # A thread is of the workload's process; a child is a process of its own.
        assert row["tgid"] == (main if thread else row["pid"]), row
        # ppid: the tgid of the parent process (a thread's: the workload's parent).
        assert row["ppid"] == (os.getpid() if thread else main), row
        assert row["comm"] == "ptw", row
        assert t0 <= row["ts_uptime_us"] <= t1, (row, t0, t1)
    # One exit row per task, threads included, and the workload's own.
    assert sorted(exits["pid"]) == sorted([*processes, *tids, main])
    assert exits.filter(pl.col("pid").is_in(tids))["tgid"].to_list() == [main] * THREADS
    # Exec rows carry the new program's name: the exec'ing children's, after their fork.
    new = execs.filter(pl.col("pid").is_in(ids["exec"]))
    assert sorted(new["pid"]) == sorted(ids["exec"]) and set(new["comm"]) == {"true"}
    assert set(execs["pid"]) <= {*ids["exec"], main}
    for child in ids["exec"]:
        ts = {k: df.filter((pl.col("pid") == child) & (pl.col("kind") == k))["ts_uptime_us"][0]
              for k in ("fork", "exec", "exit")}  # fmt: skip
        assert ts["fork"] <= ts["exec"] <= ts["exit"], ts
        assert df.filter((pl.col("pid") == child) & (pl.col("kind") == "exit"))["comm"][0] == "true"
    # Every task here execs (if at all) from its own first thread: old_pid is the pid.
    assert (df["old_pid"] == df["pid"]).all()
    assert hook.status.drops == 0


THREAD_EXEC = r"""
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>

static void *thread(void *arg)
{
	printf("thread %ld\n", (long)syscall(SYS_gettid));
	fflush(stdout);
	execl("/bin/true", "true", (char *)NULL);
	return NULL;
}

/* After a line on stdin: a thread other than the leader execs /bin/true (the
 * leader waits; exec ends it); print the leader's pid and the thread's id. */
int main(void)
{
	pthread_t t;
	char line[8];

	if (!fgets(line, sizeof(line), stdin))
		return 2;
	printf("leader %d\n", getpid());
	fflush(stdout);
	pthread_create(&t, NULL, thread, NULL);
	pthread_join(t, NULL);
	return 3;
}
"""


def test_a_thread_that_execs_is_named_by_old_pid(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The thread that calls execve takes the leader's pid: the exec row's pid is the
    leader's, its old_pid the thread's own id (from gettid), which no exit row ends."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    workload = build_c(tmp_path_factory, "ptx", THREAD_EXEC)
    flt = ProcessFilter(follow_children=True)
    hook = ProcessTraceHook()
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        frames, said, pid = run_gated(hook, flt, [str(workload)])
        frames += [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()
    told = dict(line.split() for line in said.splitlines())
    leader, tid = int(told["leader"]), int(told["thread"])
    assert leader == pid and tid != pid
    df = pl.concat(frames)
    execs = df.filter(pl.col("kind") == "exec")
    # the workload's own exec may be seen too: Popen returns once the exec released its
    # parent, before the tracepoint fires (then its old_pid is its pid)
    ours = execs.filter(pl.col("comm") == "ptx")
    assert ours.height <= 1 and (ours["old_pid"] == pid).all(), ours
    (row,) = execs.filter(pl.col("comm") != "ptx").iter_rows(named=True)
    assert (row["pid"], row["tgid"], row["old_pid"], row["comm"]) == (pid, pid, tid, "true")
    assert df.filter((pl.col("kind") == "fork") & (pl.col("pid") == tid)).height == 1
    assert df.filter((pl.col("kind") == "exit") & (pl.col("pid") == tid)).height == 0
    assert hook.status.drops == 0
