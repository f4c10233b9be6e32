"""Graph of page_faults: faults per second over time, user and kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from kernmlops.graphs.base import Graph, GraphData, format_duration_us

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"user": "#1f77b4", "kernel": "#9467bd"}


class PageFaultRate(Graph):
    """Page faults per second, by where they happened. With sampling
    (hooks.page_faults.sample_every > 1) the rate is scaled back up."""

    name = "page_fault_rate"
    title = "Page faults"
    order = 42
    tables: ClassVar[tuple[str, ...]] = ("page_faults",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("page_faults")
        every = (
            ((data.manifest.get("config") or {}).get("hooks") or {}).get("page_faults") or {}
        ).get("sample_every") or 1
        tl = data.timeline([frame])
        counts = data.per_bin(frame, tl, "kind")
        ax = fig.subplots()
        for (kind,), part in counts.sort("kind").group_by("kind", maintain_order=True):
            n = part["n"].to_numpy()
            rate = tl.per_second(part["bin"].to_numpy(), n) * every
            ax.step(tl.centers, rate, where="mid", linewidth=1.3, color=COLORS.get(kind),
                    label=f"{kind}: {int(n.sum()) * every:,} faults")  # fmt: skip
        ax.set_ylabel("faults/s")
        ax.set_ylim(bottom=0)
        note = f" (1 in {every} sampled)" if every > 1 else ""
        ax.set_title(f"per {format_duration_us(tl.width * 1e6)} bin{note}", fontweight="normal")
        data.time_axis(ax)
