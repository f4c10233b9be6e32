"""Start a benchmark's process held at a gate, and stop its whole group.

The process is created first (so its pid can be put in the kernel filter) and
execs the command only when the gate opens, after every probe is attached:
its exec and first forks are traced.
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

# The gate is the shell's stdin, a pipe: a line means go, end-of-file (the
# collector died) means exit. Stdin, not another fd: dash only takes fd numbers
# 0-9 in redirections, and a collector may hold many files. The command then
# gets /dev/null as its stdin.
_GATE = 'read -r _ || exit 125; exec "$@" </dev/null'


class GatedProcess:
    """A benchmark process in its own process group."""

    def __init__(self, launch: Launch, stdout: IO[bytes] | None = None,
                 stderr: IO[bytes] | None = None) -> None:  # fmt: skip
        read_fd, self._gate = os.pipe()
        env = {**os.environ, **launch.env}
        try:
            self.proc = subprocess.Popen(
                ["/bin/sh", "-c", _GATE, "kernmlops-gate", *launch.argv],
                stdin=read_fd,
                cwd=launch.cwd,
                env=env,
                start_new_session=True,  # own group: stop it whole, no Ctrl+C from the tty
                stdout=stdout,
                stderr=stderr,
            )
        except OSError as err:
            os.close(self._gate)
            raise BenchmarkError(f"cannot start {launch.argv[0]!r}: {err.strerror}") from err
        finally:
            os.close(read_fd)  # the child has its copy
        self.pid = self.proc.pid
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

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None and self.ended_ns is None:
            self.ended_ns = time.monotonic_ns()
        return code

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the group, then SIGKILL what is left after ``grace_s``."""
        if self._gate >= 0:
            os.close(self._gate)  # the gate reads EOF and exits 125
            self._gate = -1
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        if self.ended_ns is None:
            self.ended_ns = time.monotonic_ns()

    def reap_group(self) -> None:
        """After the main process exited: end children it left in its group."""
        self._signal_group(signal.SIGTERM)
        time.sleep(0.05)
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + signal for a killed process."""
    return 128 - returncode if returncode < 0 else returncode
