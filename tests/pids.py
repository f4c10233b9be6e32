"""A process started at a chosen pid (one freed before): how the tests show what a
reused pid does to the filter and to what is read from /proc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from tests.conftest import skip_here


def fork_at(pid: int, argv: list[str], **popen: Any) -> subprocess.Popen | None:
    """A child of this process running ``argv`` with pid ``pid`` (freed before): the
    kernel's next pid set through ns_last_pid (another process may take it first:
    retried); None where 100 tries did not get it."""
    last = Path("/proc/sys/kernel/ns_last_pid")
    if not last.exists():
        skip_here("no /proc/sys/kernel/ns_last_pid (CONFIG_CHECKPOINT_RESTORE)")
    for _ in range(100):
        last.write_text(str(pid - 1))
        proc = subprocess.Popen(argv, **popen)
        if proc.pid == pid:
            _exec_done(proc)
            return proc
        proc.kill()
        proc.wait()
    return None


def _exec_done(proc: subprocess.Popen, timeout_s: float = 10) -> None:
    """Wait until ``proc``'s command line is there: Popen returns once the exec closed
    its close-on-exec pipe, before the new program's arguments are set up, and a
    loaded machine may hold the child in between (/proc/<pid>/cmdline reads empty)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                return
        except OSError:
            return
        time.sleep(0.001)
