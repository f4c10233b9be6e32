"""What a graph is, and the facts every graph of a collection shares.

A graph is a :class:`Graph` subclass in a module of ``kernmlops.graphs`` named after
its table (``graphs/block_io.py`` draws ``block_io``). It names the tables it needs
and draws on a matplotlib ``Figure`` from a :class:`GraphData`: the collection's
tables with the tgid/comm selection applied, one time origin, and the benchmark's
start and stop. Discovery is the hooks' (:func:`kernmlops.registry.discover`): a new
module is all a new table's graphs need.

A table that needs more than the defaults (another tgid column, its own summary in
the report) says so with a :class:`TableView` in the same module.

Nothing here imports matplotlib: the figure is handed in by the renderer.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import polars as pl

from kernmlops.errors import KernmlopsError
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from kernmlops.data import Collection

__all__ = [
    "Graph",
    "GraphData",
    "Marker",
    "NoData",
    "SelectionError",
    "TableView",
    "Timeline",
    "duration_axis",
    "format_bytes",
    "format_duration_us",
    "log_bins",
    "nice_bin_s",
]

US_PER_S = 1_000_000


class NoData(Exception):
    """Raised by a graph whose tables are empty for this selection: no figure."""


class SelectionError(KernmlopsError):
    """A --tgid / --comm selection matches nothing in the collection."""


# -- tables ------------------------------------------------------------------------------


class TableView:
    """How graphs and the report read one table. Subclass it beside the table's
    graphs only where the defaults do not fit."""

    #: the table's name
    name: ClassVar[str]
    #: the column naming the process a row belongs to, for --tgid/--comm; None for a
    #: system-wide table (the selection does not apply to it)
    tgid_column: ClassVar[str | None] = "tgid"
    #: columns whose distribution the report summarises (default: every numeric
    #: column with a unit suffix, at most six)
    key_columns: ClassVar[tuple[str, ...] | None] = None

    def summary(self, frame: pl.DataFrame) -> list[tuple[str, str]]:
        """(label, value) pairs for the report: count, mean, p50, p99, max of each
        key column, formatted in its unit."""
        out = []
        for col in self.keys(frame):
            values = frame[col].drop_nulls()
            if values.is_empty():
                continue
            values = values.cast(pl.Float64)
            q = values.quantile
            fmt = unit_formatter(col)
            out.append(
                (
                    col,
                    f"mean {fmt(values.mean())} · p50 {fmt(q(0.5))} · "
                    f"p99 {fmt(q(0.99))} · max {fmt(values.max())}",
                )
            )
        return out

    def keys(self, frame: pl.DataFrame) -> list[str]:
        if self.key_columns is not None:
            return [c for c in self.key_columns if c in frame.columns]
        found = [
            c
            for c, dtype in frame.schema.items()
            if c != UPTIME_TIMESTAMP
            and dtype.is_numeric()
            and c.endswith(("_us", "_ns", "_bytes"))
            and not c.endswith(("_enabled_ns", "_running_ns"))
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
    """``nbins`` bins of ``width`` seconds from ``start`` (seconds since the origin)."""

    start: float
    width: float
    nbins: int

    @property
    def edges(self) -> np.ndarray:
        return self.start + self.width * np.arange(self.nbins + 1)

    @property
    def centers(self) -> np.ndarray:
        return self.start + self.width * (np.arange(self.nbins) + 0.5)

    def per_second(self, frame_bins: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """Rows (or ``weights``) per bin, divided by the bin width: a rate per second."""
        return np.bincount(frame_bins, weights=weights, minlength=self.nbins) / self.width


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
        collection: the collection read from disk.
        tables: each table with the selection applied (system-wide tables whole).
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
    """

    collection: Collection
    tables: dict[str, pl.DataFrame]
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

    @property
    def manifest(self) -> dict[str, Any]:
        if self.manifest_data is None:
            # here, not at the top: importing base stays light (no pydantic, no manifest model)
            from kernmlops.graphs._manifest import checked_manifest

            self.manifest_data = checked_manifest(self.collection)
        return self.manifest_data

    def frame(self, table: str) -> pl.DataFrame:
        """The table's selected rows; NoData when there are none."""
        frame = self.tables.get(table)
        if frame is None or frame.is_empty():
            raise NoData(table)
        return frame

    def optional(self, table: str) -> pl.DataFrame | None:
        frame = self.tables.get(table)
        return None if frame is None or frame.is_empty() else frame

    def seconds(self, frame: pl.DataFrame, column: str = UPTIME_TIMESTAMP) -> np.ndarray:
        """``column`` (µs of CLOCK_MONOTONIC) as seconds since the origin."""
        ts = frame[column].cast(pl.Int64).to_numpy()
        return (ts - self.origin_us) / US_PER_S

    def timeline(self, frames: Sequence[pl.DataFrame] = (), target: int = 150) -> Timeline:
        """Round time bins over the whole collection (so the time axes of one
        collection line up, and a selection's idle stretches show as zero), or over
        ``frames``' timestamps where the collection's span is not known."""
        if self.span_us is not None:
            lo, hi = self.span_us
        else:
            lo = min(int(f[UPTIME_TIMESTAMP].min()) for f in frames)  # type: ignore[arg-type]
            hi = max(int(f[UPTIME_TIMESTAMP].max()) for f in frames)  # type: ignore[arg-type]
        width = nice_bin_s((hi - lo) / US_PER_S, target)
        start = math.floor((lo - self.origin_us) / US_PER_S / width) * width
        end = (hi - self.origin_us) / US_PER_S
        return Timeline(start, width, max(math.floor((end - start) / width) + 1, 1))

    def bin_of(self, frame: pl.DataFrame, timeline: Timeline) -> np.ndarray:
        """The timeline bin of each row of ``frame``."""
        idx = np.floor((self.seconds(frame) - timeline.start) / timeline.width).astype(np.int64)
        return np.clip(idx, 0, timeline.nbins - 1)

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
