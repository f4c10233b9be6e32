"""Benchmarks by name. A new benchmark is one module here (and its tests): the
Benchmark subclasses of every module are registered (``_index.py`` names them, so
a run imports only its own benchmark; ``make defaults`` updates it)."""

from __future__ import annotations

import difflib

from kernmlops.benchmarks.base import Benchmark, BenchmarkOptions, BenchmarkRun, Launch
from kernmlops.errors import BenchmarkError
from kernmlops.registry import Plugins

REGISTRY: Plugins[Benchmark] = Plugins("kernmlops.benchmarks", Benchmark, skip=frozenset({"base"}))


def get_benchmark(name: str) -> type[Benchmark]:
    """The benchmark class called ``name``; BenchmarkError lists the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise BenchmarkError(f"unknown benchmark {name!r}{hint} (known: {known})") from None


__all__ = ["REGISTRY", "Benchmark", "BenchmarkOptions", "BenchmarkRun", "Launch", "get_benchmark"]
