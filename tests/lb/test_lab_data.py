"""Real decisions: 7,503 can_migrate_task calls recorded in the kernel lab
(Debian 6.1.0-56 under QEMU TCG, 4 CPUs on 2 NUMA nodes) by ``lb collect``:
10 runs with fexit (stress-ng cpu-half, oversubscribe, numa, cache and mixed,
twice each, 8 s) and one with kprobe + kretprobe (oversubscribe). Canonical
columns plus numa_faults_on, nodes and comm (data/lab_kprobe_decisions.parquet)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from kernmlops.lb.features import LABEL, kernel_decision, mllb_filter
from kernmlops.lb.pipeline import train_model

DATA = Path(__file__).parent / "data" / "lab_kprobe_decisions.parquet"


@pytest.fixture(scope="module")
def decisions() -> pl.DataFrame:
    return pl.read_parquet(DATA)


def test_columns_carry_the_kernels_decision(decisions: pl.DataFrame) -> None:
    # can_migrate_task's own logic on the recorded columns gives back every
    # answer the kernel returned: the columns are what the kernel used
    kept = mllb_filter(decisions)
    assert kept.height == 3525
    assert (kernel_decision(kept) == kept[LABEL].to_numpy()).all()


def test_model_agrees_99_percent_on_unseen_runs(decisions: pl.DataFrame) -> None:
    result = train_model(decisions, seed=0)
    test = result.report["test"]
    assert len(test["collections"]) == 3
    assert not set(test["collections"]) & set(result.report["train"]["collections"])
    assert test["float"]["accuracy"] >= 0.99
    assert test["fixed"]["accuracy"] >= 0.99
    assert test["float_vs_fixed"]["agreement"] >= 0.999
    assert test["float_vs_fixed"]["within_bound"]
