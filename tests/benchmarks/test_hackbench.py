"""HackbenchBenchmark: options, argv, "Time:" parsing, a real run, one through
the CLI checked against the kernel's syscall and process counts, and Ctrl+C."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import _tools
from kernmlops.benchmarks.base import BenchmarkRun
from kernmlops.benchmarks.hackbench import HackbenchBenchmark, parse_time, stopped
from kernmlops.errors import BenchmarkError
from tests.benchmarks.collect_util import (
    collect,
    collect_and_interrupt,
    execs,
    leftovers,
    results,
)
from tests.conftest import needs_tools

needs_hackbench = needs_tools("hackbench")


def _bench(**options: object) -> HackbenchBenchmark:
    return HackbenchBenchmark(HackbenchBenchmark.Options(**options))


def test_class_facts() -> None:
    assert HackbenchBenchmark.name == "hackbench"
    assert HackbenchBenchmark.default_filter == "tree"
    o = HackbenchBenchmark.Options()
    assert (o.groups, o.loops, o.fds, o.datasize, o.ipc, o.mode) == (
        10, 100, 20, 100, "socket", "process",
    )  # fmt: skip
    for name, field in HackbenchBenchmark.Options.model_fields.items():
        assert field.description, name


@pytest.mark.parametrize(
    "bad",
    [{"groups": 0}, {"loops": 0}, {"fds": 0}, {"datasize": 0}, {"ipc": "udp"},
     {"mode": "fiber"}, {"threads": True}],
)  # fmt: skip
def test_bad_options(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HackbenchBenchmark.Options(**bad)


@pytest.mark.parametrize(
    ("ipc", "mode", "flags"),
    [
        ("socket", "process", ["-P"]),
        ("pipe", "process", ["-p", "-P"]),
        ("inet", "thread", ["-i", "-T"]),
        ("socket", "thread", ["-T"]),
    ],
)
def test_argv(ipc: str, mode: str, flags: list[str]) -> None:
    launch = _bench(groups=3, loops=7, fds=5, datasize=64, ipc=ipc, mode=mode).launch()
    assert launch is not None and launch.capture_output
    assert launch.argv == ["hackbench", "-g", "3", "-l", "7", "-f", "5", "-s", "64", *flags]


def test_counts_and_extra_args() -> None:
    bench = _bench(groups=3, loops=7, fds=5, extra_args=["-F"])
    assert bench.messages() == 3 * 5 * 5 * 7
    assert bench.tasks() == 30
    assert bench.launch().argv[-1] == "-F"


def test_parse_time() -> None:
    out = (
        "Running in process mode with 2 groups using 40 file descriptors each (== 80 tasks)\n"
        "Each sender will pass 100 messages of 100 bytes\n"
        "Time: 0.217\n"
    )
    assert parse_time(out) == 0.217
    assert parse_time("Time: 12\n") == 12.0
    assert parse_time("hackbench: --loops|-l requires an integer > 0\n") is None


def test_results_without_time(tmp_path: Path) -> None:
    out = tmp_path / "stdout.txt"
    out.write_text("nothing\n")
    assert _bench().results(BenchmarkRun(tmp_path, 1, stdout_path=out)) is None
    with pytest.raises(BenchmarkError, match="printed no 'Time:' line"):
        _bench().results(BenchmarkRun(tmp_path, 0, stdout_path=out))


#: what hackbench 2.4 printed when SIGTERM stopped it a second into a run of 10**8 loops
STOPPED_OUT = (
    "Running in process mode with 1 groups using 4 file descriptors each (== 4 tasks)\n"
    "Each sender will pass 100000000 messages of 100 bytes\n"
    "signaling 4 worker threads to terminate\n"
    "Time: 0.997\n"
)
STOPPED_ERR = (
    "Signal 15 caught, longjmp'ing out!\n"
    "longjmp'ed out, reaping children\n"
    "sending SIGTERM to all child processes\n"
)


def test_stopped_run_claims_no_messages(tmp_path: Path) -> None:
    """Stopped by the collection's duration, hackbench exits 0 with a Time: the
    4 * 10**8 messages asked for were not passed, nor at 4 * 10**8 / 0.997 per s."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    out.write_text(STOPPED_OUT)
    err.write_text(STOPPED_ERR)
    bench = _bench(groups=1, loops=100_000_000, fds=2)
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out, stderr_path=err))
    assert frame is not None
    got = {m: v for m, v in frame.select("metric", "value").iter_rows()}
    assert got == {"time_s": 0.997, "tasks": 4.0}


def test_run_stopped_before_its_start_has_no_results_and_no_error(tmp_path: Path) -> None:
    """A signal between the workers' fork and the kick-off: hackbench says it was
    caught and exits 0 with no Time line. No result, and no 'exited 0 but printed no
    Time' error (that is for a run that finished)."""
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    out.write_text(STOPPED_OUT.replace("Time: 0.997\n", ""))
    err.write_text(STOPPED_ERR)
    bench = _bench(groups=1, loops=100_000_000, fds=2)
    assert bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out, stderr_path=err)) is None
    err.write_text("")  # not stopped: a finished run with no Time is an error
    with pytest.raises(BenchmarkError, match="printed no 'Time:' line"):
        bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out, stderr_path=err))


def test_loops_fit_hackbench_int() -> None:
    """hackbench reads -l into a C int: 10**22 became -1 ("Each sender will pass -1
    messages"), an endless run whose results claimed 4e25 messages."""
    with pytest.raises(ValidationError, match="less than or equal to 2147483647"):
        HackbenchBenchmark.Options(loops=10**22)
    assert _bench(loops=2**31 - 1).launch().argv[4] == "2147483647"


@needs_hackbench
def test_real_run_stopped_by_sigterm(tmp_path: Path) -> None:
    bench = _bench(groups=1, loops=100_000_000, fds=2, ipc="pipe")
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(bench.launch().argv, stdout=o, stderr=e)
        try:
            # its 4 workers forked (its handler is set by then): a SIGTERM is caught
            while len(_children(proc.pid)) < bench.tasks():
                assert proc.poll() is None, err.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0  # hackbench's own status: all well
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run = BenchmarkRun(tmp_path, 0, stdout_path=out, stderr_path=err)
    assert stopped(run), err.read_text()
    frame = bench.results(run)
    # a SIGTERM before the kick-off ends it with no Time (no result); after it, with
    # the Time of the messages passed so far: never a count of messages
    if "Time:" in out.read_text():
        assert frame is not None and set(frame["metric"]) == {"time_s", "tasks"}
    else:
        assert frame is None


@needs_hackbench
def test_counts_are_hackbench_own_when_extra_args_repeat_them(tmp_path: Path) -> None:
    """extra_args' -g and -l win over the options (hackbench takes the last): the
    results count what ran, 2 groups x 2 senders x 2 receivers x 7 loops, not the
    options' 1 x 2 x 2 x 100."""
    bench = _bench(groups=1, loops=100, fds=2, ipc="pipe", extra_args=["-g", "2", "-l", "7"])
    out = tmp_path / "stdout.txt"
    with out.open("wb") as f:
        done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    assert frame is not None
    got = {m: v for m, v in frame.select("metric", "value").iter_rows()}
    assert (got["messages"], got["tasks"]) == (2 * 2 * 2 * 7, 2 * 2 * 2)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_check_missing_hackbench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_tools.shutil, "which", lambda name: None)
    with pytest.raises(BenchmarkError, match="apt-get install rt-tests"):
        _bench().check()


@needs_hackbench
@pytest.mark.parametrize(("ipc", "mode"), [("socket", "process"), ("pipe", "thread")])
def test_real_run(tmp_path: Path, ipc: str, mode: str) -> None:
    bench = _bench(groups=1, loops=20, fds=4, ipc=ipc, mode=mode)
    bench.check()
    out = tmp_path / "stdout.txt"
    with out.open("wb") as f:
        done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE, timeout=60)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert f"Running in {'threaded' if mode == 'thread' else 'process'} mode" in text
    assert f"(== {bench.tasks()} tasks)" in text
    frame = bench.results(BenchmarkRun(tmp_path, 0, stdout_path=out))
    assert frame is not None
    got = {m: v for m, v in frame.select("metric", "value").iter_rows()}
    assert got["time_s"] == parse_time(text) >= 0
    assert got["messages"] == 1 * 4 * 4 * 20


@pytest.mark.bpf
@needs_hackbench
def test_hackbench_through_collect(tmp_path: Path) -> None:
    """Through the CLI: one write per message (syscalls hook), one fork per task
    (process_trace), and a Time within the traced life of hackbench."""
    options = {"groups": 2, "loops": 200, "fds": 10, "ipc": "pipe", "mode": "process"}
    proc, col = collect(
        tmp_path, "hackbench", options, "--hooks", "process_trace,quanta_runtime,syscalls"
    )
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    messages, tasks = 2 * 10 * 10 * 200, 2 * 2 * 10
    assert got[("hackbench", "messages")] == messages
    assert got[("hackbench", "messages_per_s")] == pytest.approx(
        messages / got[("hackbench", "time_s")]
    )
    main = execs(col, "hackbench")
    assert main.height == 1
    pt = col["process_trace"]
    forks = pt.filter((pl.col("kind") == "fork") & (pl.col("ppid") == main["pid"][0]))
    assert forks.height == tasks
    exit_row = pt.filter((pl.col("kind") == "exit") & (pl.col("pid") == main["pid"][0]))
    life_s = (exit_row["ts_uptime_us"][0] - main["ts_uptime_us"][0]) / 1e6
    # hackbench times the message passing only, inside its own life.
    assert 0 < got[("hackbench", "time_s")] <= life_s
    assert got[("hackbench", "time_s")] >= 0.05 * life_s
    # Each message is one write(2) of 100 bytes to a pipe; add one ready byte
    # per task and hackbench's own lines on stdout.
    sc = col["syscalls"]
    writes = sc.filter(pl.col("syscall") == "write")["count"].sum()
    assert messages + tasks <= writes <= messages + tasks + 10


@pytest.mark.bpf
@needs_hackbench
def test_ctrl_c_stops_every_hackbench_task(tmp_path: Path) -> None:
    run = collect_and_interrupt(
        tmp_path,
        "hackbench",
        {"groups": 2, "loops": 10_000_000, "fds": 5},
        running="hackbench",
    )
    assert run.returncode == 130
    assert list(run.seen.values()).count("hackbench") > 1  # the workers were running
    assert leftovers(run, {"hackbench"}) == []
    assert run.collection is not None
    assert run.collection.manifest["ended_by"] == "interrupted"


@needs_hackbench
def test_bad_arguments_fail_and_leave_no_results(tmp_path: Path) -> None:
    bench = _bench(groups=1, loops=5, fds=2, extra_args=["-l", "0"])  # the later -l wins
    out = tmp_path / "stdout.txt"
    with out.open("wb") as f:
        done = subprocess.run(bench.launch().argv, stdout=f, stderr=subprocess.PIPE, timeout=30)
    assert done.returncode != 0  # the session passes this status on
    assert b"requires an integer > 0" in done.stderr
    assert bench.results(BenchmarkRun(tmp_path, done.returncode, stdout_path=out)) is None
