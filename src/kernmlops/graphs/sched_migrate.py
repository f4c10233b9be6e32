"""Graph of sched_migrate: task migrations counted by (source CPU, destination CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import Graph, GraphData, TableView

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Counts are written in the cells up to this many CPUs.
ANNOTATE_CPUS = 8
KINDS = {
    "wakeup": "placed at wake-up",
    "queued": "moved while runnable (balancing, NUMA, affinity)",
}


class SchedMigrateView(TableView):
    name = "sched_migrate"
    key_columns = ("orig_nr_running", "dest_nr_running", "orig_load_avg", "dest_load_avg")


def pair_matrix(frame: pl.DataFrame, ncpu: int) -> np.ndarray:
    """counts[orig_cpu, dest_cpu]."""
    pairs = frame.group_by("orig_cpu", "dest_cpu").len()
    matrix = np.zeros((ncpu, ncpu), dtype=np.int64)
    matrix[pairs["orig_cpu"].to_numpy(), pairs["dest_cpu"].to_numpy()] = pairs["len"].to_numpy()
    return matrix


class MigrationsByCpuPair(Graph):
    """Heat maps of migrations from each CPU to each CPU, one per kind."""

    name = "migrations_by_cpu_pair"
    title = "Task migrations by CPU pair"
    order = 13
    tables: ClassVar[tuple[str, ...]] = ("sched_migrate",)
    figsize: ClassVar[tuple[float, float]] = (11.0, 5.0)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("sched_migrate")
        cpus = (data.manifest.get("system") or {}).get("logical_cpus")
        top = int(max(frame["orig_cpu"].max(), frame["dest_cpu"].max())) + 1  # type: ignore[call-overload]
        ncpu = max(int(cpus or 0), top)
        kinds = [k for k in KINDS if k in set(frame["kind"].unique().to_list())]
        others = sorted(set(frame["kind"].unique().to_list()) - set(KINDS))
        panels = [(k, frame.filter(pl.col("kind") == k)) for k in kinds + others] or [
            ("all", frame)
        ]
        matrices = [pair_matrix(part, ncpu) for _, part in panels]
        vmax = max(int(m.max()) for m in matrices) or 1
        axes = fig.subplots(1, len(panels), squeeze=False).ravel()
        image = None
        for ax, (kind, part), matrix in zip(axes, panels, matrices, strict=True):
            image = ax.imshow(matrix, cmap="Blues", vmin=0, vmax=vmax, origin="upper")
            ax.grid(False)
            ax.set_xlabel("destination CPU")
            ax.set_ylabel("source CPU")
            ax.set_title(f"{kind}: {part.height:,} — {KINDS.get(kind, '')}".rstrip(" —"),
                         fontweight="normal", fontsize=10)  # fmt: skip
            step = max(1, ncpu // 16)
            ax.set_xticks(np.arange(0, ncpu, step))
            ax.set_yticks(np.arange(0, ncpu, step))
            if ncpu <= ANNOTATE_CPUS:
                for (i, j), n in np.ndenumerate(matrix):
                    if n:
                        ax.text(j, i, f"{n:,}", ha="center", va="center", fontsize=9,
                                color="white" if n > vmax * 0.6 else "black")  # fmt: skip
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes), shrink=0.85, pad=0.02)
            bar.set_label("migrations")
