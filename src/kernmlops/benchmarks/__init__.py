"""Benchmarks by name: each is one module here, registered in REGISTRY."""

from __future__ import annotations

import difflib

from kernmlops.benchmarks.base import Benchmark, BenchmarkOptions, Launch
from kernmlops.benchmarks.command import CommandBenchmark
from kernmlops.benchmarks.faux import FauxBenchmark
from kernmlops.benchmarks.stress_ng import StressNgBenchmark
from kernmlops.errors import BenchmarkError

REGISTRY: dict[str, type[Benchmark]] = {
    FauxBenchmark.name: FauxBenchmark,
    CommandBenchmark.name: CommandBenchmark,
    StressNgBenchmark.name: StressNgBenchmark,
}


def get_benchmark(name: str) -> type[Benchmark]:
    """The benchmark class called ``name``; BenchmarkError lists the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        close = difflib.get_close_matches(name, REGISTRY, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise BenchmarkError(f"unknown benchmark {name!r}{hint} (known: {known})") from None


__all__ = [
    "REGISTRY",
    "Benchmark",
    "BenchmarkOptions",
    "CommandBenchmark",
    "FauxBenchmark",
    "Launch",
    "StressNgBenchmark",
    "get_benchmark",
]
