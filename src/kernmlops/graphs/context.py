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

import warnings
from collections.abc import Mapping
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl

from kernmlops.data import (
    Collection,
    Damaged,
    IncompleteCollectionWarning,
    LazyCollection,
    count_rows,
    read_collection,
    reading,
)
from kernmlops.errors import CollectionError, KernmlopsError
from kernmlops.graphs._manifest import checked_manifest
from kernmlops.graphs.base import (
    US_PER_S,
    F,
    Frame,
    Graph,
    GraphData,
    Marker,
    SelectionError,
    TableView,
    collect,
    collect_all,
    default_view,
    row_count,
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


def as_collection(
    collection: Collection | LazyCollection | str | Path,
) -> Collection | LazyCollection:
    """``collection`` as handed in where it is read or scanned already, else its
    folder scanned (``read_collection(path, lazy=True)``): no table is read whole."""
    if isinstance(collection, Collection | LazyCollection):
        return collection
    return read_collection(collection, lazy=True)


def _lazy(tables: Mapping[str, Frame]) -> dict[str, pl.LazyFrame]:
    return {name: frame.lazy() for name, frame in tables.items()}


# -- process names ------------------------------------------------------------------------


def _name_sources(
    tables: Mapping[str, Frame],
) -> list[tuple[int, int, pl.LazyFrame, pl.Expr]]:
    """(rank, order, rows of (tgid, comm), the name a process has there) of every
    table that names processes; a lower rank wins, then a lower order."""
    first = pl.col("comm").first()
    sources = []
    for order, (name, frame) in enumerate(_lazy(tables).items()):
        columns = frame.collect_schema().names()
        if "comm" not in columns or "tgid" not in columns:
            continue
        rows = frame.with_columns(pl.col("tgid").cast(pl.Int64), pl.col("comm").cast(pl.String))
        if "pid" in columns:  # the process's own thread, not a thread's name
            rows = rows.filter(pl.col("pid") == pl.col("tgid"))
        if name == "process_trace":
            # A process is named by its last exec; one that never exec'd by its fork.
            last = pl.col("comm").sort_by(UPTIME_TIMESTAMP, descending=True).first()
            sources.append((0, 0, rows.filter(pl.col("kind") == "exec"), last))
            sources.append((1, 0, rows.filter(pl.col("kind") == "fork"), first))
        else:
            sources.append((2, order, rows, first))
    return sources


def _name_rows(tables: Mapping[str, Frame]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Per source of names (its ``rank`` and ``order``, see _name_sources): each
    process's first name there (tgid, comm, rank, order), and every (tgid, comm,
    rank) pair it holds. Both as small as the processes, whatever the rows."""
    sources = _name_sources(tables)
    queries = []
    for rank, order, rows, name in sources:
        tag = (pl.lit(rank, pl.Int32).alias("rank"), pl.lit(order, pl.Int32).alias("order"))
        queries.append(rows.group_by("tgid").agg(name).with_columns(*tag))
        queries.append(rows.select("tgid", "comm").unique().with_columns(tag[0]))
    found = collect_all(queries)
    schema = {"tgid": pl.Int64, "comm": pl.String, "rank": pl.Int32}
    first = pl.concat(found[0::2]) if found else pl.DataFrame(schema={**schema, "order": pl.Int32})
    pairs = pl.concat(found[1::2]) if found else pl.DataFrame(schema=schema)
    return first, pairs


def process_names(tables: Mapping[str, Frame]) -> dict[int, str]:
    """tgid -> process name: its last exec in process_trace, else its fork, else the
    comm other tables (sched_migrate, block_io) saw for it."""
    first, _ = _name_rows(tables)
    best = (
        first.sort("rank", "order")
        .group_by("tgid", maintain_order=True)
        .agg(pl.col("comm").first())
    )
    return dict(zip(best["tgid"].to_list(), best["comm"].to_list(), strict=True))


def tgids_named(tables: Mapping[str, Frame], comm: str) -> set[int]:
    """Processes that carried the name ``comm`` (exact, as the kernel truncates it to
    15 characters). A forked child that exec'd something else is not counted under
    its parent's name."""
    _, rows = _name_rows(tables)
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
    manifest: dict[str, Any], trace: Frame | None
) -> tuple[list[Marker], str | None, bool]:
    """(markers, how they were found, whether the start is exact); see the module doc."""
    bench = manifest.get("benchmark") if isinstance(manifest.get("benchmark"), dict) else {}
    pid = bench.get("pid")
    start = stop = None
    source = None
    if pid and trace is not None:
        ts, kind = pl.col(UPTIME_TIMESTAMP), pl.col("kind")
        found = collect(
            trace.lazy()
            .filter(pl.col("pid") == int(pid))
            .select(start=ts.filter(kind == "exec").min(), stop=ts.filter(kind == "exit").max())
        )
        start, stop = (None if v is None else int(v) for v in found.row(0))
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


def _busiest(tables: Mapping[str, pl.LazyFrame], names: dict[int, str], n: int = 8) -> str:
    queries = []
    for table, frame in tables.items():
        view = table_view(table)
        col = view.tgid_column
        if col and col in frame.collect_schema():
            if view.unknown_tgid is not None:  # no process (mm_rss_stat's owner unknown)
                frame = frame.filter(pl.col(col) != view.unknown_tgid)
            queries.append(frame.group_by(pl.col(col).alias("tgid")).agg(n=row_count(col)))
    counts: dict[int, int] = {}
    for found in collect_all(queries):
        for tgid, k in found.iter_rows():
            counts[int(tgid)] = counts.get(int(tgid), 0) + k
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{t} ({names[t]})" if t in names else str(t) for t, _ in top) or "none"


def select(
    tables: Mapping[str, F], tgids: set[int]
) -> tuple[dict[str, F], frozenset[str], dict[str, int]]:
    """The rows of ``tgids`` in each table that names processes; the tables that do
    not (system-wide); the rows selected in each table that names processes."""
    out: dict[str, F] = {}
    wide = set()
    wanted = pl.Series(sorted(tgids), dtype=pl.Int64).implode()
    for table, frame in tables.items():
        col = table_view(table).tgid_column
        if col and col in frame.collect_schema():
            out[table] = frame.filter(pl.col(col).cast(pl.Int64).is_in(wanted))
        else:
            out[table] = frame
            if table not in _STATIC_TABLES:
                wide.add(table)
    chosen = {t: table_view(t).tgid_column for t in out if t not in wide | _STATIC_TABLES}
    counts = collect_all([out[t].lazy().select(row_count(c)) for t, c in chosen.items()])
    return out, frozenset(wide), {t: int(n.item()) for t, n in zip(chosen, counts, strict=True)}


def _bounds(tables: Mapping[str, pl.LazyFrame]) -> dict[str, tuple[int, int, int] | None]:
    """Each table's (rows, first and last timestamp), None for one without a time column,
    from one pass over its timestamps."""
    ts = pl.col(UPTIME_TIMESTAMP)
    timed = [t for t, f in tables.items() if UPTIME_TIMESTAMP in f.collect_schema()]
    found = collect_all(
        [tables[t].select(n=row_count(UPTIME_TIMESTAMP), lo=ts.min(), hi=ts.max()) for t in timed]
    )
    out: dict[str, tuple[int, int, int] | None] = dict.fromkeys(tables)
    for table, row in zip(timed, found, strict=True):
        n, lo, hi = row.row(0)
        out[table] = (int(n), int(lo), int(hi)) if n else (0, 0, 0)
    return out


def load(
    collection: Collection | LazyCollection | str | Path,
    *,
    tgid: int | None = None,
    comm: str | None = None,
    damaged: Damaged = "raise",
) -> GraphData:
    """Scan ``collection`` and prepare what its graphs share (names, markers, the
    time span, the selection: small queries over its tables, none read whole).

    Args:
        collection: a collection folder, or one already read or scanned.
        tgid: keep only this process's rows (tables without a process column stay whole
            and are marked system-wide).
        comm: keep only processes of this name (see :func:`tgids_named`).
        damaged: ``"skip"``: a table that these queries find cannot be read (a later
            part damaged past its footer, or of another schema: a lazy scan checks
            only its first part's) is left out, named in an
            IncompleteCollectionWarning and added to the collection's ``damaged``
            (taken out of its ``tables`` and ``files``), as
            ``read_collection(damaged="skip")`` leaves out a table it cannot read.

    Raises:
        SelectionError: both tgid and comm, or a selection that matches no row.
        CollectionError: the folder is not a readable collection.
    """
    if tgid is not None and comm is not None:
        raise SelectionError("select by tgid or by comm, not both")
    col = as_collection(collection)
    tables = _lazy(col.tables)
    while True:
        try:
            with reading(col.path):
                return _load(col, tables, tgid, comm)
        except CollectionError as err:
            # only a read that failed, not a refusal of _load's own (a selection)
            if damaged == "raise" or not isinstance(
                err.__cause__, pl.exceptions.PolarsError | OSError
            ):
                raise
            bad = _unreadable(col.path, tables)
            if not bad:
                raise
            for name, why in bad.items():
                del tables[name]
                col.tables.pop(name, None)
                col.files.pop(name, None)
                col.damaged[name] = why
                warnings.warn(f"{why}: the table is left out", IncompleteCollectionWarning,
                              stacklevel=2)  # fmt: skip


def _unreadable(path: Path, tables: Mapping[str, pl.LazyFrame]) -> dict[str, str]:
    """The tables of which a part cannot be read whole, with the reason (each read in
    full, every column: only once a query over them all has failed, to name which)."""
    bad = {}
    for name, frame in tables.items():
        try:
            with reading(path / name, name):
                collect(frame.select(pl.all().hash().max()))  # every value decoded
        except CollectionError as err:
            bad[name] = str(err)
    return bad


def _load(
    col: Collection | LazyCollection,
    tables: dict[str, pl.LazyFrame],
    tgid: int | None,
    comm: str | None,
) -> GraphData:
    names = process_names(tables)
    manifest = checked_manifest(col)
    markers, source, exact = benchmark_markers(manifest, tables.get("process_trace"))
    bounds = _bounds(tables)
    rows = {t: b[0] if b is not None else 0 for t, b in bounds.items()}
    untimed = [t for t, b in bounds.items() if b is None]  # system_info, benchmark_result
    rows.update((t, count_rows(tables[t])) for t in untimed)
    ends = [e for b in bounds.values() if b is not None and b[0] for e in b[1:]]
    ends += [m.t_us for m in markers if not m.label.startswith("≈")]  # ±1 s: not a bound
    span = (min(ends), max(ends)) if ends else None
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
        if sum(kept.values()) == 0:
            raise SelectionError(
                f"{col.path}: no rows of {selection} in any table "
                f"(busiest processes: {_busiest(tables, names)})"
            )
        tables = selected
        rows.update(kept)
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
        rows=rows,
    )


def unknown_graphs(names: list[str]) -> None:
    known = graph_registry()
    bad = [n for n in names if n not in known]
    if bad:
        raise KernmlopsError(
            f"unknown graph(s) {', '.join(map(repr, bad))}; known: {', '.join(known)}"
        )
