"""Graph of mm_rss_stat: each process's resident set size over time."""

from __future__ import annotations

import math
from itertools import pairwise
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from kernmlops.graphs.base import (
    F,
    Graph,
    GraphData,
    NoData,
    TableView,
    bytes_unit,
    collect,
    format_bytes,
    row_count,
)
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: RSS as /proc/<pid>/status counts it (swap is not resident).
RSS_MEMBERS = ("file", "anon", "shmem")
TOP_PROCESSES = 8
#: Rows replayed at once (about 40 MiB): a larger table is replayed in time slices of
#: about this many rows, cut at equal steps of its time span, 16 a slice on average
#: (a step holding more is a slice alone).
SLICE_ROWS = 250_000


class MmRssStatView(TableView):
    name = "mm_rss_stat"
    # The process whose memory it is, not the task that happened to change it.
    tgid_column = "mm_tgid"
    unknown_tgid = 0
    key_columns = ("size_bytes",)


def rss_series(frame: F) -> F:
    """(ts_uptime_us, mm_tgid, rss_bytes) after each change: every counter event
    carries one member's new value, so each member is carried forward per process
    and the members summed. Processes of unknown mm (mm_tgid 0) are left out."""
    # maintain_order: of two changes in one µs, the later row is the later change
    frame = frame.filter(pl.col("mm_tgid") != 0).sort(UPTIME_TIMESTAMP, maintain_order=True)
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


def _slices(frame: pl.LazyFrame) -> list[pl.Expr | None]:
    """Filters cutting ``frame`` into time slices of about SLICE_ROWS rows, in time
    order ([None]: it is one slice). Each is a range of the timestamps themselves,
    so a scan skips the row groups outside it (their statistics say so)."""
    ts = pl.col(UPTIME_TIMESTAMP)
    n, lo, hi = collect(frame.select(row_count(UPTIME_TIMESTAMP), lo=ts.min(), hi=ts.max())).row(0)
    if n <= SLICE_ROWS:
        return [None]
    steps, width = 16 * math.ceil(n / SLICE_ROWS), hi - lo + 1
    step = (ts.cast(pl.Int64) - lo) * steps // width
    per_step = collect(frame.group_by(step.alias("step")).agg(n=row_count(UPTIME_TIMESTAMP)))
    cuts, rows = [0], 0
    for at, k in per_step.sort("step").iter_rows():
        if rows and rows + k > SLICE_ROWS:
            cuts.append(at)
            rows = 0
        rows += k
    # step >= a exactly where ts >= lo + ceil(a * width / steps)
    edges = [lo - (-a * width // steps) for a in [*cuts, steps]]
    return [ts.is_between(a, b, closed="left") for a, b in pairwise(edges)]


def rss_replay(frame: pl.LazyFrame, time_bin: pl.Expr) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(peaks, binned) of :func:`rss_series` over ``frame``: each process's largest
    RSS (mm_tgid, rss_bytes), and its RSS after its last change in each time bin
    (mm_tgid, ``time_bin``'s bin, ts_uptime_us, rss_bytes). A peak needs every
    change in time order, so the table is replayed slice by slice (_slices), each
    slice from the members' values the slices before it left: memory grows with a
    slice, not with the table."""
    columns = (UPTIME_TIMESTAMP, "mm_tgid", "member", "size_bytes")
    frame = frame.filter(pl.col("mm_tgid") != 0).select(columns)
    carried = pl.DataFrame(schema=frame.collect_schema())
    peaks, binned = [], []
    for where in _slices(frame):
        part = pl.concat([carried, collect(frame if where is None else frame.filter(where))])
        # the carried values are stamped 0, before every change: not changes themselves
        rss = rss_series(part).filter(pl.col(UPTIME_TIMESTAMP) > 0)
        peaks.append(rss.group_by("mm_tgid").agg(pl.col("rss_bytes").max()))
        binned.append(
            rss.with_columns(time_bin)
            .group_by("mm_tgid", "bin", maintain_order=True)
            .agg(pl.col(UPTIME_TIMESTAMP).last(), pl.col("rss_bytes").last())
        )
        carried = (
            part.filter(pl.col("member").is_in(RSS_MEMBERS) & pl.col("size_bytes").is_not_null())
            .sort(UPTIME_TIMESTAMP, maintain_order=True)
            .group_by("mm_tgid", "member")
            .agg(pl.col("size_bytes").last())
            .with_columns(pl.lit(0).cast(part.schema[UPTIME_TIMESTAMP]).alias(UPTIME_TIMESTAMP))
            .select(columns)
        )
    peak = pl.concat(peaks).group_by("mm_tgid").agg(pl.col("rss_bytes").max())
    last = (
        pl.concat(binned)  # a bin cut by two slices: its last change is in the later
        .group_by("mm_tgid", "bin", maintain_order=True)
        .agg(pl.col(UPTIME_TIMESTAMP).last(), pl.col("rss_bytes").last())
    )
    return peak, last


class RssOverTime(Graph):
    """RSS (file + anon + shmem) of the processes with the largest peak."""

    name = "rss_over_time"
    title = "Resident set size per process"
    order = 41
    tables: ClassVar[tuple[str, ...]] = ("mm_rss_stat",)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("mm_rss_stat")
        tl = data.timeline([frame], target=400)
        # The last value in each time bin: a few hundred points per process at most.
        peaks, binned = rss_replay(frame, data.time_bin(tl))
        if peaks.is_empty():
            raise NoData("mm_rss_stat")
        peaks = peaks.sort("rss_bytes", "mm_tgid", descending=[True, False])
        top = peaks.head(TOP_PROCESSES)
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
