"""process_metadata hook: snapshots checked field by field against /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.hooks.process_metadata import (
    CgroupPaths,
    ProcessMetadataHook,
    cgroup2_mount,
    read_cmdline,
)
from tests.rows import polled

CLK_TCK = os.sysconf("SC_CLK_TCK")
NICE, POLICY = 7, os.SCHED_BATCH
PF_KTHREAD = 0x00200000  # the flags field of /proc/<pid>/stat

MOUNTINFO = """\
22 27 0:21 / /proc rw,nosuid - proc proc rw
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:8 - cgroup cgroup rw,cpu
35 25 0:31 /sub/dir /sys/fs/cgroup/my\\040mount rw,relatime shared:13 - cgroup2 cgroup2 rw
36 25 0:32 / /sys/fs/cgroup/second rw,relatime - cgroup2 cgroup2 rw
"""


# --- pure parts ---------------------------------------------------------------------
def test_cgroup2_mount_is_the_first_cgroup2_line_unescaped() -> None:
    assert cgroup2_mount(MOUNTINFO) == (Path("/sys/fs/cgroup/my mount"), "/sub/dir")
    assert cgroup2_mount("22 27 0:21 / /proc rw - proc proc rw\n") is None


def test_cgroup_paths_map_directory_inodes(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    ino = {p: os.stat(tmp_path / p).st_ino for p in (".", "a", "a/b", "c")}
    ids = np.array([ino["a/b"], ino["."], ino["c"], 1 << 60], np.uint64)
    assert CgroupPaths((tmp_path, "/")).resolve(ids) == ["/a/b", "/", "/c", None]
    # A mount of a sub-hierarchy: paths are the hierarchy's, not the mount's.
    assert CgroupPaths((tmp_path, "/base")).resolve(ids[:2]) == ["/base/a/b", "/base"]
    # A cgroup made after the first walk is found by walking again.
    paths = CgroupPaths((tmp_path, "/"))
    paths.resolve(ids[:1])
    (tmp_path / "d").mkdir()
    assert paths.resolve(np.array([os.stat(tmp_path / "d").st_ino])) == ["/d"]


def test_read_cmdline_joins_arguments() -> None:
    argv = [sys.executable, "-c", "print(1, flush=True); import time; time.sleep(30)", "a b", "c"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline()  # running the new image
        assert read_cmdline(proc.pid) == " ".join(argv)
    finally:
        proc.kill()
        proc.wait()
    assert read_cmdline(2) is None  # kthreadd: empty command line
    assert read_cmdline(1 << 30) is None  # no such process


# --- against /proc --------------------------------------------------------------------
def proc_stat(pid: int | str, tid: int | str | None = None) -> dict[str, object] | None:
    """The fields compared, from /proc/<pid>/stat and /proc/<pid>/cgroup."""
    base = f"/proc/{pid}" if tid is None else f"/proc/{pid}/task/{tid}"
    try:
        stat = Path(f"{base}/stat").read_text()
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        tasks = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        cmdline = read_cmdline(int(pid))
    except OSError:
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2 :].split()  # fields 3.. (state first)
    v2 = [line[3:] for line in cgroup.splitlines() if line.startswith("0::")]
    return {
        "comm": comm,
        "ppid": int(rest[1]),
        "nice": int(rest[16]),
        "starttime": int(rest[19]),
        "policy": int(rest[38]),
        "kernel_thread": bool(int(rest[6]) & PF_KTHREAD),
        # A removed cgroup is not under the mount the hook walks: no path (a zombie
        # left in one is reaped by PID 1 only later).
        "cgroup_path": v2[0] if v2 and not v2[0].endswith(" (deleted)") else None,
        "tasks": tasks,
        "cmdline": cmdline,
    }


def protected(pid: str) -> bool:
    """A task whose namespaces not even root may read is protected by whoever
    runs the machine (a sandbox's own init can be): such a task is hidden from
    BPF task iterators too, so it is not compared."""
    try:
        os.readlink(f"/proc/{pid}/ns/pid")
    except PermissionError:
        return True
    except OSError:
        pass
    return False


def proc_snapshot() -> dict[int, dict[str, object]]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and not protected(name) and (st := proc_stat(name)) is not None:
            out[int(name)] = st
    return out


@pytest.fixture
def cgroup_workload() -> Iterator[tuple[subprocess.Popen, str | None]]:
    """`sleep 30` at nice 7 with SCHED_BATCH, in a new cgroup v2 cgroup when
    the cgroup2 file system is mounted (None: left where it was)."""

    def setup() -> None:
        os.nice(NICE)
        os.sched_setscheduler(0, POLICY, os.sched_param(0))

    proc = subprocess.Popen(["sleep", "30"], preexec_fn=setup)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{proc.pid}/comm").read_text() != "sleep\n":  # until it has exec'd
        assert time.monotonic() < deadline, "sleep did not start"
        time.sleep(0.005)
    mount = cgroup2_mount()
    made: Path | None = None
    path = None
    if mount is not None and os.geteuid() == 0:
        made = mount[0] / f"kmo-test-{uuid.uuid4().hex[:8]}"
        made.mkdir()
        (made / "cgroup.procs").write_text(str(proc.pid))
        path = os.path.join(mount[1], made.name)
    try:
        yield proc, path
    finally:
        proc.kill()
        proc.wait()
        if made is not None:
            made.rmdir()


@pytest.fixture
def threaded_process() -> Iterator[subprocess.Popen]:
    """A process with a second thread named "kmo-worker" (a fresh machine may
    run no multi-threaded process of its own)."""
    code = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), name='kmo-worker', daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while len(list(Path(f"/proc/{proc.pid}/task").iterdir())) < 2:
        assert time.monotonic() < deadline, "the threaded process did not start its thread"
        time.sleep(0.01)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.bpf
def test_snapshot_matches_proc(
    cgroup_workload: tuple[subprocess.Popen, str | None], threaded_process: subprocess.Popen
) -> None:
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    workload, cgroup_path = cgroup_workload
    hook = ProcessMetadataHook()
    try:
        hook.start(HookContext("t", process_filter=None, self_tgid=os.getpid()))
        before = proc_snapshot()
        frame = hook.snapshot("check")
        after = proc_snapshot()
    finally:
        frames = [f for _, f in polled(hook.stop())]
    assert frame["snapshot"].unique().to_list() == ["check"]
    # Processes alive and unchanged across the snapshot: each must be there, as /proc says.
    stable = {pid: st for pid, st in before.items() if after.get(pid) == st}
    stable.pop(os.getpid(), None)  # the collector never traces itself
    assert len(stable) > 20, "too few stable processes to compare"
    assert os.getpid() not in frame["tgid"].to_list()
    leaders = frame.filter(pl.col("pid") == pl.col("tgid"))
    rows = {r["pid"]: r for r in leaders.iter_rows(named=True)}
    missing = sorted(set(stable) - set(rows))
    assert not missing, f"processes in /proc but not in the snapshot: {missing}"
    tasks = frame.group_by("tgid").agg(pl.col("pid").sort()).rows()
    tasks_of = {tgid: pids for tgid, pids in tasks}
    ticks = 10**9 // CLK_TCK
    for pid, st in stable.items():
        row = rows[pid]
        got = {
            "comm": row["comm"],
            "ppid": row["ppid"],
            "nice": row["nice"],
            "starttime": row["start_boottime_ns"] // ticks,
            "policy": row["policy"],
            "kernel_thread": row["kernel_thread"],
            "cgroup_path": row["cgroup_path"],
            "tasks": tasks_of[pid],
            "cmdline": row["cmdline"],
        }
        want = dict(st)
        if st["kernel_thread"] and len(row["comm"]) == 15 and st["comm"].startswith(row["comm"]):
            # /proc shows a kernel thread's full name (a workqueue worker's
            # with its current work); the task's comm holds 15 characters.
            want["comm"] = row["comm"]
        elif st["kernel_thread"] and st["comm"].startswith(row["comm"] + "-"):
            want["comm"] = row["comm"]  # kworker/0:1-events: comm + the worker's work
        assert got == want, f"pid {pid}"
        assert row["start_uptime_us"] <= row["ts_uptime_us"]
    # Threads carry their own comm and the process's parent.
    threads = frame.filter(pl.col("pid") != pl.col("tgid"))
    (tid,) = (int(t.name) for t in Path(f"/proc/{threaded_process.pid}/task").iterdir()
              if int(t.name) != threaded_process.pid)  # fmt: skip
    assert tid in threads.filter(pl.col("tgid") == threaded_process.pid)["pid"].to_list()
    ours = pl.col("tgid") == threaded_process.pid
    checked = threads.filter(ours | (pl.int_range(pl.len()) < 50))
    for row in checked.iter_rows(named=True):
        st = proc_stat(row["tgid"], row["pid"])
        if st is not None and row["tgid"] in stable:
            assert (row["comm"], row["ppid"]) == (st["comm"], st["ppid"])
    # The workload: set up with known values, compared with the setter's own ones.
    (w,) = frame.filter(pl.col("pid") == workload.pid).iter_rows(named=True)
    assert (w["comm"], w["cmdline"], w["nice"]) == ("sleep", "sleep 30", NICE)
    assert (w["policy"], w["policy_name"]) == (POLICY, "batch")
    assert w["ppid"] == os.getpid()
    if cgroup_path is not None:
        assert w["cgroup_path"] == cgroup_path
        assert w["cgroup_id"] == os.stat(cgroup2_mount()[0] / Path(cgroup_path).name).st_ino
    # start, the on-demand one, end: all written to the table, in order; between them
    # the machine's forks and execs (system-wide), rows without a snapshot_seq
    table = pl.concat(frames)
    snaps = table.filter(pl.col("snapshot_seq").is_not_null())
    labels = snaps.group_by("snapshot_seq", maintain_order=True).agg(pl.col("snapshot").first())
    events = table.filter(pl.col("snapshot_seq").is_null())
    assert set(events["snapshot"]) <= {"fork", "exec"}
    assert labels.sort("snapshot_seq")["snapshot"].to_list() == ["start", "check", "end"]
    assert hook.status.events == table.height
    assert hook.obj is None  # stopped: detached and closed


@pytest.mark.bpf
def test_filter_and_leaders_only() -> None:
    """With the process filter, only the tracked process; with threads off,
    only its leader."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    code = "import threading, time; [threading.Thread(target=time.sleep, args=(30,), daemon=True).start() for _ in range(3)]; print(1, flush=True); time.sleep(30)"  # noqa: E501
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    flt = ProcessFilter(follow_children=False)
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        flt.add(proc.pid)
        tids = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task"))
        assert len(tids) == 4
        for threads, want in ((True, tids), (False, [proc.pid])):
            opts = ProcessMetadataHook.Options(threads=threads, interval_s=0.05)
            hook = ProcessMetadataHook(opts)
            frames = []
            try:
                hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
                time.sleep(0.06)
                frames = [f for _, f in polled(hook.poll())]  # start, then one interval snapshot
            finally:
                table = pl.concat(frames + [f for _, f in polled(hook.stop())])
            assert table["snapshot"].unique(maintain_order=True).to_list() == [
                "start",
                "interval",
                "end",
            ]
            for label in ("start", "interval", "end"):
                snap = table.filter(pl.col("snapshot") == label)
                assert snap["tgid"].unique().to_list() == [proc.pid]
                assert sorted(snap["pid"].to_list()) == want
    finally:
        flt.close()
        proc.kill()
        proc.wait()


# --- in a collection: the benchmark's own command -------------------------------------
@pytest.mark.parametrize(
    ("argv", "comm"),
    [
        (["sleep", "0.3"], "sleep"),
        # leaves a child running: the end snapshot sees it before the stop kills it
        (["sh", "-c", "sleep 7.5 & sleep 0.3; exit 0"], "sh"),
    ],
)
def test_start_sees_the_command_and_end_sees_it_before_the_reap(
    tmp_path: Path, argv: list[str], comm: str
) -> None:
    """Not the gate shell (``/bin/sh -c read -r _ ...``) at start, nor nothing at the end."""
    from kernmlops.collect.session import Session
    from kernmlops.collect.sinks import MemorySink
    from kernmlops.config import load_config

    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["process_metadata"]},
            "benchmark": {"name": "command", "command": {"argv": argv}},
        }
    )  # fmt: skip
    sink = MemorySink()
    assert Session(cfg, sink=sink).run().exit_code == 0
    rows = sink.table("process_metadata")
    start = rows.filter(pl.col("snapshot") == "start")
    end = rows.filter(pl.col("snapshot") == "end")
    assert start["snapshot_seq"].unique().to_list() == [0]
    # the tree filter: at start the command, exec'd, as we wrote it, and never the gate
    # shell (the shell's child may be there too, caught between its fork and its exec)
    mine = start.filter(pl.col("ppid") == os.getpid())  # the session started it
    assert mine.select("comm", "cmdline").rows() == [(comm, " ".join(argv))]
    assert not start["cmdline"].fill_null("").str.contains("read -r _").any()
    pid = mine["pid"].item()
    # the main process exited, not yet reaped: a zombie keeps its comm, not its cmdline
    main = end.filter(pl.col("pid") == pid)
    assert main.select("comm", "cmdline").rows() == [(comm, None)]
    if comm == "sh":
        # reparented when its shell exited: its ppid is the reaper's now, not the shell's
        child = end.filter(pl.col("cmdline") == "sleep 7.5")
        assert child["comm"].to_list() == ["sleep"] and child["ppid"].item() != pid


#: Forks short-lived children (some exec sleep, some only fork), waits for each, and
#: writes their pids to the file it is given: the workload's own account of them.
FORKER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    pids = []
    for i in range(6):
        child = subprocess.Popen(["sleep", "0.02"])
        child.wait()
        pids.append(child.pid)
        pid = os.fork()
        if pid == 0:
            sum(range(200_000))  # runs a while on a CPU: quanta of its own
            os._exit(0)
        os.waitpid(pid, 0)
        pids.append(pid)
        time.sleep(0.03)
    with open(sys.argv[1], "w") as f:
        f.write(" ".join(map(str, pids)))
    """
)


@pytest.mark.bpf
def test_every_child_of_the_benchmark_is_recorded_at_its_default_interval(
    tmp_path: Path,
) -> None:
    """interval_s 0 (the default): the start and end snapshots see the root alone (its
    children start and end between them), and each child the benchmark ran has rows of
    its own, from its fork (and its exec): joining quanta_runtime with
    process_metadata names every child that ran."""
    from kernmlops.collect.session import Session
    from kernmlops.collect.sinks import MemorySink
    from kernmlops.config import load_config

    account = tmp_path / "children"
    argv = [sys.executable, "-c", FORKER, str(account)]
    cfg = load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["process_metadata", "quanta_runtime"]},
            "benchmark": {"name": "command", "command": {"argv": argv}},
        }
    )  # fmt: skip
    assert ProcessMetadataHook.Options().interval_s == 0
    sink = MemorySink()
    result = Session(cfg, sink=sink).run()
    assert result.exit_code == 0
    out = result.hooks["process_metadata"]
    assert out.attached and out.drops == 0
    meta = sink.table("process_metadata")
    quanta = sink.table("quanta_runtime")
    children = [int(p) for p in account.read_text().split()]
    assert len(children) == 12
    # the workload's own pids, each with rows of its own
    recorded = meta.filter(pl.col("snapshot").is_in(["fork", "exec"]))
    for pid in children:
        mine = recorded.filter(pl.col("pid") == pid)
        assert mine.height, f"child {pid} not in process_metadata"
        assert mine["tgid"].unique().to_list() == [pid]
        assert mine["snapshot_seq"].is_null().all()
    root = meta.filter(pl.col("snapshot") == "start")["pid"].to_list()
    assert [r for r in root if r in children] == []  # not there at start: born later
    execs = recorded.filter((pl.col("snapshot") == "exec") & pl.col("pid").is_in(children))
    assert sorted(execs["pid"].to_list()) == sorted(children[0::2])
    assert set(execs["comm"]) == {"sleep"}
    forks = recorded.filter((pl.col("snapshot") == "fork") & pl.col("pid").is_in(children))
    assert sorted(forks["pid"].to_list()) == sorted(children)
    parent = forks["ppid"].unique().to_list()
    assert len(parent) == 1 and parent[0] not in children  # the python benchmark
    # the join a user makes: every child that ran on a CPU is named
    ran = quanta.filter(pl.col("tgid").is_in(children))["tgid"].unique()
    assert ran.len() >= 6  # the forked ones each ran 200,000 additions at least
    named = quanta.filter(pl.col("tgid").is_in(children)).join(
        recorded.select("pid", "comm").unique("pid"), left_on="tgid", right_on="pid"
    )
    assert set(named["tgid"].unique()) == set(ran)
