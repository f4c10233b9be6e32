"""stress-ng scenarios: short, scaled to the machine's CPUs and NUMA nodes,
needing no special device. ``mixed``, ``cpu``, ``switch``, ``vm`` and ``io``
are general mixes; ``numa``, ``cpu-half``, ``cache``, ``oversubscribe``,
``hdd-seek``, ``matrixprod``, ``fft`` and ``mllb-mixed`` are the MLLB study's
evaluation scenarios exactly as :data:`kernmlops.workloads.mllb.SCENARIOS` defines
them (one definition for collecting decisions and for measuring the model's
effect); ``custom`` runs only the stressors given in ``extra_args``.
stress-ng's own metrics (bogo ops, bogo ops/s) per stressor become the
benchmark_result table.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from kernmlops.benchmarks._tools import require_tool
from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.errors import BenchmarkError
from kernmlops.host.cpus import online_cpu_count, read_cpu_list
from kernmlops.lazy import lazy_import
from kernmlops.workloads.mllb import BY_NAME, LAB_SIZES, Sizes

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


STRESS_NG = "stress-ng"
#: Memory each vm worker touches: enough to fault and reclaim, small enough for any box.
VM_BYTES = "64M"
#: File size each hdd / iomix / seek worker writes in the temporary directory.
HDD_BYTES = "16M"
IOMIX_BYTES = "16M"
#: the largest metrics file read back (stress-ng writes a few KiB)
MAX_YAML_BYTES = 16 << 20
NODE_ROOT = Path("/sys/devices/system/node")
CPU_ONLINE = Path("/sys/devices/system/cpu/online")

Scenario = Literal[
    "mixed", "cpu", "switch", "vm", "io",
    "numa", "cpu-half", "cache", "oversubscribe", "hdd-seek", "matrixprod", "fft", "mllb-mixed",
    "custom",
]  # fmt: skip
#: Our scenario name -> the MLLB scenario of kernmlops.workloads.mllb it runs (``mixed``
#: is taken by the general default mix, so MLLB's is ``mllb-mixed``).
MLLB_SCENARIOS = {
    "numa": "numa", "cpu-half": "cpu-half", "cache": "cache", "oversubscribe": "oversubscribe",
    "hdd-seek": "hdd-seek", "matrixprod": "matrixprod", "fft": "fft", "mllb-mixed": "mixed",
}  # fmt: skip

#: What stress-ng's YAML names each metric, and our name and unit for it.
_METRICS = {
    "bogo-ops": ("bogo_ops", "ops"),
    "bogo-ops-per-second-real-time": ("bogo_ops_per_s_real", "1/s"),
    "bogo-ops-per-second-usr-sys-time": ("bogo_ops_per_s_usr_sys", "1/s"),
    "wall-clock-time": ("wall_clock_s", "s"),
    "user-time": ("user_s", "s"),
    "system-time": ("system_s", "s"),
    "cpu-usage-per-instance": ("cpu_usage_per_instance_pct", "%"),
    "max-rss": ("max_rss_kib", "KiB"),
}

#: The unit of a stressor's own metric, from the first word of its name (stress-ng
#: names them "nanosecs-per-seek", "MB/sec read rate" -> mbsec-read-rate, ...).
_UNIT_WORDS = {
    "nanosecs": "ns", "microsecs": "us", "millisecs": "ms", "secs": "s", "seconds": "s",
    "kbsec": "KB/s", "mbsec": "MB/s", "gbsec": "GB/s", "bytes": "B", "kb": "KB", "mb": "MB",
}  # fmt: skip


def _metric_unit(field: str) -> str:
    """A unit for stress-ng's extra metric ``field``, as its name says ("" if it does
    not): so far every one was written with no unit."""
    words = field.lower().split("-")
    if words[0] in _UNIT_WORDS:
        return _UNIT_WORDS[words[0]]
    if words[-2:] in (["per", "sec"], ["per", "second"]):
        return "1/s"
    return ""


def numa_nodes(root: Path | None = None) -> dict[int, list[int]]:
    """{node: its online CPUs} for nodes that have CPUs; one node of all
    online CPUs where sysfs has no NUMA information."""
    root = root or NODE_ROOT
    online = set(read_cpu_list(CPU_ONLINE))
    nodes: dict[int, list[int]] = {}
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = [c for c in read_cpu_list(path / "cpulist") if not online or c in online]
        if cpus:  # memory-only nodes (CXL, PMEM) run nothing
            nodes[int(path.name[4:])] = cpus
    if not nodes:
        cpus = sorted(online) or list(range(online_cpu_count()))
        nodes = {0: cpus}
    return nodes


class StressNgOptions(BenchmarkOptions):
    scenario: Scenario = Field(
        "mixed",
        description="which stressors to run: the general mixes mixed, cpu, switch, vm, io; "
        "MLLB's evaluation scenarios numa (memory on the other node), cpu-half (the first "
        "node busy, the rest idle), cache, oversubscribe (2x the CPUs), hdd-seek, "
        "matrixprod, fft, mllb-mixed (as kernmlops.workloads.mllb defines them, worker counts "
        "in proportion to MLLB's 56 CPUs); or custom (only extra_args)",
    )
    duration_s: float = Field(10, gt=0, description="run time in seconds (rounded up)")
    workers: int = Field(
        0,
        ge=0,
        description="workers per stressor of the general mixes; 0 = the online CPUs "
        "(MLLB's scenarios scale their own counts and refuse it)",
    )
    mllb_sizes: bool = Field(
        False,
        description="MLLB's scenarios with MLLB's sizes (vm 1G, hdd 10G, matrix 512) "
        "instead of the small ones (vm 64M, hdd 32M, matrix 128)",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="more stress-ng arguments, appended as given (with scenario custom: "
        "the stressors themselves, e.g. ['--sock', '2'])",
    )


class StressNgBenchmark(Benchmark[StressNgOptions]):
    """Runs one stress-ng scenario for ``duration_s`` seconds."""

    name: ClassVar[str] = "stress-ng"
    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: StressNgOptions | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        #: the folder of the metrics file: setup()'s workdir, or one of its own that
        #: yaml_path makes when launch() comes first
        self._folder: Path | None = None
        self._own_folder = False

    def setup(self, workdir: Path) -> None:
        if self._folder is None:
            self._folder = workdir

    @property
    def yaml_path(self) -> Path:
        """stress-ng's metrics file, in a folder only the benchmark's user may enter
        (mkdtemp's 0700). Not a name in the shared temporary folder: even a random one
        is in stress-ng's argv for every user to read, and a link planted there before
        stress-ng writes its report would be followed by root's stress-ng."""
        if self._folder is None:
            self._folder = Path(tempfile.mkdtemp(prefix="kernmlops-stress-ng-"))
            self._own_folder = True
        return self._folder / "stress-ng.yaml"

    def check(self) -> None:
        require_tool("stress-ng", STRESS_NG, "apt-get install stress-ng")
        if self.options.scenario in MLLB_SCENARIOS and self.options.workers:
            raise BenchmarkError(
                f"stress-ng: scenario {self.options.scenario!r} is MLLB's, its worker counts "
                "are MLLB's in proportion to the CPUs: leave workers at 0 (or use custom)"
            )
        self.stressor_args()  # a scenario this machine cannot run fails here, not later
        if self.options.scenario == "custom" and not any(
            a.startswith("-") for a in self.options.extra_args
        ):
            raise BenchmarkError(
                "stress-ng: scenario 'custom' runs the stressors in extra_args, and there "
                "are none; e.g. benchmark.stress_ng.extra_args: ['--sock', '2']"
            )

    def workers(self) -> int:
        """Workers for the main stressor: the option, or one per online CPU."""
        return self.options.workers or online_cpu_count()

    def stressor_args(self) -> list[str]:
        """The stressors of the scenario (without timeout and metrics)."""
        n = self.workers()
        half = max(1, n // 2)
        # Files go to the system temp dir; stress-ng makes and removes its own
        # tmp-stress-ng-* folder there.
        if self.options.scenario in MLLB_SCENARIOS:
            return self.mllb_args(MLLB_SCENARIOS[self.options.scenario])
        match self.options.scenario:
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
                ]  # fmt: skip
            case "custom":
                return []
        raise BenchmarkError(f"stress-ng: unknown scenario {self.options.scenario!r}")

    def mllb_args(self, name: str) -> list[str]:
        """MLLB's scenario ``name`` on this machine's NUMA nodes (kernmlops.workloads.mllb)."""
        sizes = Sizes() if self.options.mllb_sizes else LAB_SIZES
        try:
            return BY_NAME[name].argv(numa_nodes(), sizes)
        except ValueError as err:
            raise BenchmarkError(f"stress-ng: {err}") from None

    def _argv(self, metrics: bool) -> list[str]:
        # stress-ng truncates fractional seconds ("2.5s" runs 2 s): round up so a
        # run is never shorter than asked.
        seconds = max(1, math.ceil(self.options.duration_s))
        # --temp-path for every scenario: stress-ng checks the working directory
        # even for stressors that write nothing, and it may be read-only (the lab).
        argv = [
            STRESS_NG, *self.stressor_args(), "--timeout", f"{seconds}s", "--metrics-brief",
            "--temp-path", tempfile.gettempdir(),
        ]  # fmt: skip
        if metrics:
            argv += ["--yaml", str(self.yaml_path)]
        return [*argv, *self.options.extra_args]

    def launch(self) -> Launch | None:
        return Launch(argv=self._argv(metrics=True), capture_output=True)

    def describe(self) -> str:
        # The metrics file is an internal detail: left out (and not made for this).
        return " ".join(self._argv(metrics=False))

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        text = self._read_metrics()
        return None if text is None else result_frame(parse_metrics_yaml(text))

    def _read_metrics(self) -> str | None:
        """The metrics file, if stress-ng wrote one: never through a link, nor a file
        with a second name (a benchmark run as the user owns the folder), at most
        MAX_YAML_BYTES."""
        if self._folder is None:
            return None
        path = self.yaml_path
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None  # stress-ng did not get as far as its report
        except OSError as err:
            raise BenchmarkError(f"stress-ng: {path} not read: {err.strerror or err}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise BenchmarkError(f"stress-ng: {path} is not a file of its own: not read")
            if st.st_size > MAX_YAML_BYTES:
                raise BenchmarkError(f"stress-ng: {path} is {st.st_size} bytes: not read")
            return f.read(MAX_YAML_BYTES).decode("utf-8", "replace")

    def teardown(self) -> None:
        if self._folder is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.yaml_path.unlink()
        if self._own_folder:
            shutil.rmtree(self._folder, ignore_errors=True)


def parse_metrics_yaml(text: str) -> list[tuple[str, str, float, str]]:
    """``(stressor, metric, value, unit)`` rows from stress-ng's ``--yaml`` file:
    the standard metrics under our names and units, any extra numeric metric of
    a stressor (e.g. ``nanosecs-per-seek``) under its own name."""
    import yaml

    doc: Any = yaml.safe_load(text) or {}
    rows: list[tuple[str, str, float, str]] = []
    for entry in doc.get("metrics") or []:
        stressor = str(entry.get("stressor", ""))
        if not stressor:
            continue
        for field, value in entry.items():
            if field == "stressor" or isinstance(value, bool):
                continue
            if not isinstance(value, int | float):
                continue
            metric, unit = _METRICS.get(field, (field.replace("-", "_"), _metric_unit(field)))
            rows.append((stressor, metric, float(value), unit))
    return rows
