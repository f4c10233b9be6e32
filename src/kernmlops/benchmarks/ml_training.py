"""Watch an AI job from the kernel: LeNet-5 trained with PyTorch on the CPU (see
workloads/ml_job), with periodic checkpoints written to disk; each epoch's
time, loss and accuracy and each checkpoint become results.

``ml-training`` falls back to the job's numpy MLP where torch is missing (and
says so); ``pytorch`` (KernMLOps' benchmark of that name: repeated training
runs) needs torch. Both run the same job file.
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import Field

from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.errors import BenchmarkError
from kernmlops.lazy import lazy_import
from kernmlops.workloads import ml_job

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


#: Run by file path: ``-m`` would first import the kernmlops package (and its
#: package metadata look-up) into the traced job.
JOB_SCRIPT = Path(ml_job.__file__).resolve()
#: Where Debian's python3-torch (a CPU build) lives when the venv has no torch.
SYSTEM_PYTHON = "/usr/bin/python3"
_HAS_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"


@functools.cache
def has_torch(python: str) -> bool:
    """Whether ``python`` can import torch (this interpreter is asked directly)."""
    if Path(python).resolve() == Path(sys.executable).resolve():
        return ml_job.torch_available()
    try:
        return subprocess.run([python, "-c", _HAS_TORCH], capture_output=True,
                              timeout=30).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


def job_python(chosen: str = "") -> str:
    """The interpreter for the job: ``chosen`` if given; else this one when it has
    torch, else the system python3 when it has (Debian's python3-torch), else this
    one (the job then trains its numpy fallback)."""
    if chosen:
        return chosen
    if has_torch(sys.executable) or not Path(SYSTEM_PYTHON).exists():
        return sys.executable
    return SYSTEM_PYTHON if has_torch(SYSTEM_PYTHON) else sys.executable


def parse_job_output(text: str) -> list[dict[str, Any]]:
    """The job's JSON records, in order; other lines (warnings) are skipped."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if isinstance(record, dict) and "kind" in record:
            records.append(record)
    return records


def split_runs(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """One list per training run (a run starts with its setup record)."""
    runs: list[list[dict[str, Any]]] = []
    for r in records:
        if r["kind"] == "setup" or not runs:
            runs.append([])
        runs[-1].append(r)
    return runs


def job_result_rows(records: list[dict[str, Any]]) -> list[tuple[str, str, float, str]]:
    """epoch_N rows (seconds, cpu_seconds, loss: mean training loss, accuracy: on
    the held-out samples, samples_per_s, steps: optimizer steps so far), then total
    (epochs, seconds: their sum), checkpoints (count, bytes, seconds: time spent
    writing them), setup (seconds, torch: 1 for the PyTorch LeNet-5, 0 for the
    numpy fallback) and process (seconds, cpu_seconds, threads, steps) from the
    job's end. Several runs (the pytorch benchmark's repeat) prefix each key
    with ``run_N/``."""
    runs = split_runs(records)
    rows: list[tuple[str, str, float, str]] = []
    for n, run in enumerate(runs, 1):
        prefix = f"run_{n}/" if len(runs) > 1 else ""
        rows += [(prefix + k, m, v, u) for k, m, v, u in _run_rows(run)]
    return rows


def _run_rows(records: list[dict[str, Any]]) -> list[tuple[str, str, float, str]]:
    units = {"seconds": "s", "cpu_seconds": "s", "loss": "nat", "accuracy": "fraction",
             "samples_per_s": "1/s", "steps": "count"}  # fmt: skip
    rows: list[tuple[str, str, float, str]] = []
    epochs = [r for r in records if r["kind"] == "epoch"]
    for r in epochs:
        rows += [(f"epoch_{r['epoch']}", m, float(r[m]), u) for m, u in units.items() if m in r]
    if epochs:
        rows.append(("total", "epochs", float(len(epochs)), "count"))
        rows.append(("total", "seconds", float(sum(r["seconds"] for r in epochs)), "s"))
    ckpts = [r for r in records if r["kind"] == "checkpoint"]
    if ckpts:
        rows.append(("checkpoints", "count", float(len(ckpts)), "count"))
        rows.append(("checkpoints", "bytes", float(sum(r["bytes"] for r in ckpts)), "B"))
        rows.append(("checkpoints", "seconds", float(sum(r["seconds"] for r in ckpts)), "s"))
    for r in records:
        if r["kind"] == "setup":
            rows.append(("setup", "seconds", float(r["seconds"]), "s"))
            if "framework" in r:
                rows.append(("setup", "torch", float(r["framework"] == "torch"), "bool"))
        elif r["kind"] == "done":
            rows.append(("process", "seconds", float(r["seconds"]), "s"))
            rows.append(("process", "cpu_seconds", float(r["cpu_seconds"]), "s"))
            if r.get("threads") is not None:
                rows.append(("process", "threads", float(r["threads"]), "count"))
            if "steps" in r:
                rows.append(("process", "steps", float(r["steps"]), "count"))
    return rows


class _JobOptions(BenchmarkOptions):
    """What both benchmarks pass to the job."""

    samples: int = Field(20_000, ge=1, description="training samples (generated)")
    test_samples: int = Field(2_000, ge=1, description="held-out samples for accuracy")
    classes: int = Field(10, ge=2, description="classes to tell apart")
    separation: float = Field(
        0.5, gt=0, description="contrast of the class shapes (larger: an easier problem)"
    )
    seed: int = Field(0, ge=0, description="seed of the data set, weights and shuffling")
    threads: int = Field(
        1, ge=0, description="BLAS/OpenMP/torch threads of the job; 0 = the libraries' default"
    )
    workers: int = Field(
        0, ge=0, le=64, description="data-loader worker processes (forked by the job; torch)"
    )
    checkpoint_every: int = Field(
        0, ge=0, description="optimizer steps between checkpoints; 0 = one per epoch"
    )
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    checkpoint_dir: str = Field(
        "",
        description="folder for checkpoints; '' = the run's private folder (on tmpfs no "
        "block I/O shows up)",
    )
    python: str = Field(
        "",
        description="interpreter for the job; '' = this one if it has torch, else the "
        "system python3 if it has (Debian's python3-torch), else this one",
    )


class MlTrainingOptions(_JobOptions):
    framework: Literal["auto", "torch", "numpy"] = Field(
        "auto", description="torch: LeNet-5; numpy: the MLP; auto: torch when installed"
    )
    epochs: int = Field(5, ge=1, description="passes over the training set")
    features: int = Field(64, ge=1, description="input features (numpy MLP only)")
    hidden: int = Field(256, ge=1, description="hidden units (numpy MLP only)")
    batch_size: int = Field(64, ge=1, description="minibatch size")
    learning_rate: float = Field(0.02, gt=0, description="SGD step size")


class PytorchOptions(_JobOptions):
    repeat: int = Field(1, ge=1, le=1000, description="training runs, one process each")
    epochs: int = Field(1, ge=1, description="passes over the training set per run")
    batch_size: int = Field(32, ge=1, description="minibatch size")
    learning_rate: float = Field(0.01, gt=0, description="SGD step size")
    device: Literal["cpu"] = Field("cpu", description="only the CPU is supported")
    sleep_s: float = Field(0.0, ge=0, description="pause between runs, seconds")


JobOptionsT = TypeVar("JobOptionsT", bound=_JobOptions)


class _JobBenchmark(Benchmark[JobOptionsT]):
    """What ml-training and pytorch share: the job (ml_job.py), its arguments,
    checkpoints and results."""

    default_filter: ClassVar[str] = "tree"

    def __init__(self, options: JobOptionsT | BenchmarkOptions | None = None) -> None:
        super().__init__(options)
        self.workdir: Path | None = None

    def framework(self) -> str:
        return "torch"

    def check(self) -> None:
        chosen = self.options.python
        # before the probes attach: else the run fails after them with exit 127
        if chosen and shutil.which(chosen) is None:
            raise BenchmarkError(
                f"{self.name}: the job's interpreter {chosen!r} (benchmark."
                f"{self.name.replace('-', '_')}.python) is not an executable program; "
                "'' picks one"
            )
        if self.framework() == "torch" and not has_torch(job_python(self.options.python)):
            raise BenchmarkError(
                f"{self.name}: torch is not installed for {job_python(self.options.python)} "
                "(make ml installs a CPU build)"
            )

    def setup(self, workdir: Path) -> None:
        self.workdir = workdir

    def checkpoint_dir(self) -> Path:
        if self.options.checkpoint_dir:
            return Path(self.options.checkpoint_dir)
        return (self.workdir or Path(".")) / "checkpoints"

    def job_args(self) -> list[str]:
        o = self.options
        args = [
            "--framework", self.framework(), "--epochs", str(o.epochs),
            "--samples", str(o.samples), "--test-samples", str(o.test_samples),
            "--classes", str(o.classes), "--batch-size", str(o.batch_size),
            "--lr", repr(o.learning_rate), "--separation", repr(o.separation),
            "--seed", str(o.seed), "--threads", str(o.threads), "--workers", str(o.workers),
            "--checkpoint-dir", str(self.checkpoint_dir()),
            "--checkpoint-every", str(o.checkpoint_every),
            "--keep-checkpoints", str(o.keep_checkpoints),
        ]  # fmt: skip
        if isinstance(o, MlTrainingOptions):
            args += ["--features", str(o.features), "--hidden", str(o.hidden)]
        return args

    def env(self) -> dict[str, str]:
        # The thread variables also go in the environment, so they hold from the
        # first instruction (the job sets them itself too, before numpy loads).
        t = self.options.threads
        return {var: str(t) for var in ml_job.THREAD_VARIABLES} if t else {}

    def launch(self) -> Launch | None:
        argv = [job_python(self.options.python), str(JOB_SCRIPT), *self.job_args()]
        return Launch(argv=argv, env=self.env(), capture_output=True)

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        rows = job_result_rows(parse_job_output(run.stdout_path.read_text(errors="replace")))
        return result_frame(rows) if rows else None

    def describe(self) -> str:
        return f"{self.name}: {shlex.join(['ml_job.py', *self.job_args()])}"


class MlTrainingBenchmark(_JobBenchmark[MlTrainingOptions]):
    """LeNet-5 with PyTorch (a numpy MLP without torch) on generated MNIST-shaped data."""

    name: ClassVar[str] = "ml-training"

    def framework(self) -> str:
        return self.options.framework


class PytorchBenchmark(_JobBenchmark[PytorchOptions]):
    """KernMLOps' pytorch benchmark: a PyTorch CPU training job, run ``repeat`` times
    (a fresh process each), with a pause between runs. The job is ml-training's
    LeNet-5; torch is required (no numpy fallback)."""

    name: ClassVar[str] = "pytorch"

    def launch(self) -> Launch | None:
        job = [job_python(self.options.python), str(JOB_SCRIPT), *self.job_args()]
        if self.options.repeat == 1:
            return Launch(argv=job, env=self.env(), capture_output=True)
        # A shell loop, so every run is a process of its own (the tree filter
        # follows each); it stops at the first failing run with its exit code.
        loop = (
            'n=$1; pause=$2; shift 2; i=0; while [ "$i" -lt "$n" ]; do '
            '"$@" || exit $?; i=$((i + 1)); '
            'if [ "$i" -lt "$n" ]; then sleep "$pause"; fi; done'
        )
        argv = [
            "/bin/sh",
            "-c",
            loop,
            "sh",
            str(self.options.repeat),
            repr(self.options.sleep_s),
            *job,
        ]
        return Launch(argv=argv, env=self.env(), capture_output=True)
