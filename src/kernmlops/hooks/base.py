"""What every hook is: options, needs, tables, and a start / poll / stop cycle."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import polars as pl
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from kernmlops.collect.filter import ProcessFilter


class HookOptions(BaseModel):
    """Base of each hook's config section; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class HookContext:
    """What a session hands every hook when it starts."""

    collection_id: str
    #: Process filter shared by all BPF hooks (map fd reused by each object).
    process_filter: ProcessFilter | None
    #: The collector's own tgid, ignored in the kernel.
    self_tgid: int
    bpf_dir: Any = None  # pathlib.Path of the built objects


@dataclass
class HookStatus:
    """Per-hook facts for the summary table and the manifest."""

    name: str
    attached: bool = False
    reason: str | None = None
    variant: str | None = None
    programs: list[str] = field(default_factory=list)
    events: int = 0
    #: records a full ring buffer could not take (counted in the kernel)
    drops: int = 0
    #: program runs the kernel skipped (recursion guard), so events not seen
    missed: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    #: parts the hook asked for that this machine cannot provide (e.g. perf
    #: events), name -> reason: in the manifest, never silently missing
    unsupported: dict[str, str] = field(default_factory=dict)
    #: the hook's own in-kernel counters at stop (e.g. block_io's completions
    #: of requests issued before the start)
    counters: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "attached": self.attached,
            "reason": self.reason,
            "variant": self.variant,
            "programs": self.programs,
            "events": self.events,
            "drops": self.drops,
            "missed": self.missed,
            "rows": self.rows,
            "unsupported": self.unsupported,
            "counters": self.counters,
        }


class Hook(ABC):
    """A source of tables. BPF hooks load an object; pollers read /proc."""

    name: ClassVar[str]
    Options: ClassVar[type[HookOptions]] = HookOptions
    #: Names of tables this hook writes.
    tables: ClassVar[tuple[str, ...]] = ()
    #: Capabilities needed (see kernmlops.ebpf.probe), for doctor.
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: HookOptions) -> None:
        self.options = options
        self.status = HookStatus(name=self.name)

    @abstractmethod
    def start(self, ctx: HookContext) -> None:
        """Load and attach. Raise HookUnavailable with the reason if the kernel refuses."""

    @abstractmethod
    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        """Yield (table, rows) collected since the last poll. Called every poll interval."""

    def stop(self) -> Iterator[tuple[str, pl.DataFrame]]:
        """Final rows, then detach and release every fd. Must be safe to call twice."""
        yield from self.poll()
        self.close()

    def close(self) -> None:
        """Release kernel resources; idempotent."""
