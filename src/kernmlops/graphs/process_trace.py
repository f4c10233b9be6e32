"""Graph of process_trace: forks, execs and exits per second."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.graphs.base import Graph, GraphData, format_duration_us

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KINDS = {"fork": "#1f77b4", "exec": "#ff7f0e", "exit": "#7f7f7f"}


class ProcessEvents(Graph):
    """Process and thread creation (fork), program starts (exec) and exits over time."""

    name = "process_events"
    title = "Process events"
    order = 20
    tables: ClassVar[tuple[str, ...]] = ("process_trace",)
    figsize: ClassVar[tuple[float, float]] = (10.0, 4.0)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("process_trace")
        tl = data.timeline([frame])
        counts = data.per_bin(frame, tl, "kind")
        ax = fig.subplots()
        for kind, color in KINDS.items():
            part = counts.filter(pl.col("kind") == kind)
            if part.is_empty():
                continue
            n = part["n"].to_numpy()
            ax.step(tl.centers, tl.per_second(part["bin"].to_numpy(), n), where="mid",
                    color=color, linewidth=1.3, label=f"{kind}: {int(n.sum()):,}")  # fmt: skip
        ax.set_ylabel("events/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"per {format_duration_us(tl.width * 1e6)} bin (threads included)",
                     fontweight="normal")  # fmt: skip
        data.time_axis(ax)
