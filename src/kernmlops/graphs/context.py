"""From a collection on disk to the GraphData its graphs draw from: the graph and
table-view catalogue, the tgid/comm selection, the time origin and the
benchmark's start and stop.

Where the benchmark's start and stop come from, most exact first:

1. ``process_trace``: the exec and the exit of the benchmark's pid (the manifest's
   ``benchmark.pid``). The benchmark is held at a gate until every probe is
   attached and then execs, so its exec event is its start, stamped by the
   kernel on the clock of every other table (CLOCK_MONOTONIC, µs).
2. ``benchmark.started_uptime_us`` / ``stopped_uptime_us`` in the manifest, where
   the collector records them (CLOCK_MONOTONIC read in user space).
3. The manifest's wall-clock times less ``system.boot_time_unix``: the boot time is
   whole seconds (``btime`` of /proc/stat) and CLOCK_MONOTONIC stops during
   suspend, so these are marked approximate ("≈", ±1 s) and do not set the origin.

A collection without a benchmark process (``faux``) has no markers; its time
axes start at its first event.
"""

from __future__ import annotations

from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.data import Collection, read_collection
from kernmlops.errors import KernmlopsError
from kernmlops.graphs._manifest import checked_manifest
from kernmlops.graphs.base import (
    US_PER_S,
    Graph,
    GraphData,
    Marker,
    SelectionError,
    TableView,
    default_view,
)
from kernmlops.registry import discover
from kernmlops.tables import UPTIME_TIMESTAMP

#: Modules of kernmlops.graphs that hold the machinery, not graphs (the private
#: ones, _render and _report, are skipped by discover() anyway).
_INFRASTRUCTURE = frozenset({"base", "context", "cli"})
#: Tables the selection never applies to and that have no time axis.
_STATIC_TABLES = frozenset({"system_info", "benchmark_result"})

START_COLOR, STOP_COLOR = "#2ca02c", "#d62728"


@cache
def graph_registry() -> dict[str, Graph]:
    """Every graph, by name, in report order (``Graph.order``, then name)."""
    classes = discover("kernmlops.graphs", Graph, skip=_INFRASTRUCTURE)
    ordered = sorted(classes.items(), key=lambda kv: (kv[1].order, kv[0]))
    return {name: cls() for name, cls in ordered}


@cache
def _views() -> dict[str, TableView]:
    classes = discover("kernmlops.graphs", TableView, skip=_INFRASTRUCTURE)
    return {name: cls() for name, cls in classes.items()}


def table_view(table: str) -> TableView:
    """The table's view, or the default one (tgid column ``tgid``, unit columns)."""
    return _views().get(table) or default_view(table)


def as_collection(collection: Collection | str | Path) -> Collection:
    return collection if isinstance(collection, Collection) else read_collection(collection)


# -- process names ------------------------------------------------------------------------


def _name_rows(tables: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """(tgid, comm, rank) rows from every table that names processes; lower rank wins."""
    parts = []
    trace = tables.get("process_trace")
    if trace is not None and not trace.is_empty():
        main = trace.filter(pl.col("pid") == pl.col("tgid"))
        # A process is named by its last exec; one that never exec'd by its fork.
        execs = main.filter(pl.col("kind") == "exec").sort(UPTIME_TIMESTAMP, descending=True)
        forks = main.filter(pl.col("kind") == "fork")
        parts.append(execs.select("tgid", "comm", rank=pl.lit(0)))
        parts.append(forks.select("tgid", "comm", rank=pl.lit(1)))
    for name, frame in tables.items():
        if name == "process_trace" or frame.is_empty():
            continue
        if "comm" in frame.columns and "tgid" in frame.columns:
            rows = frame
            if "pid" in frame.columns:
                rows = frame.filter(pl.col("pid") == pl.col("tgid"))
            parts.append(rows.select("tgid", "comm", rank=pl.lit(2)))
    if not parts:
        return pl.DataFrame(schema={"tgid": pl.Int64, "comm": pl.String, "rank": pl.Int32})
    return pl.concat(
        [
            p.with_columns(pl.col("tgid").cast(pl.Int64), pl.col("rank").cast(pl.Int32))
            for p in parts
        ]
    )


def process_names(tables: dict[str, pl.DataFrame]) -> dict[int, str]:
    """tgid -> process name: its last exec in process_trace, else its fork, else the
    comm other tables (sched_migrate, block_io) saw for it."""
    rows = _name_rows(tables)
    best = rows.group_by("tgid", maintain_order=True).agg(pl.col("comm").sort_by("rank").first())
    return dict(zip(best["tgid"].to_list(), best["comm"].to_list(), strict=True))


def tgids_named(tables: dict[str, pl.DataFrame], comm: str) -> set[int]:
    """Processes that carried the name ``comm`` (exact, as the kernel truncates it to
    15 characters). A forked child that exec'd something else is not counted under
    its parent's name."""
    rows = _name_rows(tables)
    execd = rows.filter(pl.col("rank") == 0)["tgid"].unique()
    rows = rows.filter(~((pl.col("rank") == 1) & pl.col("tgid").is_in(execd.implode())))
    return set(rows.filter(pl.col("comm") == comm[:15])["tgid"].unique().to_list())


# -- benchmark start and stop -------------------------------------------------------------


def _wall_to_uptime_us(wall: Any, boot_unix: Any) -> int | None:
    try:
        t = datetime.fromisoformat(str(wall)).timestamp()
        return round((t - float(boot_unix)) * US_PER_S)
    except (TypeError, ValueError):
        return None


def benchmark_markers(
    manifest: dict[str, Any], trace: pl.DataFrame | None
) -> tuple[list[Marker], str | None, bool]:
    """(markers, how they were found, whether the start is exact); see the module doc."""
    bench = manifest.get("benchmark") if isinstance(manifest.get("benchmark"), dict) else {}
    pid = bench.get("pid")
    start = stop = None
    source = None
    if pid and trace is not None and not trace.is_empty():
        mine = trace.filter(pl.col("pid") == int(pid))
        execs = mine.filter(pl.col("kind") == "exec")[UPTIME_TIMESTAMP]
        exits = mine.filter(pl.col("kind") == "exit")[UPTIME_TIMESTAMP]
        start = int(execs.min()) if len(execs) else None  # type: ignore[arg-type]
        stop = int(exits.max()) if len(exits) else None  # type: ignore[arg-type]
        if start is not None or stop is not None:
            source = "process_trace (exec/exit of the benchmark's pid)"
    for key, value in (("started_uptime_us", start), ("stopped_uptime_us", stop)):
        if value is None and isinstance(bench.get(key), int):
            if key == "started_uptime_us":
                start = bench[key]
            else:
                stop = bench[key]
            source = source or "manifest (CLOCK_MONOTONIC recorded by the collector)"
    if start is not None or stop is not None:
        markers = []
        if start is not None:
            markers.append(Marker(start, "benchmark start", START_COLOR))
        if stop is not None:
            markers.append(Marker(stop, "benchmark stop", STOP_COLOR))
        return markers, source, start is not None
    boot = (manifest.get("system") or {}).get("boot_time_unix")
    if not pid or boot is None:
        return [], None, False
    started = _wall_to_uptime_us(manifest.get("started_at"), boot)
    stopped = _wall_to_uptime_us(manifest.get("stopped_at"), boot)
    markers = []
    if started is not None:
        # The gate opens once every probe is attached.
        started += round(float(manifest.get("attach_s") or 0) * US_PER_S)
        markers.append(Marker(started, "≈ benchmark start (wall clock, ±1 s)", START_COLOR))
    if stopped is not None:
        markers.append(Marker(stopped, "≈ collection stop (wall clock, ±1 s)", STOP_COLOR))
    return markers, "wall clock minus boot time (±1 s)" if markers else None, False


# -- selection ------------------------------------------------------------------------------


def _busiest(tables: dict[str, pl.DataFrame], names: dict[int, str], n: int = 8) -> str:
    counts: dict[int, int] = {}
    for table, frame in tables.items():
        col = table_view(table).tgid_column
        if col and col in frame.columns and not frame.is_empty():
            for tgid, k in frame.group_by(col).len().iter_rows():
                counts[int(tgid)] = counts.get(int(tgid), 0) + k
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{t} ({names[t]})" if t in names else str(t) for t, _ in top) or "none"


def select(
    tables: dict[str, pl.DataFrame], tgids: set[int]
) -> tuple[dict[str, pl.DataFrame], frozenset[str], int]:
    """The rows of ``tgids`` in each table that names processes; the tables that do
    not (system-wide); the number of selected rows."""
    out: dict[str, pl.DataFrame] = {}
    wide = set()
    kept = 0
    wanted = pl.Series(sorted(tgids), dtype=pl.Int64)
    for table, frame in tables.items():
        col = table_view(table).tgid_column
        if col and col in frame.columns:
            out[table] = frame.filter(pl.col(col).cast(pl.Int64).is_in(wanted.implode()))
            kept += out[table].height
        else:
            out[table] = frame
            if table not in _STATIC_TABLES:
                wide.add(table)
    return out, frozenset(wide), kept


def load(
    collection: Collection | str | Path,
    *,
    tgid: int | None = None,
    comm: str | None = None,
) -> GraphData:
    """Read ``collection`` and prepare what its graphs share.

    Args:
        collection: a collection folder or one already read.
        tgid: keep only this process's rows (tables without a process column stay whole
            and are marked system-wide).
        comm: keep only processes of this name (see :func:`tgids_named`).

    Raises:
        SelectionError: both tgid and comm, or a selection that matches no row.
        CollectionError: the folder is not a readable collection.
    """
    if tgid is not None and comm is not None:
        raise SelectionError("select by tgid or by comm, not both")
    col = as_collection(collection)
    tables = dict(col.tables)
    names = process_names(tables)
    manifest = checked_manifest(col)
    markers, source, exact = benchmark_markers(manifest, tables.get("process_trace"))
    stamped = [f[UPTIME_TIMESTAMP] for f in tables.values() if UPTIME_TIMESTAMP in f.columns]
    bounds = [int(b) for ts in stamped if len(ts) for b in (ts.min(), ts.max())]  # type: ignore[arg-type]
    bounds += [m.t_us for m in markers if not m.label.startswith("≈")]  # ±1 s: not a bound
    span = (min(bounds), max(bounds)) if bounds else None
    if exact:
        origin, origin_label = markers[0].t_us, "benchmark start"
    else:
        origin, origin_label = (span[0] if span else 0), "first event"

    selection = None
    wide: frozenset[str] = frozenset()
    if tgid is not None or comm is not None:
        if tgid is not None:
            wanted, selection = {int(tgid)}, f"tgid {tgid}"
            if tgid < 0:
                raise SelectionError(f"tgid must be >= 0, not {tgid}")
        else:
            assert comm is not None
            wanted, selection = tgids_named(tables, comm), f"comm {comm}"
            if not wanted:
                seen = sorted(set(names.values()))
                hint = ", ".join(seen[:20]) + (" …" if len(seen) > 20 else "")
                raise SelectionError(
                    f"{col.path}: no process named {comm!r} in this collection "
                    f"(names seen: {hint or 'none: it has no process_trace'})"
                )
        selected, wide, kept = select(tables, wanted)
        if kept == 0:
            raise SelectionError(
                f"{col.path}: no rows of {selection} in any table "
                f"(busiest processes: {_busiest(tables, names)})"
            )
        tables = selected
    return GraphData(
        collection=col,
        tables=tables,
        origin_us=origin,
        origin_label=origin_label,
        markers=markers,
        marker_source=source,
        selection=selection,
        system_wide=wide,
        names=names,
        span_us=span,
        manifest_data=manifest,
    )


def unknown_graphs(names: list[str]) -> None:
    known = graph_registry()
    bad = [n for n in names if n not in known]
    if bad:
        raise KernmlopsError(
            f"unknown graph(s) {', '.join(map(repr, bad))}; known: {', '.join(known)}"
        )
