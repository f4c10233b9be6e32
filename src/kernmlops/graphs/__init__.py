"""Graphs of collections and an HTML report.

Each table's graphs live in a module named after the table or the hook that
writes it (``graphs/quanta_runtime.py``, ``graphs/block_io.py``, ...):
:class:`Graph` subclasses that name the tables they need. They are found by
importing every module of this package, as hooks and benchmarks are, so a new
table brings its graphs with one new module. A graph
is drawn only where its tables exist and the selection leaves rows in them.

In a notebook::

    from kernmlops.graphs import figure, render, report

    figure("data/curated/benchmark=faux/collection_id=...", "quanta_timeline")
    render(path, "out/", comm="stress-ng-cpu")      # -> [Path("out/quanta_timeline.png"), ...]
    report([path_a, path_b], "compare.html")         # one self-contained page, side by side

The names below are imported on first use, so ``kernmlops.graphs.cli`` (and with
it the command line) loads neither polars nor matplotlib until a graph is drawn.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Graph": "base",
    "GraphData": "base",
    "Marker": "base",
    "NoData": "base",
    "SelectionError": "base",
    "TableView": "base",
    "graph_registry": "context",
    "load": "context",
    "table_view": "context",
    "GraphFailure": "_render",
    "figure": "_render",
    "figures": "_render",
    "render": "_render",
    "report": "_report",
}

__all__ = [
    "Graph",
    "GraphData",
    "GraphFailure",
    "Marker",
    "NoData",
    "SelectionError",
    "TableView",
    "figure",
    "figures",
    "graph_registry",
    "load",
    "render",
    "report",
    "table_view",
]

if TYPE_CHECKING:
    from kernmlops.graphs._render import GraphFailure, figure, figures, render
    from kernmlops.graphs._report import report
    from kernmlops.graphs.base import Graph, GraphData, Marker, NoData, SelectionError, TableView
    from kernmlops.graphs.context import graph_registry, load, table_view


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernmlops.graphs' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"kernmlops.graphs.{module}"), name)
    globals()[name] = value
    return value
