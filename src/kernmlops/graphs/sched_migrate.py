"""Graph of sched_migrate: task migrations counted by (source CPU, destination CPU)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import Graph, GraphData, TableView, collect, row_count

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


def pair_counts(frame: pl.DataFrame | pl.LazyFrame, *by: str) -> pl.DataFrame:
    """Migrations (``n``) per ``by``..., orig_cpu, dest_cpu."""
    pairs = frame.lazy().group_by(*by, "orig_cpu", "dest_cpu")
    return collect(pairs.agg(n=row_count("orig_cpu")))


def pair_matrix(frame: pl.DataFrame | pl.LazyFrame, ncpu: int) -> np.ndarray:
    """counts[orig_cpu, dest_cpu] of the migrations ``frame`` holds: one per row, or
    counted (its ``n`` column, as :func:`pair_counts` gives them)."""
    pairs = frame.lazy()
    if "n" not in pairs.collect_schema():
        pairs = pairs.with_columns(n=pl.lit(1, pl.UInt64))
    summed = collect(pairs.group_by("orig_cpu", "dest_cpu").agg(pl.col("n").sum()))
    matrix = np.zeros((ncpu, ncpu), dtype=np.int64)
    matrix[summed["orig_cpu"].to_numpy(), summed["dest_cpu"].to_numpy()] = summed["n"].to_numpy()
    return matrix


class MigrationsByCpuPair(Graph):
    """Heat maps of migrations from each CPU to each CPU, one per kind."""

    name = "migrations_by_cpu_pair"
    title = "Task migrations by CPU pair"
    order = 13
    tables: ClassVar[tuple[str, ...]] = ("sched_migrate",)
    figsize: ClassVar[tuple[float, float]] = (11.0, 5.0)

    def draw(self, data: GraphData, fig: Figure) -> None:
        counts = pair_counts(data.frame("sched_migrate"), "kind")
        cpus = (data.manifest.get("system") or {}).get("logical_cpus")
        top = int(max(counts["orig_cpu"].max(), counts["dest_cpu"].max())) + 1  # type: ignore[call-overload]
        ncpu = max(int(cpus or 0), top)
        seen = set(counts["kind"].drop_nulls().unique().to_list())
        kinds = [k for k in KINDS if k in seen]
        others = sorted(seen - set(KINDS))
        panels = [(k, counts.filter(pl.col("kind") == k)) for k in kinds + others] or [
            ("all", counts)
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
            ax.set_title(f"{kind}: {int(part['n'].sum()):,} — {KINDS.get(kind, '')}".rstrip(" —"),
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
