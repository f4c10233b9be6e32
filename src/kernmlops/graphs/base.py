"""What a graph is, and the facts every graph of a collection shares.

A graph is a :class:`Graph` subclass in a module of ``kernmlops.graphs`` named after
its table (``graphs/block_io.py`` draws ``block_io``). It names the tables it needs
and draws on a matplotlib ``Figure`` from a :class:`GraphData`: the collection's
tables with the tgid/comm selection applied, one time origin, and the benchmark's
start and stop. Discovery is the hooks' (:func:`kernmlops.registry.discover`): a new
module is all a new table's graphs need.

Tables are LazyFrames, scanned and not read: a ten-minute switch storm collects
billions of rows, more than memory holds. A graph asks polars for what it draws
(rows per time bin, per CPU pair, per value) and collects only that, with the
streaming engine (:func:`collect`), so its memory grows with the figure, never
with the rows.

A table that needs more than the defaults (another tgid column, its own summary in
the report) says so with a :class:`TableView` in the same module.

Nothing here imports matplotlib: the figure is handed in by the renderer.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import polars as pl

from kernmlops.counters import counter_value, is_counter_time
from kernmlops.errors import KernmlopsError
from kernmlops.stats import quantile_of_counts
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kernmlops.data import Collection, LazyCollection

__all__ = [
    "Distribution",
    "Graph",
    "GraphData",
    "Marker",
    "NoData",
    "SelectionError",
    "TableView",
    "Timeline",
    "collect",
    "collect_all",
    "counted",
    "duration_axis",
    "format_bytes",
    "format_duration_us",
    "log_bins",
    "nice_bin_s",
    "row_count",
]

US_PER_S = 1_000_000

#: A table as read (a DataFrame: tests, notebooks) or scanned (a LazyFrame), and a
#: function's frame that is returned as the kind it came.
Frame = pl.DataFrame | pl.LazyFrame
F = TypeVar("F", pl.DataFrame, pl.LazyFrame)


class NoData(Exception):
    """Raised by a graph whose tables are empty for this selection: no figure."""


class SelectionError(KernmlopsError):
    """A --tgid / --comm selection matches nothing in the collection."""


# -- queries ---------------------------------------------------------------------------


def collect(frame: pl.LazyFrame) -> pl.DataFrame:
    """``frame`` collected by polars' streaming engine: the scan is read in batches
    and only the result is held (the in-memory engine reads every column it needs
    whole first)."""
    return frame.collect(engine="streaming")


def collect_all(frames: Sequence[pl.LazyFrame]) -> list[pl.DataFrame]:
    """:func:`collect` of several queries at once (polars runs them side by side)."""
    return pl.collect_all(list(frames), engine="streaming") if frames else []


def row_count(column: str) -> pl.Expr:
    """The rows where ``column`` is set, as a 64-bit count: ``pl.len()`` stops at
    2^32 rows in polars' default build, fewer than a ten-minute storm collects."""
    return pl.col(column).is_not_null().cast(pl.UInt64).sum()


#: integer types polars sums in their own width (narrower ones it sums as Int64)
_WRAPPING = {pl.Int32: pl.Int64, pl.UInt32: pl.UInt64}


def wide_sums(frame: pl.DataFrame | pl.LazyFrame, exprs: dict[str, pl.Expr]) -> dict[str, pl.Expr]:
    """Each of ``exprs`` summed, a 32-bit integer one cast to 64 bits first: polars
    sums an ``Int32``/``UInt32`` column in 32 bits, so ``block_io.bytes`` (UInt32 in
    the Parquet files) would wrap past 4 GiB without a word."""
    dtypes = frame.lazy().select(**exprs).collect_schema()
    return {
        k: (e.cast(_WRAPPING[dtypes[k]]) if dtypes[k] in _WRAPPING else e).sum()
        for k, e in exprs.items()
    }


def counted(frame: pl.DataFrame | pl.LazyFrame, column: str, *by: str) -> pl.LazyFrame:
    """How many rows have each value of ``column`` (per ``by``), nulls left out:
    columns ``by``..., ``column``, ``n``. What a histogram, a mean and exact
    quantiles need, in memory that grows with the distinct values (a whole-µs
    column's range), not with the rows."""
    return (
        frame.lazy()
        .filter(pl.col(column).is_not_null())
        .group_by(*by, column)
        .agg(n=row_count(column))
    )


@dataclass(frozen=True)
class Distribution:
    """A column's values as the distinct values (ascending) and the rows of each."""

    values: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, frame: pl.DataFrame | pl.LazyFrame, column: str) -> Distribution:
        return cls.from_counts(collect(counted(frame, column)), column)

    @classmethod
    def from_counts(cls, counts: pl.DataFrame, column: str) -> Distribution:
        """From a :func:`counted` result (a value may come once per group)."""
        values, where = np.unique(counts[column].to_numpy(), return_inverse=True)
        rows = np.bincount(where.ravel(), weights=counts["n"].to_numpy(), minlength=values.size)
        return cls(values, rows.astype(np.int64))

    @property
    def size(self) -> int:
        return int(self.counts.sum())

    def max(self) -> float:
        return float(self.values[-1])

    def mean(self) -> float:
        return float(np.dot(self.values.astype(np.float64), self.counts) / self.size)

    def share_at_most(self, x: np.ndarray) -> np.ndarray:
        """The share of rows whose value is at most each of ``x`` (the CDF at ``x``),
        exactly: a zero counts at 0, not at the first bin of a log axis."""
        ends = np.concatenate([[0], np.cumsum(self.counts)])
        return ends[np.searchsorted(self.values, x, side="right")] / max(self.size, 1)

    def histogram(self, bins: np.ndarray) -> np.ndarray:
        """Rows per bin. Zeros fall in the first bin: its own [ZERO_X, 1) where
        :func:`histogram_bins` made one, else [1, 2) with the ones."""
        counts, _ = np.histogram(
            np.clip(self.values, bins[0], None), bins=bins, weights=self.counts
        )
        return counts

    def zeros(self) -> int:
        """How many rows are 0."""
        return int(self.counts[self.values == 0].sum())

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the rows, exactly (kernmlops.stats: the smallest value
        with at least q of the rows at or below it), from the value counts, because
        polars' own quantile in a query gathers the whole column."""
        return quantile_of_counts(self.values, self.counts, q)


# -- tables ------------------------------------------------------------------------------


class TableView:
    """How graphs and the report read one table. Subclass it beside the table's
    graphs only where the defaults do not fit."""

    #: the table's name
    name: ClassVar[str]
    #: the column naming the process a row belongs to, for --tgid/--comm; None for a
    #: system-wide table (the selection does not apply to it)
    tgid_column: ClassVar[str | None] = "tgid"
    #: a value of ``tgid_column`` that names no process (mm_rss_stat's 0: the mm's
    #: owner unknown), not counted as one
    unknown_tgid: ClassVar[int | None] = None
    #: columns whose distribution the report summarises (default: every numeric
    #: column with a unit suffix, at most six)
    key_columns: ClassVar[tuple[str, ...] | None] = None

    def for_data(self, data: GraphData) -> TableView:
        """The view as it summarises ``data``'s table: itself, where the rows alone make
        its figures; a view that needs the manifest or the selection too (page_faults'
        exact counts) returns a copy that holds them."""
        return self

    def summary(self, frame: pl.DataFrame | pl.LazyFrame) -> list[tuple[str, str]]:
        """(label, value) pairs for the report: mean, p50, p99, max of each key
        column, formatted in its unit (from each column's value counts: the table
        is not read). The figures of :meth:`summary_queries`, as :meth:`summarise`
        words them (the report runs the queries in one with its own): a view of its
        own overrides those two, never this."""
        return self.summarise(collect_all(self.summary_queries(frame)))

    def summary_queries(self, frame: pl.DataFrame | pl.LazyFrame) -> list[pl.LazyFrame]:
        """The queries over ``frame`` the summary is made from: each key column's value
        counts (:func:`counted`)."""
        return [counted(frame, c) for c in self.keys(frame)]

    def summarise(self, results: Sequence[pl.DataFrame]) -> list[tuple[str, str]]:
        """The summary's (label, value) pairs from the results of
        :meth:`summary_queries`, in their order."""
        out = []
        for counts in results:
            if counts.is_empty():
                continue
            col = counts.columns[0]  # counted without by: the column, then n
            dist = Distribution.from_counts(counts, col)
            q = dist.quantile
            fmt = unit_formatter(col)
            out.append(
                (
                    col,
                    f"mean {fmt(dist.mean())} · p50 {fmt(q(0.5))} · "
                    f"p99 {fmt(q(0.99))} · max {fmt(dist.max())}",
                )
            )
        return out

    def keys(self, frame: pl.DataFrame | pl.LazyFrame) -> list[str]:
        schema = frame.collect_schema()
        if self.key_columns is not None:
            return [c for c in self.key_columns if c in schema]
        # a counter's table (task_perf's, one per event): the counter's value, not the
        # times it was enabled and running (µs columns, but no figure of the workload)
        count = counter_value(schema.names())
        if count is not None:
            return [count]
        found = [
            c
            for c, dtype in schema.items()
            if c != UPTIME_TIMESTAMP
            and dtype.is_numeric()
            and c.endswith(("_us", "_ns", "_bytes"))
            and not is_counter_time(c)
        ]
        return found[:6]


def default_view(table: str) -> TableView:
    view = type(f"{table}_view", (TableView,), {"name": table})
    return view()


def unit_formatter(column: str):
    if column.endswith("_us"):
        return format_duration_us
    if column.endswith("_ns"):
        return lambda v: format_duration_us(None if v is None else v / 1000)
    if column == "bytes" or column.endswith("_bytes"):
        return format_bytes
    return format_number


def format_number(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _sig(value: float) -> str:
    """Three significant digits, never in exponent form (1,023 rather than 1.02e+03)."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def format_duration_us(value: float | None) -> str:
    """12 µs, 3.4 ms, 1.25 s."""
    if value is None or math.isnan(value):
        return "-"
    if abs(value) < 1000:
        return f"{_sig(value)} µs"
    if abs(value) < US_PER_S:
        return f"{_sig(value / 1000)} ms"
    return f"{_sig(value / US_PER_S)} s"


def format_bytes(value: float | None) -> str:
    """1.5 KiB, 230 MiB, 23.5 GiB."""
    if value is None or math.isnan(value):
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{_sig(value / size)} {unit}"
    return f"{value:.0f} B"


def bytes_unit(max_value: float) -> tuple[str, float]:
    """The unit that keeps the largest value readable: (name, divisor)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if max_value >= 2 * size:
            return unit, float(size)
    return "B", 1.0


# -- binning -------------------------------------------------------------------------------


def nice_bin_s(span_s: float, target: int = 150) -> float:
    """A round bin width (1, 2, 5 × 10^k s) that cuts ``span_s`` into about ``target``
    bins, at least 1 ms."""
    raw = max(span_s / max(target, 1), 1e-3)
    exp = math.floor(math.log10(raw))
    for step in (1, 2, 5, 10):
        width = step * 10.0**exp
        if width >= raw:
            return width
    return 10.0 ** (exp + 1)


#: The left edge of the log duration axes. A log axis has no 0: what is drawn for 0 µs
#: sits here, on the edge, where it is not taken for a value between 1 and 2 µs.
ZERO_X = 0.8


def histogram_bins(values: np.ndarray) -> np.ndarray:
    """:func:`log_bins`, with a bin of its own for zeros, [ZERO_X, 1), on the axis'
    left edge, where ``values`` hold a 0: not counted with the values of 1 µs."""
    bins = log_bins(values)
    return np.concatenate([[ZERO_X], bins]) if values.size and values.min() < 1 else bins


def log_bins(values: np.ndarray, per_decade: int = 12) -> np.ndarray:
    """Logarithmic bin edges covering whole-µs ``values`` (clip them to >= 1: zeros
    belong to the first bin). Edges are whole numbers, so no bin below 10 falls
    between two integers and stays empty."""
    hi = max(float(values.max()) if values.size else 1.0, 1.0)
    decades = max(math.ceil(math.log10(hi + 1)), 1)
    return np.unique(np.floor(np.logspace(0, decades, decades * per_decade + 1)))


def duration_axis(ax: Axes, which: str = "x") -> None:
    """Log scale with ticks written as durations (1 µs, 10 ms, 1 s) for µs data."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(lambda v, _: format_duration_us(v)))


# -- what every graph of one collection shares ----------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """``nbins`` bins of ``width`` seconds from ``start`` (seconds since the origin).

    ``observed_us``: the first and the last µs of the collection (from the origin),
    where known. Rows before the first edge count in the first bin and rows past the
    last edge in the last (:meth:`GraphData.time_bin` clips), so the bins at the ends
    are observed from the first µs and up to the last, not over their width.
    """

    start: float
    width: float
    nbins: int
    observed_us: tuple[int, int] | None = None

    @property
    def start_us(self) -> int:
        """``start`` in whole µs from the origin (a multiple of :attr:`width_us`)."""
        return round(self.start * US_PER_S)

    @property
    def width_us(self) -> int:
        """``width`` in whole µs (a round width of at least 1 ms: exact)."""
        return round(self.width * US_PER_S)

    @property
    def edges(self) -> np.ndarray:
        return self.start + self.width * np.arange(self.nbins + 1)

    @property
    def centers(self) -> np.ndarray:
        return self.start + self.width * (np.arange(self.nbins) + 0.5)

    @property
    def observed_s(self) -> np.ndarray:
        """Seconds of each bin within the collection: the width, but at the ends."""
        if self.observed_us is None:
            return np.full(self.nbins, self.width)
        lo, hi = self.observed_us
        hi += 1  # a row's µs is observed to its end
        width = self.width_us
        lefts = self.start_us + width * np.arange(self.nbins, dtype=np.int64)
        rights = lefts + width
        lefts[0], rights[-1] = lo, hi  # the clipped rows' bins
        seen = np.minimum(rights, hi) - np.maximum(lefts, lo)
        # timeline() makes each at least half a bin; not a collection of one instant
        return np.maximum(seen, width / 2) / US_PER_S

    def per_second(self, bins: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Rows per bin (``bins``: each row's bin, or each count's in ``weights``, as
        :meth:`GraphData.per_bin` gives them), divided by the seconds the collection
        observed in the bin (:attr:`observed_s`): a rate per second. Divided by the
        width, a bin the collection began or ended in showed a lower rate than the
        rows in it had."""
        return np.bincount(bins, weights=weights, minlength=self.nbins) / self.observed_s


@dataclass(frozen=True)
class Marker:
    """A moment drawn on every time axis (the benchmark's start and stop)."""

    t_us: int
    label: str
    color: str


@dataclass
class GraphData:
    """One collection as its graphs see it.

    Attributes:
        collection: the collection, scanned (or read, where one was handed in).
        tables: each table as a LazyFrame with the selection applied (system-wide
            tables whole).
        origin_us: time zero of every time axis (``ts_uptime_us``): the benchmark's
            start where the collection shows it exactly, else its first event.
        origin_label: what time zero is, for axis labels.
        markers: the benchmark's start and stop, when known.
        marker_source: how they were found (for the report and the docs).
        selection: "tgid 1234" / "comm dd", or None for everything.
        system_wide: tables the selection could not apply to.
        names: tgid -> process name (comm), from whatever tables name processes.
        span_us: first and last timestamp of the whole collection (before selection),
            markers included.
        rows: each table's rows after the selection (counted where missing).
    """

    collection: Collection | LazyCollection
    tables: dict[str, pl.LazyFrame]
    origin_us: int
    origin_label: str
    markers: list[Marker] = field(default_factory=list)
    marker_source: str | None = None
    selection: str | None = None
    system_wide: frozenset[str] = frozenset()
    names: dict[int, str] = field(default_factory=dict)
    span_us: tuple[int, int] | None = None
    #: the manifest as plain values, its types checked (_manifest.checked_manifest)
    manifest_data: dict[str, Any] | None = None
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def manifest(self) -> dict[str, Any]:
        if self.manifest_data is None:
            # here, not at the top: importing base stays light (no pydantic, no manifest model)
            from kernmlops.graphs._manifest import checked_manifest

            self.manifest_data = checked_manifest(self.collection)
        return self.manifest_data

    def count(self, table: str) -> int:
        """The table's rows after the selection (0 for a table it does not have)."""
        if table not in self.rows:
            frame = self.tables.get(table)
            from kernmlops.data import count_rows  # here: importing base stays light

            self.rows[table] = 0 if frame is None else count_rows(frame)
        return self.rows[table]

    def frame(self, table: str) -> pl.LazyFrame:
        """The table's selected rows; NoData when there are none."""
        if not self.count(table):
            raise NoData(table)
        return self.tables[table]

    def seconds(self, frame: pl.DataFrame, column: str = UPTIME_TIMESTAMP) -> np.ndarray:
        """``column`` (µs of CLOCK_MONOTONIC) as seconds since the origin."""
        ts = frame[column].cast(pl.Int64).to_numpy()
        return (ts - self.origin_us) / US_PER_S

    def timeline(self, frames: Sequence[pl.LazyFrame] = (), target: int = 150) -> Timeline:
        """Round time bins over the whole collection (so the time axes of one
        collection line up, and a selection's idle stretches show as zero), or over
        ``frames``' timestamps where the collection's span is not known."""
        if self.span_us is not None:
            lo, hi = self.span_us
        else:
            ts = pl.col(UPTIME_TIMESTAMP)
            bounds = collect(
                pl.concat([f.select(lo=ts.min(), hi=ts.max()) for f in frames]).select(
                    pl.col("lo").min(), pl.col("hi").max()
                )
            )
            lo, hi = int(bounds["lo"].item()), int(bounds["hi"].item())
        lo, hi = int(lo), int(hi)
        width = nice_bin_s((hi - lo) / US_PER_S, target)
        width_us = round(width * US_PER_S)
        # in whole µs, as time_bin bins the rows: the first and the last row fall in
        # the first and the last bin, whatever edge they are on
        first, last = lo - self.origin_us, hi - self.origin_us
        start_us = first // width_us * width_us
        nbins = (last - start_us) // width_us + 1
        # a bin at either end that the collection saw less than half of is merged
        # into its neighbour (time_bin clips its rows there): a rate over a sliver
        # of time is mostly noise
        if nbins > 1 and start_us + width_us - first < width_us / 2:
            start_us, nbins = start_us + width_us, nbins - 1
        if nbins > 1 and last + 1 - (start_us + (nbins - 1) * width_us) < width_us / 2:
            nbins -= 1
        return Timeline(start_us / US_PER_S, width, max(nbins, 1), (first, last))

    def time_bin(self, timeline: Timeline) -> pl.Expr:
        """The timeline bin of each row (column ``bin``): [edge, next edge), in whole
        µs. In seconds (floating point) a row exactly on an edge fell in the bin
        before it or in its own as the rounding went (0.16 / 0.005 is 31.999...)."""
        since_start = pl.col(UPTIME_TIMESTAMP).cast(pl.Int64) - (self.origin_us + timeline.start_us)
        index = since_start // timeline.width_us
        return index.clip(0, timeline.nbins - 1).alias("bin")

    def per_bin(
        self, frame: pl.LazyFrame, timeline: Timeline, *by: str, **sums: pl.Expr
    ) -> pl.DataFrame:
        """Rows per timeline bin (``n``) of ``frame``, per ``by``, with each of ``sums``
        summed: the few hundred rows a rate over time is drawn from. A sum of a
        32-bit integer column is taken in 64 bits (:func:`wide_sums`)."""
        return collect(
            frame.group_by(*by, self.time_bin(timeline)).agg(
                n=row_count(UPTIME_TIMESTAMP), **wide_sums(frame, sums)
            )
        )

    def scope(self, table: str) -> str:
        """'' for a selected table, ' (system-wide)' where the selection does not apply."""
        return " (system-wide)" if self.selection and table in self.system_wide else ""

    def name_of(self, tgid: int) -> str:
        name = self.names.get(int(tgid))
        return f"{name} ({tgid})" if name else str(tgid)

    def time_axis(self, ax: Axes, *, legend: bool = True) -> None:
        """Label ``ax``'s x axis as time since the origin and draw the markers."""
        ax.set_xlabel(f"time since {self.origin_label} (s)")
        if self.span_us is not None:
            lo, hi = ((t - self.origin_us) / US_PER_S for t in self.span_us)
            pad = (hi - lo) * 0.01
            ax.set_xlim(lo - pad, hi + pad)
        for m in self.markers:
            ax.axvline(
                (m.t_us - self.origin_us) / US_PER_S,
                color=m.color,
                linestyle="--",
                linewidth=1.2,
                label=m.label,
                zorder=5,
            )
        if legend:
            handles, _labels = ax.get_legend_handles_labels()
            if handles:
                ax.legend(fontsize="small", loc="best", framealpha=0.85)


class Graph(ABC):
    """One figure. Subclasses set ``name`` (the file stem), ``title`` and ``tables``
    (all needed; without any of them the graph is not drawn) and implement draw()."""

    name: ClassVar[str]
    title: ClassVar[str]
    tables: ClassVar[tuple[str, ...]]
    #: inches at 100 dpi
    figsize: ClassVar[tuple[float, float]] = (10.0, 4.8)
    #: place in the report and in listings: scheduling 10s, processes 20s, syscalls
    #: 30s, memory 40s, I/O 50s, counters 60s; ties by name
    order: ClassVar[int] = 100

    def applies(self, available: set[str] | frozenset[str]) -> bool:
        return set(self.tables) <= set(available)

    @abstractmethod
    def draw(self, data: GraphData, fig: Figure) -> None:
        """Draw on ``fig``; raise NoData when the selection leaves nothing to show."""
