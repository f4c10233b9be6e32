"""FauxBenchmark runs nothing and traces the whole system."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.faux import FauxBenchmark


def test_faux_runs_no_process() -> None:
    bench = FauxBenchmark()
    assert bench.name == "faux"
    assert bench.default_filter == "system"
    bench.check()
    assert bench.launch() is None
    assert bench.describe() == "faux"


def test_faux_takes_no_options() -> None:
    with pytest.raises(ValidationError):
        FauxBenchmark.Options(duration=3)
