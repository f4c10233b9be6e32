"""Graph of page_faults: faults per second over time, user and kernel; the report's
figures for the table (faults in all, by kind, rate).

With sampling (hooks.page_faults.sample_every N > 1) each row stands for N faults.
The hook keeps the exact counts in the manifest (hooks.page_faults.counters:
``faults``, ``faults_<kind>``, as kernmlops.hooks.page_faults names them); the
legends and the report use them where the manifest has them and the rows drawn are
all the traced tasks' (no --tgid/--comm selection). Elsewhere (a collection made
before the hook kept them, or a selection) the count is rows × N, and said to be an
estimate where N > 1.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.graphs.base import Graph, GraphData, TableView, format_duration_us
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from matplotlib.figure import Figure

COLORS = {"user": "#1f77b4", "kernel": "#9467bd"}
#: the hook's counter of every fault; ``faults_<kind>`` those of one kind
COUNTER_ALL = "faults"


@dataclass(frozen=True)
class FaultCounts:
    """How the rows of page_faults become fault counts: each row stands for ``every``
    faults; ``exact`` is the manifest's counters (None: not kept, or not for these rows)."""

    every: int = 1
    exact: Mapping[str, int] | None = None

    @classmethod
    def of(cls, data: GraphData) -> FaultCounts:
        manifest = data.manifest
        config = ((manifest.get("config") or {}).get("hooks") or {}).get("page_faults") or {}
        hook = (manifest.get("hooks") or {}).get("page_faults") or {}
        counters = hook.get("counters") or {}
        # the counters are of every traced task: a selection's rows are fewer
        exact = counters if COUNTER_ALL in counters and not data.selection else None
        return cls(int(config.get("sample_every") or 1), exact)

    def total(self, rows: int) -> int:
        """All faults, of ``rows`` rows of every kind."""
        return self.exact[COUNTER_ALL] if self.exact is not None else rows * self.every

    def of_kind(self, kind: str, rows: int) -> int:
        """Faults of ``kind``, of its ``rows`` rows."""
        if self.exact is not None and f"{COUNTER_ALL}_{kind}" in self.exact:
            return self.exact[f"{COUNTER_ALL}_{kind}"]
        return rows * self.every

    @property
    def estimated(self) -> bool:
        """Whether the counts are rows × N (N > 1), not counted."""
        return self.exact is None and self.every > 1

    def said(self, n: int) -> str:
        """``n`` faults as the legend and the report write them: "≈" where estimated."""
        return f"≈{n:,}" if self.estimated else f"{n:,}"

    def how(self) -> str:
        """Where the counts come from, in a few words."""
        if self.exact is not None:
            return "exact, counted in the kernel"
        if self.every > 1:
            return f"estimate: rows × {self.every}, 1 in {self.every} sampled"
        return "one row per fault"


class PageFaultsView(TableView):
    """The report's figures: faults in all, by kind, and their rate over the rows'
    span, exact where the manifest has the hook's counts (:class:`FaultCounts`)."""

    name = "page_faults"

    def __init__(self, counts: FaultCounts | None = None) -> None:
        self.counts = counts or FaultCounts()

    def for_data(self, data: GraphData) -> TableView:
        view = copy.copy(self)
        view.counts = FaultCounts.of(data)
        return view

    def summary_queries(self, frame: pl.DataFrame | pl.LazyFrame) -> list[pl.LazyFrame]:
        if not {"kind", UPTIME_TIMESTAMP} <= set(frame.collect_schema().names()):
            return super().summary_queries(frame)
        ts = pl.col(UPTIME_TIMESTAMP).cast(pl.Int64)
        return [
            frame.lazy()
            .group_by("kind")
            .agg(rows=pl.len(), lo=ts.min(), hi=ts.max())
            .sort("rows", "kind", descending=[True, False])
        ]

    def summarise(self, results: Sequence[pl.DataFrame]) -> list[tuple[str, str]]:
        found = [r for r in results if "rows" in r.columns and "kind" in r.columns]
        if not found or found[0].is_empty():
            return super().summarise(results)
        kinds = found[0]
        c = self.counts
        total = c.total(int(kinds["rows"].sum()))
        out = [("faults", f"{c.said(total)} ({c.how()})")]
        by_kind = [
            f"{kind} {c.said(c.of_kind(kind, rows))}"
            for kind, rows in kinds.select("kind", "rows").iter_rows()
        ]
        out.append(("by kind", " · ".join(by_kind)))
        span_us = int(kinds["hi"].max()) - int(kinds["lo"].min())  # type: ignore[arg-type]
        if span_us > 0:
            rate = total / (span_us / 1e6)
            out.append(
                ("rate", f"{c.said(round(rate))} faults/s over {format_duration_us(span_us)}")
            )
        return out


class PageFaultRate(Graph):
    """Page faults per second, by where they happened. With sampling
    (hooks.page_faults.sample_every > 1) the rate is scaled back up; the legend's
    totals are the manifest's exact counts where it has them (:class:`FaultCounts`)."""

    name = "page_fault_rate"
    title = "Page faults"
    order = 42
    tables: ClassVar[tuple[str, ...]] = ("page_faults",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("page_faults")
        counts = FaultCounts.of(data)
        every = counts.every
        tl = data.timeline([frame])
        binned = data.per_bin(frame, tl, "kind")
        ax = fig.subplots()
        for (kind,), part in binned.sort("kind").group_by("kind", maintain_order=True):
            n = part["n"].to_numpy()
            rate = tl.per_second(part["bin"].to_numpy(), n) * every
            total = counts.said(counts.of_kind(str(kind), int(n.sum())))
            ax.step(tl.centers, rate, where="mid", linewidth=1.3, color=COLORS.get(kind),
                    label=f"{kind}: {total} faults")  # fmt: skip
        ax.set_ylabel("faults/s")
        ax.set_ylim(bottom=0)
        note = ""
        if every > 1:
            how = "totals exact" if counts.exact is not None else "totals ≈ rows × N"
            note = f" (1 in {every} sampled; {how})"
        ax.set_title(f"per {format_duration_us(tl.width * 1e6)} bin{note}", fontweight="normal")
        data.time_axis(ax)
