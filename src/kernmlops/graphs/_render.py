"""Draw a collection's graphs: figures for a notebook, PNG files for the command line.

matplotlib is used through ``Figure`` objects and the Agg canvas only (no pyplot):
no global figure state, no display needed.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmlops import fileio
from kernmlops.data import Collection, LazyCollection
from kernmlops.errors import KernmlopsError, OutputError
from kernmlops.graphs.base import Graph, GraphData, NoData
from kernmlops.graphs.context import graph_registry, load, unknown_graphs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kernmlops.host.pinned import Pinned

__all__ = ["GraphFailure", "GraphOutputError", "figure", "figures", "png_bytes", "render"]

#: Applied while a figure is drawn and saved.
STYLE: dict[str, Any] = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": True,
    "figure.titlesize": 13,
    "figure.titleweight": "bold",
    "savefig.facecolor": "white",
    "figure.facecolor": "white",
}


@dataclass(frozen=True)
class GraphFailure:
    """A graph that raised while drawing (a bug, or data it did not expect)."""

    graph: str
    error: str


class GraphError(KernmlopsError):
    """A graph failed to draw; the message names it."""


class GraphOutputError(KernmlopsError):
    """The graphs (or the report) cannot be written where asked."""


def held_dir(folder: Path, what: str, hint: str = "choose another folder with -o") -> Pinned:
    """``folder``, made if needed and held open (kernmlops.host.pinned): as root, no
    link a user planted on the way is followed and, under sudo, no folder of another
    user is written in; the PNGs (or the page) go through :attr:`Pinned.io`.
    GraphOutputError naming ``folder`` and ``what`` was to be written when it cannot be
    made or written (checked before anything is drawn)."""
    from kernmlops.host.invoker import invoker
    from kernmlops.host.pinned import UnsafePath, pin

    folder = folder.absolute()
    who = invoker()
    try:
        held = pin(folder, create=True, invoker_uid=who.uid if who else None, what=what)
    except UnsafePath as err:
        raise GraphOutputError(str(err)) from None
    except OutputError as err:
        reason = getattr(err, "reason", str(err))
        raise GraphOutputError(f"cannot write {what} into {folder}: {reason} ({hint})") from None
    if not os.access(held.io, os.W_OK | os.X_OK):  # no permission, or a read-only mount
        held.close()
        raise GraphOutputError(f"cannot write {what} into {folder}: not writable ({hint})")
    return held


@contextlib.contextmanager
def held_output(
    folder: Path, what: str, hint: str = "choose another folder with -o"
) -> Iterator[Path]:
    """The folder to write ``what`` in, as the commands and the library both write it:
    made if missing and held open (:func:`held_dir`); the block writes through the
    path it is given (the held descriptor, whatever is renamed or linked meanwhile).
    Under sudo what it writes, and the folders made for it, are the invoker's. An
    error names ``folder``, never the descriptor's path."""
    from kernmlops.host.pinned import handed_over_held

    held = held_dir(folder, what, hint)
    try:
        with handed_over_held(held):
            yield held.io
    except KernmlopsError as err:
        raise type(err)(str(err).replace(str(held.io), str(folder))) from None
    finally:
        held.close()


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary name, so a reader never sees half a file."""
    try:
        fileio.write_atomic(path, data)
    except OSError as err:
        raise GraphOutputError(f"cannot write {path}: {err.strerror}") from None


def _new_figure(graph: Graph, dpi: int) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=graph.figsize, dpi=dpi, layout="constrained")


def _subtitle(data: GraphData, graph: Graph) -> str:
    col = data.collection
    parts = [col.benchmark or "?", col.collection_id[:8]]
    if data.selection:
        wide = any(t in data.system_wide for t in graph.tables)
        parts.append("system-wide" if wide else data.selection)
    return " · ".join(parts)


def draw(graph: Graph, data: GraphData, dpi: int = 100) -> Figure:
    """One graph as a Figure; NoData when its tables are empty for this selection."""
    import matplotlib as mpl

    fig = _new_figure(graph, dpi)
    with mpl.rc_context(STYLE):
        graph.draw(data, fig)
        fig.suptitle(f"{graph.title}  ·  {_subtitle(data, graph)}")
    return fig


def figures(
    data: GraphData,
    names: Iterable[str] | None = None,
    *,
    dpi: int = 100,
    errors: list[GraphFailure] | None = None,
    progress: Callable[[], None] | None = None,
) -> Iterator[tuple[Graph, Figure]]:
    """(graph, figure) for each graph whose tables the collection has and whose
    selection is not empty. A graph that raises is appended to ``errors`` when a
    list is given, else raised as GraphError. ``progress`` is called as each of the
    :func:`applicable` graphs is done with (drawn, empty or failed)."""
    registry = graph_registry()
    wanted = list(names) if names is not None else list(registry)
    unknown_graphs(wanted)
    for name in wanted:
        graph = registry[name]
        if not graph.applies(data.tables):
            continue
        try:
            fig = draw(graph, data, dpi)
        except NoData:
            fig = None
        except Exception as err:  # a bug in one graph must not hide the others
            if errors is None:
                raise GraphError(f"graph {name!r} failed: {_one_line(err)}") from err
            errors.append(GraphFailure(name, _one_line(err)))
            fig = None
        if fig is not None:
            yield graph, fig
        if progress is not None:
            progress()


def applicable(data: GraphData, names: Iterable[str] | None = None) -> list[str]:
    """The graphs (of ``names``, default all) whose tables ``data`` has: those that
    :func:`figures` tries, in its order."""
    registry = graph_registry()
    wanted = list(names) if names is not None else list(registry)
    return [n for n in wanted if n in registry and registry[n].applies(data.tables)]


def _one_line(err: Exception) -> str:
    """A graph's failure in one line: polars appends the plan it resolved and every
    column the frame has (dozens of lines for one missing column)."""
    text = (str(err).strip().splitlines() or [""])[0]
    import polars as pl  # loaded already: the graphs' queries raised this

    if isinstance(err, pl.exceptions.ColumnNotFoundError):
        text = text.split("; valid columns:")[0] + " (a part of another table, or damaged?)"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def png_bytes(fig: Figure) -> bytes:
    import matplotlib as mpl

    buf = io.BytesIO()
    with mpl.rc_context(STYLE):
        fig.savefig(buf, format="png")
    return buf.getvalue()


def figure(
    collection: Collection | LazyCollection | GraphData | str | Path,
    name: str,
    *,
    tgid: int | None = None,
    comm: str | None = None,
) -> Figure:
    """One graph of a collection as a matplotlib Figure (shows itself in a notebook).

    Raises:
        NoData: the collection lacks the graph's tables, or they are empty.
    """
    data = (
        collection if isinstance(collection, GraphData) else load(collection, tgid=tgid, comm=comm)
    )
    unknown_graphs([name])
    graph = graph_registry()[name]
    if not graph.applies(data.tables):
        raise NoData(f"{name} needs table(s) {', '.join(graph.tables)}")
    return draw(graph, data)


def render(
    collection: Collection | LazyCollection | GraphData | str | Path,
    outdir: str | Path | None = None,
    *,
    tgid: int | None = None,
    comm: str | None = None,
    graphs: Iterable[str] | None = None,
    dpi: int = 100,
    errors: list[GraphFailure] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[Path]:
    """Write each graph of ``collection`` as ``<outdir>/<graph>.png``; return the paths.

    Args:
        collection: a collection folder (or one read with kernmlops.data.read_collection,
            or loaded with kernmlops.graphs.context.load).
        outdir: where the PNGs go (default: ``<collection>/graphs``), made if missing
            and held open as `kernmlops graph` holds it (kernmlops.host.pinned).
        tgid, comm: draw only this process (or processes of this name).
        graphs: graph names to draw (default: all whose tables exist).
        dpi: resolution (the figures are about 10 x 5 inches).
        errors: collect graphs that fail here instead of raising.
        progress: told (graphs done, graphs to try) as each is done with.
    """
    data = (
        collection if isinstance(collection, GraphData) else load(collection, tgid=tgid, comm=comm)
    )
    out = Path(outdir) if outdir is not None else data.collection.path / "graphs"
    tried = [0, len(applicable(data, graphs))]

    def one_more() -> None:
        tried[0] += 1
        if progress is not None:
            progress(*tried)

    if progress is not None:
        progress(*tried)
    with held_output(out.absolute(), "graphs") as folder:
        written = []
        for graph, fig in figures(data, graphs, dpi=dpi, errors=errors, progress=one_more):
            write_atomic(folder / f"{graph.name}.png", png_bytes(fig))
            written.append(out / f"{graph.name}.png")
    return written
