"""The tests of test_stress_ng.py that need root and BPF (the main lane), apart from the
others so that those run beside it."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

from tests.benchmarks.collect_util import collect, execs, results
from tests.benchmarks.test_stress_ng import _argv, _flag, needs_stress_ng


@pytest.mark.bpf
@needs_stress_ng
def test_cpu_half_through_collect(tmp_path: Path) -> None:
    """The cpu-half scenario through the CLI: its workers run only on the pinned
    CPUs (quanta_runtime), and stress-ng's own CPU time matches the kernel's."""
    cpus = [int(c) for c in _flag(_argv(scenario="cpu-half"), "--taskset").split(",")]
    began = time.time()
    proc, col = collect(tmp_path, "stress-ng", {"scenario": "cpu-half", "duration_s": 1})
    assert proc.returncode == 0, proc.stderr
    got = results(col)
    workers = int(_flag(_argv(scenario="cpu-half"), "--cpu"))
    assert got[("cpu", "bogo_ops")] > 0
    assert 0.7 <= got[("cpu", "wall_clock_s")] <= 3.0  # one alarm: a late fork runs less
    main = execs(col, "stress-ng")
    assert main.height == 1
    pt = col["process_trace"]
    forks = pt.filter((pl.col("kind") == "fork") & (pl.col("ppid") == main["pid"][0]))
    assert forks.height >= workers
    worker_tgids = forks["tgid"].to_list()
    quanta = col["quanta_runtime"].filter(pl.col("tgid").is_in(worker_tgids))
    assert quanta.height > 0
    assert set(quanta["cpu"].unique().to_list()) <= set(cpus)
    # stress-ng's rusage of its workers vs the scheduler's account of them.
    cpu_s = got[("cpu", "user_s")] + got[("cpu", "system_s")]
    assert quanta["quanta_run_length_us"].sum() / 1e6 == pytest.approx(cpu_s, rel=0.15, abs=0.02)
    left = Path(tempfile.gettempdir()).glob("kernmlops-stress-ng-*.yaml")
    assert not [p for p in left if p.stat().st_mtime >= began]  # the metrics file is removed
