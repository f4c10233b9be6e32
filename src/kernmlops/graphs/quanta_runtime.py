"""Graphs of quanta_runtime (run lengths, CPU busy over time) and quanta_queued_time
(how long tasks waited for a CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import (
    ZERO_X,
    Distribution,
    Graph,
    GraphData,
    TableView,
    Timeline,
    collect,
    counted,
    duration_axis,
    format_duration_us,
    histogram_bins,
    log_bins,
    row_count,
)
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

RUN, QUEUED = "quanta_run_length_us", "quanta_queued_time_us"
#: CDF lines drawn one per CPU up to this many CPUs (beyond: the total only).
MAX_CPU_LINES = 8


class QuantaRuntimeView(TableView):
    name = "quanta_runtime"
    key_columns = (RUN,)


class QuantaQueuedView(TableView):
    name = "quanta_queued_time"
    key_columns = (QUEUED,)


def _mark_quantiles(ax: Axes, dist: Distribution, color: str = "black") -> None:
    for q, style in ((0.5, ":"), (0.99, "--")):
        v = dist.quantile(q)
        ax.axvline(v if v >= 1 else ZERO_X, color=color, linestyle=style, linewidth=1,
                   label=f"p{int(q * 100)} = {format_duration_us(v)}")  # fmt: skip


class QuantaRunLength(Graph):
    """How long tasks ran each time they got a CPU, on a log scale."""

    name = "quanta_run_length"
    title = "Quanta run length distribution"
    order = 11
    tables: ClassVar[tuple[str, ...]] = ("quanta_runtime",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        dist = Distribution.of(data.frame("quanta_runtime"), RUN)
        ax = fig.subplots()
        bins = histogram_bins(dist.values)
        zeros = dist.zeros()
        label = f"quanta ({zeros / dist.size:.1%} of 0 µs at the left edge)" if zeros else "quanta"
        ax.stairs(dist.histogram(bins), bins, fill=True, alpha=0.6, color="#1f77b4",
                  label=label)  # fmt: skip
        _mark_quantiles(ax, dist)
        duration_axis(ax)
        ax.set_xlim(ZERO_X, max(dist.max() * 1.5, 10))
        ax.set_xlabel(
            "run length per quantum (log scale; 0 µs at the left edge)"
            if zeros
            else "run length per quantum (log scale)"
        )
        ax.set_ylabel("quanta per bin")
        ax.set_title(
            f"{dist.size:,} quanta · mean {format_duration_us(dist.mean())} · "
            f"max {format_duration_us(dist.max())}",
            fontweight="normal",
        )
        ax.legend(fontsize="small")


def busy_fraction(
    frame: pl.DataFrame | pl.LazyFrame, origin_us: int, timeline: Timeline
) -> tuple[np.ndarray, np.ndarray]:
    """(cpus, busy[cpu, bin]): the share of each time bin (of the part of it the
    collection saw, where ``timeline`` knows it) each CPU spent running the quanta of
    ``frame``. A quantum ending at ts ran over [ts - length, ts] and is
    split across the bins it overlaps (quanta on one CPU do not overlap).

    polars sums the quanta per (CPU, first bin, last bin), so memory grows with the
    bins, not the quanta: a quantum within one bin adds its length there; a longer
    one its part in its first bin, its part in its last, and whole bins between
    (each quantum's offsets in its first and last bin are summed to get the parts).
    """
    # the edges in whole µs, as GraphData.time_bin has them
    width = float(timeline.width_us)
    first_edge = float(origin_us + timeline.start_us)
    # what ran before the first edge or after the last is in no bin; nor what ran
    # outside the collection (timeline.observed_us): a bin it began or ended in is
    # the share of the part of it the collection saw
    seen_lo, seen_hi = first_edge, first_edge + timeline.nbins * width
    if timeline.observed_us is not None:
        seen_lo = max(seen_lo, float(origin_us + timeline.observed_us[0]))
        seen_hi = min(seen_hi, float(origin_us + timeline.observed_us[1] + 1))
    ts = pl.col(UPTIME_TIMESTAMP).cast(pl.Float64)
    end = ts.clip(seen_lo, seen_hi)
    start = (ts - pl.col(RUN).cast(pl.Float64)).clip(seen_lo, end)
    first = ((start - first_edge) / width).floor()
    last = ((end - first_edge) / width).floor()
    spans = collect(
        frame.lazy()
        .select(
            "cpu",
            first.cast(pl.Int64).alias("first"),
            last.cast(pl.Int64).alias("last"),
            length=end - start,
            head=start - (first_edge + first * width),  # where it starts in its first bin
            tail=end - (first_edge + last * width),  # where it ends in its last bin
        )
        .group_by("cpu", "first", "last")
        .agg(pl.col("length", "head", "tail").sum(), n=row_count("cpu"))
    )
    cpus = np.unique(spans["cpu"].to_numpy())
    row = np.searchsorted(cpus, spans["cpu"].to_numpy())
    lo, hi = spans["first"].to_numpy(), spans["last"].to_numpy()
    n = spans["n"].to_numpy().astype(np.float64)
    # one more bin than the timeline: a quantum ending on its last edge adds 0 there
    busy = np.zeros((cpus.size, timeline.nbins + 1))
    within = lo == hi
    np.add.at(busy, (row[within], lo[within]), spans["length"].to_numpy()[within])
    across = ~within
    np.add.at(busy, (row[across], lo[across]), n[across] * width - spans["head"].to_numpy()[across])
    np.add.at(busy, (row[across], hi[across]), spans["tail"].to_numpy()[across])
    # whole bins between: +n from the bin after the first, -n from the last, summed up
    between = np.zeros_like(busy)
    long = across & (hi - lo > 1)
    np.add.at(between, (row[long], lo[long] + 1), n[long])
    np.add.at(between, (row[long], hi[long]), -n[long])
    busy += np.cumsum(between, axis=1) * width
    edges = first_edge + width * np.arange(timeline.nbins + 1)
    seen = np.diff(np.clip(edges, seen_lo, seen_hi))
    return cpus, np.clip(busy[:, : timeline.nbins] / np.maximum(seen, 1.0), 0, 1)


class QuantaTimeline(Graph):
    """Per-CPU timeline: how busy each CPU was (with the selected tasks) over time."""

    name = "quanta_timeline"
    title = "CPU busy per CPU over time (from quanta)"
    order = 10
    tables: ClassVar[tuple[str, ...]] = ("quanta_runtime",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("quanta_runtime")
        tl = data.timeline([frame])
        cpus, busy = busy_fraction(frame, data.origin_us, tl)
        ax = fig.subplots()
        image = ax.imshow(
            busy * 100,
            aspect="auto",
            interpolation="nearest",
            origin="lower",
            cmap="magma",
            vmin=0,
            vmax=100,
            extent=(tl.start, tl.start + tl.nbins * tl.width, -0.5, cpus.size - 0.5),
        )
        step = max(1, cpus.size // 16)
        ax.set_yticks(np.arange(0, cpus.size, step), [str(c) for c in cpus[::step]])
        ax.set_ylabel("CPU")
        ax.grid(False)
        who = data.selection or "all traced tasks"
        ax.set_title(
            f"share of each {format_duration_us(tl.width * 1e6)} bin spent running {who}",
            fontweight="normal",
        )
        bar = fig.colorbar(image, ax=ax, pad=0.01)
        bar.set_label("busy (%)")
        data.time_axis(ax)


class QueuedTimeCdf(Graph):
    """How long a runnable task waited before it ran (wake-up or preemption to running).

    Each curve is the exact share of runs that waited at most x, at the bin edges of a
    log axis (whole µs) and at the axis' left edge, below 1 µs: there it is the share
    that waited 0 µs, which a log axis cannot place anywhere else; the legend says it.
    """

    name = "quanta_queued_time_cdf"
    title = "Run-queue wait (queued time) CDF"
    order = 12
    tables: ClassVar[tuple[str, ...]] = ("quanta_queued_time",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        counts = collect(counted(data.frame("quanta_queued_time"), QUEUED, "cpu"))
        total = Distribution.from_counts(counts, QUEUED)
        ax = fig.subplots()
        xs = np.concatenate([[ZERO_X], log_bins(total.values, per_decade=40)])

        cpus = np.unique(counts["cpu"].to_numpy())
        if 1 < cpus.size <= MAX_CPU_LINES:
            for cpu, part in counts.sort("cpu").group_by("cpu", maintain_order=True):
                ax.plot(xs, Distribution.from_counts(part, QUEUED).share_at_most(xs),
                        linewidth=1, alpha=0.7, label=f"CPU {cpu[0]}")  # fmt: skip
        shares = total.share_at_most(xs)
        ax.plot(xs, shares, color="black", linewidth=2, label="all CPUs")
        if shares[0] > 0:
            zero = f"{shares[0]:.1%} waited 0 µs (at the left edge)"
            ax.plot([ZERO_X], [shares[0]], marker=">", markersize=7, color="black",
                    linestyle="none", label=zero)  # fmt: skip
        _mark_quantiles(ax, total, color="#555555")
        duration_axis(ax)
        ax.set_xlim(ZERO_X, max(total.max() * 1.5, 10))
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("queued time before running (log scale; 0 µs at the left edge)")
        ax.set_ylabel("fraction of runs waiting ≤ x")
        ax.set_title(f"{total.size:,} runs", fontweight="normal")
        ax.legend(fontsize="small", loc="lower right")
