"""The arithmetic behind the graphs, on small frames whose answers are worked out by hand."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import polars as pl
import pytest

from kernmlops.data import Collection
from kernmlops.graphs.base import (
    Distribution,
    Timeline,
    format_bytes,
    format_duration_us,
    log_bins,
    nice_bin_s,
)
from kernmlops.graphs.context import (
    benchmark_markers,
    load,
    process_names,
    select,
    tgids_named,
)
from kernmlops.graphs.mm_rss_stat import rss_series
from kernmlops.graphs.perf_counters import PerfCountersView, per_sample
from kernmlops.graphs.quanta_runtime import busy_fraction
from kernmlops.graphs.sched_migrate import pair_matrix
from kernmlops.graphs.syscalls import totals
from kernmlops.stats import quantile
from tests.graphs.conftest import (
    BENCH_PID,
    BENCH_START,
    BENCH_STOP,
    BOOT_UNIX,
    KWORKER,
    T0,
    WORKER,
    synthetic_tables,
)

MIB = 1 << 20
STATIC = {"system_info", "benchmark_result"}


def test_busy_fraction_splits_each_quantum_over_the_bins_it_ran_in() -> None:
    origin = 1_000_000
    frame = pl.DataFrame(
        {
            # CPU 0 ran [0, 50) ms and [75, 80) ms; CPU 1 ran [15, 35) ms.
            "ts_uptime_us": [origin + 50_000, origin + 80_000, origin + 35_000],
            "quanta_run_length_us": [50_000, 5_000, 20_000],
            "cpu": [0, 0, 1],
        }
    )
    cpus, busy = busy_fraction(frame, origin, Timeline(start=0.0, width=0.01, nbins=10))
    assert cpus.tolist() == [0, 1]
    np.testing.assert_allclose(busy[0], [1, 1, 1, 1, 1, 0, 0, 0.5, 0, 0])
    np.testing.assert_allclose(busy[1], [0, 0.5, 1, 0.5, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_quantiles_from_value_counts_are_those_of_the_rows(seed: int) -> None:
    """The smallest value with at least q of the rows at or below it, ties and all:
    counted by brute force, and numpy's inverted_cdf where q n is exact in floating
    point."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, rng.integers(2, 50), rng.integers(1, 400)).astype(np.uint64)
    dist = Distribution.of(pl.DataFrame({"v": values}), "v")
    assert dist.size == values.size and dist.max() == values.max()
    assert dist.mean() == pytest.approx(values.mean())
    for q in [0, 0.01, 0.25, 0.5, 0.5 + 1e-9, 0.75, 0.9, 0.99, 1, *rng.random(20)]:
        at_most = (values[None, :] <= np.unique(values)[:, None]).sum(axis=1)
        need = Fraction(str(q)) * values.size
        expected = np.unique(values)[np.flatnonzero(at_most >= need)[0]]
        assert dist.quantile(q) == expected == quantile(values, q), q
        if q in (0.25, 0.5, 0.75, 0.99):
            assert dist.quantile(q) == np.quantile(values, q, method="inverted_cdf"), q


def test_log_bins_are_whole_numbers_that_cover_the_values() -> None:
    edges = log_bins(np.array([0, 1, 7, 12_345]))
    assert edges[0] == 1 and edges[-1] >= 12_345
    assert np.all(np.diff(edges) > 0) and np.all(edges == np.floor(edges))
    # every bin holds at least one whole µs value: no bin is empty by construction
    counts, _ = np.histogram(np.arange(1, int(edges[-1])), bins=edges)
    assert counts.min() >= 1
    assert edges[:4].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(
    ("span", "width"), [(2.0, 0.02), (3600.0, 50.0), (0.0, 0.001), (15.0, 0.1)]
)
def test_nice_bin_width(span: float, width: float) -> None:
    assert nice_bin_s(span) == pytest.approx(width)


def test_formatting_with_units() -> None:
    assert format_duration_us(12) == "12 µs"
    assert format_duration_us(3_400) == "3.4 ms"
    assert format_duration_us(1_250_000) == "1.25 s"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(230 * MIB) == "230 MiB"
    assert format_bytes(100) == "100 B"
    assert format_bytes(1023 * MIB) == "1,023 MiB"
    assert format_duration_us(999.7) == "1,000 µs"


def test_timeline_rates() -> None:
    tl = Timeline(start=0.0, width=0.5, nbins=4)
    assert tl.centers.tolist() == [0.25, 0.75, 1.25, 1.75]
    # 3 rows in bin 0 and 1 in bin 2, per 0.5 s
    assert tl.per_second(np.array([0, 0, 0, 2])).tolist() == [6, 0, 2, 0]


# -- markers ----------------------------------------------------------------------------------


def test_markers_come_from_the_benchmark_pid_in_process_trace() -> None:
    trace = synthetic_tables()["process_trace"]
    markers, source, exact = benchmark_markers({"benchmark": {"pid": BENCH_PID}}, trace)
    assert [m.t_us for m in markers] == [BENCH_START, BENCH_STOP]
    assert exact and "process_trace" in (source or "")


def test_markers_from_the_manifest_uptime_fields() -> None:
    manifest = {"benchmark": {"pid": 5, "started_uptime_us": 10, "stopped_uptime_us": 90}}
    markers, source, exact = benchmark_markers(manifest, None)
    assert [m.t_us for m in markers] == [10, 90] and exact
    assert "manifest" in (source or "")


def test_markers_from_wall_clock_are_marked_approximate() -> None:
    manifest = {
        "benchmark": {"pid": 5},
        # 5 s and 8 s after the boot (1700000000 is 2023-11-14T22:13:20Z)
        "started_at": "2023-11-14T22:13:25+00:00",
        "stopped_at": "2023-11-14T22:13:28+00:00",
        "attach_s": 0.25,
        "system": {"boot_time_unix": BOOT_UNIX},
    }
    markers, source, exact = benchmark_markers(manifest, None)
    assert [m.t_us for m in markers] == [5_250_000, 8_000_000]
    assert not exact and all(m.label.startswith("≈") for m in markers)
    assert "wall clock" in (source or "")


def test_no_markers_without_a_benchmark_process() -> None:
    manifest = {"benchmark": {"pid": None}, "system": {"boot_time_unix": BOOT_UNIX}}
    assert benchmark_markers(manifest, None) == ([], None, False)


def test_time_origin_is_the_benchmark_start(synthetic: Collection) -> None:
    data = load(synthetic)
    assert data.origin_us == BENCH_START and data.origin_label == "benchmark start"
    assert data.span_us == (T0, T0 + 2_000_000)


# -- names and selection ------------------------------------------------------------------------


def test_process_names_follow_exec() -> None:
    tables = synthetic_tables()
    names = process_names(tables)
    assert names[BENCH_PID] == "bench"
    assert names[WORKER] == "worker"  # forked as "bench", then exec'd
    assert names[KWORKER] == "kworker/0:1"
    assert tgids_named(tables, "bench") == {BENCH_PID}
    assert tgids_named(tables, "worker") == {WORKER}
    assert tgids_named(tables, "nothing") == set()


def test_select_keeps_the_process_and_leaves_system_tables_whole() -> None:
    tables = synthetic_tables()
    out, wide, kept = select(tables, {WORKER})
    assert set(out["quanta_runtime"]["tgid"].unique()) == {WORKER}
    assert out["quanta_runtime"].height == 1000  # every other quantum on both CPUs
    # mm_rss_stat is selected by whose memory it is (mm_tgid), not who ran
    assert out["mm_rss_stat"]["mm_tgid"].to_list() == [WORKER] * 4
    assert out["memory_usage"].equals(tables["memory_usage"])
    assert {"memory_usage", "perf_counters"} <= wide
    assert "system_info" not in wide and "quanta_runtime" not in wide
    # rows kept per selected table (benchmark_result, static, neither kept nor wide)
    assert kept == {t: out[t].height for t in out if t not in wide | STATIC}
    assert (
        sum(kept.values()) == sum(out[t].height for t in out if t not in wide | {"system_info"}) - 1
    )


# -- per-table arithmetic ------------------------------------------------------------------------


def test_perf_rates_and_totals_sum_the_cpus() -> None:
    frame = synthetic_tables()["perf_counters"]
    rates = per_sample(frame, cumulative=False)
    # 150 switches per 0.2 s read over both CPUs; each CPU counts 1e9 ns of task-clock per s
    assert rates["context_switches_scaled"].to_list() == pytest.approx([750.0] * 10)
    assert rates["task_clock_ns_scaled"].to_list() == pytest.approx([2e9] * 10)
    cumulative = per_sample(frame, cumulative=True)
    assert cumulative["context_switches_scaled"].to_list()[-1] == pytest.approx(1500)


def test_perf_counts_are_scaled_when_multiplexed() -> None:
    frame = synthetic_tables()["perf_counters"].with_columns(
        context_switches_running_ns=pl.col("context_switches_enabled_ns") // 2
    )
    rates = per_sample(frame, cumulative=False)
    assert rates["context_switches_scaled"].to_list() == pytest.approx([1500.0] * 10)
    summary = dict(PerfCountersView().summary(frame))
    assert summary["context_switches"].startswith("3,000 ")


def test_perf_rates_of_counters_past_32_bits_of_nanoseconds() -> None:
    # The same reads, 3.1 s into the counters' lives (count * enabled > 2**63): the
    # rates and totals are those of the table's own differences, not a wrapped product.
    frame = synthetic_tables()["perf_counters"]
    late = frame.with_columns(
        pl.col(c).cast(pl.Int64) + 3_100_000_000  # as the hook writes them: Int64
        for c in frame.columns
        if c.startswith("task_clock") or c.startswith("context_switches_")
    )
    assert late["task_clock_ns"].max() * late["task_clock_enabled_ns"].max() > 2**63
    # 1e9 ns of task-clock per s on each of the 2 CPUs: 2 CPU-s/s
    assert per_sample(late, cumulative=False)["task_clock_ns_scaled"].to_list() == pytest.approx(
        [2e9] * 10
    )
    total = per_sample(late, cumulative=True)["task_clock_ns_scaled"].to_list()[-1]
    by_cpu = late.group_by("cpu").agg(pl.col("task_clock_ns").max() - pl.col("task_clock_ns").min())
    assert total == by_cpu["task_clock_ns"].sum() == 4_000_000_000
    summary = dict(PerfCountersView().summary(late))
    assert summary["task_clock_ns"] == "4.000 s (2.00 CPU-s/s)"


def test_rss_sums_the_members_carried_forward() -> None:
    rss = rss_series(synthetic_tables()["mm_rss_stat"])
    worker = rss.filter(pl.col("mm_tgid") == WORKER)["rss_bytes"].to_list()
    assert worker == [100 * MIB, 150 * MIB, 350 * MIB, 50 * MIB]
    assert rss.filter(pl.col("mm_tgid") == BENCH_PID)["rss_bytes"].to_list() == [MIB]


def test_migrations_pair_matrix() -> None:
    matrix = pair_matrix(synthetic_tables()["sched_migrate"], 2)
    assert matrix.tolist() == [[0, 3], [2, 0]]


def test_syscall_totals_sum_the_intervals() -> None:
    per = totals(synthetic_tables()["syscalls"])
    assert per["syscall"].to_list() == ["read", "write", "openat"]
    assert per["count"].to_list() == [32, 7, 5]
    assert per.filter(pl.col("syscall") == "read")["total_latency_ns"].item() == 2_030_000
