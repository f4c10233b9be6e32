"""The model in this kernel: BPF's arithmetic against Python's, and the
tracepoint variant end to end (collection, data set, shadow mode)."""

from __future__ import annotations

import json
import math
import os
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


def _run_oversubscribed(
    top: Path, args: list[str], duration_s: int, env: dict[str, str] | None = None
) -> tuple[Path, str]:
    """``python -m kernmlops.lb ARGS --variant tracepoint`` on stress-ng's oversubscribe
    scenario for ``duration_s``, into ``top``/out: the collection's folder and what the
    command printed on stderr."""
    cfg = top / "c.yaml"
    cfg.write_text(
        "benchmark:\n  name: stress-ng\n  stress_ng:\n    scenario: oversubscribe\n"
        f"    duration_s: {duration_s}\n"
    )
    proc = subprocess.run(
        [*LB, *args, "--variant", "tracepoint", "-c", str(cfg), "-o", str(top / "out"),
         "--no-progress"],
        capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = (top / "out" / "curated" / "benchmark=stress-ng").iterdir()
    return folder, proc.stderr


@needs_tools("stress-ng")
def test_tracepoint_variant_end_to_end(model, tmp_path: Path) -> None:
    path = model.save(tmp_path / "m.json")
    folder, _ = _run_oversubscribed(tmp_path, ["shadow", str(path)], 2)
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
    # the rows' figures are those of the data set's pulls (the program saw more)
    assert rows["model_migrates"] == int((pos["model_pred"] == 1).sum())
    assert json.dumps(lb)  # the manifest section is plain JSON


@needs_tools("stress-ng")
def test_tracepoint_collect_without_a_model_reads_each_pull_once(tmp_path: Path) -> None:
    """lb collect's tracepoint variant runs the lb_tp program without a model too: the
    data set's pulls are its records, as they are under lb shadow."""
    folder, _ = _run_oversubscribed(tmp_path, ["collect"], 2)
    c = read_collection(folder)
    pos = c["lb_decisions"].filter(pl.col("can_migrate") == 1)
    assert pos.height > 0, "stress-ng oversubscribed and no load-balancer pull seen"
    assert (pos["model_pred"] == -1).all()  # observed by the program, no model
    pairs = _program_rows(c["lb_tp_shadow"], pos)
    assert pairs.height == pos.height
    for col in ("src_len", "dst_len", "src_load", "dst_load"):
        assert (pairs[col] == pairs[f"{col}_tp"]).all(), (col, pairs)
    assert (pairs["kernel_delta_ns"] == pairs["delta_ns_tp"]).all(), pairs
    assert c.manifest["lb"]["shadow"] is None and c.manifest["lb"]["model"] is None


def _feature0_model() -> dict:
    """A Q20.11 model file whose output turns on MLLB's feature 0 (src_non_pref_nr:
    +1.46 on every hidden unit) and on feature 1 (delta_hot: +1.22), and moves with
    every other feature: any input of a row that differs from the one the kernel
    evaluated changes the logit."""
    from kernmlops.lb.fixed import fixed_json

    rng = np.random.default_rng(5)
    w1 = rng.integers(-1500, 1500, (15, 10))
    w1[0], w1[1] = 3000, 2500
    fixed = FixedModel(w1=w1, b1=rng.integers(0, 1000, 10), w2=rng.integers(-3000, 3000, 10),
                       b2=int(rng.integers(-500, 500)))  # fmt: skip
    return fixed_json(fixed, {})


@pytest.fixture(scope="module")
def tp_shadow(tmp_path_factory) -> tuple[Path, dict, str]:
    """One lb shadow --variant tracepoint run of an oversubscribed stress-ng:
    its collection folder, the model file's document, and what it printed."""
    top = tmp_path_factory.mktemp("tp-shadow")
    doc = _feature0_model()
    model = top / "m.q11.json"
    model.write_text(json.dumps(doc))
    folder, printed = _run_oversubscribed(top, ["shadow", str(model)], 2, {"COLUMNS": "400"})
    return folder, doc, printed


def _program_rows(shadow: pl.DataFrame, pos: pl.DataFrame) -> pl.DataFrame:
    """Each data set pull beside the lb_tp program's record of the same event: the
    same task and its migration count (both read se.nr_migrations on that call),
    checked against the CPUs and the time (the programs run µs apart)."""
    key = ["pid", "nr_migrations"]
    s = shadow.with_columns(pl.col(c).cast(pl.Int64) for c in [*key, "ts_uptime_us"])
    j = pos.with_columns(pl.col(c).cast(pl.Int64) for c in key).join(s, on=key, suffix="_tp")
    assert (j["src_cpu"] == j["src_cpu_tp"]).all() and (j["dst_cpu"] == j["dst_cpu_tp"]).all()
    assert ((j["ts_uptime_us"] - j["ts_uptime_us_tp"]).abs() <= 1000).all()
    return j


@needs_tools("stress-ng")
def test_tracepoint_shadow_computes_what_the_data_set_holds(tp_shadow) -> None:
    from kernmlops.lb.dataset import impute_missing
    from tests.lb import q11

    folder, doc, _ = tp_shadow
    c = read_collection(folder)
    cost = c.manifest["lb"]["migration_cost_ns"]
    assert len(set(c.manifest["lb"]["cpu_node"])) == 1, "this test wants a one-node machine"
    data = impute_missing(c["lb_decisions"])  # the data set as a model reads it
    pos = data.filter(pl.col("can_migrate") == 1)
    assert pos.height > 0
    # Every pull's row is the observation the kernel's model was given: its logit
    # is the Q20.11 evaluation of the row's own inputs, for every pull (one read of
    # the unlocked destination queue; two reads disagreed on ~1 pull in 300)
    # (with the kernel's delta the program read: the data set's delta_ns is measured
    # as the negatives' is, from quanta_runtime)
    for row in pos.iter_rows(named=True):
        given = {**row, "delta_ns": row["kernel_delta_ns"]}
        want = q11.logit(q11.features(given, cost), doc["w1"], doc["b1"], doc["w2"], doc["b2"])
        assert row["model_out"] == want, row
        assert row["model_pred"] == (want > 0), row
    # ... and that logit is the program's own record of the pull, made from the
    # queues it read there
    pairs = _program_rows(c["lb_tp_shadow"], pos)
    assert pairs.height == pos.height
    for col in ("model_out", "src_len", "dst_len", "src_load", "dst_load"):
        assert (pairs[col] == pairs[f"{col}_tp"]).all(), (col, pairs)
    assert (pairs["kernel_delta_ns"] == pairs["delta_ns_tp"]).all(), pairs
    # the kernel's own input on one node, which the data set holds too
    assert (pairs["src_preferred_len"] == 0).all() and (pairs["src_preferred_len_tp"] == 0).all()


@needs_tools("stress-ng")
def test_tracepoint_shadow_figures_cover_the_data_sets_pulls(tp_shadow) -> None:
    folder, _, printed = tp_shadow
    c = read_collection(folder)
    pos = c["lb_decisions"].filter(pl.col("can_migrate") == 1)
    shadow = c["lb_tp_shadow"]
    summary = c.manifest["lb"]["shadow"]["tracepoint"]
    rows = summary["rows"]
    assert rows["data_set_pulls"] == pos.height
    pairs = _program_rows(shadow, pos)
    # the shadow program is attached before the scheduler tables' hooks and detached
    # after them: it sees every pull of the data set, and maybe more
    assert rows["pulls"] == pairs.height == pos.height
    assert rows["outside_data_set"] == shadow.height - pos.height
    assert c.manifest["lb"]["tracepoint"]["positives_observed"] == pos.height
    migrate = int((pairs["model_pred"] == 1).sum())
    assert rows["model_migrates"] == migrate
    assert rows["agreement"] == pytest.approx(migrate / pos.height)
    ns = summary["inference_ns"]
    # one population for every figure: the data set's pulls
    times = sorted(pairs["infer_ns"].to_list())
    rank = lambda q: times[max(math.ceil(q * len(times)) - 1, 0)]  # noqa: E731
    assert ns["population"] == "pulls of the data set" and ns["decisions"] == pos.height
    assert (ns["p50"], ns["p99"], ns["max"]) == (rank(0.5), rank(0.99), times[-1])
    assert ns["mean"] == pytest.approx(sum(times) / len(times))
    assert (
        f"; on the {pos.height:,} pulls of the data set: {pos.height:,} evaluated, "
        f"{migrate:,} migrate, agreement {100 * migrate / pos.height:.2f}% "
        f"({shadow.height - pos.height:,} pulls outside it)\n"
    ) in printed
    assert (
        f"  inference (features + MLP) over the {pos.height:,} pulls of the data set: "
        f"p50 {rank(0.5):.0f} ns, p99 {rank(0.99):.0f} ns, mean {ns['mean']:.0f} ns, "
        f"max {times[-1]:.0f} ns\n"
    ) in printed
    # lb report's shadow column is the same population's
    from kernmlops.lb.report import build_report

    (col,) = build_report([folder])["collections"]
    assert col["shadow_agreement"] == pytest.approx(migrate / pos.height)


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
