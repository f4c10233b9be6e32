"""MLLB's features from a hand-written dump in MLLB's raw CSV format, checked
value by value against numbers worked out by hand from the columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.lb.features import (
    FEATURES,
    FeatureError,
    fixed_features,
    float_features,
    mllb_filter,
    rule_decision,
)
from kernmlops.lb.mllb_import import MllbFormatError, read_mllb_csv

RAW = Path(__file__).parent / "mllb_raw.csv"

# Rows 0, 1 and 4 of mllb_raw.csv pass the filter (row 2: running, row 3:
# a hard constraint failed). Worked out by hand:
#   0: src 3 > preferred 1; ran 1.2 ms ago (cold); not idle; one node;
#      src_len 3-2; loads 2048/1000, 1024/1000; dst_len 1
#   1: newly idle; ran 0.1 ms ago (hot); other node, prefers src; faults
#      -30/120; 3 failures > 1 nice try; buddy
#   4: src 5 = preferred 5; 0.4 ms (hot); not idle; other node; loads 3.0,
#      0.01; faults -7/3; 1 failure, 1 try
FLOAT = np.array(
    [
        [1, 0, 0, 1, 0, 1, 0, 0, 1, 2.048, 1.024, 1, 0.0, 0, 0],
        [0, 1, 0, 0, 1, 0, 1, 0, 0, 0.999, 0.0, 0, -0.25, 1, 1],
        [0, 1, 0, 1, 0, 0, 0, 0, 3, 3.0, 0.01, 0, -7 / 3, 0, 0],
    ]
)
# Q20.11: flags and lengths << 11; load * 2048 / 1000 and faults * 2048 /
# total truncated toward zero, as C divides: 4194.3 -> 4194, 2045.95 -> 2045,
# 20.48 -> 20, -4778.67 -> -4778 (not -4779)
FIXED = np.array(
    [
        [2048, 0, 0, 2048, 0, 2048, 0, 0, 2048, 4194, 2097, 2048, 0, 0, 0],
        [0, 2048, 0, 0, 2048, 0, 2048, 0, 0, 2045, 0, 0, -512, 2048, 2048],
        [0, 2048, 0, 2048, 0, 0, 0, 0, 6144, 6144, 20, 0, -4778, 0, 0],
    ]
)


@pytest.fixture
def decisions() -> pl.DataFrame:
    return read_mllb_csv(RAW)


def test_import_maps_mllb_columns(decisions: pl.DataFrame) -> None:
    assert decisions.height == 5
    assert decisions["collection_id"].unique().to_list() == ["mllb-mllb_raw"]
    assert decisions["variant"].unique().to_list() == ["mllb"]
    # ts is bpf_ktime_get_ns(): microseconds here
    assert decisions["ts_uptime_us"].to_list() == [1000000, 1000250, 1000500, 1000750, 1001000]
    assert decisions["delta_ns"].to_list() == [1200000, 100000, 50000, 50000, 400000]
    assert decisions["nr_balance_failed"].to_list() == [0, 3, 0, 0, 1]
    assert decisions["can_migrate"].to_list() == [1, 1, 0, 0, 0]


def test_filter_drops_running_and_constrained(decisions: pl.DataFrame) -> None:
    kept = mllb_filter(decisions)
    assert kept["pid"].to_list() == [100, 101, 104]


def test_float_features_by_hand(decisions: pl.DataFrame) -> None:
    x = float_features(mllb_filter(decisions))
    assert x.shape == (3, len(FEATURES))
    np.testing.assert_allclose(x, FLOAT, rtol=0, atol=1e-12)


def test_fixed_features_by_hand(decisions: pl.DataFrame) -> None:
    xq = fixed_features(mllb_filter(decisions))
    assert xq.dtype == np.int64
    np.testing.assert_array_equal(xq, FIXED)


def test_kernel_rule_matches_the_dumped_answers(decisions: pl.DataFrame) -> None:
    kept = mllb_filter(decisions)
    assert rule_decision(float_features(kept)).tolist() == kept["can_migrate"].to_list()
    assert rule_decision(fixed_features(kept)).tolist() == [1, 1, 0]


def test_migration_cost_moves_delta_hot(decisions: pl.DataFrame) -> None:
    kept = mllb_filter(decisions)
    # 0.4 ms is cold when the cost is 0.3 ms
    assert float_features(kept, migration_cost_ns=300_000)[:, 1].tolist() == [0, 1, 0]


def test_missing_feature_inputs_are_named() -> None:
    frame = read_mllb_csv(RAW).with_columns(pl.lit(None, pl.Int64).alias("buddy_hot"))
    with pytest.raises(FeatureError, match="buddy_hot"):
        float_features(frame)


def test_preprocessed_file_is_refused(tmp_path: Path) -> None:
    post = tmp_path / "post_ng.csv"
    post.write_text(",".join([*FEATURES, "can_migrate"]) + "\n" + ",".join(["0"] * 16) + "\n")
    with pytest.raises(MllbFormatError, match="preprocessed"):
        read_mllb_csv(post)


def test_not_a_dump_names_missing_columns(tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("ts,pid\n1,2\n")
    with pytest.raises(MllbFormatError, match="no column src_len"):
        read_mllb_csv(bad)


def test_kernel_migration_cost_from_debugfs_or_sysctl(tmp_path: Path) -> None:
    from kernmlops.lb.features import kernel_migration_cost_ns

    debugfs, sysctl = tmp_path / "migration_cost_ns", tmp_path / "sched_migration_cost_ns"
    assert kernel_migration_cost_ns((debugfs, sysctl)) is None  # neither readable
    sysctl.write_text("500000\n")
    assert kernel_migration_cost_ns((debugfs, sysctl)) == 500_000
    debugfs.write_text("10000000\n")  # the newer place wins
    assert kernel_migration_cost_ns((debugfs, sysctl)) == 10_000_000
    debugfs.write_text("garbage\n")
    assert kernel_migration_cost_ns((debugfs, sysctl)) == 500_000
