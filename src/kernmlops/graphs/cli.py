"""`kernmlops graph` and `kernmlops report`: thin commands over kernmlops.graphs.

Register them on the main group with ``cli.add_command(graph_command)`` and
``cli.add_command(report_command)``. matplotlib is imported only when one runs.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from kernmlops.clitools import fail, progress, reachable_path, warnings_as_lines
from kernmlops.errors import CollectionError, KernmlopsError

console = Console(stderr=True, highlight=False)

_COLLECTION = reachable_path(exists=True, file_okay=True, dir_okay=True, path_type=Path)


def _selection_options(command):
    command = click.option(
        "--comm",
        metavar="NAME",
        help="draw only processes of this name (as the kernel truncates it: 15 characters).",
    )(command)
    command = click.option(
        "--tgid", type=click.IntRange(min=0), help="draw only this process (its tgid)."
    )(command)
    command = click.option("--no-progress", is_flag=True, help="no progress bar on a terminal.")(
        command
    )
    return click.option(
        "--dpi",
        type=click.IntRange(40, 400),
        default=100,
        show_default=True,
        help="resolution of the PNGs.",
    )(command)


def _only_option(command):
    return click.option(
        "--only",
        metavar="NAMES",
        help="comma-separated graph names (default: every graph whose tables exist; "
        "`kernmlops graph --list` lists them).",
    )(command)


def _names(only: str | None) -> list[str] | None:
    """The graphs --only names, each once, in order; None without --only.

    Raises:
        click.UsageError: --only given, naming no graph (``--only ""`` drew every graph,
            ``--only ,`` none, saying the collection had no table to draw).
    """
    if only is None:
        return None
    names = list(dict.fromkeys(n.strip() for n in only.split(",") if n.strip()))
    if not names:
        raise click.UsageError(f"--only {only!r} names no graph (`kernmlops graph --list`)")
    return names


def _report_failures(failures: list) -> None:
    for f in failures:
        # a report's table it could not summarise: its error names the table
        what = "not summarised" if f.graph.startswith("table ") else f"graph {f.graph} failed"
        console.print(f"[red]{what}:[/] {escape(f.error)}", markup=True, soft_wrap=True)


def _lacking(names: list[str], tables: Iterable[str], damaged: Iterable[str] = ()) -> str | None:
    """What a collection with ``tables`` lacks for the graphs asked for by name (--only),
    naming the tables it has (a table in ``damaged`` was left out, and is said so), or
    None when it has every one's."""
    from kernmlops.graphs.context import graph_registry

    registry, have, left_out = graph_registry(), set(tables), set(damaged)
    lacking = [n for n in names if not registry[n].applies(have)]
    if not lacking:
        return None

    def need(t: str) -> str:
        return f"{t} (damaged: left out)" if t in left_out else t

    needs = "; ".join(
        f"{n} needs {', '.join(need(t) for t in registry[n].tables if t not in have)}"
        for n in lacking
    )
    return (
        f"the collection has no table for {', '.join(lacking)} ({needs}); its tables: "
        f"{', '.join(sorted(have)) or 'none'}"
    )


def _missing_tables(names: list[str], tables: Iterable[str], damaged: Iterable[str] = ()) -> None:
    """Refuse, before a folder is made, graphs asked for by name (--only) whose tables
    the collection lacks, naming the tables it has.

    Raises:
        CollectionError: one such graph or more.
    """
    lacking = _lacking(names, tables, damaged)
    if lacking is not None:
        raise CollectionError(lacking)


@click.command("graph")
# required unless --list: shown so in the usage (click would show [COLLECTION])
@click.argument("collection", type=_COLLECTION, required=False, metavar="COLLECTION")
@click.option(
    "-o",
    "--output-dir",
    type=reachable_path(file_okay=False, path_type=Path),
    help="where the PNGs go (default: COLLECTION/graphs).",
)
@_only_option
@click.option("--list", "list_only", is_flag=True, help="list the graphs and the tables they need.")
@_selection_options
def graph_command(
    collection: Path | None,
    output_dir: Path | None,
    only: str | None,
    list_only: bool,
    tgid: int | None,
    comm: str | None,
    dpi: int,
    no_progress: bool,
) -> None:
    """Draw a collection's tables as PNG files (one per graph) and list them.

    COLLECTION is required, except with --list.

    \b
    Examples:
      kernmlops graph data/curated/benchmark=faux/collection_id=<id>
      kernmlops graph COLLECTION -o figs/ --comm stress-ng-cpu
      kernmlops graph COLLECTION --only quanta_timeline,syscalls_top

    Only graphs whose tables the collection has are drawn; a table without
    rows (for the selection) gives no graph. Tables that hold no process
    (memory_usage, perf_counters) are drawn whole under --tgid/--comm.
    """
    from kernmlops.graphs import render
    from kernmlops.graphs.context import graph_registry

    if list_only:
        for name, graph in graph_registry().items():
            click.echo(f"{name:<24} {', '.join(graph.tables):<34} {graph.title}")
        return
    if collection is None:
        raise click.UsageError("Missing argument 'COLLECTION'.")
    if tgid is not None and comm is not None:
        raise click.UsageError("--tgid and --comm exclude each other")
    names = _names(only)
    from kernmlops.data import read_collection
    from kernmlops.graphs.context import load, unknown_graphs

    failures: list = []
    try:
        if names is not None:
            unknown_graphs(names)
        # scanned (and refused) before a folder is made; never read whole: each graph
        # collects what it draws, so a collection larger than memory is drawn too
        with warnings_as_lines():  # a damaged table is said, the rest drawn
            col = read_collection(collection, lazy=True, damaged="skip", pages=True)
            data = load(col, tgid=tgid, comm=comm, damaged="skip")
        if names is not None:
            _missing_tables(names, data.tables, col.damaged)
        # render holds the folder open (no link planted on the way followed); under
        # sudo the PNGs are the user's, handed over through the held folder
        with progress("drawing", "graphs", enabled=not no_progress) as steps:
            written = render(
                data,
                output_dir,
                tgid=tgid,
                comm=comm,
                graphs=names,
                dpi=dpi,
                errors=failures,
                progress=steps,
            )
    except KernmlopsError as err:
        fail(err)
    for path in written:
        click.echo(str(path))
    _report_failures(failures)
    if not written and not failures:
        console.print("no graphs: the collection has no table with rows that a graph draws")
    else:
        console.print(f"{len(written)} graph(s) written")
    sys.exit(1 if failures or col.damaged else 0)


@click.command("report")
@click.argument("collections", nargs=-1, required=True, type=_COLLECTION)
@click.option(
    "-o",
    "--output",
    type=reachable_path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="the HTML file to write.",
)
@_only_option
@_selection_options
def report_command(
    collections: tuple[Path, ...],
    output: Path,
    only: str | None,
    tgid: int | None,
    comm: str | None,
    dpi: int,
    no_progress: bool,
) -> None:
    """Write one self-contained HTML page about one or more collections.

    \b
    Examples:
      kernmlops report COLLECTION                       -> report.html
      kernmlops report A B -o compare.html              A and B side by side
      kernmlops report COLLECTION --only quanta_timeline,syscalls_top

    The page holds the system, the configuration, each hook's status (events,
    drops), per-table statistics and every figure (inline PNGs: no other file
    is needed to open it); --only draws the named figures alone (a collection
    without the tables of one is said in a warning, and the exit status is 1).
    """
    from kernmlops.graphs import report

    if tgid is not None and comm is not None:
        raise click.UsageError("--tgid and --comm exclude each other")
    names = _names(only)
    from kernmlops.data import read_collection
    from kernmlops.graphs.context import load, unknown_graphs

    failures: list = []
    try:
        if names is not None:
            unknown_graphs(names)
        _can_write_in(output)  # before the collections are read and drawn
        # scanned before a file is made, never read whole (as for `graph`)
        with warnings_as_lines():  # a damaged table is said, the rest reported
            read = [read_collection(c, lazy=True, damaged="skip", pages=True) for c in collections]
            cols = [load(c, tgid=tgid, comm=comm, damaged="skip") for c in read]
        # a figure asked for (--only) that a collection cannot have is said (as `graph`
        # says it), not left to a note in the page: the page is written still, as the
        # other collections (and the rest of this one's page) are worth it
        lacking = [] if names is None else [
            (given, why) for given, c, data in zip(collections, read, cols, strict=True)
            if (why := _lacking(names, data.tables, c.damaged)) is not None
        ]  # fmt: skip
        # report holds the page's folder open (no planted link followed); under sudo
        # the page is the user's, handed over through it
        with progress("reporting", "graphs and tables", enabled=not no_progress) as steps:
            path = report(
                cols,
                output,
                tgid=tgid,
                comm=comm,
                graphs=names,
                dpi=dpi,
                errors=failures,
                progress=steps,
            )
    except KernmlopsError as err:
        fail(err)
    for where, why in lacking:
        console.print(f"[yellow]warning:[/] {escape(f'{where}: {why}')}", soft_wrap=True)
    _report_failures(failures)
    click.echo(str(path))
    sys.exit(1 if failures or lacking or any(c.damaged for c in read) else 0)


def _can_write_in(output: Path) -> None:
    """Refuse now, in one line, a page whose folder takes no file (not a folder, not
    writable, /proc, where even root makes none): found otherwise once every figure
    was drawn. The folder is checked as the report holds it (made if missing), and a
    file without a name is made in it and gone at once."""
    import tempfile

    from kernmlops.errors import why_not_written
    from kernmlops.graphs._render import GraphOutputError, held_output

    path = output.absolute()
    with held_output(path.parent, f"the report {path.name}", "choose another path with -o") as at:
        try:
            with tempfile.TemporaryFile(dir=at):
                pass
        except OSError as err:
            why = why_not_written(err, path)
            raise GraphOutputError(f"cannot write the report {output}: {why}") from None


# --- KernMLOps' `collect dump` and `collect graph` --------------------------------------

#: where KernMLOps' commands look without -d (its collect wrote there)
_KML_INPUT = Path("data/curated")
_KML_INPUT_OPTION = click.option(
    "-d",
    "--input-dir",
    type=reachable_path(file_okay=False, path_type=Path),
    default=_KML_INPUT,
    show_default=True,
    help="the collections' folder (or the data folder holding curated/).",
)


@click.command("collect dump")
@_KML_INPUT_OPTION
@click.option(
    "-b",
    "--benchmark",
    "benchmark_name",
    help="only this benchmark's collections (linux_build or linux-build).",
)
def kernmlops_dump_command(input_dir: Path, benchmark_name: str | None) -> None:
    """KernMLOps' `collect dump`: print every table of the collections under INPUT_DIR,
    as its data call reads them (kernmlops.data_import)."""
    from kernmlops import data_import

    try:
        tables = data_import.read_parquet_dir(input_dir, benchmark_name)
    except KernmlopsError as err:
        fail(err)
    for name, frame in tables.items():
        click.echo(f"{name}: {frame}")


@click.command("collect graph")
@_KML_INPUT_OPTION
@click.option(
    "-o",
    "--output-dir",
    type=reachable_path(file_okay=False, path_type=Path),
    help="where the PNGs go (default: the collection's graphs/).",
)
@click.option(
    "-c",
    "--collection-id",
    required=True,
    help="the collection's id, or a prefix of it that no other collection's has.",
)
@click.option("--no-trends", is_flag=True, help="taken as KernMLOps took it: these draw no trends.")
@click.option("-m", "--matplot", is_flag=True, help="taken as KernMLOps took it: these are PNGs.")
@click.pass_context
def kernmlops_graph_command(
    ctx: click.Context,
    input_dir: Path,
    output_dir: Path | None,
    collection_id: str,
    no_trends: bool,
    matplot: bool,
) -> None:
    """KernMLOps' `collect graph`: `kernmlops graph` of the collection under INPUT_DIR
    whose id starts with COLLECTION_ID."""
    del no_trends, matplot  # its scripts pass them; our graphs have one form
    from kernmlops.data import list_collections

    try:
        found = list_collections(input_dir)
        ids = [
            (cid, path)
            for cid, path in zip(found["collection_id"], found["path"], strict=True)
            if cid.startswith(collection_id)
        ]
        if not ids:
            raise CollectionError(f"{input_dir}: no collection's id starts with {collection_id!r}")
        if len(ids) > 1:
            raise CollectionError(
                f"{input_dir}: {len(ids)} collections' ids start with {collection_id!r} "
                f"({', '.join(sorted(c for c, _ in ids))}): give more of the id"
            )
    except KernmlopsError as err:
        fail(err)
    ctx.invoke(graph_command, collection=Path(ids[0][1]), output_dir=output_dir)
