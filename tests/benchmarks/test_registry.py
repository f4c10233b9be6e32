"""The benchmark registry and its error for unknown names."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import REGISTRY, get_benchmark
from kernmlops.benchmarks.base import Benchmark
from kernmlops.benchmarks.command import CommandBenchmark
from kernmlops.benchmarks.faux import FauxBenchmark
from kernmlops.benchmarks.gap import GapBenchmark
from kernmlops.benchmarks.ml_training import MlTrainingBenchmark
from kernmlops.benchmarks.stress_ng import StressNgBenchmark
from kernmlops.config import load_config
from kernmlops.errors import BenchmarkError, ConfigError


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


def _float_fields(cls: type[Benchmark]) -> list[str]:
    return [
        name for name, field in cls.Options.model_fields.items() if "float" in str(field.annotation)
    ]


def test_float_options_refuse_inf_and_nan() -> None:
    """A duration of .inf passed gt=0 and ended in an OverflowError traceback
    (stress-ng's math.ceil); every benchmark's float option refuses it."""
    checked = 0
    for cls in REGISTRY.values():
        for name in _float_fields(cls):
            for bad in (float("inf"), float("-inf"), float("nan")):
                with pytest.raises(ValidationError, match="finite number"):
                    cls.Options(**{name: bad})
            checked += 1
    assert checked >= 3  # stress-ng's duration_s, fio's runtime_s, ...


def test_inf_duration_is_one_config_error(tmp_path: Path) -> None:
    path = tmp_path / "o.yaml"
    path.write_text("benchmark:\n  name: stress-ng\n  stress_ng:\n    duration_s: .inf\n")
    with pytest.raises(ConfigError, match=r"benchmark\.stress_ng\.duration_s"):
        load_config(path)
