"""Graph of memory_usage (/proc/meminfo polled): system memory over time."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.graphs.base import Graph, GraphData, NoData, TableView, bytes_unit, collect
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: (label, expression in bytes) of what is drawn; meminfo fields as the hook names them.
SERIES: tuple[tuple[str, pl.Expr], ...] = (
    ("used (total − available)", pl.col("mem_total_bytes") - pl.col("mem_available_bytes")),
    ("anonymous", pl.col("anon_pages_bytes")),
    ("page cache", pl.col("cached_bytes") + pl.col("buffers_bytes")),
    ("slab", pl.col("slab_bytes")),
    ("free", pl.col("mem_free_bytes")),
)


class MemoryUsageView(TableView):
    name = "memory_usage"
    tgid_column = None
    key_columns = ("mem_available_bytes", "cached_bytes", "anon_pages_bytes", "dirty_bytes")


class MemoryUsage(Graph):
    """System memory: absolute levels, and the change since the first sample, which
    shows what the workload did where the levels dwarf it."""

    name = "memory_usage"
    title = "System memory (/proc/meminfo)"
    order = 40
    tables: ClassVar[tuple[str, ...]] = ("memory_usage",)
    figsize: ClassVar[tuple[float, float]] = (11.0, 4.8)

    def draw(self, data: GraphData, fig: Figure) -> None:
        scan = data.frame("memory_usage")
        columns = set(scan.collect_schema().names())
        series = [(label, expr) for label, expr in SERIES if _has(columns, expr)]
        # a sample every 100 ms: small enough to read, the columns drawn only
        used = {UPTIME_TIMESTAMP, "mem_total_bytes"} | {
            c for _, expr in series for c in expr.meta.root_names()
        }
        frame = collect(scan.select(sorted(used & columns)))
        values = frame.select(*(expr.cast(pl.Float64).alias(label) for label, expr in series))
        t = data.seconds(frame)
        level_ax, delta_ax = fig.subplots(1, 2)
        if not series:
            raise NoData("memory_usage")
        total = (
            float(frame["mem_total_bytes"].max())  # type: ignore[arg-type]
            if "mem_total_bytes" in frame.columns
            else None
        )
        unit, div = bytes_unit(total or float(values.max_horizontal().max()))  # type: ignore[arg-type]
        for label in values.columns:
            level_ax.plot(t, values[label].to_numpy() / div, linewidth=1.4, label=label)
        if total is not None:
            level_ax.axhline(total / div, color="black", linestyle=":", linewidth=1,
                             label="total")  # fmt: skip
        level_ax.set_ylim(bottom=0)
        level_ax.set_ylabel(unit)
        level_ax.set_title("levels", fontweight="normal")
        data.time_axis(level_ax, legend=False)
        level_ax.legend(fontsize="small", loc="center right")

        change = values.select(pl.all() - pl.all().first())
        peak = max(float(change.select(pl.all().abs().max()).max_horizontal()[0]), 1.0)
        d_unit, d_div = bytes_unit(peak)
        for label in change.columns:
            delta_ax.plot(t, change[label].to_numpy() / d_div, linewidth=1.4, label=label)
        delta_ax.axhline(0, color="black", linewidth=0.8)
        delta_ax.set_ylabel(f"change since first sample ({d_unit})")
        delta_ax.set_title("change since the first sample", fontweight="normal")
        data.time_axis(delta_ax)


def _has(columns: set[str], expr: pl.Expr) -> bool:
    return set(expr.meta.root_names()) <= columns
