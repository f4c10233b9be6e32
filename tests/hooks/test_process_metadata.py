"""process_metadata hook: snapshots checked field by field against /proc."""

from __future__ import annotations

import json
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

from kernmlops.errors import KernmlopsError
from kernmlops.hooks.process_metadata import (
    CgroupPaths,
    ProcessMetadataHook,
    args_limit,
    args_to_cmdlines,
    cgroup2_mount,
    event_dtype,
    join_args,
    read_cmdline,
)
from kernmlops.tables import UPTIME_TIMESTAMP
from tests.conftest import skip_here
from tests.pids import fork_at
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


def test_argument_blocks_become_command_lines_as_proc_s_are_joined() -> None:
    """Each block's first ``length`` bytes, as join_args makes /proc's cmdline a line:
    trailing NULs dropped, the others spaces, null when nothing is left, a character
    cut at the end replaced; bytes past the length (a ring record's stale ones) left."""
    blocks = [
        (b"/bin/true\0a b\0\xc3\xbc\0", 19),
        (b"x\0\0\0", 4),
        (b"abc\0de", 6),  # cut: no NUL at its end
        (b"ab\0STALE", 3),
        (b"STALE", 0),  # not read
        (b"\0\0", 2),  # one empty argument: nothing
        (b"caf\xc3", 4),  # cut inside a character
    ]
    width = 24
    raw = np.zeros((len(blocks), width), np.uint8)
    for i, (b, _) in enumerate(blocks):
        raw[i, : len(b)] = np.frombuffer(b, np.uint8)
    lengths = np.array([n for _, n in blocks], np.uint32)
    want = ["/bin/true a b ü", "x", "abc de", "ab", None, None, "caf\ufffd"]
    assert args_to_cmdlines(raw, lengths).to_pylist() == want
    assert [join_args(b[:n]) for b, n in blocks] == want
    # and any block, against join_args: ASCII only (the fast path) and not
    rng = np.random.default_rng(7)
    for alphabet in (np.array([0, 0, 0x20, 0x61, 0x7A], np.uint8), np.arange(256, dtype=np.uint8)):
        raw = rng.choice(alphabet, size=(300, 16))
        lengths = rng.integers(0, 17, 300).astype(np.uint32)
        got = args_to_cmdlines(raw, lengths).to_pylist()
        assert got == [join_args(r[:n].tobytes()) for r, n in zip(raw, lengths, strict=True)]


def test_event_records_view_their_task_as_the_iterator_s_record() -> None:
    """The ring record's ``task`` member, laid out as the iterator's record, is one
    field of that record's dtype (offsets from the layouts); a drift is refused."""
    from kernmlops.ebpf.btf import RecordLayout

    task = RecordLayout(
        "rec",
        np.dtype(
            {
                "names": ["pid", "tgid", "comm"],
                "formats": ["<u4", "<u4", "S16"],
                "offsets": [0, 4, 8],
                "itemsize": 24,
            }
        ),
        {},
        ("comm",),
    )
    flat = np.dtype({"names": ["task_pid", "task_tgid", "task_comm", "event", "args_len", "args"],
                     "formats": ["<u4", "<u4", "S16", "<u4", "<u4", "S8"],
                     "offsets": [0, 4, 8, 24, 28, 32], "itemsize": 40})  # fmt: skip
    ring = RecordLayout("ev", flat, {"event": {0: "fork", 1: "exec"}}, ("task_comm", "args"))
    dtype = event_dtype(ring, task)
    records = np.zeros(2, flat)
    records["task_pid"], records["task_tgid"], records["task_comm"] = [5, 6], [7, 8], b"sh"
    records["event"], records["args"] = [0, 1], b"a\0b"
    view = records.view(dtype)
    assert view["task"].dtype == task.dtype
    assert view["task"]["pid"].tolist() == [5, 6] and view["task"]["tgid"].tolist() == [7, 8]
    assert view["task"]["comm"].tolist() == [b"sh", b"sh"] and view["event"].tolist() == [0, 1]
    assert view["args"].tolist() == [b"a\0b", b"a\0b"]
    moved = {**dict(flat.fields), "task_tgid": (np.dtype("<u4"), 8)}  # where comm is
    drift = np.dtype({"names": list(moved), "formats": [v[0] for v in moved.values()],
                      "offsets": [v[1] for v in moved.values()], "itemsize": 40})  # fmt: skip
    with pytest.raises(KernmlopsError, match=r"ev.task.tgid is not laid out as rec.tgid"):
        event_dtype(RecordLayout("ev", drift, {}, ()), task)


def test_the_hook_sleeps_until_its_ring_or_its_next_snapshot_falls_due() -> None:
    """Fork and exec rows wait in the ring until it falls due (BpfHook's time), an
    interval snapshot until its time; a snapshot's rows already taken: every poll."""
    from types import SimpleNamespace

    hook = ProcessMetadataHook(ProcessMetadataHook.Options(batch_ms=250))
    ring = SimpleNamespace(spilled=False, size=2 << 20, pending_bytes=lambda: 0)
    hook._rings = {"process_metadata": (ring, 616)}  # type: ignore[assignment]
    hook._last_drain = {"process_metadata": 100.0}
    assert hook.next_poll(100.05) == pytest.approx(100.25)  # no interval snapshots
    hook._next_s = 100.1
    assert hook.next_poll(100.05) == pytest.approx(100.1)
    hook._pending.append(pl.DataFrame())
    assert hook.next_poll(100.05) is None


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


def _command_config(tmp_path: Path, argv: list[str]) -> object:
    """A collection of ``argv`` with process_metadata alone."""
    from kernmlops.config import load_config

    return load_config(
        {
            "collector": {"output_dir": str(tmp_path), "progress": False,
                          "hooks": ["process_metadata"]},
            "benchmark": {"name": "command", "command": {"argv": argv}},
        }
    )  # fmt: skip


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

    cfg = _command_config(tmp_path, argv)
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


# --- fork and exec rows: the command line captured at the event ----------------------
#: Runs short-lived children with known argv, each waited for (gone long before the
#: hook's next poll, but for the sleeper), and writes its own account of them: one
#: JSON line per child, its pid and argv.
CHILDREN = textwrap.dedent(
    """
    import json, subprocess, sys
    LONG = "L" * 700
    runs = [["/bin/true", f"kmo-{i}", "a b", "\\u00fc"] for i in range(20)]
    runs += [
        ["sh", "-c", "true; /bin/true a b"],  # sh, then a child of its own: /bin/true a b
        ["sh", "-c", "exec /bin/true c d"],  # one pid exec'd twice
        ["/bin/true", LONG],  # cut at the kernel's limit: gone by the poll
        # still there at the poll: the whole line, from /proc
        [sys.executable, "-c", "import time; time.sleep(1.5)", LONG],
    ]
    with open(sys.argv[1], "w") as f:
        for argv in runs:
            child = subprocess.Popen(argv)
            child.wait()
            f.write(json.dumps({"pid": child.pid, "argv": argv}) + "\\n")
    """
)


@pytest.mark.bpf
def test_fork_and_exec_rows_carry_the_command_line_of_children_already_gone(
    tmp_path: Path,
) -> None:
    """Every child the workload ran, as its own account says (pid, argv), has an exec
    row with its argv as cmdline, though each is gone before the hook's next poll;
    each fork row has the command line the child had then (its parent's); a pid
    exec'd twice has two exec rows; an argument block past the kernel's limit is cut
    there, unless the process still runs it at the poll (then /proc has all of it)."""
    from kernmlops.collect.session import Session
    from kernmlops.collect.sinks import MemorySink

    script, account = tmp_path / "children.py", tmp_path / "children.jsonl"
    script.write_text(CHILDREN)
    argv = [sys.executable, str(script), str(account)]
    cfg = _command_config(tmp_path, argv)
    sink = MemorySink()
    result = Session(cfg, sink=sink).run()
    assert result.exit_code == 0 and result.hooks["process_metadata"].drops == 0
    meta = sink.table("process_metadata")
    rows = meta.filter(pl.col("snapshot").is_in(["fork", "exec"])).sort(UPTIME_TIMESTAMP)
    runs = [json.loads(line) for line in account.read_text().splitlines()]
    assert len(runs) == 24
    (workload,) = rows.filter(
        (pl.col("snapshot") == "exec") & (pl.col("cmdline") == " ".join(argv))
    )["pid"].to_list()
    long = "L" * 700
    cut = ("/bin/true " + long)[: args_limit()]
    for run in runs:
        pid, args = run["pid"], run["argv"]
        mine = rows.filter(pl.col("pid") == pid)
        fork = mine.filter(pl.col("snapshot") == "fork")
        # forked by the workload: its command line then, the workload's own
        assert fork.select("ppid", "comm", "cmdline").rows() == [
            (workload, Path(sys.executable).name[:15], " ".join(argv))
        ], f"fork of {args}"
        execs = mine.filter(pl.col("snapshot") == "exec").select("comm", "cmdline").rows()
        if args[:2] == ["sh", "-c"] and args[2].startswith("exec "):
            want = [("sh", " ".join(args)), ("true", args[2].removeprefix("exec "))]
        elif args[:2] == ["sh", "-c"]:
            want = [("sh", " ".join(args))]
            # its own child: forked with sh's command line, then /bin/true's
            grand = rows.filter(pl.col("ppid") == pid)
            assert grand.select("snapshot", "comm", "cmdline").rows() == [
                ("fork", "sh", " ".join(args)),
                ("exec", "true", "/bin/true a b"),
            ]
        elif args == ["/bin/true", long]:
            want = [("true", cut)]
        else:
            want = [(Path(args[0]).name[:15], " ".join(args))]
        assert execs == want, f"exec of {args}"


#: Runs /bin/true N times (argv[1]), each waited for.
TRUES = "import subprocess, sys\nfor i in range(int(sys.argv[1])):\n    subprocess.run(['/bin/true', str(i)])\n"  # noqa: E501


@pytest.mark.bpf
def test_a_poll_takes_fork_and_exec_rows_without_a_system_call_per_row() -> None:
    """The rows of N children (a fork and an exec each), all waiting in the kernel,
    taken by one poll, for N = 10 and 500: the polling thread's system calls in that
    poll, counted by the raw_syscalls:sys_enter tracepoint (perf, this thread alone),
    do not grow with the rows (the map popped key by key took 2.5-3.7 a row). A
    batch's few (memory, waking polars' threads) do not depend on its size."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.perf_counters import PerfEventError, open_counter, resolve
    from kernmlops.hooks.base import HookContext

    try:
        counter = open_counter(resolve("raw_syscalls:sys_enter"), cpu=-1, pid=0)
    except PerfEventError as err:
        skip_here(f"cannot count this thread's system calls: {err}")

    def syscalls() -> int:
        return int.from_bytes(os.read(counter, 24)[:8], "little")

    def run(children: int) -> int:
        """The workload's pid, once it ran its children and exited, in the scope."""
        gate = subprocess.Popen(
            ["sh", "-c", 'read _; exec "$@"', "sh", sys.executable, "-c", TRUES, str(children)],
            stdin=subprocess.PIPE,
        )
        flt.add(gate.pid)
        assert gate.stdin is not None
        gate.stdin.close()  # read returns: the workload runs
        assert gate.wait() == 0
        return gate.pid

    def poll(children: int) -> tuple[pl.DataFrame, int, int]:
        """(rows, the workload's pid, system calls of the poll that took them)."""
        workload = run(children)
        time.sleep(0.3)  # past the ring's batch_ms: the poll drains it
        before = syscalls()
        out = list(hook.poll())
        calls = syscalls() - before - 1  # less the read of the count
        return pl.concat([f for _, f in polled(out)]), workload, calls

    flt = ProcessFilter(follow_children=True)
    hook = ProcessMetadataHook()
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        poll(3)  # the first rows: libraries imported, the cgroup's path known
        taken = {n: poll(n) for n in (10, 500)}
    finally:
        list(hook.stop())
        flt.close()
        os.close(counter)
    for n, (rows, workload, _) in taken.items():
        # every child: its fork, then its exec
        forks = rows.filter((pl.col("snapshot") == "fork") & (pl.col("ppid") == workload))
        children = pl.col("pid").is_in(forks["pid"].to_list())
        execs = rows.filter((pl.col("snapshot") == "exec") & children)
        assert forks.height == execs.height == n and execs["comm"].unique().to_list() == ["true"]
    (small, _, few), (large, _, many) = taken[10], taken[500]
    per_row = (many - few) / (large.height - small.height)
    assert per_row < 0.05, f"{few} system calls for {small.height} rows, {many} for {large.height}"


@pytest.mark.bpf
def test_rows_spilled_while_the_libraries_load_come_out_as_the_others() -> None:
    """While the session imports its libraries it spills the rings (their records moved
    out as bytes), and the next poll decodes those with what is in the ring since (one
    array, whose dtype numpy packs): the rows of both, each exec's command line."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.hooks.base import HookContext

    flt = ProcessFilter(follow_children=True)
    # a quarter of 64 KiB: 26 records, so 20 children's 40 are spilled, 10's 20 not
    hook = ProcessMetadataHook(ProcessMetadataHook.Options(ring_kib=64, batch_ms=0))
    workloads = {}
    try:
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))
        for n in (20, 10):
            gate = subprocess.Popen(
                ["sh", "-c", 'read _; exec "$@"', "sh", sys.executable, "-c", TRUES, str(n)],
                stdin=subprocess.PIPE,
            )
            flt.add(gate.pid)
            assert gate.stdin is not None
            gate.stdin.close()
            assert gate.wait() == 0
            workloads[gate.pid] = n
            hook.spill()
        assert hook.spilled_bytes() > 0
        rows = pl.concat([f for _, f in polled(hook.poll())])
    finally:
        list(hook.stop())
        flt.close()
    assert hook.status.drops == 0
    for workload, n in workloads.items():
        forks = rows.filter((pl.col("snapshot") == "fork") & (pl.col("ppid") == workload))
        children = pl.col("pid").is_in(forks["pid"].to_list())
        execs = rows.filter((pl.col("snapshot") == "exec") & children)
        assert sorted(execs["cmdline"]) == sorted(f"/bin/true {i}" for i in range(n))


def _start_boottime_ns(pid: int) -> int:
    """A process's start (CLOCK_BOOTTIME ns, as a record's task has it) from /proc's
    field 22 (clock ticks): within the tick, as the kernel rounds it down."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return ticks * (1_000_000_000 // CLK_TCK) + 1


def test_an_unread_command_line_is_not_taken_from_a_process_that_reused_the_pid() -> None:
    """A record whose arguments the program could not read falls back to
    /proc/<tgid>/cmdline at the poll, but only where that is still the record's
    process (its start time): a pid reused by another process since leaves it null
    (counted unread), never the newcomer's argv; the newcomer's own record takes it."""
    nap = [sys.executable, "-c", "import time; time.sleep(30)"]
    gone = subprocess.Popen([*nap, "the-first-process"])
    started = _start_boottime_ns(gone.pid)
    gone.kill()
    gone.wait()  # reaped: its pid is free
    time.sleep(0.02)  # the newcomer starts a tick or more later
    newcomer = fork_at(gone.pid, [*nap, "the-newcomer"])
    if newcomer is None:
        pytest.fail(f"pid {gone.pid} was always taken by another process first")
    try:
        task = np.dtype([("pid", "<u4"), ("tgid", "<u4"), ("start_boottime_ns", "<u8")])
        dtype = np.dtype([("task", task), ("args_size", "<u4"), ("args_len", "<u4"),
                          ("args", "S32")])  # fmt: skip
        events = np.zeros(2, dtype)
        events["task"]["pid"] = events["task"]["tgid"] = gone.pid
        events["task"]["start_boottime_ns"] = [started, _start_boottime_ns(newcomer.pid)]
        events["args_size"], events["args_len"] = 40, 0  # arguments there, none read
        hook = ProcessMetadataHook(ProcessMetadataHook.Options())
        lines = hook._event_cmdlines(events).to_list()
        assert lines == [None, " ".join([*nap, "the-newcomer"])], lines
        assert hook.counters()["cmdline_unread"] == 1
    finally:
        newcomer.kill()
        newcomer.wait()


@pytest.mark.bpf
def test_a_snapshot_takes_no_command_line_from_a_process_that_reused_the_pid() -> None:
    """A snapshot's rows read /proc/<tgid>/cmdline after the iterator's pass, only
    where that is still the row's process (its start time): a pid freed and taken by
    another process in between leaves the row's cmdline null, never the newcomer's;
    a process still running has its own."""
    from kernmlops.collect.filter import ProcessFilter
    from kernmlops.ebpf.build import build
    from kernmlops.hooks.base import HookContext

    build()
    nap = [sys.executable, "-c", "import time; time.sleep(30)"]
    gone = subprocess.Popen([*nap, "the-first-process"])
    kept = subprocess.Popen([*nap, "still-running"])
    started = _start_boottime_ns(gone.pid)
    flt = ProcessFilter(follow_children=False)
    hook = ProcessMetadataHook(ProcessMetadataHook.Options(threads=False))
    newcomer: list[subprocess.Popen] = []
    real = hook.read_records

    def read_records() -> np.ndarray:
        records = real()
        if not newcomer:  # the start snapshot: its pid reused before /proc is read
            gone.kill()
            gone.wait()
            time.sleep(0.02)  # the newcomer starts a tick or more later
            taken = fork_at(gone.pid, [*nap, "the-newcomer"])
            if taken is None:
                pytest.fail(f"pid {gone.pid} was always taken by another process first")
            newcomer.append(taken)
        return records

    hook.read_records = read_records  # type: ignore[method-assign]
    try:
        flt.add(gone.pid)
        flt.add(kept.pid)
        hook.start(HookContext("t", process_filter=flt, self_tgid=os.getpid()))  # "start"
        (frame,) = [f for _, f in polled(hook.poll())]
    finally:
        list(hook.stop())
        flt.close()
        for proc in (kept, *newcomer):
            proc.kill()
            proc.wait()
    start = frame.filter(pl.col("snapshot") == "start").sort("tgid")
    rows = {r["tgid"]: r for r in start.iter_rows(named=True)}
    assert set(rows) == {gone.pid, kept.pid}, rows
    first = rows[gone.pid]
    assert first["start_boottime_ns"] // (10**9 // CLK_TCK) == started // (10**9 // CLK_TCK)
    assert first["cmdline"] is None, first["cmdline"]
    assert rows[kept.pid]["cmdline"] == " ".join([*nap, "still-running"])
