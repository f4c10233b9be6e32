"""The model in this kernel: BPF's arithmetic against Python's, and the
tracepoint variant end to end (collection, data set, shadow mode)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.data import read_collection
from kernmlops.lb.dataset import synthetic_decisions
from kernmlops.lb.features import fixed_features, float_features
from kernmlops.lb.fixed import FixedModel
from kernmlops.lb.model import TrainConfig, train
from tests.conftest import needs_tools

pytestmark = pytest.mark.bpf
LB = [sys.executable, "-m", "kernmlops.lb"]


@pytest.fixture(scope="module")
def model():
    data = synthetic_decisions(3000, "train", seed=31)
    return train(float_features(data), data["can_migrate"].to_numpy(), TrainConfig(epochs=15))


def test_bpf_model_is_bit_exact(model) -> None:
    from kernmlops.lb.shadow import run_in_kernel

    fixed = FixedModel.from_model(model)
    rows = synthetic_decisions(400, "t", seed=32)
    run = run_in_kernel(fixed, rows, repeat=2000)
    np.testing.assert_array_equal(run.outputs, fixed.output(fixed_features(rows)))
    assert (run.eval_ns > 0).all()
    assert 0 < run.run_ns_per_call < 100_000


def _tp_inputs(shadow: pl.DataFrame) -> pl.DataFrame:
    """lb_tp_shadow rows as decisions, filled as the BPF program fills them."""
    return shadow.with_columns(
        (pl.col("dst_faults").cast(pl.Int64) - pl.col("src_faults").cast(pl.Int64)).alias(
            "delta_faults"
        ),
        (pl.col("src_nid") == pl.col("dst_nid")).cast(pl.Int8).alias("same_node"),
        (pl.col("numa_preferred_nid") == pl.col("src_nid")).cast(pl.Int8).alias("prefer_src"),
        (pl.col("numa_preferred_nid") == pl.col("dst_nid")).cast(pl.Int8).alias("prefer_dst"),
        pl.lit(0).alias("cpu_idle"),
        (pl.col("dst_len") == 0).cast(pl.Int8).alias("cpu_newly_idle"),
        (pl.col("dst_len") != 0).cast(pl.Int8).alias("cpu_not_idle"),
        pl.lit(0).alias("nr_balance_failed"),
        pl.lit(1).alias("cache_nice_tries"),
        pl.lit(0).alias("buddy_hot"),
    )


@needs_tools("stress-ng")
def test_tracepoint_variant_end_to_end(model, tmp_path: Path) -> None:
    path = model.save(tmp_path / "m.json")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "benchmark:\n  name: stress-ng\n  stress_ng:\n    scenario: oversubscribe\n"
        "    duration_s: 3\n"
    )
    proc = subprocess.run(
        [*LB, "shadow", str(path), "--variant", "tracepoint", "-c", str(cfg), "-o",
         str(tmp_path / "out"), "--no-progress"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = (tmp_path / "out" / "curated" / "benchmark=stress-ng").iterdir()
    c = read_collection(folder)

    # positives are exactly the pulls in the sched_migrate table
    m = c["sched_migrate"]
    pulls = m.filter(
        (pl.col("kind") == "queued")
        & (pl.col("cpu") == pl.col("dest_cpu"))
        & (pl.col("orig_cpu") != pl.col("dest_cpu"))
    )
    d = c["lb_decisions"]
    pos = d.filter(pl.col("can_migrate") == 1)
    assert pulls.height > 0, "stress-ng oversubscribed and no load-balancer pull seen"
    assert sorted(pos["pid"].to_list()) == sorted(pulls["pid"].cast(pl.Int64).to_list())
    assert (pos["src_len"] == pos.join(pulls.select(
        pl.col("pid").cast(pl.Int64), "ts_uptime_us", (pl.col("orig_nr_running") + 1).alias("n")
    ), on=["pid", "ts_uptime_us"])["n"]).all()  # fmt: skip
    # every negative waited on the source CPU at that moment and was not moved
    neg = d.filter(pl.col("can_migrate") == 0)
    assert set(neg["variant"]) <= {"tracepoint"}
    if neg.height:
        waits = c["quanta_queued_time"].with_columns(
            (pl.col("ts_uptime_us") - pl.col("quanta_queued_time_us")).alias("from"),
            pl.col("pid").cast(pl.Int64),
            pl.col("cpu").cast(pl.Int64).alias("src_cpu"),
        )
        j = neg.join(waits.rename({"ts_uptime_us": "until"}), on=["pid", "src_cpu"])
        spans = j.filter(
            (pl.col("from") <= pl.col("ts_uptime_us")) & (pl.col("until") > pl.col("ts_uptime_us"))
        )
        assert spans.select("pid", "ts_uptime_us").unique().height == neg.height

    # shadow: the kernel's model outputs are the exported model's, row by row
    shadow = c["lb_tp_shadow"]
    assert shadow.height > 0
    fixed = FixedModel.from_model(model)
    xq = fixed_features(_tp_inputs(shadow))
    np.testing.assert_array_equal(shadow["model_out"].to_numpy(), fixed.output(xq))
    np.testing.assert_array_equal(shadow["model_pred"].to_numpy(), fixed.predict(xq))
    assert (shadow["infer_ns"] > 0).all()
    lb = c.manifest["lb"]
    kernel = lb["shadow"]["tracepoint"]["kernel"]
    assert c.manifest["hooks"]["lb_tp_shadow"]["drops"] == 0
    assert kernel["decisions"] >= shadow.height  # counted beyond the drained window
    assert lb["tracepoint"]["positives"] == pulls.height
    rows = lb["shadow"]["tracepoint"]["rows"]
    assert rows["model_migrates"] == int((shadow["model_pred"] == 1).sum())
    assert json.dumps(lb)  # the manifest section is plain JSON


def test_kprobe_variant_says_why_it_cannot_run_here(tmp_path: Path) -> None:
    from kernmlops.ebpf.probe import probe_all

    features = probe_all()
    proc = subprocess.run(
        [*LB, "collect", "--variant", "kprobe", "-o", str(tmp_path), "--no-progress", "--",
         "sleep", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if features["fentry"].ok or features["kprobe"].ok:
        assert proc.returncode == 0, proc.stderr[-2000:]
    else:
        assert proc.returncode == 2
        assert "cannot probe can_migrate_task" in proc.stderr
        assert "kernmlops vm" in proc.stderr and "--variant tracepoint" in proc.stderr
        assert not (tmp_path / "curated").exists()  # nothing half-collected
