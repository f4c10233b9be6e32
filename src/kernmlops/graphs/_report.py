"""One self-contained HTML page for one or more collections, side by side.

Everything is inline: the figures as base64 PNG, the style in a <style> element,
no script and no external resource, so the file can be mailed, archived or
opened offline. With several collections every section is a row with one column
per collection, so the same figure of each lines up across.
"""

from __future__ import annotations

import base64
import html
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from kernmlops import __version__
from kernmlops.data import Collection, LazyCollection, reading
from kernmlops.errors import CollectionError
from kernmlops.fileio import refuse_special
from kernmlops.graphs._render import (
    GraphFailure,
    GraphOutputError,
    applicable,
    figures,
    held_output,
    png_bytes,
    write_atomic,
)
from kernmlops.graphs.base import (
    US_PER_S,
    GraphData,
    TableView,
    collect,
    collect_all,
    format_bytes,
)
from kernmlops.graphs.context import graph_registry, load, table_view, unknown_graphs
from kernmlops.tables import UPTIME_TIMESTAMP

__all__ = ["report"]

_CSS = """
:root { --fg: #1d232b; --muted: #5b6673; --line: #d9dee4; --bg-alt: #f5f7f9;
        --ok: #1f7a3d; --warn: #9a6200; --bad: #b3261e; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); margin: 0 auto; padding: 24px 28px 60px; max-width: var(--page); }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 34px 0 10px; padding-bottom: 4px;
     border-bottom: 2px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: var(--muted); margin: 0 0 12px; }
.row { display: grid; grid-template-columns: repeat(var(--cols), minmax(0, 1fr)); gap: 22px; }
.cell { min-width: 0; }
.head { background: var(--bg-alt); border: 1px solid var(--line); border-radius: 6px;
        padding: 10px 12px; }
.head .name { font-size: 16px; font-weight: 600; }
.head code { font-size: 12px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid var(--line);
         vertical-align: top; }
th { color: var(--muted); font-weight: 600; background: var(--bg-alt); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv th { width: 38%; background: none; font-weight: 500; }
.ok { color: var(--ok); font-weight: 600; }
.warn { color: var(--warn); font-weight: 600; }
.bad { color: var(--bad); font-weight: 600; }
.small { font-size: 12px; color: var(--muted); }
figure { margin: 0; }
figure img { width: 100%; height: auto; display: block; border: 1px solid var(--line);
             border-radius: 4px; background: white; }
figcaption { font-size: 12px; color: var(--muted); margin-top: 4px; }
.none { color: var(--muted); font-style: italic; padding: 18px; border: 1px dashed var(--line);
        border-radius: 4px; text-align: center; }
details pre { background: var(--bg-alt); padding: 10px; border-radius: 4px; overflow-x: auto;
              font-size: 12px; max-height: 480px; }
.stats { margin: 0; padding-left: 0; list-style: none; font-size: 12px; }
.stats b { font-weight: 600; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


@dataclass
class _Column:
    """What one collection contributes to the page."""

    data: GraphData
    figures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (title, b64)
    failed: dict[str, str] = field(default_factory=dict)
    #: its tables' rows of the page (table_summary, run as the report's progress counts)
    summary: list[dict[str, Any]] = field(default_factory=list)

    @property
    def manifest(self) -> dict[str, Any]:
        return self.data.manifest


def _kv(rows: Sequence[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows if v not in (None, ""))
    return f'<table class="kv">{body}</table>'


def _ended_by(m: dict[str, Any]) -> Any:
    """How the collector ended ("state" since version 2); for a recovered collection,
    as it ended before ``kernmlops recover`` made its spool's rows."""
    state = m.get("ended_by") or m.get("state")
    recovery = m.get("recovery")
    if state == "recovered" and isinstance(recovery, dict):
        before = recovery.get("recovered_from")
        return "its collector was killed" if before == "running" else before
    return state


def _recovered(m: dict[str, Any]) -> str | None:
    """When ``kernmlops recover`` ran and what it added (None: it never ran)."""
    recovery = m.get("recovery")
    if not isinstance(recovery, dict):
        return None
    added = recovery.get("rows_added") or {}
    rows = sum(n for n in added.values() if isinstance(n, int))
    what = (
        f"{_e(recovery.get('recovered_at'))} by kernmlops {_e(recovery.get('kernmlops'))}: "
        f"{rows:,} rows from its spool"
    )
    if recovery.get("lost_pieces"):
        lost = f"{recovery['lost_pieces']} piece(s) of the spool could not be read"
        return f'{what}; <span class="bad">{_e(lost)}</span>'
    return what


def _counter(hook: Any, key: str) -> int:
    """One of a hook's counters (hooks.<hook>.counters.<key>); 0 where unknown."""
    counters = hook.get("counters") if isinstance(hook, dict) else None
    value = counters.get(key) if isinstance(counters, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _overview(col: _Column) -> str:
    m = col.manifest
    bench = m.get("benchmark") if isinstance(m.get("benchmark"), dict) else {}
    exit_code = m.get("exit_code")
    code = (
        f'<span class="ok">{exit_code}</span>'
        if exit_code == 0
        else f'<span class="bad">{_e(exit_code)}</span>'
    )
    filt = m.get("filter") or {}
    filt_text = _e(filt.get("mode")) + (f" (tgid {_e(filt['tgid'])})" if filt.get("tgid") else "")
    drops = sum(int(h.get("drops") or 0) for h in (m.get("hooks") or {}).values())
    missed = sum(int(h.get("missed") or 0) for h in (m.get("hooks") or {}).values())
    # what a hook's reconciliation found lost besides drops (block_io: completions by
    # /proc/diskstats never seen, rows its programs wrote that the table lacks)
    hooks = (m.get("hooks") or {}).values()
    unseen = sum(_counter(h, "completions_not_seen") for h in hooks)
    unseen += sum(_counter(h, "rows_not_in_collection") for h in hooks)
    rows: list[tuple[str, Any]] = [
        ("benchmark", _e(bench.get("description") or bench.get("name"))),
        ("started", _e(m.get("started_at"))),
        ("duration", f"{float(m.get('duration_s') or 0):.2f} s"),
        ("probes attached in", f"{float(m.get('attach_s') or 0) * 1000:.0f} ms"),
        ("ended by", _e(_ended_by(m))),
        ("recovered", _recovered(m)),
        ("exit code", code),
        ("filter", filt_text),
        (
            "events lost",
            '<span class="ok">none</span>'
            if not drops and not missed and not unseen
            else f'<span class="bad">{drops:,} dropped, {missed:,} missed'
            + (f", {unseen:,} never seen" if unseen else "")
            + "</span>",
        ),
        ("error", f'<span class="bad">{_e(m.get("error"))}</span>' if m.get("error") else None),
        (
            "results error",
            f'<span class="bad">{_e(m.get("results_error"))}</span>'
            if m.get("results_error")
            else None,
        ),
        ("selection", _e(col.data.selection) if col.data.selection else None),
        (
            "time axes",
            f"0 s = {_e(col.data.origin_label)}"
            + (f"; start/stop from {_e(col.data.marker_source)}" if col.data.marker_source else ""),
        ),
        ("kernmlops", _e((m.get("versions") or {}).get("kernmlops"))),
    ]
    return _kv(rows)


_SYSTEM_ROWS: tuple[tuple[str, str, str], ...] = (
    ("host", "hostname", ""),
    ("kernel", "kernel_release", ""),
    ("OS", "os_name", ""),
    ("architecture", "arch", ""),
    ("CPU", "cpu_model", ""),
    ("sockets / cores / threads per core", "", "topology"),
    ("logical CPUs", "logical_cpus", ""),
    ("NUMA nodes", "numa_nodes", ""),
    ("L1d / L2 / L3", "", "caches"),
    ("memory", "memory_bytes", "bytes"),
    ("swap", "swap_bytes", "bytes"),
    ("THP enabled / defrag", "", "thp"),
    ("hypervisor", "hypervisor", ""),
    ("boot time", "boot_time", ""),
)


def _system(col: _Column) -> str:
    s = col.manifest.get("system") or {}
    rows = []
    for label, key, kind in _SYSTEM_ROWS:
        if kind == "topology":
            value = " / ".join(_e(s.get(k)) for k in ("sockets", "cores", "threads_per_core"))
        elif kind == "caches":
            value = " / ".join(
                format_bytes(s[k]) if s.get(k) is not None else "-"
                for k in ("l1d_cache_bytes", "l2_cache_bytes", "l3_cache_bytes")
            )
        elif kind == "thp":
            value = f"{_e(s.get('thp_enabled'))} / {_e(s.get('thp_defrag'))}"
        elif kind == "bytes":
            value = format_bytes(s.get(key)) if s.get(key) is not None else None
        else:
            value = _e(s.get(key)) if s.get(key) is not None else None
        rows.append((label, value))
    return _kv(rows) if s else '<div class="none">no system information</div>'


def _results(col: _Column) -> str:
    if not col.data.count("benchmark_result"):
        return '<div class="none">no benchmark results</div>'
    frame = col.data.tables["benchmark_result"]
    cols = [c for c in ("key", "metric", "value", "unit") if c in frame.collect_schema()]
    head = "".join(f'<th class="{"num" if c == "value" else ""}">{_e(c)}</th>' for c in cols)
    body = []
    for row in collect(frame.select(cols)).iter_rows(named=True):  # a row per metric
        cells = []
        for c in cols:
            v = row[c]
            if c == "value" and isinstance(v, float):
                cells.append(f'<td class="num">{v:,.6g}</td>')
            else:
                cells.append(f"<td>{_e(v)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _hooks(col: _Column) -> str:
    hooks = col.manifest.get("hooks") or {}
    if not hooks:
        return '<div class="none">no hooks recorded</div>'
    rows = []
    for name, h in hooks.items():
        if h.get("attached"):
            status = f'<span class="ok">{_e(h.get("variant") or "attached")}</span>'
            unsupported = h.get("unsupported") or {}
            if unsupported:
                names = ", ".join(_e(k) for k in unsupported)
                why = _e("; ".join(f"{k}: {v}" for k, v in unsupported.items()))
                status += f'<div class="small" title="{why}">not counted: {names}</div>'
        else:
            status = (
                '<span class="warn">not attached</span>'
                f'<div class="small">{_e(h.get("reason"))}</div>'
            )
        drops, missed = int(h.get("drops") or 0), int(h.get("missed") or 0)
        rows.append(
            f"<tr><td>{_e(name)}</td><td>{status}</td>"
            f'<td class="num">{int(h.get("events") or 0):,}</td>'
            f'<td class="num{" bad" if drops else ""}">{drops:,}</td>'
            f'<td class="num{" bad" if missed else ""}">{missed:,}</td></tr>'
        )
    head = (
        '<tr><th>hook</th><th>status</th><th class="num">events</th>'
        '<th class="num">drops</th><th class="num">missed</th></tr>'
    )
    return f"<table>{head}{''.join(rows)}</table>"


def table_facts(frame: pl.LazyFrame, view: TableView) -> dict[str, pl.Expr]:
    """What the report says of a table besides its rows and its view's figures: its
    time span (``span_us``) and how many processes it holds (``processes``), where
    it has the columns."""
    columns = frame.collect_schema()
    facts = {}
    if UPTIME_TIMESTAMP in columns:
        ts = pl.col(UPTIME_TIMESTAMP)
        facts["span_us"] = (ts.max() - ts.min()).cast(pl.Int64)
    if view.tgid_column and view.tgid_column in columns:
        tgid = pl.col(view.tgid_column)
        if view.unknown_tgid is not None:
            tgid = tgid.filter(tgid != view.unknown_tgid)
        facts["processes"] = tgid.n_unique()
    return facts


def table_summary(
    data: GraphData, progress: Callable[[], None] | None = None
) -> list[dict[str, Any]]:
    """Per table: rows, time span, processes and the view's key statistics (each
    table's from one query, its facts and its view's figures together: none is read;
    the rows are those :func:`load` counted). ``progress`` is called after each table."""
    out = []
    for name, frame in data.tables.items():
        rows = data.count(name)
        entry: dict[str, Any] = {"table": name, "rows": rows, "span_s": None, "processes": None}
        view = table_view(name).for_data(data)
        facts = table_facts(frame, view)
        entry["stats"] = []
        if rows:
            # one query: the facts and the view's figures, run side by side
            asked = [frame.select(**facts)] if facts else []
            try:
                with reading(data.collection.path / name, name):
                    found = collect_all([*asked, *view.summary_queries(frame)])
            except CollectionError as err:
                # a column damaged that load's queries did not read: said in its row
                entry["error"] = str(err)
                found = []
            if found:
                if facts:
                    got = found[0].row(0, named=True)
                    if "span_us" in got:
                        entry["span_s"] = got["span_us"] / US_PER_S
                    entry["processes"] = got.get("processes")
                entry["stats"] = view.summarise(found[len(asked) :])
        out.append(entry)
        if progress is not None:
            progress()
    return out


def _tables(col: _Column) -> str:
    rows = []
    for t in col.summary:
        span = f"{t['span_s']:.2f} s" if t["span_s"] is not None else "-"
        procs = f"{t['processes']:,}" if t["processes"] is not None else "-"
        stats = "".join(f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in t["stats"])
        if "error" in t:
            stats = f'<li class="bad">cannot be read: {_e(t["error"])}</li>'
        scope = col.data.scope(t["table"])
        rows.append(
            f"<tr><td>{_e(t['table'])}{_e(scope)}</td><td class='num'>{t['rows']:,}</td>"
            f"<td class='num'>{span}</td><td class='num'>{procs}</td>"
            f"<td><ul class='stats'>{stats}</ul></td></tr>"
        )
    head = (
        "<tr><th>table</th><th class='num'>rows</th><th class='num'>span</th>"
        "<th class='num'>processes</th><th>key statistics</th></tr>"
    )
    return f"<table>{head}{''.join(rows)}</table>"


def _config(col: _Column) -> str:
    config = col.manifest.get("config")
    if not config:
        return '<div class="none">no configuration recorded</div>'
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    return f"<details><summary>resolved configuration</summary><pre>{_e(text)}</pre></details>"


def _figure_cell(col: _Column, name: str) -> str:
    if name in col.figures:
        title, b64 = col.figures[name]
        return (
            f'<figure><img alt="{_e(title)}" src="data:image/png;base64,{b64}">'
            f"<figcaption>{_e(name)}.png</figcaption></figure>"
        )
    if name in col.failed:
        return f'<div class="none bad">graph failed: {_e(col.failed[name])}</div>'
    graph = graph_registry()[name]
    missing = [t for t in graph.tables if t not in col.data.tables]
    if missing:
        return f'<div class="none">not collected: no {_e(", ".join(missing))} table</div>'
    return '<div class="none">no rows to draw</div>'


def _header(col: _Column) -> str:
    c = col.data.collection
    return (
        f'<div class="head"><div class="name">{_e(c.benchmark or "?")}</div>'
        f"<code>{_e(c.collection_id)}</code>"
        f'<div class="small">{_e(col.manifest.get("started_at"))}</div></div>'
    )


def _row(columns: list[_Column], render_cell) -> str:
    cells = "".join(f'<div class="cell">{render_cell(c)}</div>' for c in columns)
    return f'<div class="row">{cells}</div>'


def report(
    collections: Sequence[Collection | LazyCollection | GraphData | str | Path]
    | Collection
    | LazyCollection
    | GraphData
    | str
    | Path,
    out: str | Path = "report.html",
    *,
    tgid: int | None = None,
    comm: str | None = None,
    graphs: Iterable[str] | None = None,
    dpi: int = 100,
    errors: list[GraphFailure] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write one self-contained HTML page about ``collections``; return its path.

    Args:
        collections: one or more collection folders (side by side, in this order).
        out: the HTML file to write.
        tgid, comm: draw and summarise only this process (or processes of this name).
        graphs: graph names to draw (default: all whose tables exist).
        dpi: resolution of the embedded figures.
        errors: collect graphs that fail here (shown in the page) instead of raising.
        progress: told (steps done, steps in all) as each figure is drawn and each
            table summarised.
    """
    if isinstance(collections, str | Path | Collection | LazyCollection | GraphData):
        collections = [collections]
    if not collections:
        raise ValueError("report needs at least one collection")
    names = list(graphs) if graphs is not None else None
    if names is not None:
        unknown_graphs(names)  # before the page's folder is made
    shown = Path(out)
    path = shown.absolute()
    # held (made if missing) before the work of drawing, as `kernmlops report` holds it:
    # no link planted on the way is written through; under sudo the page is the user's
    hint = "choose another path with -o"
    with held_output(path.parent, f"the report {path.name}", hint) as folder:
        target = folder / path.name
        if target.is_dir() and not target.is_symlink():
            raise GraphOutputError(f"cannot write the report {shown}: it is a folder")
        try:  # before the work of drawing, as write_atomic would refuse it after
            refuse_special(target)
        except OSError as err:
            raise GraphOutputError(f"cannot write the report {shown}: {err.strerror}") from None
        page = _page(
            collections,
            tgid=tgid,
            comm=comm,
            graphs=names,
            dpi=dpi,
            errors=errors,
            progress=progress,
        )
        write_atomic(target, page.encode("utf-8"))
    return shown


def report_title(benchmarks: Sequence[str]) -> str:
    """The page's title: each benchmark once, in order of first appearance, with how
    many of the collections are of it where more than one is (``command (2
    collections), stress-ng``)."""
    counts = Counter(benchmarks)
    return ", ".join(
        name if counts[name] == 1 else f"{name} ({counts[name]} collections)" for name in counts
    )


def _page(
    collections: Sequence[Collection | LazyCollection | GraphData | str | Path],
    *,
    tgid: int | None,
    comm: str | None,
    graphs: list[str] | None,
    dpi: int,
    errors: list[GraphFailure] | None,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """The report's HTML."""
    loaded = [c if isinstance(c, GraphData) else load(c, tgid=tgid, comm=comm) for c in collections]
    # the steps: each graph tried and each table summarised, of every collection
    steps = [0, sum(len(applicable(d, graphs)) + len(d.tables) for d in loaded)]

    def step() -> None:
        steps[0] += 1
        if progress is not None:
            progress(*steps)

    if progress is not None:
        progress(*steps)
    columns = []
    for data in loaded:
        col = _Column(data)
        failures: list[GraphFailure] = []
        drawn = figures(
            data, graphs, dpi=dpi, errors=failures if errors is not None else None, progress=step
        )
        for graph, fig in drawn:
            b64 = base64.b64encode(png_bytes(fig)).decode("ascii")
            col.figures[graph.name] = (graph.title, b64)
        col.failed = {f.graph: f.error for f in failures}
        col.summary = table_summary(data, step)
        unread = [t["error"] for t in col.summary if "error" in t]
        if unread and errors is None:
            raise CollectionError(unread[0])
        failures += [GraphFailure(f"table {t['table']}", t["error"])
                     for t in col.summary if "error" in t]  # fmt: skip
        if errors is not None:
            errors.extend(failures)
        columns.append(col)

    names = [n for n in graph_registry() if any(n in c.figures or n in c.failed for c in columns)]
    n = len(columns)
    title = report_title([c.data.collection.benchmark or "?" for c in columns])
    page = "1200px" if n == 1 else f"{min(700 * n, 2400)}px"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>kernmlops report: {_e(title)}</title>",
        f"<style>:root {{ --cols: {n}; --page: {page}; }}{_CSS}</style>",
        "</head><body>",
        "<h1>kernmlops report</h1>",
        f'<p class="sub">{n} collection{"s" if n > 1 else ""} · generated '
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} by kernmlops {_e(__version__)}"
        + (f" · selection: {_e(columns[0].data.selection)}" if columns[0].data.selection else "")
        + "</p>",
        _row(columns, _header),
        "<h2>Overview</h2>",
        _row(columns, _overview),
        "<h2>System</h2>",
        _row(columns, _system),
    ]
    if any("benchmark_result" in c.data.tables for c in columns):
        parts += ["<h2>Benchmark results</h2>", _row(columns, _results)]
    parts += [
        "<h2>Hooks</h2>",
        _row(columns, _hooks),
        "<h2>Tables</h2>",
        _row(columns, _tables),
        "<h2>Figures</h2>",
    ]
    registry = graph_registry()
    if not names:
        parts.append('<div class="none">no table with data for any graph</div>')
    else:
        links = " · ".join(f'<a href="#{_e(n)}">{_e(registry[n].title)}</a>' for n in names)
        parts.append(f'<p class="small">{links}</p>')
    for name in names:
        parts.append(f'<h3 id="{_e(name)}">{_e(registry[name].title)}</h3>')
        parts.append(_row(columns, lambda c, name=name: _figure_cell(c, name)))
    parts += ["<h2>Configuration</h2>", _row(columns, _config), "</body></html>"]
    return "\n".join(parts)
