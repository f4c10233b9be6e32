"""The benchmark registry and its error for unknown names."""

from __future__ import annotations

import pytest

from kernmlops.benchmarks import REGISTRY, get_benchmark
from kernmlops.benchmarks.base import Benchmark
from kernmlops.benchmarks.command import CommandBenchmark
from kernmlops.benchmarks.faux import FauxBenchmark
from kernmlops.benchmarks.gap import GapBenchmark
from kernmlops.benchmarks.ml_training import MlTrainingBenchmark
from kernmlops.benchmarks.stress_ng import StressNgBenchmark
from kernmlops.errors import BenchmarkError


def test_registry_names() -> None:
    expected = {
        "faux": FauxBenchmark,
        "command": CommandBenchmark,
        "stress-ng": StressNgBenchmark,
        "gap": GapBenchmark,
        "ml-training": MlTrainingBenchmark,
    }
    assert expected.items() <= REGISTRY.items()  # new modules add themselves
    for name, cls in REGISTRY.items():
        assert issubclass(cls, Benchmark)
        assert cls.name == name
        assert get_benchmark(name) is cls
        cls(cls.Options())  # every benchmark builds from default options


def test_unknown_name_lists_known() -> None:
    with pytest.raises(BenchmarkError) as err:
        get_benchmark("nope")
    message = str(err.value)
    assert "'nope'" in message
    for name in REGISTRY:
        assert name in message


def test_unknown_name_suggests_nearest() -> None:
    with pytest.raises(BenchmarkError, match="did you mean 'stress-ng'"):
        get_benchmark("stress_ng")
