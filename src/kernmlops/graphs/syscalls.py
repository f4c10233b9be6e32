"""Graphs of syscalls: the most frequent and the most time-consuming system calls,
and their latency distributions (the kernel's log2 histograms)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import (
    Graph,
    GraphData,
    NoData,
    TableView,
    collect,
    collect_all,
    duration_axis,
    format_duration_us,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

TOP_N = 15
HIST = "latency_log2_hist"
#: Latency distributions drawn for this many syscalls (most calls first).
HIST_LINES = 6


class SyscallsView(TableView):
    name = "syscalls"

    def summary_queries(self, frame: pl.DataFrame | pl.LazyFrame) -> list[pl.LazyFrame]:
        sums = pl.col("count", "errors", "completed", "total_latency_ns").cast(pl.UInt64).sum()
        return [frame.lazy().select(sums, distinct=pl.col("syscall").n_unique())]

    def summarise(self, results: Sequence[pl.DataFrame]) -> list[tuple[str, str]]:
        calls, errors, done, lat, distinct = results[0].row(0)
        mean = format_duration_us(lat / done / 1000) if done else "-"
        return [
            ("calls", f"{calls:,} of {distinct} syscalls · {errors:,} failed"),
            ("latency", f"{lat / 1e9:,.3f} s in total · mean {mean}"),
        ]


def totals(frame: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Per syscall: calls, errors, completed, time (ns); rows hold per-interval changes."""
    return collect(
        frame.lazy()
        .group_by("syscall")
        .agg(pl.col("count", "errors", "completed", "total_latency_ns").cast(pl.UInt64).sum())
        .sort("count", "syscall", descending=[True, False])
    )


class SyscallTopN(Graph):
    """The syscalls made most often (failures darker) and those that took the most time."""

    name = "syscalls_top"
    title = f"System calls: top {TOP_N}"
    order = 30
    tables: ClassVar[tuple[str, ...]] = ("syscalls",)
    figsize: ClassVar[tuple[float, float]] = (11.0, 5.5)

    def draw(self, data: GraphData, fig: Figure) -> None:
        per = totals(data.frame("syscalls"))
        count_ax, time_ax = fig.subplots(1, 2)
        by_count = per.head(TOP_N).reverse()
        y = np.arange(by_count.height)
        bars = count_ax.barh(y, by_count["count"].to_numpy(), color="#1f77b4", label="calls")
        count_ax.barh(y, by_count["errors"].to_numpy(), color="#d62728", label="failed")
        count_ax.bar_label(bars, [f" {n:,}" for n in by_count["count"].to_list()], fontsize=8)
        count_ax.set_yticks(y, by_count["syscall"].to_list())
        count_ax.set_xlabel("calls")
        count_ax.set_title(f"most calls ({int(per['count'].sum()):,} in all)", fontweight="normal")
        count_ax.legend(fontsize="small", loc="lower right")
        count_ax.grid(axis="y", visible=False)

        by_time = per.sort("total_latency_ns", descending=True).head(TOP_N).reverse()
        seconds = by_time["total_latency_ns"].to_numpy() / 1e9
        unit, scale = ("s", 1.0) if seconds.max(initial=0) >= 1 else ("ms", 1e3)
        y = np.arange(by_time.height)
        bars = time_ax.barh(y, seconds * scale, color="#ff7f0e")
        time_ax.bar_label(bars, [f" {format_duration_us(v * 1e6)}" for v in seconds], fontsize=8)
        time_ax.set_yticks(y, by_time["syscall"].to_list())
        time_ax.set_xlabel(f"time in the syscall, summed over calls ({unit})")
        time_ax.set_title("most time (entry to exit)", fontweight="normal")
        time_ax.grid(axis="y", visible=False)
        for ax in (count_ax, time_ax):
            ax.margins(x=0.15)  # room for the labels


class SyscallLatency(Graph):
    """Latency distribution of the most frequent syscalls, from the in-kernel log2
    histograms (slot i: [2^i, 2^(i+1)) ns)."""

    name = "syscalls_latency"
    title = "System call latency"
    order = 31
    tables: ClassVar[tuple[str, ...]] = ("syscalls",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("syscalls")
        top = totals(frame).filter(pl.col("completed") > 0).head(HIST_LINES)
        if top.is_empty():
            raise NoData("syscalls")
        # each top syscall's histograms summed slot by slot: one row per slot
        slots = (
            frame.filter(pl.col("syscall").is_in(top["syscall"].implode()))
            .select("syscall", HIST, slot=pl.int_ranges(pl.col(HIST).list.len()))
            .explode(HIST, "slot")
            .group_by("syscall", "slot")
            .agg(pl.col(HIST).cast(pl.UInt64).sum())
        )
        widest, summed = collect_all([frame.select(pl.col(HIST).list.len().max()), slots])
        width = int(widest.item())
        hist = {
            name: np.bincount(part["slot"].to_numpy(), part[HIST].to_numpy(), minlength=width)
            for (name,), part in summed.group_by("syscall")
        }
        ax = fig.subplots()
        edges_us = 2.0 ** np.arange(width + 1) / 1000
        used = np.zeros(width, dtype=bool)
        for name, calls in top.select("syscall", "completed").iter_rows():
            counts = hist.get(name, np.zeros(width))
            if counts.sum() == 0:
                continue
            used |= counts > 0
            ax.stairs(counts / counts.sum(), edges_us, linewidth=1.5,
                      label=f"{name} ({calls:,} calls)")  # fmt: skip
        slots = np.flatnonzero(used)
        if slots.size == 0:
            raise NoData("syscalls")
        duration_axis(ax)
        ax.set_xlim(edges_us[max(slots[0] - 1, 0)], edges_us[min(slots[-1] + 2, width)])
        ax.set_xlabel("latency (log2 buckets)")
        ax.set_ylabel("fraction of calls")
        ax.set_title(f"{top.height} syscalls with the most calls", fontweight="normal")
        ax.legend(fontsize="small")
