"""The one way every command fails, the one BPF privilege check, output without a reader,
the one progress of long work."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernmlops.clitools import progress, require_bpf_privileges, shows_live, waiting
from kernmlops.errors import ConfigError, KernmlopsError
from tests.progress import force_terminal, frames, last_count


def test_fail_prints_one_literal_line_on_stderr_and_exits_with_the_code() -> None:
    long = "x" * 150  # longer than a terminal line: must not wrap
    code = (
        "from kernmlops.clitools import fail\n"
        "from kernmlops.errors import ConfigError\n"
        f"fail(ConfigError('bad [bold]key[/] in [hooks.perf] {long}'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == ConfigError("x").exit_code != 0
    assert out.stdout == ""
    assert out.stderr == f"error: bad [bold]key[/] in [hooks.perf] {long}\n"


def test_warnings_as_lines_says_ours_in_one_line_and_others_as_python_does() -> None:
    long = "y" * 150  # longer than a terminal line: must not wrap
    code = (
        "import warnings\n"
        "from kernmlops.clitools import warnings_as_lines\n"
        "from kernmlops.data import IncompleteCollectionWarning\n"
        "with warnings_as_lines():\n"
        f"    warnings.warn('a [b]partial[/] {long}', IncompleteCollectionWarning)\n"
        "    warnings.warn('going away', DeprecationWarning)\n"
        "warnings.warn('outside', IncompleteCollectionWarning)\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == f"warning: a [b]partial[/] {long}"
    # not ours: where it came from, as Python says it; and Python's way again once out
    assert lines[1] == "<string>:6: DeprecationWarning: going away"
    assert lines[2] == "<string>:7: IncompleteCollectionWarning: outside"
    assert len(lines) == 3


def test_require_bpf_privileges(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernmlops.ebpf import probe

    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: True)
    require_bpf_privileges("collect")  # root: fine
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: False)
    with pytest.raises(KernmlopsError, match=r"^collect needs CAP_BPF \+ CAP_PERFMON .* uid 0"):
        require_bpf_privileges("collect")  # uid 0 whose bounding set left them out
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: True)
    require_bpf_privileges("collect")  # CAP_BPF + CAP_PERFMON: fine
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: False)
    with pytest.raises(KernmlopsError, match=r"^export needs root \(or CAP_BPF \+ CAP_PERFMON\)"):
        require_bpf_privileges("export")


@pytest.mark.parametrize(
    ("args", "command"),
    [(["collect"], "collect"), (["export"], "export"), (["lb", "collect"], "lb collect")],
)
def test_a_privileged_command_run_by_a_user_fails_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], command: str
) -> None:
    from click.testing import CliRunner

    from kernmlops.cli import cli
    from kernmlops.ebpf import probe

    monkeypatch.chdir(tmp_path)  # no overrides.yaml here, so no "using ..." line
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: False)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == KernmlopsError.exit_code
    assert result.stdout == ""
    assert result.stderr == (
        f"error: {command} needs root (or CAP_BPF + CAP_PERFMON) to load BPF programs: "
        "run it with sudo\n"
    )


def test_the_duet_collector_checks_privileges_with_its_own_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernmlops.duet.collect import Collector
    from kernmlops.duet.runner import DuetError
    from kernmlops.ebpf import probe

    monkeypatch.setattr("os.geteuid", lambda: 1000)
    monkeypatch.setattr(probe, "has_bpf_capabilities", lambda: False)
    with pytest.raises(DuetError, match=r"^duet run --collect needs root"):
        Collector()


def test_output_whose_reader_is_gone_goes_to_dev_null_and_the_command_goes_on(
    tmp_path: Path,
) -> None:
    done = tmp_path / "done"
    child = (
        "import os, sys\n"
        "from kernmlops.clitools import survive_closed_output\n"
        "survive_closed_output()\n"
        "print('first', flush=True)\n"
        "sys.stdin.read()  # until the parent closed its end of the pipe\n"
        "for i in range(20000):\n"
        "    print('line', i)\n"
        "    print('err', i, file=sys.stderr)\n"
        "sys.stdout.buffer.write(b'bytes too\\n')\n"
        "sys.stdout.flush()\n"
        f"open({str(done)!r}, 'w').write(os.readlink('/proc/self/fd/1') + ' '"
        " + os.readlink('/proc/self/fd/2'))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == b"first\n"
    proc.stdout.close()
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    assert done.read_text() == "/dev/null /dev/null"  # both, once each found the pipe gone


def _terminal() -> tuple[Any, io.StringIO]:
    from rich.console import Console

    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=120), out


def test_progress_on_a_terminal_is_shown_and_reaches_its_total() -> None:
    console, out = _terminal()
    with progress("sorting", "widgets", total=3, console=console) as steps:
        for _ in range(3):
            steps.advance()
    assert steps.done == steps.total == 3
    assert last_count(out.getvalue(), "sorting", "widgets") == ("3", "3")
    # transient: the bar is erased at its end (the cursor goes up and the line is cleared)
    assert out.getvalue().endswith("\x1b[2K")


def test_progress_never_advanced_does_not_show_its_total() -> None:
    console, out = _terminal()
    with progress("sorting", "widgets", total=3, console=console):
        pass
    assert last_count(out.getvalue(), "sorting", "widgets") == ("0", "3")


def test_progress_in_bytes_and_a_total_learnt_on_the_way() -> None:
    console, out = _terminal()
    with progress("copying", "bytes", console=console) as steps:
        steps(0, 2_000_000)
        steps.advance(2_000_000)
    assert last_count(out.getvalue(), "copying", "MB") == ("2.0", "2.0")
    assert steps.line() == "copying: 2.0 MB/2.0 MB"


def test_progress_without_a_terminal_or_turned_off_says_nothing(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from rich.console import Console

    console, out = _terminal()
    with progress("sorting", "widgets", total=2, enabled=False, console=console) as steps:
        steps.advance(2)
    assert out.getvalue() == ""
    plain = io.StringIO()
    with progress("sorting", "widgets", total=2, console=Console(file=plain)) as steps:
        steps.advance(2)
    assert plain.getvalue() == ""
    assert capfd.readouterr() == ("", "")


def test_long_work_without_a_terminal_says_a_plain_line_now_and_then(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rich.console import Console

    from kernmlops import clitools

    monkeypatch.setattr(clitools, "PLAIN_EVERY_S", 0.0)  # every step is "10 s later"
    plain = Console(file=io.StringIO())
    with progress("sorting", "widgets", total=2, console=plain) as steps:
        steps.advance()
        steps.advance()
    assert capsys.readouterr().err == "sorting: 1/2 widgets\nsorting: 2/2 widgets\n"
    with progress("sorting", "widgets", total=2, enabled=False, console=plain) as steps:
        steps.advance(2)  # --no-progress: not even that
    assert capsys.readouterr().err == ""


def test_a_wait_on_a_terminal_spins_with_its_time_and_leaves_nothing() -> None:
    console, out = _terminal()
    began = time.monotonic()
    with waiting("reaching s3://b/x", console=console):
        time.sleep(0.3)  # a few of the spinner's frames
    lasted = time.monotonic() - began
    shown = frames(out.getvalue())
    # the time so far, at most as long as the wait lasted (seconds when starved)
    times = {f"0:00:{s:02d}" for s in range(int(lasted) + 2)}
    assert shown and all(f.strip()[-7:] in times for f in shown), (shown, lasted)
    assert all("reaching s3://b/x" in f for f in shown), shown
    assert out.getvalue().endswith("\x1b[2K")  # transient: erased at its end


def test_a_wait_without_a_terminal_is_said_once_only_when_it_lasts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rich.console import Console

    from kernmlops import clitools

    plain = Console(file=io.StringIO())
    monkeypatch.setattr(clitools, "WAIT_SAY_AFTER_S", 0.1)
    said = ""
    with waiting("reaching s3://b/x", console=plain):
        # until the timer's thread said it: a starved one takes more than 0.1 s
        deadline = time.monotonic() + 60
        while not said and time.monotonic() < deadline:
            time.sleep(0.05)
            said += capsys.readouterr().err
    assert said + capsys.readouterr().err == "reaching s3://b/x ...\n"
    # quick: nothing said, and nothing later either (its timer's thread is waited for).
    # Only a wait that lasted under 0.1 s counts: a starved test's may not have.
    for _ in range(100):
        began = time.monotonic()
        with waiting("reaching s3://b/x", console=plain):
            pass
        quick = time.monotonic() - began < 0.1
        for timer in [t for t in threading.enumerate() if isinstance(t, threading.Timer)]:
            timer.join(60)
        said = capsys.readouterr().err
        if quick:
            assert said == ""
            break
    assert quick, "no wait lasted under 0.1 s in 100 tries"
    with waiting("reaching s3://b/x", enabled=False, console=plain):
        time.sleep(0.3)  # --no-progress: never
    time.sleep(0.3)
    assert capsys.readouterr().err == "" and plain.file.getvalue() == ""


def test_shows_live_follows_the_terminal_and_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert shows_live(console=Console(file=io.StringIO())) is False
    assert shows_live(console=Console(file=io.StringIO(), force_terminal=True)) is True
    assert shows_live(False, Console(file=io.StringIO(), force_terminal=True)) is False
    force_terminal(monkeypatch)  # what the commands' tests use: rich's own variable
    assert shows_live(console=Console(file=io.StringIO())) is True


def test_check_tgid_refuses_a_threads_id_naming_its_process() -> None:
    """A thread's id (top -H, ps -L) is in /proc but the filter matches processes:
    --tgid of it would collect nothing. Refused, naming the process to give."""
    import os
    import threading

    import click

    from kernmlops.clitools import check_tgid

    started, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def idle() -> None:
        tids.append(threading.get_native_id())
        started.set()
        done.wait()

    thread = threading.Thread(target=idle)
    thread.start()
    try:
        started.wait()
        (tid,) = tids
        assert tid != os.getpid()
        with pytest.raises(click.BadParameter, match=f"{tid} is a thread of process {os.getpid()}"):
            check_tgid(tid)
        with pytest.raises(ConfigError) as raised:
            check_tgid(tid, "collector.tgid", ConfigError)
        assert str(raised.value) == (
            f"collector.tgid {tid}: {tid} is a thread of process {os.getpid()}: "
            f"give the process id, {os.getpid()}"
        )
        check_tgid(os.getpid())  # the process itself passes
    finally:
        done.set()
        thread.join()


#: (command line, where "{p}" is a path in a folder nobody may not search; the command
#: whose help is named; the words naming the argument): each said "does not exist" of a
#: path that is there, or went on to a PermissionError's traceback
UNREACHABLE = [
    (["graph", "{p}"], "graph", "Invalid value for 'COLLECTION': Path '{p}'"),
    (["recover", "{p}"], "recover", "Invalid value for 'COLLECTION': Directory '{p}'"),
    (["push", "{p}", "{p}-dataset"], "push", "Invalid value for 'PATHS...': Path '{p}'"),
    (["collect", "dump", "-d", "{p}"], "collect dump",
     "Invalid value for '-d' / '--input-dir': Directory '{p}'"),
    (["lb", "train", "{p}"], "lb train",
     "Invalid value for 'DATA...': Path '{p}'"),
    (["duet", "process", "{p}"], "duet process",
     "Invalid value for 'FOLDERS...': Directory '{p}'"),
]  # fmt: skip


def test_a_path_the_user_may_not_reach_is_said_so_in_one_line() -> None:
    from click.testing import CliRunner

    from kernmlops.cli import cli
    from kernmlops.exporter.compat import resolve_config_dir
    from tests.nobody import as_nobody, reachable_folder

    with reachable_folder("kmo-unreachable-") as top:
        locked = top / "locked"
        (locked / "inside").mkdir(parents=True)
        locked.chmod(0o700)  # root's: nobody may not search it
        p = str(locked / "inside")

        def step() -> None:
            for args, command, said in UNREACHABLE:
                argv = [a.format(p=p) for a in args]
                result = CliRunner().invoke(cli, argv, prog_name="kernmlops")
                assert result.exit_code == 2, (argv, result.output)
                assert "Traceback" not in result.output
                assert result.output == (
                    f"error: {said.format(p=p)} cannot be reached: permission denied "
                    f"(see kernmlops {command} --help)\n"
                ), argv
            # one that is missing is still said to be missing
            missing = CliRunner().invoke(cli, ["graph", str(top / "nothing")])
            assert missing.exit_code == 2 and "does not exist" in missing.output
            # export's --config.dir is ebpf_exporter's plain option: its own words (the
            # command's lazy imports are not tried here: as nobody the interpreter's
            # files may not be readable where it is installed in root's home)
            with pytest.raises(KernmlopsError) as err:
                resolve_config_dir(p, "x")
            assert str(err.value) == f"--config.dir {p}: cannot be read: permission denied"

        as_nobody(step)
