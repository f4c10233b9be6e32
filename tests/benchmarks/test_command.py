"""CommandBenchmark: checks that name the problem, and the launch it returns."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from kernmlops.benchmarks.base import Launch
from kernmlops.benchmarks.command import CommandBenchmark
from kernmlops.errors import BenchmarkError


def _bench(argv: list[str], cwd: str | None = None) -> CommandBenchmark:
    return CommandBenchmark(CommandBenchmark.Options(argv=argv, cwd=cwd))


def test_class_facts() -> None:
    assert CommandBenchmark.name == "command"
    assert CommandBenchmark.default_filter == "tree"
    assert CommandBenchmark.Options().argv == []
    with pytest.raises(ValidationError):
        CommandBenchmark.Options(args=["x"])


@pytest.mark.parametrize("argv", [[], [""]])
def test_empty_argv_says_how(argv: list[str]) -> None:
    with pytest.raises(BenchmarkError, match=r"after --: kernmlops collect -- \./app arg"):
        _bench(argv).check()


def test_program_on_path() -> None:
    true = shutil.which("true")
    assert true is not None
    bench = _bench(["true", "a b", "c"])
    bench.check()
    assert bench.launch() == Launch(argv=["true", "a b", "c"], cwd=None)
    assert bench.describe() == "true 'a b' c"


def test_program_not_on_path() -> None:
    with pytest.raises(BenchmarkError, match="'no-such-program-kml' not found on PATH"):
        _bench(["no-such-program-kml"]).check()


def test_path_missing(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="not found"):
        _bench([str(tmp_path / "app")]).check()


def test_path_not_executable(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.write_text("#!/bin/sh\n")
    app.chmod(0o644)
    # No x bit at all: not executable even to root.
    assert not os.access(app, os.X_OK)
    with pytest.raises(BenchmarkError, match="not executable"):
        _bench([str(app)]).check()
    with pytest.raises(BenchmarkError, match="not executable"):
        _bench([str(tmp_path)]).check()  # a directory


def test_relative_path_resolves_in_cwd(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.write_text("#!/bin/sh\nexit 0\n")
    app.chmod(0o755)
    bench = _bench(["./app", "x"], cwd=str(tmp_path))
    bench.check()
    assert bench.launch() == Launch(argv=["./app", "x"], cwd=str(tmp_path))


def test_missing_cwd(tmp_path: Path) -> None:
    with pytest.raises(BenchmarkError, match="does not exist"):
        _bench(["true"], cwd=str(tmp_path / "nope")).check()


def test_launch_copies_argv() -> None:
    bench = _bench(["true"])
    launch = bench.launch()
    assert launch is not None
    launch.argv.append("x")
    assert bench.options.argv == ["true"]
