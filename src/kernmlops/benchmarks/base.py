"""What every benchmark is: validated options, a check, and a process to run."""

from __future__ import annotations

import os
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict

from kernmlops.host.cgroup import Containment
from kernmlops.host.environment import Environment
from kernmlops.lazy import lazy_import
from kernmlops.registry import options_model, options_of

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


class BenchmarkOptions(BaseModel):
    """Base of each benchmark's config section; unknown keys are errors, and so are
    inf and nan (a ``gt=0`` duration takes ``.inf``, which no tool can run for)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


#: a benchmark's options model: ``class FioBenchmark(Benchmark[FioOptions])`` types
#: ``self.options`` and sets ``FioBenchmark.Options`` (its config section)
OptionsT = TypeVar("OptionsT", bound=BenchmarkOptions)


@dataclass(frozen=True)
class Launch:
    """A process for the session to start (in its own process group)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    #: write stdout/stderr to files in the run's workdir (for results()) instead
    #: of the terminal
    capture_output: bool = False


@dataclass(frozen=True)
class BenchmarkRun:
    """What a finished (or stopped) benchmark process left behind."""

    workdir: Path
    exit_code: int | None
    stdout_path: Path | None = None
    stderr_path: Path | None = None
    #: CLOCK_MONOTONIC µs (the tables' ts_uptime_us) of the release and the end
    started_us: int | None = None
    ended_us: int | None = None


def result_schema() -> dict[str, type[pl.DataType]]:
    """Columns of the benchmark_result table: long format, the same for every
    benchmark, so a fleet's results read as one table."""
    return {"key": pl.String, "metric": pl.String, "value": pl.Float64, "unit": pl.String}


def result_frame(rows: list[tuple[str, str, float, str]]) -> pl.DataFrame:
    """``(key, metric, value, unit)`` rows, e.g. ``("randread", "iops", 1234.0, "1/s")``."""
    return pl.DataFrame(rows, schema=result_schema(), orient="row")


class Benchmark(ABC, Generic[OptionsT]):
    """One workload. ``launch()`` returns None for a benchmark that runs no process."""

    name: ClassVar[str]
    Options: ClassVar[type[BenchmarkOptions]] = BenchmarkOptions
    #: Default process filter: "tree" follows the benchmark's processes,
    #: "system" traces everything.
    default_filter: ClassVar[str] = "system"
    #: the run's environment (CPUs, THP), set by the session before setup(): servers
    #: started with start_service are kept on the benchmark's CPUs too
    environment: Environment | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        model = options_model(cls, BenchmarkOptions)
        if model is not None:
            cls.Options = model

    def __init__(self, options: OptionsT | BenchmarkOptions | None = None) -> None:
        #: the benchmark's own section (defaults for None, validated once from a base one)
        self.options: OptionsT = cast(OptionsT, options_of(self.Options, options))

    def check(self) -> None:
        """Raise BenchmarkError before anything is attached if the benchmark cannot run."""

    def setup(self, workdir: Path) -> None:
        """Prepare before probes attach (start a server, make input data). ``workdir``
        is a private temporary folder, removed after teardown()."""

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        """The benchmark's own results (see result_frame), parsed after it ends."""
        return None

    def teardown(self) -> None:
        """Undo setup(): always called, also after a failure or Ctrl+C."""

    def start_service(
        self,
        argv: list[str],
        *,
        cwd: Path | None = None,
        stdout: IO[bytes] | int | None = None,
        stderr: IO[bytes] | int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a process that setup() needs running (a server), contained like the
        benchmark itself: in a cgroup of its own, in its own session (a Ctrl+C at the
        terminal reaches the collector, which stops it in order), and watched by a
        watchdog that kills it all if the collector dies (SIGKILL, the OOM killer).
        Whatever it forks or daemonises stays in the cgroup; the session ends all of
        it after teardown() (see :meth:`stop_services`).

        Raises:
            OSError: the command cannot be started.
        """
        box = Containment(label=f"{self.name}-service")
        # The shell puts itself in the cgroup before it execs the command, so not
        # even a first fork can happen outside it.
        enter = 'if [ -n "$0" ]; then echo $$ > "$0/cgroup.procs" || exit 126; fi; exec "$@"'
        env = self.environment
        cpus = env.cpus if env is not None else None
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", enter, str(box.path or ""), *argv],
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                # benchmark.cpus: on its CPUs before it starts a thread
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        except OSError:
            box.close()
            raise
        box.add(proc.pid)  # the watchdog learns its process group
        if env is not None:
            env.limit(proc.pid, box.path)
        self.__dict__.setdefault("_services", []).append(box)
        return proc

    def stop_services(self) -> None:
        """End every process started with :meth:`start_service` and what it started
        (idempotent; the session calls it after teardown())."""
        for box in self.__dict__.pop("_services", []):
            box.close()

    def tracked_pids(self) -> list[int]:
        """Processes started in setup() (a server) that the "tree" filter follows
        too, with their future children; called after setup()."""
        return []

    @abstractmethod
    def launch(self) -> Launch | None:
        """The command to run, or None (run until stopped or the duration passes)."""

    def describe(self) -> str:
        """One line for progress output and the manifest."""
        launch = self.launch()
        return " ".join(launch.argv) if launch else self.name
