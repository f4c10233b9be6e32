"""The benchmark's side of one collection, from its folder to its results.

The benchmark is set up in a folder of its own (the invoking user's, where it runs as
that user), its process is started held at a gate (kernmlops.collect.gated) with its
output captured there when it asks, and, whatever ends the collection, it is stopped and
reaped, its captured output and parsed results are kept (``benchmark_result``), it is
torn down and its folder removed. :meth:`RunningBenchmark.record` is what the manifest
says of it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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

#: runs one step of a stop; its error is collected, not raised (see collect.stopping)
Step = Callable[[Callable[[], object]], None]


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


class RunningBenchmark:
    """``benchmark`` as one collection in ``path`` runs it: its folder (made now), its
    process once launched (``proc``, None for a benchmark with none), and what went
    wrong with its results (``results_error``). ``keep_output``: copy its captured
    output into the collection (not with a caller's sink: nothing on disk)."""

    def __init__(self, benchmark: Benchmark, name: str, path: Path, *, keep_output: bool) -> None:
        self.benchmark = benchmark
        self.name = name
        self.path = path
        self.keep_output = keep_output
        self.workdir = Path(tempfile.mkdtemp(prefix="kernmlops-bench-"))
        self.outputs: list[IO[bytes]] = []
        self.proc: GatedProcess | None = None
        self.results_error: str | None = None
        #: (st_dev, st_ino) of the files the benchmark's output is captured in
        self._captured: dict[str, tuple[int, int]] = {}

    def launch(self, env: Environment, runs_as: Invoker | None) -> bool:
        """Set the benchmark up and start its process held at the gate, in ``env``'s
        limits; whether it has a process to follow."""
        self.benchmark.environment = env
        self.benchmark.setup(self.workdir)
        launch = self.benchmark.launch()
        if launch is None:
            return False
        if launch.capture_output:
            self.outputs = [(self.workdir / n).open("wb") for n in ("stdout.txt", "stderr.txt")]
            self._captured = {
                Path(out.name).name: _identity(os.fstat(out.fileno())) for out in self.outputs
            }
        # the benchmark's own folder (what setup() made in it too) is its user's
        hand_over(self.workdir, runs_as)
        self.proc = GatedProcess(launch, *self.outputs, user=runs_as)
        env.limit(self.proc.pid, self.proc.containment.path)  # held at the gate
        return True

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
        try:
            self.benchmark.teardown()
        except Exception as err:  # reported; never loses the collection
            self.results_error = f"teardown failed: {err}"
        step(self.benchmark.stop_services)  # servers of setup() and all they started
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _results(self, sink: Sink, exit_code: int | None) -> None:
        """Keep the benchmark's captured output and its parsed results; a
        benchmark whose output does not parse loses nothing else."""
        proc, workdir = self.proc, self.workdir
        kept = self.path / "benchmark_output"
        for name in ("stdout.txt", "stderr.txt"):
            if (workdir / name).exists() and self.keep_output:
                kept.mkdir(parents=True, exist_ok=True)
                self._keep_output(workdir / name, kept / name)
        run = BenchmarkRun(
            workdir=workdir,
            exit_code=exit_code,
            stdout_path=workdir / "stdout.txt" if (workdir / "stdout.txt").exists() else None,
            stderr_path=workdir / "stderr.txt" if (workdir / "stderr.txt").exists() else None,
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

    def _keep_output(self, source: Path, target: Path) -> None:
        """Copy a captured output file, only if it is still the file it was opened as:
        a benchmark run as the user owns its folder, and could put a link to a file
        only root may read in its place."""
        try:
            fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            self.results_error = f"{source.name} not kept: {err.strerror or err}"
            return
        with os.fdopen(fd, "rb") as src:
            if _identity(os.fstat(fd)) != self._captured.get(source.name):
                self.results_error = f"{source.name} not kept: replaced while the benchmark ran"
                return
            with target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
