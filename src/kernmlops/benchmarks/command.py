"""Any command the user gives (``kernmlops collect -- ./app arg``)."""

from __future__ import annotations

import os
import shlex
import shutil
from typing import ClassVar

from pydantic import Field

from kernmlops.benchmarks.base import Benchmark, BenchmarkOptions, Launch
from kernmlops.errors import BenchmarkError


class CommandOptions(BenchmarkOptions):
    argv: list[str] = Field(default_factory=list, description="program and its arguments")
    cwd: str | None = Field(None, description="working directory (default: the current one)")


class CommandBenchmark(Benchmark[CommandOptions]):
    """Runs ``argv`` (in ``cwd``) and follows its process tree."""

    name: ClassVar[str] = "command"
    default_filter: ClassVar[str] = "tree"

    def check(self) -> None:
        argv, cwd = self.options.argv, self.options.cwd
        if not argv or not argv[0]:
            raise BenchmarkError(
                "command: no command to run; give the command after --: "
                "kernmlops collect -- ./app arg"
            )
        if cwd is not None and not os.path.isdir(cwd):
            raise BenchmarkError(f"command: working directory {cwd!r} does not exist")
        program = argv[0]
        if os.sep in program:
            # A path runs relative to the working directory the process gets.
            path = program if os.path.isabs(program) or cwd is None else os.path.join(cwd, program)
            if not os.path.exists(path):
                raise BenchmarkError(f"command: {program!r} not found")
            if os.path.isdir(path) or not os.access(path, os.X_OK):
                raise BenchmarkError(f"command: {program!r} is not executable")
        elif shutil.which(program) is None:
            raise BenchmarkError(
                f"command: {program!r} not found on PATH; give a path (./{program}) or install it"
            )

    def launch(self) -> Launch | None:
        return Launch(argv=list(self.options.argv), cwd=self.options.cwd)

    def describe(self) -> str:
        return shlex.join(self.options.argv) if self.options.argv else self.name
