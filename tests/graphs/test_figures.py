"""What each figure shows, drawn from a scanned collection, against the same numbers
computed here with numpy from the rows read into memory (as the graphs computed them
before they scanned): counts per bin, quantiles, busy shares, CDFs, RSS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kernmlops.data import Collection, read_collection
from kernmlops.graphs import SelectionError, figure, load
from kernmlops.graphs._report import table_summary
from kernmlops.graphs.base import (
    US_PER_S,
    GraphData,
    TableView,
    Timeline,
    bytes_unit,
    format_duration_us,
    log_bins,
    unit_formatter,
)
from kernmlops.graphs.context import table_view
from kernmlops.graphs.mm_rss_stat import TOP_PROCESSES, rss_series
from tests.graphs.conftest import (
    BENCH_PID,
    BENCH_START,
    WORKER,
    _ts,
    synthetic_tables,
    write_collection,
)

CPUS = 4


def _quanta(rng: np.random.Generator, per_cpu: int) -> pl.DataFrame:
    """Quanta of random lengths with random gaps on each CPU (none overlap)."""
    frames = []
    for cpu in range(CPUS):
        lengths = np.maximum(rng.lognormal(6, 1.5, per_cpu).astype(np.int64), 0)
        gaps = rng.integers(0, 3000, per_cpu)
        ends = 5_000_000_000 + np.cumsum(lengths + gaps)
        frames.append(
            pl.DataFrame(
                {
                    "ts_uptime_us": ends.astype(np.uint64),
                    "quanta_run_length_us": lengths.astype(np.uint64),
                    "cpu": np.full(per_cpu, cpu, np.uint32),
                    "pid": rng.choice(np.array([WORKER, 7], np.uint32), per_cpu),
                }
            )
        )
    return (
        pl.concat(frames)
        .sample(fraction=1.0, shuffle=True, seed=1)
        .with_columns(tgid=pl.col("pid"))
    )


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Collection:
    """The synthetic tables, with random quanta (the synthetic ones are all 2 ms)."""
    tables = synthetic_tables(seed=3)
    tables["quanta_runtime"] = _quanta(np.random.default_rng(3), 1500)
    folder = write_collection(tmp_path_factory.mktemp("figures"), tables)
    return read_collection(folder)


@pytest.fixture(scope="module")
def data(collection: Collection) -> GraphData:
    return load(collection.path)  # scanned from the folder


def _bins(data: GraphData, frame: pl.DataFrame, tl: Timeline) -> np.ndarray:
    """Each row's time bin, in numpy, in whole µs: [edge, next edge)."""
    since = frame["ts_uptime_us"].cast(pl.Int64).to_numpy() - data.origin_us
    start, width = round(tl.start * US_PER_S), round(tl.width * US_PER_S)
    return np.clip((since - start) // width, 0, tl.nbins - 1)


def _seen(data: GraphData, tl: Timeline) -> np.ndarray:
    """Seconds of each bin within the collection (its first µs to the end of its
    last), in numpy: the first bin also holds the rows before its edge and the last
    those after its end, so they count from the first µs and up to the last."""
    assert data.span_us is not None
    first, last = (t - data.origin_us for t in data.span_us)
    start, width = round(tl.start * US_PER_S), round(tl.width * US_PER_S)
    left = start + width * np.arange(tl.nbins)
    right = left + width
    left[0], right[-1] = min(left[0], first), max(right[-1], last + 1)
    return (np.minimum(right, last + 1) - np.maximum(left, first)) / US_PER_S


def _lines(ax) -> dict[str, np.ndarray]:
    return {line.get_label(): np.asarray(line.get_ydata(), float) for line in ax.lines}


def _quantile_marks(ax) -> dict[str, float]:
    """p50 / p99 vertical lines: label -> x."""
    return {
        line.get_label().split(" = ")[0]: float(line.get_xdata()[0])
        for line in ax.lines
        if line.get_label().startswith("p")
    }


def _q(values: np.ndarray | pl.Series, q: float) -> float:
    """numpy's inverse of the empirical CDF (exact for q n whole, as 0.5 and 0.99 of
    the tables here)."""
    return float(np.quantile(np.asarray(values), q, method="inverted_cdf"))


def test_the_tables_are_scanned_not_read(data: GraphData) -> None:
    assert all(isinstance(f, pl.LazyFrame) for f in data.tables.values())


def test_run_length_histogram_and_quantiles(data: GraphData, collection: Collection) -> None:
    values = collection["quanta_runtime"]["quanta_run_length_us"].to_numpy()
    ax = figure(data, "quanta_run_length").axes[0]
    counts, edges, _ = ax.patches[0].get_data()
    expected_edges, expected = _histogram_with_zeros(values)
    np.testing.assert_array_equal(edges, expected_edges)
    np.testing.assert_array_equal(counts, expected)
    marks = _quantile_marks(ax)
    assert marks == {q: max(_q(values, int(q[1:]) / 100), 1) for q in ("p50", "p99")}
    assert ax.get_title().startswith(
        f"{values.size:,} quanta · mean {format_duration_us(values.mean())} · "
    )


def _histogram_with_zeros(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edges and counts a duration histogram should have: the log bins of the
    values from 1 µs up, and before them, where there are zeros, a bin [0.8, 1) of
    the zeros alone."""
    edges = log_bins(values)
    counts, _ = np.histogram(values[values >= 1], bins=edges)
    if (values == 0).any():
        edges = np.concatenate([[0.8], edges])
        counts = np.concatenate([[(values == 0).sum()], counts])
    return edges, counts


def test_run_length_zeros_have_a_bin_of_their_own(tmp_path: Path) -> None:
    """Quanta of 0 µs (shorter than a µs) sit in a bin on the axis' left edge, not
    with the quanta of 1 µs; the legend says their share."""
    tables = synthetic_tables(seed=7)
    n = tables["quanta_runtime"].height
    runs = np.tile(np.array([0, 0, 1, 1, 1, 3, 20, 300, 4000, 50000], np.uint64), n // 10)
    tables["quanta_runtime"] = tables["quanta_runtime"].with_columns(
        quanta_run_length_us=pl.Series(runs)
    )
    ax = figure(load(write_collection(tmp_path, tables)), "quanta_run_length").axes[0]
    counts, edges, _ = ax.patches[0].get_data()
    assert (edges[0], edges[1], counts[0]) == (ax.get_xlim()[0], 1, (runs == 0).sum())
    assert counts[1] == (runs == 1).sum()  # the 1-µs bin holds the ones only
    expected_edges, expected = _histogram_with_zeros(runs)
    np.testing.assert_array_equal(edges, expected_edges)
    np.testing.assert_array_equal(counts, expected)
    assert ax.patches[0].get_label() == "quanta (20.0% of 0 µs at the left edge)"
    assert "0 µs at the left edge" in ax.get_xlabel()


def test_busy_share_is_the_overlap_of_quanta_and_bins(
    data: GraphData, collection: Collection
) -> None:
    frame = collection["quanta_runtime"]
    tl = data.timeline()
    assert data.span_us is not None
    # the bins within the collection: the one it ended in is a share of its part
    first, last = data.span_us
    edges = np.clip(data.origin_us + tl.edges * US_PER_S, first, last + 1)
    ends = frame["ts_uptime_us"].to_numpy().astype(np.float64)
    starts = ends - frame["quanta_run_length_us"].to_numpy()
    cpu = frame["cpu"].to_numpy()
    # every quantum against every bin: how much of it lies inside
    overlap = np.clip(
        np.minimum(ends[:, None], edges[None, 1:]) - np.maximum(starts[:, None], edges[None, :-1]),
        0,
        None,
    )
    expected = np.stack([overlap[cpu == c].sum(axis=0) for c in range(CPUS)])
    expected /= np.diff(edges)
    image = figure(data, "quanta_timeline").axes[0].images[0].get_array()
    np.testing.assert_allclose(image, expected * 100, atol=1e-6)


def _cdf_at(values: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The share of ``values`` at most each of ``xs``, by brute force."""
    return (values[:, None] <= xs[None, :]).mean(axis=0)


def test_queued_time_cdf_per_cpu_and_quantiles(data: GraphData, collection: Collection) -> None:
    frame = collection["quanta_queued_time"]
    values = frame["quanta_queued_time_us"].to_numpy()
    ax = figure(data, "quanta_queued_time_cdf").axes[0]
    lines = _lines(ax)
    total = next(line for line in ax.lines if line.get_label() == "all CPUs")
    xs = np.asarray(total.get_xdata(), float)
    assert xs[0] == ax.get_xlim()[0] < 1  # the left edge: 0 µs
    np.testing.assert_array_equal(xs[1:], log_bins(values, per_decade=40))
    cpus = frame["cpu"].to_numpy()
    assert {f"CPU {c}" for c in np.unique(cpus)} | {"all CPUs"} <= set(lines)
    np.testing.assert_allclose(lines["all CPUs"], _cdf_at(values, xs))
    for c in np.unique(cpus):
        np.testing.assert_allclose(lines[f"CPU {c}"], _cdf_at(values[cpus == c], xs))
    assert _quantile_marks(ax) == {"p50": max(_q(values, 0.5), 1), "p99": max(_q(values, 0.99), 1)}


def test_queued_time_cdf_starts_at_the_share_of_zero_waits(tmp_path: Path) -> None:
    """Waits of 0 µs (a log axis has no 0) are the curve's start at the axis' left edge,
    and the legend says their share: not drawn as waits between 1 and 2 µs."""
    tables = synthetic_tables(seed=5)
    n = tables["quanta_queued_time"].height
    waits = np.tile(np.array([0, 0, 0, 1, 1, 2, 5, 40, 900, 7000], np.uint64), n // 10)
    cpu = np.repeat(np.array([0, 1], np.uint32), n // 2)
    waits[cpu == 1] = np.maximum(waits[cpu == 1], 3)  # CPU 1 never ran a task at once
    tables["quanta_queued_time"] = tables["quanta_queued_time"].with_columns(
        quanta_queued_time_us=pl.Series(waits), cpu=pl.Series(cpu)
    )
    ax = figure(load(write_collection(tmp_path, tables)), "quanta_queued_time_cdf").axes[0]
    left = ax.get_xlim()[0]
    lines = {line.get_label(): line for line in ax.lines}
    zero_share = float((waits == 0).mean())  # 0.15: 3 in 10 on CPU 0, none on CPU 1
    assert zero_share == 0.15
    for label, mine in (
        ("all CPUs", waits),
        ("CPU 0", waits[cpu == 0]),
        ("CPU 1", waits[cpu == 1]),
    ):
        x, y = (np.asarray(v, float) for v in lines[label].get_data())
        assert (x[0], y[0]) == (left, (mine == 0).mean()), label
        # at 1 µs: the waits of 0 and 1 µs, not only those of 1
        assert y[np.flatnonzero(x == 1)[0]] == (mine <= 1).mean(), label
        np.testing.assert_allclose(y, _cdf_at(mine, x))
    marker = lines["15.0% waited 0 µs (at the left edge)"]
    assert (tuple(marker.get_xdata()), tuple(marker.get_ydata())) == ((left,), (zero_share,))
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "15.0% waited 0 µs (at the left edge)" in legend


def test_a_quantile_of_0_us_is_marked_at_the_left_edge(tmp_path: Path) -> None:
    tables = synthetic_tables(seed=6)
    n = tables["quanta_queued_time"].height
    waits = np.zeros(n, np.uint64)
    waits[: n // 4] = 50  # most runs waited 0 µs: the median is 0
    tables["quanta_queued_time"] = tables["quanta_queued_time"].with_columns(
        quanta_queued_time_us=pl.Series(waits)
    )
    ax = figure(load(write_collection(tmp_path, tables)), "quanta_queued_time_cdf").axes[0]
    marks = {line.get_label(): float(line.get_xdata()[0]) for line in ax.lines}
    assert marks["p50 = 0 µs"] == ax.get_xlim()[0]
    assert "75.0% waited 0 µs (at the left edge)" in marks


@pytest.mark.parametrize(
    ("graph", "table", "kinds"),
    [
        ("process_events", "process_trace", ("fork", "exec", "exit")),
        ("page_fault_rate", "page_faults", ("kernel", "user")),
    ],
)
def test_event_rates_per_bin(
    data: GraphData, collection: Collection, graph: str, table: str, kinds: tuple[str, ...]
) -> None:
    frame = collection[table]
    tl = data.timeline()
    lines = _lines(figure(data, graph).axes[0])
    for kind in kinds:
        part = frame.filter(pl.col("kind") == kind)
        expected = np.bincount(_bins(data, part, tl), minlength=tl.nbins) / _seen(data, tl)
        (label,) = [k for k in lines if k.startswith(f"{kind}: ")]
        assert label.split(": ")[1].split()[0] == f"{part.height:,}"
        np.testing.assert_allclose(lines[label], expected)


def test_block_io_rates_and_latency(data: GraphData, collection: Collection) -> None:
    frame = collection["block_io"]
    tl = data.timeline()
    seen = _seen(data, tl)
    iops, mib = figure(data, "block_io_rate").axes[:2]
    rates, moved = _lines(iops), _lines(mib)
    for op in ("READ", "WRITE"):
        part = frame.filter(pl.col("op") == op)
        bins = _bins(data, part, tl)
        np.testing.assert_allclose(rates[op], np.bincount(bins, minlength=tl.nbins) / seen)
        weights = part["bytes"].cast(pl.Float64).to_numpy()
        expected = np.bincount(bins, weights, minlength=tl.nbins) / seen / (1 << 20)
        np.testing.assert_allclose(moved[op], expected)
    other = frame.filter(~pl.col("op").is_in(["READ", "WRITE"]))
    expected = np.bincount(_bins(data, other, tl), minlength=tl.nbins) / seen
    np.testing.assert_allclose(rates["other"], expected)

    service_ax = figure(data, "block_io_latency").axes[0]
    values = frame["issue_to_complete_us"].to_numpy()
    bins = _histogram_with_zeros(values)[0]
    for patch in service_ax.patches:
        op = patch.get_label().split(":")[0]
        main = pl.col("op").is_in(["READ", "WRITE"])
        mine = frame.filter(~main if op == "other" else pl.col("op") == op)
        mine = mine["issue_to_complete_us"].to_numpy()
        counts, _ = np.histogram(np.clip(mine, bins[0], None), bins=bins)
        np.testing.assert_allclose(patch.get_data()[0], counts / mine.size)
        p50, p99 = _q(mine, 0.5), _q(mine, 0.99)
        assert patch.get_label() == (
            f"{op}: {mine.size:,} · p50 {format_duration_us(p50)} · p99 {format_duration_us(p99)}"
        )


def test_migrations_per_kind_and_cpu_pair(data: GraphData, collection: Collection) -> None:
    frame = collection["sched_migrate"]
    axes = figure(data, "migrations_by_cpu_pair").axes
    for ax, kind in zip(axes, ("wakeup", "queued"), strict=False):
        part = frame.filter(pl.col("kind") == kind)
        expected = np.zeros((2, 2))
        np.add.at(expected, (part["orig_cpu"].to_numpy(), part["dest_cpu"].to_numpy()), 1)
        np.testing.assert_array_equal(ax.images[0].get_array(), expected)
        assert ax.get_title().startswith(f"{kind}: {part.height:,} ")


def test_syscall_totals_and_latency(data: GraphData, collection: Collection) -> None:
    frame = collection["syscalls"]
    count_ax, _ = figure(data, "syscalls_top").axes[:2]
    widths = {
        label.get_text(): bar.get_width()
        for label, bar in zip(count_ax.get_yticklabels(), count_ax.patches, strict=False)
    }
    calls = {n: int(frame.filter(pl.col("syscall") == n)["count"].sum()) for n in widths}
    assert widths == calls and set(widths) == set(frame["syscall"])

    ax = figure(data, "syscalls_latency").axes[0]
    hist = np.array(frame["latency_log2_hist"].to_list(), dtype=np.float64)
    names = frame["syscall"].to_numpy()
    for patch in ax.patches:
        name = patch.get_label().split(" (")[0]
        counts = hist[names == name].sum(axis=0)
        np.testing.assert_allclose(patch.get_data()[0], counts / counts.sum())


@pytest.mark.parametrize("slice_rows", [None, 1])
def test_rss_of_the_largest_processes(
    data: GraphData, collection: Collection, monkeypatch: pytest.MonkeyPatch, slice_rows: int | None
) -> None:
    """The same lines whether the table is replayed at once or a row at a time."""
    if slice_rows is not None:
        monkeypatch.setattr("kernmlops.graphs.mm_rss_stat.SLICE_ROWS", slice_rows)
    rss = rss_series(collection["mm_rss_stat"])
    tl = data.timeline(target=400)
    ax = figure(data, "rss_over_time").axes[0]
    peaks = rss.group_by("mm_tgid").agg(pl.col("rss_bytes").max())
    drawn = [line for line in ax.lines if " · peak " in line.get_label()]
    assert len(drawn) == min(TOP_PROCESSES, peaks.height)
    _, div = bytes_unit(float(peaks["rss_bytes"].max()))  # type: ignore[arg-type]
    for line in drawn:
        tgid = next(t for t in peaks["mm_tgid"] if line.get_label().startswith(data.name_of(t)))
        mine = rss.filter(pl.col("mm_tgid") == tgid)
        mine = mine.with_columns(bin=pl.Series(_bins(data, mine, tl)))
        last = mine.group_by("bin", maintain_order=True).last()
        np.testing.assert_allclose(line.get_xdata(), data.seconds(last))
        np.testing.assert_allclose(line.get_ydata(), last["rss_bytes"].to_numpy() / div)


def test_table_summaries_as_polars_gives_them(data: GraphData, collection: Collection) -> None:
    """Rows, span, processes and each key column's mean, p50, p99 and max as polars and
    numpy compute them on the rows in memory (the percentiles numpy's inverted_cdf)."""
    for entry in table_summary(data):
        frame = collection[entry["table"]]
        assert entry["rows"] == frame.height
        if "ts_uptime_us" in frame.columns:
            ts = frame["ts_uptime_us"].cast(pl.Int64)
            assert entry["span_s"] == (ts.max() - ts.min()) / US_PER_S  # type: ignore[operator]
        view = table_view(entry["table"])
        if view.tgid_column in frame.columns:
            assert entry["processes"] == frame[view.tgid_column].n_unique()
        if type(view).summarise is not TableView.summarise:
            continue  # a summary of its own (syscalls, perf_counters)
        expected = []
        for col in view.keys(frame):
            values = frame[col].drop_nulls().cast(pl.Float64)
            fmt = unit_formatter(col)
            expected.append(
                (
                    col,
                    f"mean {fmt(values.mean())} · p50 {fmt(_q(values, 0.5))} · "
                    f"p99 {fmt(_q(values, 0.99))} · max {fmt(values.max())}",
                )
            )
        assert entry["stats"] == expected, entry["table"]


def test_the_graph_and_the_report_give_one_median(tmp_path: Path) -> None:
    """Run lengths whose median by linear interpolation (1,501 µs), by polars' nearest
    rank (3,000 µs) and as the value of rank ceil(n/2) (2 µs: the page's one
    definition) all differ: the figure's p50 line and the report's summary agree on
    the last."""
    tables = synthetic_tables(seed=7)
    n = tables["quanta_runtime"].height  # even: the median falls between two rows
    runs = np.where(np.arange(n) < n // 2, 2, 3000).astype(np.uint64)
    runs[0] = 1  # the lower half is not all one value: 2 is picked by rank
    tables["quanta_runtime"] = tables["quanta_runtime"].with_columns(
        quanta_run_length_us=pl.Series(runs)
    )
    data = load(write_collection(tmp_path, tables))
    assert np.quantile(runs, 0.5) == 1501
    assert pl.Series(runs).quantile(0.5, "nearest") == 3000
    rank = np.sort(runs)[(n + 1) // 2 - 1]
    assert rank == 2 == _q(runs, 0.5)
    ax = figure(data, "quanta_run_length").axes[0]
    assert _quantile_marks(ax)["p50"] == 2
    assert "p50 = 2 µs" in [line.get_label() for line in ax.lines]
    [runtime] = [t for t in table_summary(data) if t["table"] == "quanta_runtime"]
    summary = dict(runtime["stats"])["quanta_run_length_us"]
    assert " · p50 2 µs · " in summary


def test_a_selection_is_drawn_from_its_rows_alone(collection: Collection) -> None:
    data = load(collection.path, comm="worker")
    frame = collection["quanta_runtime"].filter(pl.col("tgid") == WORKER)
    values = frame["quanta_run_length_us"].to_numpy()
    ax = figure(data, "quanta_run_length").axes[0]
    assert ax.get_title().startswith(f"{values.size:,} quanta ")
    expected, _ = np.histogram(np.clip(values, 1, None), bins=log_bins(values))
    np.testing.assert_array_equal(ax.patches[0].get_data()[0], expected)
    assert data.count("quanta_runtime") == frame.height
    assert data.count("memory_usage") == collection["memory_usage"].height  # system-wide


def _device_lines(ax) -> dict[str, np.ndarray]:
    """The lines of devices ("254:0"), not the time axis' markers."""
    return {k: v for k, v in _lines(ax).items() if not k.startswith("benchmark ")}


def test_block_io_queue_is_the_mean_queue_at_issue_per_device(
    data: GraphData, collection: Collection
) -> None:
    """Per device and bin of the issue (completion less service time), the mean of
    the queue read at each issue; a bin without an issue is a gap, not 0."""
    frame = collection["block_io"].filter(pl.col("inflight").is_not_null())
    issued = frame.with_columns(
        ts_uptime_us=pl.col("ts_uptime_us").cast(pl.Int64)
        - pl.col("issue_to_complete_us").cast(pl.Int64)
    )
    tl = data.timeline()
    req_ax, size_ax = figure(data, "block_io_queue").axes[:2]
    requests, sizes = _device_lines(req_ax), _device_lines(size_ax)
    assert sorted(requests) == sorted(sizes) == ["254:0", "7:1"]
    for device in ("254:0", "7:1"):
        mine = issued.filter(pl.col("device") == device)
        bins = _bins(data, mine, tl)
        n = np.bincount(bins, minlength=tl.nbins).astype(float)
        with np.errstate(invalid="ignore"):
            for lines, column in ((requests, "inflight"), (sizes, "inflight_4k_ios")):
                total = np.bincount(bins, mine[column].cast(pl.Float64).to_numpy(), tl.nbins)
                np.testing.assert_allclose(lines[device], total / n)  # nan where n is 0
        assert np.isnan(requests[device]).any() and not np.isnan(requests[device]).all()


def test_block_io_queue_of_a_collection_before_the_queue_size(tmp_path: Path) -> None:
    tables = synthetic_tables()
    tables["block_io"] = tables["block_io"].drop("inflight_4k_ios")
    data = load(write_collection(tmp_path, tables))
    req_ax, size_ax = figure(data, "block_io_queue").axes[:2]
    assert sorted(_device_lines(req_ax)) == ["254:0", "7:1"] and not _device_lines(size_ax)
    assert [t.get_text() for t in size_ax.texts] == [
        "collected before kernmlops recorded the queue's size"
    ]


def test_block_io_rate_sums_bytes_past_4_gib(tmp_path: Path) -> None:
    # block_io.bytes is UInt32 in the files, and polars sums a UInt32 column in 32
    # bits: three 2-GiB requests in one bin (off its edges) summed to 2 GiB, not 6.
    sizes = [1 << 31] * 3
    tables = synthetic_tables()
    block = tables["block_io"].head(3)
    tables["block_io"] = block.with_columns(
        pl.Series("bytes", sizes, pl.UInt32),
        pl.lit("READ").alias("op"),
        pl.lit(int(_ts(np.array([1.005]))[0]), pl.UInt64).alias("ts_uptime_us"),
    )
    data = load(write_collection(tmp_path, tables))
    tl = data.timeline()
    moved = _lines(figure(data, "block_io_rate").axes[1])["READ"]
    assert moved.max() == pytest.approx(sum(sizes) / tl.width / (1 << 20))


def test_rows_on_bin_edges_fall_in_the_bin_the_edge_opens(tmp_path: Path) -> None:
    """A row exactly on an edge is the first of the bin after it. The bins were
    computed in floating-point seconds, where (0.015 + 0.145) / 0.005 is 31.999...:
    some edge rows were counted in the bin before (two forks there, none in their
    own), and the RSS line lost the bin's point (a collection of 1.16 s whose first
    event is 0.143076 s before the benchmark's start, as a real one was)."""
    origin = BENCH_START
    lo, hi = origin - 143_076, origin + 1_016_886
    forks = np.arange(-140_000, 1_010_001, 10_000)  # every 10 ms edge within the span
    ts = np.concatenate([[lo], origin + forks, [origin, hi]])
    kinds = ["exit"] + ["fork"] * forks.size + ["exec", "exit"]
    pids = [WORKER] * (forks.size + 1) + [BENCH_PID, BENCH_PID]
    trace = pl.DataFrame(
        {
            "ts_uptime_us": ts.astype(np.uint64),
            "pid": np.array(pids, np.uint32),
            "tgid": np.array(pids, np.uint32),
            "ppid": np.ones(ts.size, np.uint32),
            "kind": kinds,
            "comm": ["worker"] * ts.size,
        }
    )
    changes = np.arange(-140_000, 1_010_001, 5_000)  # every 5 ms edge (RSS: 400 bins)
    rss = pl.DataFrame(
        {
            "ts_uptime_us": (origin + changes).astype(np.uint64),
            "size_bytes": (np.arange(changes.size) + 1) * 4096,
            "pid": np.full(changes.size, WORKER, np.uint32),
            "tgid": np.full(changes.size, WORKER, np.uint32),
            "mm_tgid": np.full(changes.size, WORKER, np.uint32),
            "member": ["anon"] * changes.size,
        }
    )
    data = load(write_collection(tmp_path, {"process_trace": trace, "mm_rss_stat": rss}))
    assert data.origin_us == origin and data.span_us == (lo, hi)

    tl = data.timeline()
    # [-150, -140) ms, 3.076 ms of it in the collection, is merged into [-140, -130)
    assert (tl.start, tl.width, tl.nbins) == (-0.14, 0.01, forks.size)
    lines = _lines(figure(data, "process_events").axes[0])
    [forks_line] = [v for k, v in lines.items() if k.startswith("fork: ")]
    # one fork in each bin, the first and the last over the part the collection saw
    seen = np.full(tl.nbins, 0.01)
    seen[0], seen[-1] = (
        (-130_000 - (lo - origin)) / US_PER_S,
        (hi + 1 - origin - 1_010_000) / US_PER_S,
    )
    np.testing.assert_allclose(forks_line, 1 / seen)

    # one change per 5 ms bin, each on its bin's left edge: every one is its bin's last
    ax = figure(data, "rss_over_time").axes[0]
    [line] = [li for li in ax.lines if " · peak " in li.get_label()]
    np.testing.assert_allclose(line.get_xdata(), changes / US_PER_S)
    _, div = bytes_unit(float(rss["size_bytes"].max()))
    np.testing.assert_allclose(line.get_ydata(), rss["size_bytes"].to_numpy() / div)


def test_rss_changes_of_an_unknown_owner_are_no_process(tmp_path: Path) -> None:
    """mm_tgid 0 is an mm whose owner is not known (an exec's new mm, changed before
    it is current): rss_over_time leaves it out, and the report counted it as one
    more process than the graph's title names."""
    tables = synthetic_tables()
    rss = tables["mm_rss_stat"]
    unknown = rss.head(2).with_columns(pl.lit(0, pl.UInt32).alias("mm_tgid"))
    tables["mm_rss_stat"] = pl.concat([rss, unknown])
    data = load(write_collection(tmp_path, {"mm_rss_stat": tables["mm_rss_stat"]}))
    owners = set(tables["mm_rss_stat"]["mm_tgid"].to_list()) - {0}
    assert owners == {WORKER, BENCH_PID}
    [entry] = table_summary(data)
    assert entry["processes"] == len(owners)
    title = figure(data, "rss_over_time").axes[0].get_title()
    assert title.startswith(f"{len(owners)} of {len(owners)} processes")
    # nor is it named among the busiest processes when a selection finds nothing
    many = pl.concat([unknown] * 10)
    folder = write_collection(tmp_path / "many", {"mm_rss_stat": pl.concat([rss, many])})
    with pytest.raises(SelectionError, match="busiest processes") as info:
        load(folder, tgid=424242)
    busiest = str(info.value).split("busiest processes: ")[1]
    assert busiest == f"{WORKER}, {BENCH_PID})"  # most rows first; no 0 however many


def test_a_steady_rate_is_steady_in_the_bins_the_collection_began_and_ended_in(
    tmp_path: Path,
) -> None:
    """Page faults every 100 µs (10,000/s) from 7.3 ms before the start of a 20 ms bin
    to 6.3 ms into one: divided by the bin's width, the first bin showed 3,650/s and
    the last 3,200/s; over the time the collection saw, about 10,000/s as the rest."""
    origin = BENCH_START
    lo, hi = origin - 7_300, origin + 1_986_300
    ts = np.arange(lo, hi + 1, 100)
    faults = pl.DataFrame(
        {
            "ts_uptime_us": ts.astype(np.uint64),
            "pid": np.full(ts.size, WORKER, np.uint32),
            "tgid": np.full(ts.size, WORKER, np.uint32),
            "cpu": np.zeros(ts.size, np.uint32),
            "kind": ["user"] * ts.size,
        }
    )
    trace = synthetic_tables()["process_trace"].filter(pl.col("pid") == BENCH_PID)
    trace = trace.with_columns(pl.Series("ts_uptime_us", [origin, origin + 1_000_000], pl.UInt64))
    data = load(write_collection(tmp_path, {"process_trace": trace, "page_faults": faults}))
    assert data.origin_us == origin and data.span_us == (lo, hi)
    tl = data.timeline()
    assert tl.width == 0.02
    lines = _lines(figure(data, "page_fault_rate").axes[0])
    [(label, rate)] = [(k, v) for k, v in lines.items() if k.startswith("user: ")]
    assert label == f"user: {ts.size:,} faults"
    np.testing.assert_allclose(rate, np.bincount(_bins(data, faults, tl)) / _seen(data, tl))
    np.testing.assert_allclose(rate, 10_000, rtol=0.04)


def test_a_cpu_busy_all_the_time_is_busy_in_the_bins_the_collection_began_and_ended_in(
    tmp_path: Path,
) -> None:
    """1 ms quanta back to back on CPU 0 through a collection that begins 13 ms before
    a 20 ms edge and ends 13 ms after one: the CPU ran all the time the collection
    saw. Shares of the whole bins, the first and the last were 70% and 65%."""
    origin = BENCH_START
    lo, hi = origin - 13_000, origin + 1_993_000
    ends = np.arange(lo, hi + 1, 1000)
    quanta = pl.DataFrame(
        {
            "ts_uptime_us": ends.astype(np.uint64),
            "quanta_run_length_us": np.full(ends.size, 1000, np.uint64),
            "cpu": np.zeros(ends.size, np.uint32),
            "pid": np.full(ends.size, WORKER, np.uint32),
            "tgid": np.full(ends.size, WORKER, np.uint32),
        }
    )
    trace = synthetic_tables()["process_trace"].filter(pl.col("pid") == BENCH_PID)
    trace = trace.with_columns(pl.Series("ts_uptime_us", [origin, origin + 1_000_000], pl.UInt64))
    data = load(write_collection(tmp_path, {"process_trace": trace, "quanta_runtime": quanta}))
    assert data.span_us == (lo, hi)
    tl = data.timeline()
    assert (tl.start, tl.width, tl.nbins) == (-0.02, 0.02, 101)
    busy = figure(data, "quanta_timeline").axes[0].images[0].get_array()[0] / 100
    # each bin's part within [lo, hi + 1 µs), all of it run
    edges = np.clip(origin + round(tl.start * US_PER_S) + 20_000 * np.arange(102), lo, hi + 1)
    ran = np.clip(
        np.minimum(ends[:, None], edges[1:]) - np.maximum(ends[:, None] - 1000, edges[:-1]), 0, None
    )
    np.testing.assert_allclose(busy, ran.sum(axis=0) / np.diff(edges))
    np.testing.assert_allclose(busy, 1, atol=1e-4)


def _sampled_faults(tmp_path: Path, counters: dict[str, int] | None) -> Path:
    """A collection whose page_faults kept 1 fault in 10: 30 user rows of WORKER and
    10 kernel rows of BENCH_PID over 1.95 s; the manifest's exact counts where given."""
    ts = BENCH_START + np.arange(40, dtype=np.int64) * 50_000
    faults = pl.DataFrame(
        {
            "ts_uptime_us": ts.astype(np.uint64),
            "pid": np.array([WORKER] * 30 + [BENCH_PID] * 10, np.uint32),
            "tgid": np.array([WORKER] * 30 + [BENCH_PID] * 10, np.uint32),
            "cpu": np.zeros(40, np.uint32),
            "kind": ["user"] * 30 + ["kernel"] * 10,
        }
    )
    trace = synthetic_tables()["process_trace"]
    hooks: dict[str, dict] = {"page_faults": {"attached": True, "rows": {"page_faults": 40}}}
    if counters is not None:
        hooks["page_faults"]["counters"] = counters
    extra = {"config": {"hooks": {"page_faults": {"sample_every": 10}}}, "hooks": hooks}
    tables = {"process_trace": trace, "page_faults": faults}
    return write_collection(tmp_path, tables, extra=extra)


def _fault_figures(data) -> tuple[set[str], str, dict[str, str]]:
    ax = figure(data, "page_fault_rate").axes[0]
    labels = {ln.get_label() for ln in ax.lines if ln.get_label().endswith(" faults")}
    (entry,) = [t for t in table_summary(data) if t["table"] == "page_faults"]
    return labels, ax.get_title(), dict(entry["stats"])


def test_sampled_page_faults_are_counted_from_the_manifest_where_it_has_them(
    tmp_path: Path,
) -> None:
    # exact counts that rows × 10 (300 user, 100 kernel) would miss
    exact = {"faults": 407, "faults_user": 303, "faults_kernel": 104}
    labels, title, stats = _fault_figures(load(_sampled_faults(tmp_path, exact)))
    assert labels == {"user: 303 faults", "kernel: 104 faults"}
    assert title.endswith("(1 in 10 sampled; totals exact)")
    assert stats["faults"] == "407 (exact, counted in the kernel)"
    assert stats["by kind"] == "user 303 · kernel 104"
    assert stats["rate"] == "209 faults/s over 1.95 s"  # 407 / 1.95 s: first to last row


def test_sampled_page_faults_of_an_older_collection_are_an_estimate_said_so(
    tmp_path: Path,
) -> None:
    # a manifest from before the hook kept its counts: rows × 10, marked as such
    labels, title, stats = _fault_figures(load(_sampled_faults(tmp_path, None)))
    assert labels == {"user: ≈300 faults", "kernel: ≈100 faults"}
    assert title.endswith("(1 in 10 sampled; totals ≈ rows × N)")
    assert stats["faults"] == "≈400 (estimate: rows × 10, 1 in 10 sampled)"
    assert stats["by kind"] == "user ≈300 · kernel ≈100"
    assert stats["rate"] == "≈205 faults/s over 1.95 s"


def test_a_selection_of_sampled_page_faults_is_an_estimate(tmp_path: Path) -> None:
    # the manifest's counts are every traced task's: one process's rows are fewer
    exact = {"faults": 407, "faults_user": 303, "faults_kernel": 104}
    labels, _, stats = _fault_figures(load(_sampled_faults(tmp_path, exact), tgid=WORKER))
    assert labels == {"user: ≈300 faults"}
    assert stats["faults"] == "≈300 (estimate: rows × 10, 1 in 10 sampled)"


def test_the_graphs_read_the_counters_the_hook_writes() -> None:
    from kernmlops.graphs import page_faults as graph
    from kernmlops.hooks import page_faults as hook

    assert graph.COUNTER_ALL == hook.COUNTER_ALL
    assert {f"{graph.COUNTER_ALL}_{k}" for k in hook.KINDS} == {
        hook.kind_counter(k) for k in hook.KINDS
    }
    assert set(graph.COLORS) == set(hook.KINDS)
