"""What every benchmark is: validated options, a check, and a process to run."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel, ConfigDict


class BenchmarkOptions(BaseModel):
    """Base of each benchmark's config section; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Launch:
    """A process for the session to start (in its own process group)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Benchmark(ABC):
    """One workload. ``launch()`` returns None for a benchmark that runs no process."""

    name: ClassVar[str]
    Options: ClassVar[type[BenchmarkOptions]] = BenchmarkOptions
    #: Default process filter: "tree" follows the benchmark's processes,
    #: "system" traces everything.
    default_filter: ClassVar[str] = "system"

    def __init__(self, options: BenchmarkOptions) -> None:
        self.options = options

    def check(self) -> None:
        """Raise BenchmarkError before anything is attached if the benchmark cannot run."""

    @abstractmethod
    def launch(self) -> Launch | None:
        """The command to run, or None (run until stopped or the duration passes)."""

    def describe(self) -> str:
        """One line for progress output and the manifest."""
        launch = self.launch()
        return " ".join(launch.argv) if launch else self.name
