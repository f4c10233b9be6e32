"""Graphs of block_io: request latency distributions, I/O rates by operation and the
devices' queues (KernMLOps' block I/O queue graph)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import polars as pl

from kernmlops.graphs.base import (
    Distribution,
    Graph,
    GraphData,
    TableView,
    collect_all,
    counted,
    duration_axis,
    format_bytes,
    format_duration_us,
    histogram_bins,
)
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from collections.abc import Sequence

    from matplotlib.figure import Figure

SERVICE, QUEUE = "issue_to_complete_us", "queue_to_issue_us"
#: Ops drawn separately; the rest (FLUSH, DISCARD, ...) are drawn as "other".
MAIN_OPS = ("READ", "WRITE")
OP_COLORS = {"READ": "#1f77b4", "WRITE": "#d62728", "other": "#7f7f7f"}


class BlockIoView(TableView):
    """The report's figures: latencies of every request; bytes of reads and writes
    alone, as the rate graph draws them (a DISCARD's size is the range discarded,
    a whole device's at mkfs: no data moved); the other ops counted apart."""

    name = "block_io"
    key_columns = (SERVICE, QUEUE, "bytes")

    def summary_queries(self, frame: pl.DataFrame | pl.LazyFrame) -> list[pl.LazyFrame]:
        if not {"op", "bytes"} <= set(frame.collect_schema().names()):
            return super().summary_queries(frame)
        moved = frame.lazy().filter(pl.col("op").is_in(list(MAIN_OPS)))
        queries = [counted(moved if c == "bytes" else frame, c) for c in self.keys(frame)]
        others = (
            frame.lazy()
            .filter(~pl.col("op").is_in(list(MAIN_OPS)))
            .group_by("op")
            .agg(requests=pl.len(), bytes=pl.col("bytes").cast(pl.UInt64).sum())
            .sort("requests", "op", descending=[True, False])
        )
        return [*queries, others]

    def summarise(self, results: Sequence[pl.DataFrame]) -> list[tuple[str, str]]:
        out = super().summarise([r for r in results if "requests" not in r.columns])
        others = [r for r in results if "requests" in r.columns]
        if others and not others[0].is_empty():
            said = []
            for op, requests, size in others[0].iter_rows():
                said.append(f"{op} {requests:,}" + (f" ({format_bytes(size)})" if size else ""))
            out.append(("other requests", " · ".join(said)))
        return out


def _op_groups(counts: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
    """The rows of ``counts`` (per ``op_group``, see _tagged) of each op group, in
    drawing order; groups without rows left out."""
    groups = []
    for name in (*MAIN_OPS, "other"):
        part = counts.filter(pl.col("op_group") == name)
        if not part.is_empty():
            groups.append((name, part))
    return groups


def _tagged(frame: pl.LazyFrame) -> pl.LazyFrame:
    op = pl.when(pl.col("op").is_in(list(MAIN_OPS))).then(pl.col("op")).otherwise(pl.lit("other"))
    return frame.with_columns(op_group=op)


class BlockIoLatency(Graph):
    """Device service time (issue to completion) and time queued before issue, per op."""

    name = "block_io_latency"
    title = "Block I/O latency"
    order = 51
    tables: ClassVar[tuple[str, ...]] = ("block_io",)
    figsize: ClassVar[tuple[float, float]] = (11.0, 4.8)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = _tagged(data.frame("block_io"))
        axes = fig.subplots(1, 2)
        columns = (SERVICE, QUEUE)
        per_column = collect_all([counted(frame, c, "op_group") for c in columns])
        for ax, column, counts, what in (
            (axes[0], SERVICE, per_column[0], "device service time (issue → complete)"),
            (axes[1], QUEUE, per_column[1], "queued before issue (insert → issue)"),
        ):
            drawn = False
            present = Distribution.from_counts(counts, column)
            bins = histogram_bins(present.values) if present.size else None
            for op, part in _op_groups(counts):
                dist = Distribution.from_counts(part, column)
                if dist.size == 0 or bins is None:
                    continue
                # a share of each op's requests: a rare op's shape stays visible
                p50, p99 = dist.quantile(0.5), dist.quantile(0.99)
                ax.stairs(
                    dist.histogram(bins) / dist.size,
                    bins,
                    color=OP_COLORS[op],
                    linewidth=1.5,
                    label=f"{op}: {dist.size:,} · p50 {format_duration_us(p50)} · "
                    f"p99 {format_duration_us(p99)}",
                )
                drawn = True
            duration_axis(ax)
            zero_note = "; 0 µs at the left edge" if present.zeros() else ""
            ax.set_xlabel(f"{what} (log scale{zero_note})")
            ax.set_ylabel("share of the op's requests")
            ax.set_title(what.split(" (")[0], fontweight="normal")
            if drawn:
                ax.legend(fontsize="small")
            else:
                ax.text(0.5, 0.5, "no requests with this interval", ha="center",
                        va="center", transform=ax.transAxes, color="#777777")  # fmt: skip


class BlockIoRate(Graph):
    """Requests and bytes completed per second, per op."""

    name = "block_io_rate"
    title = "Block I/O rate"
    order = 50
    tables: ClassVar[tuple[str, ...]] = ("block_io",)
    figsize: ClassVar[tuple[float, float]] = (10.0, 6.0)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("block_io")
        tl = data.timeline([frame])
        # bytes is UInt32: per_bin sums it in 64 bits
        counts = data.per_bin(_tagged(frame), tl, "op_group", bytes=pl.col("bytes"))
        iops_ax, mib_ax = fig.subplots(2, 1, sharex=True)
        for op, part in _op_groups(counts):
            bins = part["bin"].to_numpy()
            kw = {"where": "mid", "color": OP_COLORS[op], "label": op, "linewidth": 1.3}
            iops_ax.step(tl.centers, tl.per_second(bins, part["n"].to_numpy()), **kw)
            if op in MAIN_OPS:  # a DISCARD's or FLUSH's size is no data moved
                moved = part["bytes"].cast(pl.Float64).to_numpy()
                mib_ax.step(tl.centers, tl.per_second(bins, moved) / (1 << 20), **kw)
        iops_ax.set_ylabel("requests/s")
        mib_ax.set_ylabel("MiB/s (reads and writes)")
        iops_ax.set_title(
            f"completed requests per {format_duration_us(tl.width * 1e6)} bin", fontweight="normal"
        )
        iops_ax.set_ylim(bottom=0)
        mib_ax.set_ylim(bottom=0)
        data.time_axis(iops_ax)
        data.time_axis(mib_ax, legend=False)
        iops_ax.set_xlabel("")


#: devices drawn in the queue graph, the busiest first
QUEUE_DEVICES = 6


class BlockIoQueue(Graph):
    """Each device's queue at a request's issue (requests in flight, and their size in
    4 KiB units: KernMLOps' queue lengths), the mean over the requests issued in a bin."""

    name = "block_io_queue"
    title = "Block I/O queue"
    order = 52
    tables: ClassVar[tuple[str, ...]] = ("block_io",)
    figsize: ClassVar[tuple[float, float]] = (10.0, 6.0)

    def draw(self, data: GraphData, fig: Figure) -> None:
        frame = data.frame("block_io")
        # a collection from before inflight_4k_ios has the request counts only
        sized = "inflight_4k_ios" in frame.collect_schema().names()
        tl = data.timeline([frame])
        issued = frame.filter(pl.col("inflight").is_not_null()).with_columns(
            (pl.col(UPTIME_TIMESTAMP).cast(pl.Int64) - pl.col(SERVICE).cast(pl.Int64)).alias(
                UPTIME_TIMESTAMP
            )  # binned at the issue, when the queue was read
        )
        sums = {"requests": pl.col("inflight")}
        if sized:
            sums["ios_4k"] = pl.col("inflight_4k_ios")
        counts = data.per_bin(issued, tl, "device", **sums)
        busiest = (
            counts.group_by("device")
            .agg(pl.col("n").sum())
            .sort(["n", "device"], descending=[True, False])
        )["device"].to_list()[:QUEUE_DEVICES]
        req_ax, size_ax = fig.subplots(2, 1, sharex=True)
        for device in busiest:
            part = counts.filter(pl.col("device") == device)
            bins, n = part["bin"].to_numpy(), part["n"].to_numpy().astype(float)
            for ax, column in ((req_ax, "requests"), (size_ax, "ios_4k")):
                if column not in part.columns:
                    continue
                mean = np.full(tl.nbins, np.nan)  # no issue in a bin: no reading of the queue
                mean[bins] = part[column].cast(pl.Float64).to_numpy() / n
                ax.step(tl.centers, mean, where="mid", linewidth=1.3, label=device)
        req_ax.set_ylabel("requests in flight")
        size_ax.set_ylabel("in flight (4 KiB units)")
        req_ax.set_title(
            f"the device's queue at each issue, mean per {format_duration_us(tl.width * 1e6)} bin",
            fontweight="normal",
        )
        for ax in (req_ax, size_ax):
            ax.set_ylim(bottom=0)
        if not busiest:
            req_ax.text(0.5, 0.5, "no request was seen issued", ha="center", va="center",
                        transform=req_ax.transAxes, color="#777777")  # fmt: skip
        elif not sized:
            size_ax.text(0.5, 0.5, "collected before kernmlops recorded the queue's size",
                         ha="center", va="center", transform=size_ax.transAxes,
                         color="#777777")  # fmt: skip
        data.time_axis(req_ax)
        data.time_axis(size_ax, legend=False)
        req_ax.set_xlabel("")
