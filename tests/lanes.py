"""Two lanes for one test run on a small machine (tests/conftest.py starts them).

The tests that load BPF or assert something of time or CPU (``bpf``, ``quiet``, Spark's,
the kernel lab's) run one at a time in the run's own process, in this order: the
``bpf`` and Spark modules, the lab's (they wait for its boot), the ``quiet`` modules.
They leave the machine about half idle: they wait on daemons, on collections, on one
Python thread. The modules with none of those marks, which tolerate a busy CPU, run
meanwhile in a second pytest, the idle lane, at the scheduler's idle policy
(SCHED_IDLE): it runs only where a CPU would otherwise idle, and any task of the main
run preempts it at once, so a collector's reader is not delayed by it. The kernel
lab's QEMU boots at that policy too, beside the ``bpf`` modules, but in a session of its
own, which is an autogroup of its own at nice 0: it shares the CPUs with the run's
group rather than waiting for the idle lane (tests/lab.py). (Not for free: on the
2-vCPU VMs here, QEMU's emulation costs the VM ~30% of its CPU time in steal, at any
policy, and the main run's tests took ~20% longer beside it. Still, the run took 14:41
with the other modules beside the lab's boot first and the ``bpf`` modules after both,
13:06 in two lanes.)

A ``quiet`` test takes the lanes' lock alone (:func:`hold`): the idle lane finishes
the test it is running and starts no other until the quiet test ends; the lab's boot
has ended by then (its tests come before the quiet modules).

The idle lane's output goes to a log in the run's temporary folder; its summary, and
its failures in full, follow the main run's. A failure there fails the run.
``KERNMLOPS_TEST_LANES=1`` runs everything in one lane, in the same order.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

#: set in the idle lane's own run: the lanes' lock files, without their suffixes
LANE_ENV = "KERNMLOPS_TEST_LANE"
#: "1": no idle lane, everything in the run's own process
ONE_LANE_ENV = "KERNMLOPS_TEST_LANES"
#: the main run's pid, in the idle lane: it stops once that run is gone (killed)
MAIN_ENV = "KERNMLOPS_TEST_MAIN"
#: the idle lane's code when the main run stopped it
STOPPED = -1


def idle_lane_lock() -> Path | None:
    """In the idle lane's run: the lanes' lock files, without their suffixes."""
    prefix = os.environ.get(LANE_ENV)
    return Path(prefix) if prefix else None


def in_idle_lane() -> bool:
    return idle_lane_lock() is not None


def main_gone() -> bool:
    """In the idle lane: the main run that started it has ended."""
    try:
        os.kill(int(os.environ[MAIN_ENV]), 0)
    except (KeyError, ValueError):
        return False
    except ProcessLookupError:
        return True
    return False


def idle_policy() -> None:
    """This process (and what it starts) runs only where a CPU would otherwise idle.
    For ``preexec_fn``."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


#: sh, first in a session of its own: with autogroups (a scheduling group a session) the
#: policy only orders tasks inside their session's group, and the group weighs as much
#: as the test run's own at nice 0 (the lane took ~8% from it so; at nice 19, ~3%)
IDLE_SESSION = "echo 19 >/proc/self/autogroup 2>/dev/null; "


def wanted(config: pytest.Config) -> bool:
    """Whether this run may start an idle lane: not in one, not asked for one lane, and
    not where the user steps through failures or stops at the first (-x, --pdb, -s)."""
    option = config.option
    return not (
        in_idle_lane()
        or os.environ.get(ONE_LANE_ENV) == "1"
        or option.collectonly
        or getattr(option, "exitfirst", False)
        or getattr(option, "usepdb", False)
        or getattr(option, "trace", False)
        or getattr(option, "capture", "fd") == "no"
    )


def _lock(path: Path, how: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, how)
    return fd


@contextlib.contextmanager
def hold(prefix: Path, alone: bool) -> Iterator[None]:
    """The lanes' lock, shared by the idle lane's tests, taken alone by a quiet test.
    A turnstile first: a quiet test that waits keeps the idle lane from starting
    another test meanwhile."""
    turn: int | None = _lock(prefix.with_suffix(".turn"), fcntl.LOCK_EX)
    held: int | None = None
    try:
        held = _lock(prefix.with_suffix(".lock"), fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            os.close(turn)
            turn = None
        yield
    finally:
        for fd in (held, turn):
            if fd is not None:
                os.close(fd)


def start_idle_session(
    argv: Sequence[str],
    pid: Path,
    code: Path,
    *,
    stdout: Path | None,
    stderr: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """``argv`` started at the idle policy in a session of its own, no child of this
    process (``setsid --fork``: its shell is reparented away at once): the session's
    pid (its process group's, for a stop) in ``pid``, its output in ``stdout`` (None:
    dropped) and ``stderr`` (may be the same file), its exit code in ``code`` once it
    ended (written whole)."""
    q, done = shlex.quote, str(code)
    out = "/dev/null" if stdout is None else q(str(stdout))
    err = "&1" if stdout == stderr else q(str(stderr))
    subprocess.run(
        ["setsid", "--fork", "sh", "-c",
         f"{IDLE_SESSION}echo $$ >{q(str(pid))}; {shlex.join(argv)} >{out} 2>{err}; "
         f"echo $? >{q(done + '.tmp')}; mv {q(done + '.tmp')} {q(done)}"],
        cwd=cwd, env=env, stdin=subprocess.DEVNULL, check=True, preexec_fn=idle_policy,
    )  # fmt: skip


class IdleLane:
    """A second pytest of ``nodeids`` at the idle policy, started at once; its log,
    lock files and temporary folder are in ``base``. Like the lab's VM, it runs in a
    session of its own and is no child of the run (tests check that the code they run
    leaves no child behind)."""

    def __init__(
        self, nodeids: Sequence[str], rootdir: Path, base: Path, extra: Sequence[str] = ()
    ) -> None:
        self.count = len(nodeids)
        self.lock = base / "lanes"
        self.log = base / "idle-lane.log"
        self._code = base / "idle-lane.exit_code"
        self._pid = base / "idle-lane.pid"
        args = base / "idle-lane.args"
        args.write_text("".join(f"{n}\n" for n in nodeids))
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--color=no",
                f"--basetemp={base / 'idle-lane'}", *extra, f"@{args}"]  # fmt: skip
        env = dict(os.environ, **{LANE_ENV: str(self.lock), MAIN_ENV: str(os.getpid())})
        start_idle_session(
            argv, self._pid, self._code, stdout=self.log, stderr=self.log, cwd=rootdir, env=env
        )
        self.code: int | None = None
        self._said: str | None = None

    def running(self) -> bool:
        return self.code is None and not self._code.exists()

    def wait(self) -> int:
        while not self._code.exists():
            time.sleep(0.2)
        self.code = int(self._code.read_text())
        return self.code

    def stop(self) -> None:
        """The run ends early (Ctrl+C, -x): the lane too, its whole process group."""
        if not self.running():
            return
        deadline = time.monotonic() + 5
        while not self._pid.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError, ValueError):
            group = int(self._pid.read_text())
            os.killpg(group, signal.SIGTERM)
            deadline = time.monotonic() + 20
            while not self._code.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            os.killpg(group, signal.SIGKILL)
        self.code = STOPPED

    @property
    def failed(self) -> bool:
        return self.code != 0

    def _output(self) -> str:
        """The lane's log, read once it ended (the summary and the report share it)."""
        if self._said is None:
            self._said = self.log.read_text(errors="replace") if self.log.exists() else ""
        return self._said

    def summary(self) -> str:
        """The lane's own last line ("1314 passed in 325.59s (0:05:25)")."""
        if self.code == STOPPED:
            return "stopped with the main run"
        lines = reversed(self._output().splitlines())
        last = next((ln for ln in lines if ln.startswith("=")), "")
        return last.strip("= ") or f"no summary (exit code {self.code})"

    def report(self) -> list[str]:
        """What the main run's summary shows of the lane: its last line, and where it
        failed everything from its failures on (its short summary otherwise)."""
        said = [f"{self.count} tests, log {self.log}: {self.summary()}"]
        if self.code == STOPPED:
            return said
        text = self._output()
        lines = text.splitlines()
        start = r"^=+ (FAILURES|ERRORS) =+$" if self.failed else r"^=+ short test summary"
        match = re.search(start, text, re.MULTILINE)
        if match is not None:
            said += text[match.start() :].splitlines()[:-1]
        elif self.failed:
            said += lines[-60:]
        return said
