"""What `kernmlops collect` (and the small commands beside it) tell a user: the events
a collection lost, the lines a log keeps whole, the runs refused before they start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kernmlops.cli import cli, drop_advice, unseen_lines
from kernmlops.config import load_config
from kernmlops.hooks.base import HookStatus


def test_drop_advice_names_each_hook_and_its_own_remedy() -> None:
    cfg = load_config({"hooks": {"memory_usage": {"poll_hz": 4}}})
    hooks = {
        "process_trace": HookStatus("process_trace", attached=True),
        "quanta_runtime": HookStatus("quanta_runtime", attached=True, drops=1_234),
        "memory_usage": HookStatus("memory_usage", attached=True, drops=2),
    }
    assert drop_advice(hooks, cfg.hook_options) == [
        "quanta_runtime: 1,234 events dropped (its ring was full): raise "
        "hooks.quanta_runtime.ring_kib",
        "memory_usage: 2 samples missed (the machine was too busy to read at poll_hz 4): "
        "lower hooks.memory_usage.poll_hz, or set collector.nice: -10",
    ]
    assert drop_advice({"process_trace": hooks["process_trace"]}, cfg.hook_options) == []


def test_unseen_lines_name_each_disk_whose_completions_were_never_seen() -> None:
    """block_io's completions that /proc/diskstats counted and no row nor count holds
    are a loss the summary says, disk by disk; none, or not set against it: silent."""
    disks = {
        "254:0": {"name": "vda", "kernel_completed": 210_000, "completions_not_seen": 8_205},
        "7:0": {"name": "loop0", "kernel_completed": 12, "completions_not_seen": 0},
        "8:16": {"name": "sdb", "kernel_completed": None, "completions_not_seen": None},
        "259:0": {"name": "nvme0n1", "kernel_completed": 5_000, "completions_not_seen": 3},
    }
    block_io = HookStatus(
        "block_io", attached=True, counters={"missed_completions": 1_636},
        reconciliation={"status": "done", "disks": disks},
    )  # fmt: skip
    assert unseen_lines({"block_io": block_io}) == [
        "block_io: 8,208 completions never seen, no row and no count (vda 8,205 of 210,000, "
        "nvme0n1 3 of 5,000, by /proc/diskstats; 1,636 more counted as missed_completions): "
        "the kernel skipped its programs (manifest: hooks.block_io.reconciliation)"
    ]
    disks["254:0"]["completions_not_seen"] = disks["259:0"]["completions_not_seen"] = 0
    filtered = HookStatus("block_io", attached=True, reconciliation={"status": "not done"})
    assert unseen_lines({"block_io": block_io, "x": filtered}) == []
    # rows its programs wrote that the collection lacks, with no drop counting them
    block_io.counters["rows_not_in_collection"] = 9_216
    assert unseen_lines({"block_io": block_io}) == [
        "block_io: 9,216 rows its programs wrote never reached the collection, and no drop "
        "counts them (manifest: hooks.block_io.reconciliation.rows_written)"
    ]


def test_drop_advice_names_the_cpus_that_lost_and_the_copiers_trouble() -> None:
    cfg = load_config({})
    by_cpu = [0, 1_000, 0, 30, *[5] * 7]
    copier = {"native": True, "priority": 0, "error": "SCHED_FIFO 1: denied"}
    lost = HookStatus("quanta_runtime", attached=True, drops=1_065, drops_by_cpu=by_cpu,
                      copier=copier)  # fmt: skip
    assert drop_advice({"quanta_runtime": lost}, cfg.hook_options) == [
        "quanta_runtime: 1,065 events dropped (its ring was full, on CPUs 1 (1,000), 3 (30), "
        "10 (5), 9 (5), 8 (5), 7 (5) and 3 more): give the collector CAP_SYS_NICE (the "
        "copier's priority was refused: SCHED_FIFO 1: denied), or raise "
        "hooks.quanta_runtime.ring_kib"
    ]
    # SCHED_FIFO refused but nice -20 granted (root in a cgroup without a real-time
    # budget): the priority is not what to change
    niced = HookStatus("quanta_runtime", attached=True, drops=5, drops_by_cpu=[5],
                       copier={**copier, "nice": -20})  # fmt: skip
    assert drop_advice({"quanta_runtime": niced}, cfg.hook_options) == [
        "quanta_runtime: 5 events dropped (its ring was full, on CPU 0 (5)): raise "
        "hooks.quanta_runtime.ring_kib"
    ]
    # the spool's filesystem could not allocate ahead of the copier's writes
    runway = {"allocations": 0, "allocated_bytes": 0, "outside_bytes": 9 << 20,
              "longest_ms": 0.1, "error": "Operation not supported"}  # fmt: skip
    slow_disk = HookStatus("quanta_runtime", attached=True, drops=7, drops_by_cpu=[0, 7],
                           copier={"native": True, "priority": 1, "runway": runway})  # fmt: skip
    assert drop_advice({"quanta_runtime": slow_disk}, cfg.hook_options) == [
        "quanta_runtime: 7 events dropped (its ring was full, on CPU 1 (7)): collect to a "
        "filesystem that can allocate ahead, such as ext4 or xfs (the spool's could not: "
        "Operation not supported), or raise hooks.quanta_runtime.ring_kib"
    ]
    # the disk writer waited until its queue was full: the copier left records in the ring
    queued = HookStatus("quanta_runtime", attached=True, drops=11, drops_by_cpu=[11],
                        copier={"native": True, "priority": 1, "queue_full": 1_204})  # fmt: skip
    assert drop_advice({"quanta_runtime": queued}, cfg.hook_options) == [
        "quanta_runtime: 11 events dropped (its ring was full, on CPU 0 (11)): collect to a "
        "faster disk or raise collector.spool_memory_mib (the spool's disk writes waited: its "
        "queue was full 1,204 times), or raise hooks.quanta_runtime.ring_kib"
    ]
    # a copier thread that was busy nearly a whole second: its ring's one thread was
    # the limit, whatever the ring's size
    busy = HookStatus("quanta_runtime", attached=True, drops=3, drops_by_cpu=[3],
                      copier={"native": True, "priority": 1, "busy": 0.2,
                              "busy_peak": 0.93})  # fmt: skip
    assert drop_advice({"quanta_runtime": busy}, cfg.hook_options) == [
        "quanta_runtime: 3 events dropped (its ring was full, on CPU 0 (3)): raise "
        "hooks.quanta_runtime.ring_groups (a copier thread was busy 93% of a second), or "
        "raise hooks.quanta_runtime.ring_kib"
    ]
    python = HookStatus("quanta_runtime", attached=True, drops=9, drops_by_cpu=[9],
                        copier={"native": False})  # fmt: skip
    assert drop_advice({"quanta_runtime": python}, cfg.hook_options) == [
        "quanta_runtime: 9 events dropped (its ring was full, on CPU 0 (9)): build the native "
        "ring copier (kernmlops build-bpf), or raise hooks.quanta_runtime.ring_kib"
    ]


def test_the_progress_table_shows_what_waits_in_the_spool() -> None:
    from rich.console import Console

    from kernmlops.cli import _progress_table
    from kernmlops.collect.loop import Progress
    from kernmlops.hooks.base import HookStatus

    attached = {"quanta_runtime": HookStatus("quanta_runtime", attached=True)}
    console = Console(width=120, record=True)
    quiet = Progress(1.0, {"quanta_runtime": 5}, {}, {}, "faux")
    console.print(_progress_table(quiet, attached))
    assert "spooled" not in console.export_text()
    busy = Progress(1.0, {"quanta_runtime": 5}, {}, {}, "faux", {"quanta_runtime": 3 << 20})
    console.print(_progress_table(busy, attached))
    assert "3.0 MiB" in console.export_text()


def kernmlops(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m kernmlops ARGS`` in ``cwd`` (no overrides.yaml there), its output kept."""
    return subprocess.run(
        [sys.executable, "-m", "kernmlops", *args],
        capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def test_a_collections_message_is_one_line_whatever_its_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernmlops.cli import _session_message
    from kernmlops.spool.memory import Leftover

    collection = tmp_path / ("x" * 90) / "curated" / "benchmark=faux" / "collection_id=[id]"
    left = Leftover(Path("/dev/shm/kernmlops-spool-id"), 3 << 20, collection, found=True)
    _session_message(left.describe())  # stderr is not a terminal here: rich's 80 columns
    assert capsys.readouterr().err == f"warning: {left.describe()}\n"
    assert f"`kernmlops recover {collection}`" in left.describe()


def _no_pid() -> int:
    # pids are below pid_max: this one is no process's
    return int(Path("/proc/sys/kernel/pid_max").read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-b", "faux", "-d", "1", "--tgid", "{pid}"],
         "Invalid value for --tgid: no process {pid}"),
        (["-b", "faux", "--tgid", "0"], "Invalid value for --tgid: 0: a process id is positive"),
        # a command is traced with its own tree: --tgid would follow process 1 instead
        (["--tgid", "1", "--", "sleep", "0.5"], "--tgid and a COMMAND exclude each other"),
    ],
)  # fmt: skip
def test_collect_refuses_a_tgid_it_would_not_follow_before_anything_is_set_up(
    tmp_path: Path, args: list[str], message: str
) -> None:
    out = tmp_path / "out"
    pid = str(_no_pid())
    done = kernmlops("collect", "-o", str(out), *(a.format(pid=pid) for a in args), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    # one line, as every other error (not click's usage, hint and error)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message.format(pid=pid)}")
    assert lines[0].endswith("(see kernmlops collect --help)")
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["collect", "--tgid", "abc"],
         "error: Invalid value for '--tgid': 'abc' is not a valid integer "
         "(see kernmlops collect --help)"),
        (["collect", "--no-such-flag"],
         "error: No such option '--no-such-flag' (see kernmlops collect --help)"),
        (["graph"], "error: Missing argument 'COLLECTION' (see kernmlops graph --help)"),
        (["fleet", "ls", "--json", "--bogus"],
         "error: No such option '--bogus' (see kernmlops fleet ls --help)"),
        (["no-such-command"], "error: No such command 'no-such-command' (see kernmlops --help)"),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line_naming_the_help(
    tmp_path: Path, args: list[str], said: str
) -> None:
    done = kernmlops(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == said + "\n" and done.stdout == ""


def test_a_group_given_no_command_shows_its_help(tmp_path: Path) -> None:
    done = kernmlops("fleet", cwd=tmp_path)
    assert done.returncode == 2 and "Usage: kernmlops fleet" in done.stdout + done.stderr


def test_collect_refuses_a_files_tgid_of_no_process(tmp_path: Path) -> None:
    pid = _no_pid()
    (tmp_path / "t.yaml").write_text(f"collector:\n  filter: tgid\n  tgid: {pid}\n")
    out = tmp_path / "out"
    done = kernmlops("collect", "-c", "t.yaml", "-o", str(out), "-b", "faux", "-d", "1",
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: collector.tgid {pid}: no process {pid}\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("afile/d.yaml", "a part of the path is a file, not a folder"),
        ("nonexist/d.yaml", "there is no folder nonexist"),
        ("/sys/d.yaml", "permission denied"),  # even root's: sysfs makes no files
        ("/proc/d.yaml", "no file can be made in /proc"),  # not 'there is no folder /proc'
    ],
)
def test_defaults_that_cannot_be_written_is_one_line(
    tmp_path: Path, target: str, reason: str
) -> None:
    (tmp_path / "afile").write_text("")
    done = kernmlops("defaults", target, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"error: cannot write {target}: {reason}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no temporary left


def test_defaults_writes_the_whole_file(tmp_path: Path) -> None:
    from kernmlops.config import defaults_yaml

    done = kernmlops("defaults", "d.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "wrote d.yaml\n"
    assert (tmp_path / "d.yaml").read_text() == defaults_yaml()


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (lambda p: p.symlink_to("/nonexistent/cfg.yaml"), "No such file or directory"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
)
def test_an_overrides_file_that_cannot_be_read_is_refused_not_passed_over(
    tmp_path: Path, make, said: str
) -> None:
    # the defaults in its place would make a collection of settings the user did not ask for
    make(tmp_path / "overrides.yaml")
    done = subprocess.run([sys.executable, "-m", "kernmlops", "collect", "--", "true"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.endswith(f"error: cannot read config overrides.yaml: {said}\n"), done.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("args", "config", "where"),
    [
        (["--hooks", ""], "", "(set on the command line)"),  # before: the 4 default hooks
        (["--hooks", " , "], "", "(set on the command line)"),  # before: none, 0/0 hooks
        ([], "collector:\n  hooks: []\n", ""),  # before: none, 0/0 hooks
        (["--hooks", ""], "collector:\n  hooks: [process_trace]\n", "(set on the command line)"),
    ],
)
def test_collect_refuses_an_empty_hook_list_in_one_line(
    tmp_path: Path, args: list[str], config: str, where: str
) -> None:
    (tmp_path / "c.yaml").write_text(config or "{}\n")
    out = tmp_path / "out"
    done = kernmlops("collect", "-c", "c.yaml", "-o", str(out), *args, "--", "true",
                     cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: invalid configuration") and line.endswith(where), line
    assert "collector.hooks: give at least one hook" in line
    assert "`kernmlops collect --help`" in line and "`kernmlops doctor` lists them" in line
    assert not out.exists()  # refused before anything is made


def _has_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` holds ``path`` open."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        return any(os.readlink(fd) == str(path) for fd in fds.iterdir())
    except FileNotFoundError:  # an fd closed while listed, or the process gone
        return False


def test_ctrl_c_while_the_config_is_read_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl+C before the collection's folder exists (here: while the config is read)
    was click's "Aborted!" and exit 1; a stop later in the run exits 130. The config
    is a FIFO whose writer (this test) sends nothing, so collect is held reading it
    until the signal, whatever the machine's speed."""
    fifo = tmp_path / "held.yaml"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a writer that never writes
    out = tmp_path / "out"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernmlops", "collect", "-c", str(fifo), "-o", str(out),
             "--no-progress", "--", "true"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        try:
            while not _has_open(proc.pid, fifo):  # until it reads the config
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    finally:
        os.close(writer)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert err == (
        "interrupted: nothing was collected (stopped before the collection's folder was made)\n"
    )
    assert not out.exists()


def test_c_dash_reads_the_config_from_stdin(tmp_path: Path) -> None:
    """`-c -` said "No such file or directory"; it is stdin, read with a file's limits
    and named "stdin" in errors."""
    read = subprocess.run(
        [sys.executable, "-c", "from kernmlops.config import load_config as c; "
         "print(c('-').collector.poll_interval_ms)"],
        input="collector: {poll_interval_ms: 37}\n", capture_output=True, text=True,
        cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert (read.returncode, read.stdout) == (0, "37\n"), read.stderr
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "kernmlops", "collect", "-c", "-", "-o", str(out), "--", "true"]
    bad = subprocess.run(argv, input="collector:\n  poll_interval_ms: many\n",
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.startswith("error: invalid configuration in stdin"), bad.stderr
    assert "poll_interval_ms" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    big = subprocess.run(argv, input="# " + "x" * (1 << 20) + "\n",
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert big.returncode == 2, big.stderr
    assert big.stderr == "error: stdin is more than 1 MiB: a config file may be at most 1 MiB\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("typed", "ours"),
    [
        (["collect", "defaults", "-"], ["defaults", "-"]),
        (["collect", "perf-list", "--json"], ["perf-list", "--json"]),
        (["collect", "perf-list", "--help"], ["perf-list", "--help"]),
    ],
)
def test_kernmlops_collect_perf_list_and_defaults_are_ours(
    tmp_path: Path, typed: list[str], ours: list[str]
) -> None:
    """KernMLOps' `collect defaults` and `collect perf-list` print what `kernmlops
    defaults` and `kernmlops perf-list` print (as root: the events' support; else both
    refuse alike); the help names them as typed."""
    as_typed, as_ours = kernmlops(*typed, cwd=tmp_path), kernmlops(*ours, cwd=tmp_path)
    assert (as_typed.returncode, as_typed.stderr) == (as_ours.returncode, as_ours.stderr)
    if "--help" in typed:
        assert as_typed.stdout == as_ours.stdout.replace(
            "Usage: kernmlops perf-list", "Usage: kernmlops collect perf-list"
        )
    else:
        assert as_typed.stdout == as_ours.stdout
        assert as_typed.stdout  # something to compare


def test_kernmlops_collect_defaults_writes_defaults_yaml(tmp_path: Path) -> None:
    """Without a path, as KernMLOps' does: ./defaults.yaml, the same as ours writes."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert kernmlops("collect", "defaults", cwd=tmp_path / "a").returncode == 0
    assert kernmlops("defaults", cwd=tmp_path / "b").returncode == 0
    written = (tmp_path / "a" / "defaults.yaml").read_text()
    assert written == (tmp_path / "b" / "defaults.yaml").read_text()
    assert written == kernmlops("defaults", "-", cwd=tmp_path).stdout


@pytest.mark.parametrize("word", ["perf-list", "defaults"])
def test_collect_dashdash_runs_a_program_of_that_name(word: str) -> None:
    """After `--` the word is a command to run, not KernMLOps' subcommand."""
    assert isinstance(cli, click.Group)
    with click.Context(cli) as ctx:
        name, found, left = cli.resolve_command(ctx, ["collect", "--", word])
    assert found is not None and found.name == "collect"
    assert (name, left) == ("collect", ["--", word])
    with click.Context(cli) as ctx:
        name, found, left = cli.resolve_command(ctx, ["collect", word, "-x"])
    assert found is cli.get_command(ctx, word) and (name, left) == (f"collect {word}", ["-x"])


def test_kernmlops_collect_data_poll_rate_out_of_range_is_one_line(tmp_path: Path) -> None:
    done = kernmlops("collect", "data", "-p", "2", "-b", "faux", cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "-p" in line and "2" in line, line


def test_collect_data_d_is_kernmlops_benchmark_folder_and_collect_d_a_duration(
    tmp_path: Path,
) -> None:
    """`collect data -d DIR` is KernMLOps' benchmark folder (its --duration is ours);
    kernmlops' own `collect -d 2` stays a duration in seconds."""
    from kernmlops.cli import collect, collect_data

    ours = collect.make_context("collect", ["-d", "2", "-b", "faux"])
    assert ours.params["duration"] == 2.0 and "benchmark_dir" not in ours.params
    theirs = collect_data.make_context(
        "collect data", ["-d", str(tmp_path), "--duration", "2", "--cpus", "1", "--no-hooks"]
    )
    assert theirs.params["benchmark_dir"] == tmp_path and theirs.params["duration"] == 2.0
    assert (theirs.params["cpus"], theirs.params["no_hooks"]) == (1, True)
    assert collect_data.make_context("collect data", ["--cpus", "0-1,3"]).params["cpus"] == "0-1,3"
    # typed as a KernMLOps user types it, it reaches `collect data`
    with click.Context(cli) as ctx:
        assert cli.resolve_command(ctx, ["collect", "data", "-d", "x"])[1] is collect_data


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["data", "-d", "2", "-b", "faux"],
         "-d 2: no such folder (in `collect data`, -d is KernMLOps' benchmark folder; a "
         "duration in seconds is --duration)"),
        (["data", "--no-hooks", "--hooks", "process_trace"],
         "--no-hooks and --hooks exclude each other (--no-hooks runs the benchmark untraced)"),
        (["--no-hooks", "--tgid", "1"], "--no-hooks and --tgid exclude each other"),
        (["--no-hooks", "--system-wide"], "--no-hooks and --system-wide exclude each other"),
    ],
)  # fmt: skip
def test_kernmlops_collect_data_options_refused_in_one_line(
    tmp_path: Path, args: list[str], said: str
) -> None:
    done = kernmlops("collect", *args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {said}"), line
    assert not (tmp_path / "data").exists()


def test_kernmlops_collect_data_help_says_each_option_in_kernmlops_terms() -> None:
    from click.testing import CliRunner

    from kernmlops.cli import collect, collect_data

    runner = CliRunner()
    shown = runner.invoke(cli, ["collect", "data", "--help"], prog_name="kernmlops")
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("Usage: kernmlops collect data [OPTIONS]")
    assert "kernmlops collect data -b linux_build -d " in shown.output  # an example
    helps = {p.name: p for p in collect_data.params if isinstance(p, click.Option)}
    for name in ("benchmark_dir", "output_dir", "verbose", "poll_rate", "no_hooks", "cpus"):
        assert not helps[name].hidden and "KernMLOps'" in (helps[name].help or ""), name
    assert helps["benchmark_dir"].opts == ["-d", "--benchmark-dir"]
    assert helps["duration"].opts == ["--duration"]
    # kernmlops' own collect: -d is the duration; -v and -p hidden as before
    ours = {p.name: p for p in collect.params if isinstance(p, click.Option)}
    assert ours["duration"].opts == ["-d", "--duration"] and "benchmark_dir" not in ours
    assert ours["verbose"].hidden and ours["poll_rate"].hidden and not ours["no_hooks"].hidden


def test_ctrl_c_in_any_command_is_one_line_and_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command without a stop of its own (graph, report, push, ...) said click's blank
    line and "Aborted!", exit 1; collect's stop is 130 and one line: so is theirs. Here
    Ctrl+C comes while `defaults` makes its text (a KeyboardInterrupt, as the signal's)."""
    import kernmlops.config

    def interrupted() -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(kernmlops.config, "defaults_yaml", interrupted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["defaults", "d.yaml"], prog_name="kernmlops")
    assert result.exit_code == 128 + signal.SIGINT, result.output
    assert result.output == (
        "interrupted: stopped before it finished (what it had written whole is kept)\n"
    )
    assert not list(tmp_path.iterdir())
