"""sched_migrate: migrations of a workload vs its own /proc/<pid>/sched se.nr_migrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING

import polars as pl
import pytest

from kernmlops.hooks.base import HookContext
from tests.rows import polled

if TYPE_CHECKING:
    from kernmlops.hooks.sched_migrate import SchedMigrateHook

FLIPS = 200

NR_MIGRATIONS = """
def nr_migrations(pid):
    with open(f"/proc/{pid}/sched") as fh:
        for line in fh:
            if line.startswith("se.nr_migrations"):
                return int(line.split(":")[1])
"""

# The task flips its own affinity between two CPUs while spinning. Each flip
# to the other CPU moves it before the call returns. The kernel parks the
# caller on a completion and has the stopper move it: a wake-up migration when
# the caller slept first, a queued one when the stopper preempted it first
# (about a quarter of them with both CPUs busy; none on an idle 2-vCPU VM), so
# only the count is this workload's to check. Reports the kernel's own count
# (since fork) and the time just before it was read.
SELF_FLIP = (
    NR_MIGRATIONS
    + f"""
import json, os, time
n0 = nr_migrations(os.getpid())
cpus = sorted(os.sched_getaffinity(0))[:2]
for i in range({FLIPS}):
    os.sched_setaffinity(0, {{cpus[i % 2]}})
    end = time.perf_counter() + 0.0005
    while time.perf_counter() < end:
        pass
t_us = time.monotonic_ns() // 1000
n = nr_migrations(os.getpid())
report = {{"pid": os.getpid(), "cpus": cpus, "t_us": t_us, "nr_migrations": n, "at_start": n0}}
print(json.dumps(report))
"""
)

# A parent moves a sleeping child to the other CPU, then wakes it: the child
# is placed on its new CPU as it wakes, so every move is a wake-up migration,
# however busy the CPUs are. The child is asleep (blocked in read, off its
# runqueue) before each move: it answers each wake-up and goes back to its read.
WAKE_FLIP = (
    NR_MIGRATIONS
    + f"""
import json, os, time
cpus = sorted(os.sched_getaffinity(0))[:2]
go_r, go_w = os.pipe()
ack_r, ack_w = os.pipe()
child = os.fork()
if child == 0:
    os.close(go_w)
    while os.read(go_r, 1):
        os.write(ack_w, b".")
    os._exit(0)
os.close(go_r)

def wait_asleep(pid):
    # A wait channel is shown only once the task is off its runqueue; state
    # S alone is set a moment before it leaves.
    while True:
        with open(f"/proc/{{pid}}/wchan") as fh:
            if fh.read() not in ("", "0"):
                return


wait_asleep(child)
n0 = nr_migrations(child)
t0_us = time.monotonic_ns() // 1000
for i in range({FLIPS}):
    os.sched_setaffinity(child, {{cpus[i % 2]}})
    os.write(go_w, b".")
    os.read(ack_r, 1)
    wait_asleep(child)
t_us = time.monotonic_ns() // 1000
n = nr_migrations(child)
os.close(go_w)
os.waitpid(child, 0)
report = {{
    "pid": child, "cpus": cpus, "t0_us": t0_us, "t_us": t_us, "nr_migrations": n, "at_start": n0
}}
print(json.dumps(report))
"""
)

# A parent flips the affinity of a spinning child: the child is runnable
# (queued) when it is moved, so these are queued migrations.
OTHER_FLIP = (
    NR_MIGRATIONS
    + f"""
import json, os, signal, time
cpus = sorted(os.sched_getaffinity(0))[:2]
child = os.fork()
if child == 0:
    while True:
        pass
for i in range({FLIPS}):
    os.sched_setaffinity(child, {{cpus[i % 2]}})
    time.sleep(0.0005)
t_us = time.monotonic_ns() // 1000
n = nr_migrations(child)
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
# The child was forked after its parent entered the filter: all of its
# migrations are ours to see.
report = {{"pid": child, "cpus": cpus, "t_us": t_us, "nr_migrations": n, "at_start": 0}}
print(json.dumps(report))
"""
)


def _run(workload: str, **options: object) -> tuple[dict, pl.DataFrame, SchedMigrateHook]:
    """Run a workload under the hook; its report and its task's rows."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.sched_migrate import SchedMigrateHook

    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("needs 2 CPUs to migrate between")
    flt = ProcessFilter(follow_children=True)
    hook = SchedMigrateHook(SchedMigrateHook.Options(**options))
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        # The workload waits on stdin until it is in the filter.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", 'read _ && exec "$@"', "sh", sys.executable, "-c", workload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        flt.add(proc.pid)
        out, err = proc.communicate("go\n", timeout=60)
        assert proc.returncode == 0, err
        frames = [f for _, f in polled(hook.stop())]
    finally:
        hook.close()
        flt.close()
    report = json.loads(out)
    return report, pl.concat(frames).filter(pl.col("pid") == report["pid"]), hook


@pytest.mark.bpf
@pytest.mark.parametrize(
    ("workload", "kind"),
    [(SELF_FLIP, None), (WAKE_FLIP, "wakeup"), (OTHER_FLIP, "queued")],
    ids=["self", "wake", "other"],
)
def test_migrations_match_nr_migrations(workload: str, kind: str | None) -> None:
    report, df, hook = _run(workload)
    c0, c1 = report["cpus"]
    assert (df["tgid"] == report["pid"]).all()
    # The tracepoint also fires for set_task_cpu() to the same CPU; only a
    # change counts in se.nr_migrations.
    moved = df.filter(
        (pl.col("orig_cpu") != pl.col("dest_cpu")) & (pl.col("ts_uptime_us") <= report["t_us"])
    )
    theirs = report["nr_migrations"]
    print(
        f"ours {moved.height} (of {df.height} events); se.nr_migrations {theirs}"
        f" ({report['at_start']} when the workload began)"
    )
    print(moved.group_by("kind", "orig_cpu", "dest_cpu").len().sort("len", descending=True))
    # Exact over the workload's life. Migrations before its first instruction
    # (at_start: the shell that exec'd it, between fork and the pid entering
    # the filter) may be missed, and are allowed for.
    assert theirs - report["at_start"] <= moved.height <= theirs, (moved.height, report)
    assert theirs >= FLIPS - 1
    # nr_migrations is the kernel's count before each move: one more per move,
    # none skipped, ending below the count the workload read afterwards
    counts = moved.sort("ts_uptime_us")["nr_migrations"].cast(pl.Int64)
    assert (counts.diff().drop_nulls() == 1).all(), counts.to_list()
    assert counts.min() <= report["at_start"] and counts.max() <= theirs - 1, (counts, report)

    # Every move the workload makes is of the kind it forces (the self-flip's is
    # the kernel's race: either). Those before its moves began (a child's balancing
    # after its fork, counted in at_start) may be of either kind.
    assert set(moved["kind"]) <= {"wakeup", "queued"}
    during = moved.filter(pl.col("ts_uptime_us") > report.get("t0_us", 0))
    forced = during if kind is None else during.filter(pl.col("kind") == kind)
    assert forced.height == during.height >= FLIPS - 1, during.group_by("kind").len()
    pairs = set(zip(forced["orig_cpu"].to_list(), forced["dest_cpu"].to_list(), strict=True))
    assert pairs <= {(c0, c1), (c1, c0)}, pairs
    assert (df["comm"] == os.path.basename(sys.executable)[:15]).any()

    # Runqueue fields: read on this kernel, and sane.
    assert hook.status.variant is not None and hook.status.variant.endswith("+runqueues")
    assert df["rq_valid"].all()
    assert (df["orig_nr_running"] < 10_000).all() and (df["dest_nr_running"] < 10_000).all()
    # A CPU the workload just spun on for 0.5 ms carries some load.
    assert (forced["orig_util_avg"] + forced["dest_util_avg"]).max() > 0


@pytest.mark.bpf
def test_runqueues_off() -> None:
    _, df, hook = _run(SELF_FLIP, runqueues=False)
    assert hook.status.variant is not None and hook.status.variant.endswith("-runqueues")
    assert df.height >= FLIPS - 1
    assert not df["rq_valid"].any()
    assert (df["orig_nr_running"] == 0).all() and (df["dest_load_avg"] == 0).all()
