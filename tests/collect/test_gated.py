"""GatedProcess.wait_exec: the exec is seen whole, its command line and its new name
(the kernel sets them in steps: a look at one alone saw the command's arguments under
"sh", or its name with no arguments yet)."""

from __future__ import annotations

import subprocess
import time

from kernmlops.collect.gated import GatedProcess


def _gated(proc: subprocess.Popen, argv: list[str]) -> GatedProcess:
    gated = object.__new__(GatedProcess)  # what wait_exec reads
    gated.proc, gated.pid, gated.argv = proc, proc.pid, argv
    gated._gate_argv = ["/bin/sh", "-c", "gate"]
    return gated


def _wait(proc: subprocess.Popen, argv: list[str], timeout_s: float) -> tuple[bool, float]:
    t0 = time.monotonic()
    return _gated(proc, argv).wait_exec(timeout_s), time.monotonic() - t0


def test_a_command_line_under_the_gates_name_is_not_yet_the_exec() -> None:
    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 3; :"])  # stays "sh", new args
    try:
        time.sleep(0.05)
        # named sleep, it should not still be "sh": waited for to the end, then taken
        got, took = _wait(shell, ["sleep", "0.3"], 0.2)
        assert got and took >= 0.2
        got, took = _wait(shell, ["/bin/sh", "-c", "x"], 5)  # a shell: its name is sh
        assert got and took < 0.1
    finally:
        shell.kill()
        shell.wait()


def test_a_command_with_its_name_and_arguments_is_the_exec_at_once() -> None:
    sleeper = subprocess.Popen(["sleep", "3"])
    try:
        time.sleep(0.05)
        got, took = _wait(sleeper, ["sleep", "3"], 5)
        assert got and took < 0.1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_command_that_died_is_not_waited_for() -> None:
    done = subprocess.Popen(["true"])
    time.sleep(0.2)  # a zombie: no command line
    got, took = _wait(done, ["true"], 5)
    assert not got and took < 0.1
    done.wait()
