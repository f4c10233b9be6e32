"""The Spark job's page faults of a real collection that kept 1 fault in 10 (root and
BPF: the main lane; test_spark_job.py has the plain tests and the collections made
before the hook kept its exact count)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

from kernmlops.fleet import open_dataset
from kernmlops.fleet.push import push
from kernmlops.hooks.page_faults import COUNTER_ALL
from tests.conftest import REQUIRE_BPF, needs_tools
from tests.e2e.test_page_fault_counts import BEFORE_TRACED, collect_workload
from tests.hooks.conftest import build_c
from tests.hooks.test_page_faults import AFTER_LAST, WORKLOAD

pytestmark = [
    pytest.mark.bpf,
    needs_tools("java"),
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None and not REQUIRE_BPF,
        reason="pyspark is not installed (make test installs it)",
    ),
]


def test_a_sampled_collections_faults_are_the_kernels_count(
    spark, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """1 fault in 10 kept as a row: the summary's faults are the manifest's exact count
    (within what the workload's own getrusage saw), not rows x 10, and not an estimate."""
    from kernmlops.fleet.spark_job import run

    every = 10
    workload = build_c(tmp_path_factory, "pfw", WORKLOAD)
    proc, col = collect_workload(tmp_path, workload, every)
    lifetime = int(proc.stdout.split()[-1])
    counted = col.manifest["hooks"]["page_faults"]["counters"][COUNTER_ALL]
    assert lifetime - BEFORE_TRACED <= counted <= lifetime + AFTER_LAST
    dest = tmp_path / "dest"
    results, refused = push([col.path], open_dataset(str(dest)))
    assert len(results) == 1 and not refused
    run(spark, str(dest), str(tmp_path / "job"))
    [row] = pl.read_parquet(tmp_path / "job" / "collections" / "*.parquet").iter_rows(named=True)
    assert row["collection_id"] == col.collection_id
    assert row["faults"] == counted
    assert row["fault_sample_every"] == every
    assert row["faults_estimated"] is False
    rows = col["page_faults"].height
    ncpu = col.manifest["system"]["logical_cpus"]
    # what the summary said before: rows x 10, off by up to 10 per CPU (the faults a
    # CPU saw after its last kept one)
    assert abs(rows * every - counted) <= every * ncpu
