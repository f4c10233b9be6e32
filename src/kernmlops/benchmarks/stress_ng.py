"""stress-ng scenarios: short, scaled to the machine, needing no special device."""

from __future__ import annotations

import math
import shutil
import tempfile
from typing import ClassVar, Literal

from pydantic import Field

from kernmlops.benchmarks.base import Benchmark, BenchmarkOptions, Launch
from kernmlops.collect.sysinfo import online_cpu_count
from kernmlops.errors import BenchmarkError

STRESS_NG = "stress-ng"
#: Memory each vm worker touches: enough to fault and reclaim, small enough for any box.
VM_BYTES = "64M"
#: File size each hdd / iomix worker writes in the temporary directory.
HDD_BYTES = "16M"
IOMIX_BYTES = "16M"

Scenario = Literal["mixed", "cpu", "switch", "vm", "io"]


class StressNgBenchmark(Benchmark):
    """Runs one stress-ng scenario for ``duration_s`` seconds."""

    class Options(BenchmarkOptions):
        scenario: Scenario = Field("mixed", description="which stressors to run")
        duration_s: float = Field(10, gt=0, description="run time in seconds (rounded up)")
        workers: int = Field(0, ge=0, description="workers per stressor; 0 = the online CPUs")
        extra_args: list[str] = Field(
            default_factory=list, description="more stress-ng arguments, appended as given"
        )

    name: ClassVar[str] = "stress-ng"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: BenchmarkOptions | None = None) -> None:
        if not isinstance(options, StressNgBenchmark.Options):
            options = StressNgBenchmark.Options.model_validate(
                options.model_dump() if options is not None else {}
            )
        super().__init__(options)
        self.opts: StressNgBenchmark.Options = options

    def check(self) -> None:
        if shutil.which(STRESS_NG) is None:
            raise BenchmarkError(
                "stress-ng: the stress-ng program is not installed; "
                "install it: apt-get install stress-ng"
            )

    def workers(self) -> int:
        """Workers for the main stressor: the option, or one per online CPU."""
        return self.opts.workers or online_cpu_count()

    def stressor_args(self) -> list[str]:
        """The stressors of the scenario (without timeout and metrics)."""
        n = self.workers()
        half = max(1, n // 2)
        # Files go to the system temp dir; stress-ng makes and removes its own
        # tmp-stress-ng-* folder there.
        io_path = ["--temp-path", tempfile.gettempdir()]
        match self.opts.scenario:
            case "cpu":
                return ["--cpu", str(n)]
            case "switch":
                return ["--switch", str(n)]
            case "vm":
                return ["--vm", str(n), "--vm-bytes", VM_BYTES]
            case "io":
                return [
                    "--hdd", str(n), "--hdd-bytes", HDD_BYTES,
                    "--iomix", str(half), "--iomix-bytes", IOMIX_BYTES,
                    *io_path,
                ]  # fmt: skip
            case "mixed":
                # Every CPU busy computing, plus half as many switching, paging
                # and writing workers so the scheduler always has a choice.
                quarter = max(1, n // 4)
                return [
                    "--cpu", str(n),
                    "--switch", str(half),
                    "--vm", str(half), "--vm-bytes", VM_BYTES,
                    "--hdd", str(quarter), "--hdd-bytes", HDD_BYTES,
                    *io_path,
                ]  # fmt: skip
        raise BenchmarkError(f"stress-ng: unknown scenario {self.opts.scenario!r}")

    def launch(self) -> Launch | None:
        # stress-ng truncates fractional seconds ("2.5s" runs 2 s): round up so a
        # run is never shorter than asked.
        seconds = max(1, math.ceil(self.opts.duration_s))
        argv = [STRESS_NG, *self.stressor_args(), "--timeout", f"{seconds}s", "--metrics-brief"]
        return Launch(argv=[*argv, *self.opts.extra_args])
