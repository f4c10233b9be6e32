"""Graphs of perf_counters: each event's rate and its cumulative count, summed over
CPUs (the counters are per CPU and system-wide).

Counts are scaled by enabled/running time first (kernmlops.counters.scaled), so a
multiplexed hardware counter is estimated over the whole interval.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.counters import enabled_column, event_column, scaled
from kernmlops.graphs.base import US_PER_S, Graph, GraphData, NoData, TableView, collect
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

TABLE = "perf_counters"
SUFFIX = "_scaled"


class PerfCountersView(TableView):
    name = TABLE
    tgid_column = None

    def summary_queries(self, frame: pl.DataFrame | pl.LazyFrame) -> list[pl.LazyFrame]:
        # one row per CPU per read (10 a second): small enough to read whole
        return [frame.lazy()]

    def summarise(self, results: Sequence[pl.DataFrame]) -> list[tuple[str, str]]:
        """Each event's total over the collection, summed over CPUs."""
        totals = per_sample(results[0], cumulative=True)
        if totals.is_empty():
            return []
        last = totals.tail(1)
        span_s = float(totals["t_us"].max() - totals["t_us"].min()) / US_PER_S  # type: ignore[operator]
        out = []
        for col in event_columns(totals):
            total = float(last[col][0])
            if col.endswith("_ns" + SUFFIX):
                text = f"{total / 1e9:,.3f} s" + (
                    f" ({total / 1e9 / span_s:.2f} CPU-s/s)" if span_s > 0 else ""
                )
            else:
                text = f"{total:,.0f}" + (f" ({total / span_s:,.1f}/s)" if span_s > 0 else "")
            out.append((col.removesuffix(SUFFIX), text))
        return out


def event_columns(frame: pl.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.endswith(SUFFIX)]


def per_sample(frame: pl.DataFrame | pl.LazyFrame, *, cumulative: bool) -> pl.DataFrame:
    """One row per read of the counters: ``t_us`` and, per event, the rate per second
    (``cumulative=False``) or the count since the first read, summed over CPUs.
    Per-CPU differences come first, so a CPU missing from one read adds no jump."""
    # one row per CPU per read (10 a second): small enough to read whole
    if isinstance(frame, pl.LazyFrame):
        frame = collect(frame)
    frame = scaled(frame).sort("cpu", UPTIME_TIMESTAMP)
    events = event_columns(frame)
    if not events:
        return pl.DataFrame()
    # Never running yet (the first read): nothing counted, nothing to scale.
    frame = frame.with_columns(pl.col(c).fill_null(pl.col(c.removesuffix(SUFFIX))) for c in events)
    ts = pl.col(UPTIME_TIMESTAMP).cast(pl.Float64)
    if cumulative:
        values = [(pl.col(c) - pl.col(c).first()).over("cpu").alias(c) for c in events]
    else:
        # Per second of the counter's own enabled time, read with its count: the
        # row's timestamp is taken before the CPUs' counters are read, so a read
        # the poller was preempted in shifts counts between neighbouring rows
        # (2.68 CPU-s/s of task-clock on 2 CPUs seen on a busy machine).
        dt_row_s = ts.diff().over("cpu") / US_PER_S
        values = []
        for c in events:
            enabled = enabled_column(c.removesuffix(SUFFIX), frame.columns)
            dt_s = (
                pl.col(enabled).cast(pl.Float64).diff().over("cpu") / 1e9 if enabled else dt_row_s
            )
            values.append(pl.when(dt_s > 0).then(pl.col(c).diff().over("cpu") / dt_s).alias(c))
    sample = pl.int_range(pl.len()).over("cpu").alias("sample")
    rows = frame.select(sample, ts.alias("t_us"), *values)
    if not cumulative:
        rows = rows.filter(pl.col("sample") > 0)
    return (
        rows.group_by("sample")
        .agg(pl.col("t_us").mean(), *(pl.col(c).sum() for c in events))
        .sort("sample")
    )


def display_names(data: GraphData, columns: list[str]) -> dict[str, str]:
    """Column -> the event's name as configured (``tlb:tlb_flush``), from the manifest."""
    hook = (data.manifest.get("hooks") or {}).get("perf") or {}
    names = {}
    for event in hook.get("programs") or []:
        col = event_column(str(event))
        for candidate in (col, f"{col}_ns"):
            names[candidate + SUFFIX] = str(event)
    return {c: names.get(c, c.removesuffix(SUFFIX)) for c in columns}


class _PerfGraph(Graph):
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    cumulative: ClassVar[bool]

    def draw(self, data: GraphData, fig: Figure) -> None:
        rows = per_sample(data.frame(TABLE), cumulative=self.cumulative)
        events = event_columns(rows) if not rows.is_empty() else []
        if not events:
            raise NoData(TABLE)
        names = display_names(data, events)
        ncols = min(len(events), 3)
        nrows = math.ceil(len(events) / ncols)
        fig.set_size_inches(11, 1.2 + 2.5 * nrows)
        axes = fig.subplots(nrows, ncols, sharex=True, squeeze=False).ravel()
        t = (rows["t_us"].to_numpy() - data.origin_us) / US_PER_S
        for ax, col in zip(axes, events, strict=False):
            clock = col.endswith("_ns" + SUFFIX)
            y = rows[col].to_numpy()
            if clock:  # ns counted: shown in seconds (per second: how many CPUs' worth)
                y = y / 1e9
            ax.plot(t, y, linewidth=1.3, color="#1f77b4")
            if self.cumulative:
                ax.fill_between(t, y, alpha=0.15, color="#1f77b4")
                unit = "CPU-seconds" if clock else "events"
            else:
                unit = "CPU-seconds/s" if clock else "events/s"
            ax.set_title(names[col], fontweight="normal")
            ax.set_ylabel(unit)
            ax.set_ylim(bottom=0)
            data.time_axis(ax, legend=False)
        for ax in axes[len(events) :]:
            ax.set_visible(False)
        for i, ax in enumerate(axes[: len(events)]):
            if i + ncols < len(events):  # another panel below shows the time axis
                ax.set_xlabel("")
            else:
                ax.xaxis.set_tick_params(labelbottom=True)
        handles, labels = axes[0].get_legend_handles_labels()
        if handles:
            axes[0].legend(handles, labels, fontsize="x-small", loc="best")


class PerfRate(_PerfGraph):
    """Events per second (all CPUs) between consecutive reads."""

    name = "perf_rate"
    title = "Perf counters: rate (all CPUs)"
    order = 60
    cumulative = False


class PerfCumulative(_PerfGraph):
    """Events counted since the first read (all CPUs)."""

    name = "perf_cumulative"
    title = "Perf counters: cumulative (all CPUs)"
    order = 61
    cumulative = True
