"""Start a benchmark's process held at a gate, and stop everything it started.

The process is created first (so its pid can be put in the kernel filter and in
a cgroup of its own) and execs the command only when the gate opens, after every
probe is attached: its exec and first forks are traced, and none of its
descendants can leave the cgroup (see :mod:`kernmlops.host.cgroup`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import IO

from kernmlops.benchmarks.base import Launch
from kernmlops.errors import BenchmarkError
from kernmlops.host.cgroup import Containment
from kernmlops.host.invoker import Invoker

# The gate is the shell's stdin, a pipe: a line means go, end-of-file (the
# collector died) means exit. Stdin, not another fd: dash only takes fd numbers
# 0-9 in redirections, and a collector may hold many files. The command then
# gets /dev/null as its stdin.
_GATE = 'read -r _ || exit 125; exec "$@" </dev/null'


class GatedProcess:
    """A benchmark process in its own process group and cgroup, watched by a watchdog
    that kills it all if the collector dies."""

    def __init__(self, launch: Launch, stdout: IO[bytes] | None = None,
                 stderr: IO[bytes] | None = None, user: Invoker | None = None) -> None:  # fmt: skip
        """``user``: run as that user (its uid, gid, groups and HOME), not as the
        collector's own."""
        self.containment = Containment()
        read_fd, self._gate = os.pipe()
        env = {**os.environ, **(user.env() if user else {}), **launch.env}
        who: dict = (
            {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}
            if user is not None
            else {}
        )
        self._gate_argv = ["/bin/sh", "-c", _GATE, "kernmlops-gate", *launch.argv]
        try:
            self.proc = subprocess.Popen(
                self._gate_argv,
                stdin=read_fd,
                cwd=launch.cwd,
                env=env,
                start_new_session=True,  # own group: stop it whole, no Ctrl+C from the tty
                stdout=stdout,
                stderr=stderr,
                **who,
            )
        except OSError as err:
            os.close(self._gate)
            self.containment.close()
            raise BenchmarkError(f"cannot start {launch.argv[0]!r}: {err.strerror}") from err
        finally:
            os.close(read_fd)  # the child has its copy
        self.pid = self.proc.pid
        # Held at the gate, it has forked nothing yet: all it will start is inside.
        self.containment.add(self.pid)
        self.argv = launch.argv
        self.started_ns: int | None = None
        self.ended_ns: int | None = None

    def release(self) -> None:
        """Open the gate: the command execs now."""
        if self._gate >= 0:
            with contextlib.suppress(BrokenPipeError):  # it died already: poll() tells
                os.write(self._gate, b"go\n")
            os.close(self._gate)
            self._gate = -1
            self.started_ns = time.monotonic_ns()

    def wait_exec(self, timeout_s: float) -> bool:
        """After release(): wait (at most ``timeout_s``) until the gate shell has exec'd
        the command, seen in /proc as a command line that is not the gate's and, unless
        the command is named as the gate is ("sh"), the command's name (its exe may stay
        /bin/sh: the command can be a shell). The kernel gives an exec's task its new
        memory, its name and its argument block in steps, so a look at one alone saw the
        command's arguments under "sh", or its name with no arguments yet (seen twice,
        2 ms apart). False on a timeout before the command line changed, or if it died
        first."""
        gate = b"".join(os.fsencode(a) + b"\0" for a in self._gate_argv)
        gate_name = os.path.basename(self._gate_argv[0])[:15]
        same_name = os.path.basename(self.argv[0])[:15] == gate_name
        deadline = time.monotonic() + timeout_s
        seen = 0  # looks in a row that saw the exec whole
        while True:
            try:
                with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                    line = f.read()
                with open(f"/proc/{self.pid}/comm", "rb") as f:
                    named = same_name or f.read().rstrip(b"\n") != os.fsencode(gate_name)
            except OSError:
                return False
            # twice, 2 ms apart: while the new stack is laid out, the argument block
            # reads empty again after the name is set (a look then read no command line)
            seen = seen + 1 if line and line != gate and named else 0
            if seen == 2:
                return True
            if seen:
                time.sleep(0.002)
                continue
            if not line and self.exited():
                return False  # a zombie: it exited
            if time.monotonic() >= deadline:
                return bool(line) and line != gate
            time.sleep(0.0005)

    def exited(self) -> bool:
        """Whether the main process has exited, without reaping it (its /proc entry
        stays, a zombie, until poll() or stop())."""
        if self.proc.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True  # reaped already
        return info is not None

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended_ns is None:
            self.ended_ns = time.monotonic_ns()
        return code

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every process of the benchmark, then SIGKILL what is left after
        ``grace_s`` (or once the main process is gone)."""
        if self._gate >= 0:
            os.close(self._gate)  # the gate reads EOF and exits 125
            self._gate = -1
        self.containment.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self.containment.kill()
        self.proc.wait()
        if self.ended_ns is None:
            self.ended_ns = time.monotonic_ns()

    def reap_group(self) -> None:
        """After the main process exited: end what it left behind (daemons, ``setsid``
        children included), then remove the cgroup and dismiss the watchdog."""
        if self.containment.pids() or self.containment.path is None:
            self.containment.signal(signal.SIGTERM)
            time.sleep(0.05)
        self.containment.close()


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + signal for a killed process."""
    return 128 - returncode if returncode < 0 else returncode
