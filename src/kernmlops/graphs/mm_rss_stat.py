"""Graph of mm_rss_stat: each process's resident set size over time."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.graphs.base import Graph, GraphData, NoData, TableView, bytes_unit, format_bytes
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: RSS as /proc/<pid>/status counts it (swap is not resident).
RSS_MEMBERS = ("file", "anon", "shmem")
TOP_PROCESSES = 8


class MmRssStatView(TableView):
    name = "mm_rss_stat"
    # The process whose memory it is, not the task that happened to change it.
    tgid_column = "mm_tgid"
    key_columns = ("size_bytes",)


def rss_series(frame: pl.DataFrame) -> pl.DataFrame:
    """(ts_uptime_us, mm_tgid, rss_bytes) after each change: every counter event
    carries one member's new value, so each member is carried forward per process
    and the members summed. Processes of unknown mm (mm_tgid 0) are left out."""
    frame = frame.filter(pl.col("mm_tgid") != 0).sort(UPTIME_TIMESTAMP)
    members = [
        pl.when(pl.col("member") == m)
        .then(pl.col("size_bytes"))
        .forward_fill()
        .over("mm_tgid")
        .fill_null(0)
        .alias(m)
        for m in RSS_MEMBERS
    ]
    return frame.with_columns(members).select(
        UPTIME_TIMESTAMP, "mm_tgid", rss_bytes=pl.sum_horizontal(*RSS_MEMBERS)
    )


class RssOverTime(Graph):
    """RSS (file + anon + shmem) of the processes with the largest peak."""

    name = "rss_over_time"
    title = "Resident set size per process"
    order = 41
    tables: ClassVar[tuple[str, ...]] = ("mm_rss_stat",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        rss = rss_series(data.frame("mm_rss_stat"))
        if rss.is_empty():
            raise NoData("mm_rss_stat")
        peaks = (
            rss.group_by("mm_tgid")
            .agg(pl.col("rss_bytes").max())
            .sort("rss_bytes", descending=True)
        )
        top = peaks.head(TOP_PROCESSES)
        tl = data.timeline([rss], target=400)
        # The last value in each time bin: a few hundred points per process at most.
        chosen = rss.filter(pl.col("mm_tgid").is_in(top["mm_tgid"].implode()))
        binned = (
            chosen.with_columns(bin=pl.Series(data.bin_of(chosen, tl)))
            .group_by("mm_tgid", "bin", maintain_order=True)
            .agg(pl.col(UPTIME_TIMESTAMP).last(), pl.col("rss_bytes").last())
        )
        unit, div = bytes_unit(float(top["rss_bytes"].max()))  # type: ignore[arg-type]
        ax = fig.subplots()
        for tgid, peak in top.iter_rows():
            part = binned.filter(pl.col("mm_tgid") == tgid)
            t = data.seconds(part)
            ax.step(t, part["rss_bytes"].to_numpy() / div, where="post", linewidth=1.4,
                    label=f"{data.name_of(tgid)} · peak {format_bytes(peak)}")  # fmt: skip
        ax.set_ylabel(f"RSS ({unit})")
        ax.set_ylim(bottom=0)
        shown = min(TOP_PROCESSES, peaks.height)
        ax.set_title(
            f"{shown} of {peaks.height} processes, largest peak first (file + anon + shmem)",
            fontweight="normal",
        )
        data.time_axis(ax, legend=False)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
