"""Shadow mode's summary without a kernel: which decisions each figure covers."""

from __future__ import annotations

import polars as pl
import pytest

from kernmlops.lb.dataset import synthetic_decisions
from kernmlops.lb.shadow import summarize


def _kprobe_rows() -> pl.DataFrame:
    """20 decisions with a model beside them: 5 of a running task (out of MLLB's
    filter), one of which took 2.45 ms (the lab's emulation)."""
    d = synthetic_decisions(20, "k", seed=3)
    ns = [1000 + 100 * i for i in range(20)]
    ns[2] = 2_450_000
    running = [1 if i % 4 == 2 else 0 for i in range(20)]
    return d.with_columns(
        pl.Series("p_running", running, pl.Int8),
        pl.Series("infer_ns", ns, pl.UInt32),
        pl.col("can_migrate").alias("model_pred"),
    )


def test_kprobe_inference_figures_are_of_the_filtered_decisions() -> None:
    rows = _kprobe_rows()
    s = summarize(rows, {"decisions": 20, "filtered": 15, "agreement": 1.0}, "kprobe")
    ns = s["inference_ns"]
    kept = sorted(rows.filter(pl.col("p_running") == 0)["infer_ns"].to_list())
    assert len(kept) == 15 and 2_450_000 not in kept  # the outlier was a running task's
    assert ns["population"] == "decisions after MLLB's filter" and ns["decisions"] == 15
    # the smallest value with at least q of the rows at or below it
    assert (ns["p50"], ns["p99"], ns["max"]) == (kept[7], kept[14], kept[14])
    assert ns["mean"] == pytest.approx(sum(kept) / 15)
    assert s["rows"]["filtered"] == 15 and s["rows"]["accuracy"] == 1.0


def test_the_printed_inference_line_names_its_population(capsys) -> None:
    from kernmlops.lb import cli

    rows = _kprobe_rows()
    s = summarize(rows, {"decisions": 20, "filtered": 15, "agreement": 1.0}, "kprobe")
    cli._print_shadow("kprobe", s)
    err = capsys.readouterr().err
    assert (
        "  inference (features + MLP) over the 15 decisions after MLLB's filter: "
        "p50 1900 ns, p99 2900 ns, mean 1933 ns, max 2900 ns\n"
    ) in err, err
    assert "inference mean" not in err


def _pulls(rows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    return pl.DataFrame(
        rows, schema=["ts_uptime_us", "pid", "src_cpu", "dst_cpu"], orient="row"
    ).with_columns(pl.lit(1, pl.Int8).alias("can_migrate"))


def test_tracepoint_figures_cover_the_pulls_of_the_data_set() -> None:
    # the shadow program saw a pull before the scheduler tables' hooks were
    # attached (pid 9) and one after (pid 8); the data set holds the 3 others,
    # each with the answer the program gave on its inputs, and one (pid 4) the
    # program has no row for
    shadow = _pulls(
        [(100, 9, 0, 1), (1003, 1, 0, 1), (1004, 2, 0, 1), (2001, 1, 1, 0), (9000, 8, 0, 1)]
    ).with_columns(
        pl.Series("model_pred", [1, 0, 1, 1, 0], pl.Int8),
        pl.Series("infer_ns", [50_000, 300, 400, 500, 60_000], pl.UInt32),
    )
    data = pl.concat(
        [
            _pulls([(1005, 1, 0, 1), (1006, 2, 0, 1), (2002, 1, 1, 0), (3000, 4, 1, 0)]),
            # a negative: not a pull, no answer of the program's
            _pulls([(1005, 3, 0, 1)]).with_columns(pl.lit(0, pl.Int8).alias("can_migrate")),
        ]
    ).with_columns(
        pl.Series("model_pred", [0, 1, 1, None, None], pl.Int8),
        pl.Series("infer_ns", [300, 400, 500, None, None], pl.Int64),
    )
    s = summarize(shadow, {"decisions": 5, "agreement": 0.6}, "tracepoint", data)
    assert s["rows"] == {
        "population": "pulls of the data set", "data_set_pulls": 4, "pulls": 3,
        "model_migrates": 2, "agreement": pytest.approx(2 / 3), "outside_data_set": 2,
    }  # fmt: skip
    assert s["inference_ns"]["max"] == 500 and s["inference_ns"]["decisions"] == 3


def test_without_the_programs_answers_no_pull_counts_as_evaluated() -> None:
    """A data set without model columns (the program had no row for any pull):
    nothing evaluated, nothing agreed, and every shadow row outside it."""
    shadow = _pulls([(1003, 1, 0, 1)]).with_columns(pl.lit(1, pl.Int8).alias("model_pred"))
    s = summarize(shadow, None, "tracepoint", _pulls([(1005, 1, 0, 1)]))
    assert (s["rows"]["pulls"], s["rows"]["agreement"], s["rows"]["outside_data_set"]) == (
        0, None, 1,
    )  # fmt: skip
