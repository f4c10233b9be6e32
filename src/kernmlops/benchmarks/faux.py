"""A benchmark that runs nothing: collect the whole system until stopped."""

from __future__ import annotations

from typing import ClassVar

from kernmlops.benchmarks.base import Benchmark, BenchmarkOptions, Launch


class FauxBenchmark(Benchmark[BenchmarkOptions]):
    """No process; the session runs until Ctrl+C or the configured duration."""

    name: ClassVar[str] = "faux"
    # Nothing of ours runs, so the only interesting processes are everyone's.
    default_filter: ClassVar[str] = "system"

    def launch(self) -> Launch | None:
        return None
