"""Graphs of quanta_runtime (run lengths, CPU busy over time) and quanta_queued_time
(how long tasks waited for a CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import (
    US_PER_S,
    Graph,
    GraphData,
    TableView,
    Timeline,
    duration_axis,
    format_duration_us,
    log_bins,
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


def _mark_quantiles(ax: Axes, values: np.ndarray, color: str = "black") -> None:
    for q, style in ((0.5, ":"), (0.99, "--")):
        v = float(np.quantile(values, q))
        ax.axvline(max(v, 1), color=color, linestyle=style, linewidth=1,
                   label=f"p{int(q * 100)} = {format_duration_us(v)}")  # fmt: skip


class QuantaRunLength(Graph):
    """How long tasks ran each time they got a CPU, on a log scale."""

    name = "quanta_run_length"
    title = "Quanta run length distribution"
    order = 11
    tables: ClassVar[tuple[str, ...]] = ("quanta_runtime",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        values = data.frame("quanta_runtime")[RUN].to_numpy()
        ax = fig.subplots()
        bins = log_bins(values)
        counts, edges = np.histogram(np.clip(values, 1, None), bins=bins)
        ax.stairs(counts, edges, fill=True, alpha=0.6, color="#1f77b4", label="quanta")
        _mark_quantiles(ax, values)
        duration_axis(ax)
        ax.set_xlim(0.8, max(float(values.max()) * 1.5, 10))
        ax.set_xlabel("run length per quantum (log scale)")
        ax.set_ylabel("quanta per bin")
        ax.set_title(
            f"{values.size:,} quanta · mean {format_duration_us(float(values.mean()))} · "
            f"max {format_duration_us(float(values.max()))}",
            fontweight="normal",
        )
        ax.legend(fontsize="small")


def busy_fraction(
    frame: pl.DataFrame, origin_us: int, timeline: Timeline
) -> tuple[np.ndarray, np.ndarray]:
    """(cpus, busy[cpu, bin]): the share of each time bin each CPU spent running the
    quanta of ``frame``. A quantum ending at ts ran over [ts - length, ts] and is
    split across the bins it overlaps (quanta on one CPU do not overlap)."""
    edges_us = origin_us + timeline.edges * US_PER_S
    cpus = np.unique(frame["cpu"].to_numpy())
    busy = np.zeros((cpus.size, timeline.nbins))
    ordered = frame.select("cpu", UPTIME_TIMESTAMP, RUN).sort("cpu", UPTIME_TIMESTAMP)
    cpu_col = ordered["cpu"].to_numpy()
    ends_all = ordered[UPTIME_TIMESTAMP].to_numpy().astype(np.float64)
    lens_all = ordered[RUN].to_numpy().astype(np.float64)
    bounds = [*np.searchsorted(cpu_col, cpus, side="left").tolist(), cpu_col.size]
    for i in range(cpus.size):
        ends = ends_all[bounds[i] : bounds[i + 1]]
        lens = lens_all[bounds[i] : bounds[i + 1]]
        starts = ends - lens
        done = np.concatenate([[0.0], np.cumsum(lens)])
        # B(edge): run time finished by edge, plus the part of the quantum straddling it.
        k = np.searchsorted(ends, edges_us, side="right")
        total = done[k]
        straddle = k < ends.size
        kk = np.minimum(k, ends.size - 1)
        part = np.where(straddle, np.clip(edges_us - starts[kk], 0, lens[kk]), 0.0)
        busy[i] = np.diff(total + part) / (timeline.width * US_PER_S)
    return cpus, np.clip(busy, 0, 1)


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
    """How long a runnable task waited before it ran (wake-up or preemption to running)."""

    name = "quanta_queued_time_cdf"
    title = "Run-queue wait (queued time) CDF"
    order = 12
    tables: ClassVar[tuple[str, ...]] = ("quanta_queued_time",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("quanta_queued_time")
        values = frame[QUEUED].to_numpy()
        ax = fig.subplots()
        bins = log_bins(values, per_decade=40)

        def cdf(v: np.ndarray) -> np.ndarray:
            counts, _ = np.histogram(np.clip(v, 1, None), bins=bins)
            return np.concatenate([[0.0], np.cumsum(counts) / max(v.size, 1)])

        cpus = np.unique(frame["cpu"].to_numpy())
        if 1 < cpus.size <= MAX_CPU_LINES:
            cpu_col = frame["cpu"].to_numpy()
            for cpu in cpus:
                ax.plot(bins, cdf(values[cpu_col == cpu]), linewidth=1, alpha=0.7,
                        label=f"CPU {cpu}")  # fmt: skip
        ax.plot(bins, cdf(values), color="black", linewidth=2, label="all CPUs")
        _mark_quantiles(ax, values, color="#555555")
        duration_axis(ax)
        ax.set_xlim(0.8, max(float(values.max()) * 1.5, 10))
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("queued time before running (log scale)")
        ax.set_ylabel("fraction of runs waiting ≤ x")
        ax.set_title(f"{values.size:,} runs", fontweight="normal")
        ax.legend(fontsize="small", loc="lower right")
