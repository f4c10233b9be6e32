"""GatedProcess.wait_exec: the exec is seen whole, its command line and its new name
(the kernel sets them in steps: a look at one alone saw the command's arguments under
"sh", or its name with no arguments yet)."""

from __future__ import annotations

import os
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


#: a wait that ends "at once" ends well before this; one that ran to its end takes it
#: all. Long, so that a starved test (CI's idle lane: seconds without a CPU) still
#: tells the two apart; it is only waited out when the code is wrong.
LONG_S = 60.0


def test_a_command_line_under_the_gates_name_is_not_yet_the_exec() -> None:
    # stays "sh", new args; alive till killed (a starved test may take seconds)
    shell = subprocess.Popen(["/bin/sh", "-c", "sleep 600; :"])
    try:
        time.sleep(0.05)
        # named sleep, it should not still be "sh": waited for to the end, then taken
        got, took = _wait(shell, ["sleep", "0.3"], 0.2)
        assert got and took >= 0.2
        got, took = _wait(shell, ["/bin/sh", "-c", "x"], LONG_S)  # a shell: its name is sh
        assert got and took < LONG_S / 2
    finally:
        shell.kill()
        shell.wait()


def test_a_command_with_its_name_and_arguments_is_the_exec_at_once() -> None:
    sleeper = subprocess.Popen(["sleep", "600"])  # alive till killed
    try:
        time.sleep(0.05)
        got, took = _wait(sleeper, ["sleep", "600"], LONG_S)
        assert got and took < LONG_S / 2
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_command_that_died_is_not_waited_for() -> None:
    done = subprocess.Popen(["true"])
    # a zombie (no command line) once it exited: waited for, not a fixed time
    deadline = time.monotonic() + LONG_S
    while os.waitid(os.P_PID, done.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, "true did not exit"
        time.sleep(0.01)
    got, took = _wait(done, ["true"], LONG_S)
    assert not got and took < LONG_S / 2
    done.wait()
