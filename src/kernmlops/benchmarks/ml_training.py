"""Watch an AI job from the kernel: a CPU training job (see ml_job) that reports
each epoch's time, loss and accuracy."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from kernmlops.benchmarks.base import (
    Benchmark,
    BenchmarkOptions,
    BenchmarkRun,
    Launch,
    result_frame,
)
from kernmlops.lazy import lazy_import
from kernmlops.workloads import ml_job

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


#: Run by file path: ``-m`` would first import the kernmlops package (and its
#: package metadata look-up) into the traced job.
JOB_SCRIPT = Path(ml_job.__file__).resolve()


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


def job_result_rows(records: list[dict[str, Any]]) -> list[tuple[str, str, float, str]]:
    """epoch_N rows (seconds, cpu_seconds, loss: mean training loss, accuracy: on
    the held-out samples, samples_per_s), then total (epochs, seconds: their sum),
    setup (seconds) and process (seconds, cpu_seconds, threads) from the job's end."""
    units = {"seconds": "s", "cpu_seconds": "s", "loss": "nat", "accuracy": "fraction",
             "samples_per_s": "1/s"}  # fmt: skip
    rows: list[tuple[str, str, float, str]] = []
    epochs = [r for r in records if r["kind"] == "epoch"]
    for r in epochs:
        rows += [(f"epoch_{r['epoch']}", m, float(r[m]), u) for m, u in units.items() if m in r]
    if epochs:
        rows.append(("total", "epochs", float(len(epochs)), "count"))
        rows.append(("total", "seconds", float(sum(r["seconds"] for r in epochs)), "s"))
    for r in records:
        if r["kind"] == "setup":
            rows.append(("setup", "seconds", float(r["seconds"]), "s"))
        elif r["kind"] == "done":
            rows.append(("process", "seconds", float(r["seconds"]), "s"))
            rows.append(("process", "cpu_seconds", float(r["cpu_seconds"]), "s"))
            if r.get("threads") is not None:
                rows.append(("process", "threads", float(r["threads"]), "count"))
    return rows


class MlTrainingOptions(BenchmarkOptions):
    epochs: int = Field(10, ge=1, description="passes over the training set")
    samples: int = Field(100_000, ge=1, description="training samples")
    test_samples: int = Field(5_000, ge=1, description="held-out samples for accuracy")
    features: int = Field(64, ge=1, description="input features")
    classes: int = Field(10, ge=2, description="classes to tell apart")
    hidden: int = Field(256, ge=1, description="hidden units")
    batch_size: int = Field(128, ge=1, description="minibatch size")
    learning_rate: float = Field(0.05, gt=0, description="SGD step size")
    separation: float = Field(
        0.5, gt=0, description="spread of the class centres (larger: an easier problem)"
    )
    seed: int = Field(0, ge=0, description="seed of the data set, weights and shuffling")
    threads: int = Field(
        1, ge=0, description="BLAS/OpenMP threads of the job; 0 = the libraries' default"
    )


class MlTrainingBenchmark(Benchmark[MlTrainingOptions]):
    """A numpy MLP trained with minibatch SGD on a generated data set."""

    name: ClassVar[str] = "ml-training"
    default_filter: ClassVar[str] = "tree"

    def job_args(self) -> list[str]:
        o = self.options
        return [
            "--epochs", str(o.epochs), "--samples", str(o.samples),
            "--test-samples", str(o.test_samples), "--features", str(o.features),
            "--classes", str(o.classes), "--hidden", str(o.hidden),
            "--batch-size", str(o.batch_size), "--lr", repr(o.learning_rate),
            "--separation", repr(o.separation), "--seed", str(o.seed),
            "--threads", str(o.threads),
        ]  # fmt: skip

    def launch(self) -> Launch | None:
        # The thread variables also go in the environment, so they hold from the
        # first instruction (the job sets them itself too, before numpy loads).
        env = (
            {var: str(self.options.threads) for var in ml_job.THREAD_VARIABLES}
            if self.options.threads
            else {}
        )
        return Launch(
            argv=[sys.executable, str(JOB_SCRIPT), *self.job_args()], env=env, capture_output=True
        )

    def results(self, run: BenchmarkRun) -> pl.DataFrame | None:
        if run.stdout_path is None:
            return None
        rows = job_result_rows(parse_job_output(run.stdout_path.read_text(errors="replace")))
        return result_frame(rows) if rows else None

    def describe(self) -> str:
        return f"ml-training: {shlex.join(['ml_job.py', *self.job_args()])}"
