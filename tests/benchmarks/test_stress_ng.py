"""StressNgBenchmark: argv per scenario, scaled to the CPUs; real short runs."""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks import stress_ng
from kernmlops.benchmarks.stress_ng import StressNgBenchmark
from kernmlops.collect.sysinfo import online_cpu_count
from kernmlops.errors import BenchmarkError

needs_stress_ng = pytest.mark.skipif(
    shutil.which("stress-ng") is None, reason="stress-ng is not installed"
)


def _argv(**options: object) -> list[str]:
    launch = StressNgBenchmark(StressNgBenchmark.Options(**options)).launch()
    assert launch is not None
    return launch.argv


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_class_facts() -> None:
    assert StressNgBenchmark.name == "stress-ng"
    assert StressNgBenchmark.default_filter == "tree"
    opts = StressNgBenchmark.Options()
    assert (opts.scenario, opts.duration_s, opts.workers, opts.extra_args) == ("mixed", 10, 0, [])


@pytest.mark.parametrize(
    "bad", [{"scenario": "disk"}, {"duration_s": 0}, {"workers": -1}, {"timeout": 3}]
)
def test_bad_options(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        StressNgBenchmark.Options(**bad)


def test_mixed_scales_to_online_cpus() -> None:
    n = online_cpu_count()
    argv = _argv(duration_s=5)
    assert argv[0] == "stress-ng"
    assert _flag(argv, "--cpu") == str(n)
    assert _flag(argv, "--switch") == str(max(1, n // 2))
    assert _flag(argv, "--vm") == str(max(1, n // 2))
    assert _flag(argv, "--vm-bytes") == "64M"
    assert _flag(argv, "--hdd") == str(max(1, n // 4))
    assert _flag(argv, "--temp-path") == tempfile.gettempdir()
    assert _flag(argv, "--timeout") == "5s"
    assert "--metrics-brief" in argv


def test_mixed_on_a_big_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stress_ng, "online_cpu_count", lambda: 16)
    argv = _argv()
    assert [_flag(argv, f) for f in ("--cpu", "--switch", "--vm", "--hdd")] == ["16", "8", "8", "4"]
    assert _flag(argv, "--timeout") == "10s"


@pytest.mark.parametrize(
    ("scenario", "flags"),
    [
        ("cpu", {"--cpu": "3"}),
        ("switch", {"--switch": "3"}),
        ("vm", {"--vm": "3", "--vm-bytes": "64M"}),
        ("io", {"--hdd": "3", "--iomix": "1"}),
    ],
)
def test_single_scenarios_use_workers(scenario: str, flags: dict[str, str]) -> None:
    argv = _argv(scenario=scenario, workers=3)
    for flag, value in flags.items():
        assert _flag(argv, flag) == value
    stressors = {"--cpu", "--switch", "--vm", "--hdd", "--iomix"}
    assert {a for a in argv if a in stressors} == {f for f in flags if f in stressors}


def test_duration_rounds_up_and_extra_args_last() -> None:
    argv = _argv(scenario="cpu", duration_s=2.5, extra_args=["--verify", "--cpu-method", "fft"])
    assert _flag(argv, "--timeout") == "3s"
    assert argv[-3:] == ["--verify", "--cpu-method", "fft"]
    assert _flag(_argv(scenario="cpu", duration_s=0.1), "--timeout") == "1s"


def test_describe_is_the_command() -> None:
    bench = StressNgBenchmark(StressNgBenchmark.Options(scenario="cpu", workers=2, duration_s=1))
    assert bench.describe() == "stress-ng --cpu 2 --timeout 1s --metrics-brief"


def test_check_missing_stress_ng(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stress_ng.shutil, "which", lambda name: None)
    with pytest.raises(BenchmarkError, match="apt-get install stress-ng"):
        StressNgBenchmark().check()


@needs_stress_ng
@pytest.mark.parametrize("scenario", ["mixed", "cpu", "switch", "vm", "io"])
def test_flags_exist_in_installed_stress_ng(scenario: str) -> None:
    help_text = subprocess.run(
        ["stress-ng", "--help"], capture_output=True, text=True, check=False
    ).stdout
    for arg in _argv(scenario=scenario):
        if arg.startswith("--"):
            assert f"{arg} " in help_text, arg


@needs_stress_ng
def test_mixed_runs_for_two_seconds() -> None:
    bench = StressNgBenchmark(StressNgBenchmark.Options(scenario="mixed", duration_s=2))
    bench.check()
    launch = bench.launch()
    assert launch is not None
    done = subprocess.run(launch.argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout + done.stderr
    assert "successful run completed" in out
    for stressor in ("cpu", "switch", "vm", "hdd"):
        assert f"] {stressor} " in out  # a metrics line per stressor


@needs_stress_ng
@pytest.mark.parametrize("scenario", ["cpu", "switch", "vm", "io"])
def test_other_scenarios_run(scenario: str) -> None:
    launch = StressNgBenchmark(
        StressNgBenchmark.Options(scenario=scenario, duration_s=1, workers=1)
    ).launch()
    assert launch is not None
    done = subprocess.run(launch.argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
