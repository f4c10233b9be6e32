"""A throw-away server on 127.0.0.1 that a benchmark's setup() starts and its
teardown() stops (memcached, redis): a free port picked once, its output in a log,
ready once it answers, contained like the benchmark (``Benchmark.start_service``).

A benchmark that drives a server holds one :class:`LocalServer` and says only what
is its own: the server's command line, how to ask it whether it is up, and (if it
has one) a polite way to shut it down.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from kernmlops.benchmarks._tools import free_tcp_port, stop_process_group
from kernmlops.errors import BenchmarkError

if TYPE_CHECKING:
    from kernmlops.benchmarks.base import Benchmark

__all__ = ["HOST", "LocalServer"]

HOST = "127.0.0.1"


class LocalServer:
    """One server process of ``owner`` (a benchmark), the program ``program``."""

    def __init__(self, owner: Benchmark, program: str) -> None:
        self.owner = owner
        self.program = program
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._port: int | None = None
        self._log: IO[bytes] | None = None

    @property
    def port(self) -> int:
        """The server's port: picked once, when first needed (launch() may come
        before setup())."""
        if self._port is None:
            self._port = free_tcp_port(HOST)
        return self._port

    def start(
        self,
        argv: list[str],
        *,
        cwd: Path,
        log: Path,
        answers: Callable[[], bool],
        question: str,
        timeout_s: float,
    ) -> None:
        """Start ``argv`` in ``cwd`` with its output in ``log`` and wait until
        ``answers()`` (OSError counts as not yet) or ``timeout_s`` passes.

        Raises:
            BenchmarkError: it could not start, it exited, or it never answered
                ``question`` (each with the tail of its log).
        """
        name = self.owner.name
        self.log_path = log
        self._log = log.open("wb")
        try:
            self.proc = self.owner.start_service(
                argv, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT
            )
        except OSError as err:
            raise BenchmarkError(f"{name}: cannot start {self.program}: {err.strerror}") from err
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise BenchmarkError(
                    f"{name}: {self.program} exited with status {self.proc.returncode} "
                    f"before answering: {self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                if answers():
                    return
            if time.monotonic() > deadline:
                raise BenchmarkError(
                    f"{name}: {self.program} did not answer {question} on {HOST}:{self.port} "
                    f"within {timeout_s:g} s: {self.log_tail()}"
                )
            time.sleep(0.02)

    def log_tail(self, lines: int = 3) -> str:
        """The last lines of the server's output, for an error message."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(ln.strip() for ln in text[-lines:] if ln.strip()) or "(no output)"

    def pids(self) -> list[int]:
        """The server's pid while it runs (for the tree filter)."""
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []

    def stop(self, polite: Callable[[], None] | None = None) -> None:
        """Stop the server (idempotent): ``polite()`` first where given (OSError
        ignored, 5 s to exit), then SIGTERM and SIGKILL to its process group, then
        whatever else the benchmark's services left."""
        if self.proc is not None:
            if polite is not None and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    polite()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            stop_process_group(self.proc)
            self.proc = None
        self.owner.stop_services()  # what it forked, its cgroup and watchdog
        if self._log is not None:
            self._log.close()
            self._log = None
