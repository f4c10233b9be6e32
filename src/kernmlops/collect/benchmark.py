"""The benchmark's side of one collection, from its folder to its results.

The benchmark is set up in a folder of its own (the invoking user's, where it runs as
that user), its process is started held at a gate (kernmlops.collect.gated) with its
output captured when it asks: straight into the collection's ``benchmark_output/``, so
a collector killed mid-run keeps what the benchmark printed (root's files in root's
fresh folder, which the benchmark's user cannot swap). Whatever ends the collection, it
is stopped and reaped, its parsed results are kept (``benchmark_result``), it is torn
down and its folder removed. :meth:`RunningBenchmark.record` is what the manifest says
of it.

The benchmark's folder is ``work/`` in a folder of root's in the temporary directory,
held locked (``flock``) while the collector lives: a collector killed with SIGKILL
cannot remove it, so each one, as it ends, removes the folders of this user that no
live collector holds (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kernmlops.benchmarks.base import Benchmark, BenchmarkRun
from kernmlops.collect.gated import GatedProcess, exit_status
from kernmlops.collect.manifest import BenchmarkRecord
from kernmlops.host.environment import Environment
from kernmlops.host.invoker import Invoker, hand_over
from kernmlops.tables import Sink

__all__ = ["RESULT_TABLE", "RunningBenchmark"]

RESULT_TABLE = "benchmark_result"
#: the collection's folder of the benchmark's captured stdout.txt and stderr.txt
OUTPUT_DIR = "benchmark_output"
OUTPUT_FILES = ("stdout.txt", "stderr.txt")
#: the temporary folders of the benchmarks' folders
WORK_PREFIX = "kernmlops-bench-"
#: a folder left unlocked this long is a killed collector's, not one being made
STALE_AFTER_S = 600.0
#: the mode of those folders (the benchmark's user may pass, not list)
TOP_MODE = 0o711


def tail_lines(path: Path | None, lines: int = 5, width: int = 300) -> list[str]:
    """The last ``lines`` non-blank lines of a captured output file (its last 8 KiB),
    each cut at ``width`` characters and with control characters (a terminal's escape
    sequences) left out: what a failed benchmark last said, for one glance."""
    if path is None:
        return []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        f.seek(max(0, size - 8192))
        text = f.read(8192).decode("utf-8", errors="replace")
    kept = []
    for line in text.splitlines()[-lines * 4 :]:
        line = "".join(c for c in line if c.isprintable() or c == "\t").rstrip()
        if line:
            kept.append(line if len(line) <= width else line[: width - 1] + "…")
    return kept[-lines:]


def sweep_stale(tmp: Path | None = None, *, now: float | None = None) -> list[Path]:
    """Remove the benchmark folders that killed collectors left in ``tmp`` (the
    temporary directory): this user's, of this layout, unlocked, unchanged for
    STALE_AFTER_S. Never a link, another user's folder, one a live collector holds
    or one an older version made (it takes no lock). The folders removed."""
    tmp = Path(tmp or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed = []
    try:
        names = [e.name for e in os.scandir(tmp) if e.name.startswith(WORK_PREFIX)]
    except OSError:
        return []
    for name in names:
        path = tmp / name
        try:
            st = path.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        try:
            ours = stat.S_IMODE(st.st_mode) == TOP_MODE and (path / "work").is_dir()
        except OSError:
            ours = False
        if not ours:
            continue  # not this layout: an older collector's, which holds no lock
        if now - st.st_mtime < STALE_AFTER_S:
            continue
        held = _lock(path)
        if held is None:
            continue  # a live collector's
        try:
            # a folder of this user in a sticky temporary directory: nobody else can
            # rename it away; rmtree follows no link inside
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(held)
    return removed


def _lock(path: Path) -> int | None:
    """A descriptor holding ``path``'s flock, or None where another holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


#: runs one step of a stop; its error is collected, not raised (see collect.stopping)
Step = Callable[[Callable[[], object]], None]


class RunningBenchmark:
    """``benchmark`` as one collection in ``path`` runs it: its folder (made now), its
    process once launched (``proc``, None for a benchmark with none), and what went
    wrong with its results (``results_error``). ``keep_output``: capture its output in
    the collection (not with a caller's sink: nothing on disk; then in its folder)."""

    def __init__(self, benchmark: Benchmark, name: str, path: Path, *, keep_output: bool) -> None:
        self.benchmark = benchmark
        self.name = name
        self.path = path
        self.keep_output = keep_output
        #: root's (0711: the benchmark's user may pass), locked while this lives
        self.top = Path(tempfile.mkdtemp(prefix=WORK_PREFIX))
        self._held = _lock(self.top)
        os.chmod(self.top if self._held is None else self._held, TOP_MODE)
        self.workdir = self.top / "work"
        self.workdir.mkdir(mode=0o700)
        self.outputs: list[IO[bytes]] = []
        #: name -> path of the files the benchmark's output is captured in
        self.captured: dict[str, Path] = {}
        self.proc: GatedProcess | None = None
        self.results_error: str | None = None
        #: the last lines of a failed benchmark's captured stderr (``collect`` says them)
        self.stderr_tail: list[str] = []

    def launch(self, env: Environment, runs_as: Invoker | None) -> bool:
        """Set the benchmark up and start its process held at the gate, in ``env``'s
        limits; whether it has a process to follow."""
        self.benchmark.environment = env
        self.benchmark.setup(self.workdir)
        launch = self.benchmark.launch()
        if launch is None:
            return False
        if launch.capture_output:
            self._capture()
        # the benchmark's own folder (what setup() made in it too) is its user's
        hand_over(self.workdir, runs_as)
        self.proc = GatedProcess(launch, *self.outputs, user=runs_as)
        env.limit(self.proc.pid, self.proc.containment.path)  # held at the gate
        return True

    def _capture(self) -> None:
        """Open the files the benchmark's stdout and stderr go to: new files (never
        one found there) in the collection's folder, or (nothing kept on disk) in
        root's folder around the benchmark's, where its user can swap none of them
        for a link before they are parsed."""
        folder = self.path / OUTPUT_DIR if self.keep_output else self.top
        if self.keep_output:
            folder.mkdir(mode=0o755)  # the collection is new: nothing is there yet
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        # the collection's files are read by its readers; in /tmp, by root alone
        mode = 0o644 if self.keep_output else 0o600
        for name in OUTPUT_FILES:
            self.outputs.append(os.fdopen(os.open(folder / name, flags, mode), "wb"))
            self.captured[name] = folder / name

    def record(self, environment: Environment) -> BenchmarkRecord:
        """The manifest's benchmark section, as far as the run got."""
        proc = self.proc
        return BenchmarkRecord(
            name=self.name,
            description=self.benchmark.describe(),
            pid=proc.pid if proc else None,
            exit_code=exit_status(proc.returncode)
            if proc and proc.returncode is not None
            else None,
            # CLOCK_MONOTONIC µs, the clock of every table's ts_uptime_us
            started_uptime_us=proc.started_ns // 1000 if proc and proc.started_ns else None,
            stopped_uptime_us=proc.ended_ns // 1000 if proc and proc.ended_ns else None,
            cgroup=proc.containment.cgroup if proc else None,
            environment=dict(environment.record) or None,
        )

    def stop(self, step: Step, grace_s: float, exit_code: int | None) -> int | None:
        """Stop the process (SIGTERM, ``grace_s``, SIGKILL) and all it started, close
        its output; its exit status where the loop did not see it."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                step(lambda: proc.stop(grace_s))
            step(proc.reap_group)
            if exit_code is None and proc.returncode is not None:
                exit_code = exit_status(proc.returncode)
        for out in self.outputs:
            step(out.close)
        return exit_code

    def finish(self, step: Step, sink: Sink, exit_code: int | None) -> None:
        """Once the hooks are drained: keep the results, tear down, stop the services
        of setup() (and all they started), remove the folder."""
        step(lambda: self._results(sink, exit_code))
        if exit_code:  # before its folder goes: the output may be kept nowhere else
            self.stderr_tail = tail_lines(self.captured.get("stderr.txt"))
        try:
            self.benchmark.teardown()
        except Exception as err:  # reported; never loses the collection
            self.results_error = f"teardown failed: {err}"
        step(self.benchmark.stop_services)  # servers of setup() and all they started
        self.remove_folder()

    def remove_folder(self) -> None:
        """Remove the benchmark's folder and let go of its lock; then the folders
        killed collectors left (at the end, not the start: a large one never
        delays a benchmark)."""
        shutil.rmtree(self.top, ignore_errors=True)
        if self._held is not None:
            with contextlib.suppress(OSError):
                os.close(self._held)
            self._held = None
        sweep_stale()

    def _results(self, sink: Sink, exit_code: int | None) -> None:
        """Parse the benchmark's results from its output and its folder; a benchmark
        whose output does not parse loses nothing else."""
        proc, workdir = self.proc, self.workdir
        run = BenchmarkRun(
            workdir=workdir,
            exit_code=exit_code,
            stdout_path=self.captured.get("stdout.txt"),
            stderr_path=self.captured.get("stderr.txt"),
            started_us=proc.started_ns // 1000 if proc and proc.started_ns else None,
            ended_us=proc.ended_ns // 1000 if proc and proc.ended_ns else None,
        )
        try:
            frame = self.benchmark.results(run)
        except Exception as err:  # a parser bug must not lose the collection
            self.results_error = f"{self.benchmark.name} results: {err}"
            return
        if frame is not None and frame.height:
            sink.write(RESULT_TABLE, frame)
