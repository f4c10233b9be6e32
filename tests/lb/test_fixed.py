"""Q20.11 fixed point: against the float model on every test row, and the
exported C header compiled with gcc, stand-alone and as MLLB's patch uses it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.lb.dataset import synthetic_decisions
from kernmlops.lb.features import fixed_features, float_features
from kernmlops.lb.fixed import FixedModel, agreement, c_header, error_bound, fixed_json, quantize
from kernmlops.lb.model import TrainConfig, train
from tests.conftest import needs_tools


@pytest.fixture(scope="module")
def model():
    data = synthetic_decisions(4000, "train", seed=21)
    return train(float_features(data), data["can_migrate"].to_numpy(), TrainConfig(epochs=20))


@pytest.fixture(scope="module")
def test_rows() -> pl.DataFrame:
    return synthetic_decisions(3000, "test", seed=22)


def test_quantize_rounds_half_away_from_zero() -> None:
    got = quantize(np.array([0.5 / 2048, -0.5 / 2048, 1.0, -1.25, 0.1]))
    assert got.tolist() == [1, -1, 2048, -2560, 205]
    with pytest.raises(ValueError, match=r"Q20\.11"):
        quantize(np.array([2.0**21]))


def test_fixed_matches_float_on_every_row(model, test_rows: pl.DataFrame) -> None:
    fixed = FixedModel.from_model(model)
    x, xq = float_features(test_rows), fixed_features(test_rows)
    diff = np.abs(fixed.output(xq) / 2048 - model.logits(x))
    bound = error_bound(model, fixed, x, xq)
    # the stated tolerance: the per-row bound of fixed.error_bound, never exceeded
    assert (diff <= bound).all()
    assert bound.max() < 0.5  # and it is tight enough to mean something
    a = agreement(model, fixed, x, xq)
    assert a["within_bound"] and a["rows"] == 3000
    assert a["agreement"] >= 0.999
    assert a["max_abs_sum"] < 2**31  # MLLB's int32 sums give the same numbers


def _compile(tmp: Path, name: str, source: str) -> Path:
    (tmp / f"{name}.c").write_text(source)
    exe = tmp / name
    subprocess.run(
        ["gcc", "-std=c99", "-O2", "-Wall", "-Werror", "-I", str(tmp), "-o", str(exe),
         str(tmp / f"{name}.c")],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return exe


def _run(exe: Path, xq: np.ndarray) -> np.ndarray:
    text = "\n".join(" ".join(str(int(v)) for v in row) for row in xq) + "\n"
    out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True)
    return np.array([[int(v) for v in line.split()] for line in out.stdout.splitlines()])


# Reads 15 integers per line; prints the prediction and the Q20.11 logit.
STANDALONE = """
#include <stdio.h>
#include "model.h"
int main(void)
{
    kmo_lb_q11_t x[KMO_LB_NR_FEAT];
    for (;;) {
        for (int k = 0; k < KMO_LB_NR_FEAT; k++)
            if (scanf("%d", &x[k]) != 1)
                return 0;
        printf("%d %lld\\n", kmo_lb_predict_q11(x), (long long)kmo_lb_output_q11(x));
    }
}
"""

# The arithmetic of MLLB's patch with CONFIG_JC_SCHED_FXDPT, restated: int32
# values, each product widened and shifted, int32 sums, migrate when
# output > 0.5. The header must define its w1, b1, w2, b2 arrays.
MLLB = """
#include <stdio.h>
#include <stdint.h>
typedef int32_t fxdpt_t;
typedef int64_t fxdpt_ext;
#define FXDPT_FBITS 11
#define FXDPT_ONE ((fxdpt_t)1 << FXDPT_FBITS)
#define dtype fxdpt_t
#define ftod(F) ((fxdpt_t)((F) * FXDPT_ONE + ((F) >= 0 ? 0.5 : -0.5)))
#define mul(A, B) ((fxdpt_t)(((fxdpt_ext)(A) * (fxdpt_ext)(B)) >> FXDPT_FBITS))
#include "model.h"
int main(void)
{
    fxdpt_t x[15];
    for (;;) {
        fxdpt_t out = 0;
        for (int k = 0; k < 15; k++)
            if (scanf("%d", &x[k]) != 1)
                return 0;
        for (int j = 0; j < 10; j++) {
            fxdpt_t h = 0;
            for (int k = 0; k < 15; k++)
                h += mul(x[k], w1[k * 10 + j]);
            h += b1[j];
            h = h > 0 ? h : 0;
            out += mul(h, w2[j]);
        }
        out += b2[0];
        printf("%d %d\\n", out > ftod(0.5) ? 1 : 0, out);
    }
}
"""


@needs_tools("gcc")
def test_header_compiles_and_predicts_like_python(model, test_rows, tmp_path: Path) -> None:
    fixed = FixedModel.from_model(model)
    (tmp_path / "model.h").write_text(c_header(fixed, {"migration_cost_ns": 500000}))
    xq = fixed_features(test_rows)
    got = _run(_compile(tmp_path, "standalone", STANDALONE), xq)
    np.testing.assert_array_equal(got[:, 1], fixed.output(xq))
    np.testing.assert_array_equal(got[:, 0], fixed.predict(xq))
    # and nearly always what the float model says
    assert (got[:, 0] == model.predict(float_features(test_rows))).mean() >= 0.999


@needs_tools("gcc")
def test_header_is_a_drop_in_for_mllbs_patch(model, test_rows, tmp_path: Path) -> None:
    fixed = FixedModel.from_model(model)
    (tmp_path / "model.h").write_text(c_header(fixed, {}))
    xq = fixed_features(test_rows)
    got = _run(_compile(tmp_path, "mllb", MLLB), xq)
    np.testing.assert_array_equal(got[:, 0], fixed.predict(xq))
    # the patch's b2 is ours + 0.5 (its threshold): outputs differ by exactly 1024
    np.testing.assert_array_equal(got[:, 1], fixed.output(xq) + 1024)


def test_fixed_json_round_trip(model, tmp_path: Path) -> None:
    from kernmlops.lb.fixed import load_fixed_json

    fixed = FixedModel.from_model(model)
    path = tmp_path / "m.q11.json"
    path.write_text(json.dumps(fixed_json(fixed, {"note": "x"})))
    back, meta = load_fixed_json(path)
    np.testing.assert_array_equal(back.w1, fixed.w1)
    assert back.b2 == fixed.b2 and meta == {"note": "x"}


# MLLB's patch with CONFIG_JC_SCHED_FXDPT, restated: should_migrate_task's
# jc_lb_data from the raw inputs (fair.c), then jc_mlp_main's Q20.11 features
# with its macros: int_to_fxdpt (an int32 product), fxdpt_div ((int64)a * 2048 / b,
# C's truncation), src_len - 2, loads / 1000, delta_faults / total_faults (total 0:
# delta_faults itself). Reads the raw inputs of one decision a line.
MLLB_FEATURES = """
#include <stdio.h>
#include <stdint.h>
typedef int32_t fxdpt_t;
typedef int64_t fxdpt_ext;
#define FXDPT_ONE ((fxdpt_t)((fxdpt_t)1 << 11))
#define itodtype(F) ((fxdpt_t)((F) * FXDPT_ONE))
#define dtype_div(A, B) ((fxdpt_t)(((fxdpt_ext)(A) * FXDPT_ONE) / (B)))
int main(void)
{
    unsigned src_len, pref_len, dst_len, fails, tries;
    unsigned long src_load, dst_load, total;
    long long delta, cost;
    long delta_faults;
    int idle, not_idle, newly, same, psrc, pdst, buddy;
    while (scanf("%u %u %lld %lld %lu %lu %ld %lu %u %u %u %d %d %d %d %d %d %d",
                 &src_len, &pref_len, &delta, &cost, &src_load, &dst_load, &delta_faults,
                 &total, &dst_len, &fails, &tries, &idle, &not_idle, &newly, &same, &psrc,
                 &pdst, &buddy) == 18) {
        fxdpt_t x[15] = {
            itodtype(src_len > pref_len), itodtype(delta < cost), itodtype(idle),
            itodtype(not_idle), itodtype(newly), itodtype(same), itodtype(psrc),
            itodtype(pdst), itodtype((int)src_len) - itodtype(2),
            dtype_div(itodtype(src_load), itodtype(1000)),
            dtype_div(itodtype(dst_load), itodtype(1000)), itodtype((int)dst_len),
            total ? dtype_div(itodtype(delta_faults), itodtype(total)) : itodtype(delta_faults),
            itodtype(fails > tries), itodtype(buddy),
        };
        for (int k = 0; k < 15; k++)
            printf("%d ", x[k]);
        printf("\\n");
    }
    return 0;
}
"""

#: the raw inputs in MLLB_FEATURES' order
MLLB_INPUTS = (
    "src_len", "src_preferred_len", "delta_ns", "cost", "src_load", "dst_load",
    "delta_faults", "total_faults", "dst_len", "nr_balance_failed", "cache_nice_tries",
    "cpu_idle", "cpu_not_idle", "cpu_newly_idle", "same_node", "prefer_src", "prefer_dst",
    "buddy_hot",
)  # fmt: skip


@needs_tools("gcc")
def test_fixed_features_are_mllbs_patch_features(tmp_path: Path) -> None:
    """Every feature, bit for bit, as MLLB's fixed-point patch computes it, over
    the range where its int32 inputs do not wrap (|v| < 2^20): loads and fault
    ratios at the truncation edges, negative fault deltas (truncated toward
    zero, not floored), no faults, empty and long queues, delta at the cost."""
    rng = np.random.default_rng(7)
    n, cost = 5000, 500_000
    edges = np.array([0, 1, 999, 1000, 1001, 1023, 1024, 2047, 123_456, (1 << 20) - 1])
    total = rng.choice([0, 1, 2, 3, 7, 1000, 123_457, (1 << 20) - 1], n)
    idle = rng.integers(0, 3, n)

    def load() -> np.ndarray:  # half at the edges, half anywhere below 2^20
        return np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.integers(0, 1 << 20, n))

    cols = {
        "src_len": rng.integers(0, 300, n),
        "src_preferred_len": rng.integers(0, 300, n),
        "delta_ns": rng.choice([-5, 0, cost - 1, cost, cost + 1, 10**9, 3 * 10**12], n),
        "cost": np.full(n, cost),
        "src_load": load(),
        "dst_load": load(),
        "delta_faults": np.round(rng.uniform(-1, 1, n) * np.maximum(total, 5)).astype(np.int64),
        "total_faults": total,
        "dst_len": rng.integers(0, 300, n),
        "nr_balance_failed": rng.integers(0, 6, n),
        "cache_nice_tries": rng.integers(0, 3, n),
        "cpu_idle": (idle == 1).astype(np.int64),
        "cpu_not_idle": (idle == 0).astype(np.int64),
        "cpu_newly_idle": (idle == 2).astype(np.int64),
        **{k: rng.integers(0, 2, n) for k in ("same_node", "prefer_src", "prefer_dst")},
        "buddy_hot": rng.integers(0, 2, n),
    }  # fmt: skip
    raw = np.column_stack([cols[k] for k in MLLB_INPUTS])
    frame = pl.DataFrame({k: v for k, v in cols.items() if k != "cost"})
    ours = fixed_features(frame, migration_cost_ns=cost)
    got = _run(_compile(tmp_path, "mllb_features", MLLB_FEATURES), raw)
    assert got.shape == ours.shape == (n, 15)
    np.testing.assert_array_equal(ours, got)
    # the cases that tell truncation from flooring were there
    assert (
        (cols["delta_faults"] < 0) & (cols["delta_faults"] * 2048 % np.maximum(total, 1) != 0)
    ).any()


def test_max_abs_sum_counts_mllbs_output_with_its_threshold() -> None:
    """MLLB's patch ends with b2 + 0.5 (our b2 + 1024) in an int32: an output
    within 1024 of 2^31 fits ours but wraps there, and turns "migrate" into
    "stay". max_abs_sum must say it does not fit."""
    b2 = (1 << 31) - 1 - 500
    fixed = FixedModel(
        w1=np.zeros((15, 10), dtype=np.int64), b1=np.zeros(10, dtype=np.int64),
        w2=np.zeros(10, dtype=np.int64), b2=b2,
    )  # fmt: skip
    xq = np.zeros((1, 15), dtype=np.int64)
    mllb = (b2 + 1024 + (1 << 31)) % (1 << 32) - (1 << 31)  # its int32 sum, wrapped
    assert mllb < 0 and not mllb > 1024  # MLLB: stay
    assert fixed.predict(xq).tolist() == [1]  # ours: migrate
    assert fixed.max_abs_sum(xq) >= 1 << 31
