"""perf_counters: perf events counted on every CPU, read at a fixed rate.

One row per CPU per sample: ``ts_uptime_us``, ``cpu``, and for each event its
cumulative 64-bit count plus ``<event>_enabled_ns`` / ``<event>_running_ns``.
When the PMU has fewer counters than events, the kernel multiplexes them;
``count * enabled / running`` estimates the full count (see :func:`scaled`).

The table is wide (a column per event), not long (a row per cpu and event):
the event set is fixed for a collection, so the schema is too; a wide row
is 3 columns per event instead of repeating ts / cpu / name per event, and
deltas are one ``diff`` per column over rows grouped by cpu.

Counters are system-wide per CPU (pid -1): the process filter does not apply.
Events the machine cannot count (hardware events in most VMs) get no column;
they are named with the reason in the hook status (``unsupported``), never
written as zeros. An event whose PMU counts a whole package or die (RAPL's
``power/energy-pkg/``, the uncore PMUs: a ``cpumask`` in sysfs) is read on the CPU
the kernel names for each package and is null on the others, so a column's sum over
CPUs counts each package once (as ``perf stat -a``); an event of one core type of a
hybrid machine is null on the other type's CPUs.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator

from kernmlops.ebpf.perf_counters import (
    HARDWARE,
    HARDWARE_ALIASES,
    SOFTWARE,
    SOFTWARE_ALIASES,
    CounterSet,
    EventSpec,
    cache_events,
    event_column,
    resolve_all,
)
from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookContext, HookOptions, SampledHook, SampledHookOptions
from kernmlops.host.cpus import online_cpus
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


TABLE = "perf_counters"

#: Counted on every machine, whatever ``events`` says.
SOFTWARE_EVENTS: tuple[str, ...] = (
    "task-clock",
    "cpu-clock",
    "context-switches",
    "cpu-migrations",
    "minor-faults",
    "major-faults",
)
#: The default ``events``: the seed's TLB events and the usual hardware set.
DEFAULT_EVENTS: tuple[str, ...] = (
    "dTLB-load-misses",
    "dTLB-store-misses",
    "iTLB-load-misses",
    "tlb:tlb_flush",
    "cycles",
    "instructions",
    "cache-misses",
    "branch-misses",
)

_SHAPED = re.compile(r"^([\w.-]+/[^/]*/|r[0-9a-fA-F]+|[\w-]+:[\w-]+)$")
_GENERIC = (set(HARDWARE) | set(HARDWARE_ALIASES) | set(SOFTWARE) | set(SOFTWARE_ALIASES)) | set(
    cache_events()
)


def check_event_name(name: str) -> str:
    """A generic event name or one of the shapes perf accepts; else a ValueError
    naming the nearest known events. Whether the machine counts it is decided at
    start, not here (a config is checked without the kernel)."""
    name = name.strip()
    if name in _GENERIC or _SHAPED.match(name):
        return name
    near = difflib.get_close_matches(name, sorted(_GENERIC), n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ValueError(
        f"unknown perf event {name!r}{hint} (names as `kernmlops perf-list` prints them: "
        "cycles, dTLB-load-misses, subsystem:tracepoint, pmu/event/)"
    )


class PerfOptions(SampledHookOptions):
    events: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description=(
            "events to count besides the software set (task-clock, cpu-clock, "
            "context-switches, cpu-migrations, minor-faults, major-faults), by "
            "their `kernmlops perf-list` names; those the machine cannot count "
            "are reported in the manifest"
        ),
    )

    @field_validator("events")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        return [check_event_name(v) for v in value]


class PerfHook(SampledHook[PerfOptions]):
    """Reads per-CPU perf counters at ``poll_hz`` into ``perf_counters``, in a thread of
    its own (missed intervals are counted as drops)."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name: ClassVar[str] = "perf"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ("sw_cpu_clock",)

    sample_at_stop: ClassVar[bool] = True  # the final row closes every delta

    def __init__(self, options: PerfOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._counters: CounterSet | None = None
        #: event name -> why it is not counted (also in the status, for the manifest)
        self.unsupported: dict[str, str] = {}

    @property
    def events(self) -> list[EventSpec]:
        """The events being counted (empty before start)."""
        return list(self._counters.events) if self._counters else []

    def _specs(self) -> list[EventSpec]:
        specs, left_out = resolve_all(
            [*SOFTWARE_EVENTS, *self.options.events], distinct_columns=True
        )
        self.unsupported.update(left_out)
        return specs

    def start(self, ctx: HookContext | None = None) -> None:
        self.unsupported = {}
        specs = self._specs()
        try:
            self._counters = CounterSet(specs, online_cpus(), skip_unsupported=True)
        except OSError as err:
            raise HookUnavailable(f"{self.name}: {err}") from err
        self.unsupported.update(self._counters.unsupported)
        # Until HookStatus has the field, the attribute is set on the instance.
        self.status.unsupported = dict(self.unsupported)
        if self.unsupported:
            self.status.reason = "not counted: " + "; ".join(
                f"{n} ({why})" for n, why in self.unsupported.items()
            )
        if not self._counters.events:
            self.close()
            raise HookUnavailable(f"{self.name}: no event can be counted: {self.status.reason}")
        self.status.attached = True
        self.status.variant = "perf_event"
        self.status.programs = [e.name for e in self._counters.events]
        # A sample at once: the first row is the baseline of every delta.
        self._start_sampling()

    def _sample(self, now_ns: int) -> None:
        assert self._counters is not None
        # [event, cpu, (count, enabled, running)]; the frame is built later, off this thread
        self._rows.append((now_ns, self._counters.read()))
        self.status.events += len(self._counters.cpus)

    def _frames(self, taken: list[tuple[int, np.ndarray]]) -> Iterator[tuple[str, pl.DataFrame]]:
        if not taken or self._counters is None:
            return
        cpus = self._counters.cpus
        frames = []
        for now_ns, values in taken:
            columns: dict[str, np.ndarray] = {
                UPTIME_TIMESTAMP: np.full(len(cpus), now_ns // 1000, dtype=np.int64),
                "cpu": np.asarray(cpus, dtype=np.uint32),
            }
            # Counts and times as signed int64, as the BPF tables' u64 fields (a
            # 64-bit counter does not pass 2**63 in a collection's lifetime).
            values = values.view(np.int64)
            opened = self._counters.opened
            for i, spec in enumerate(self._counters.events):
                base = event_column(spec.name)
                for name, k in ((spec.column, 0), (f"{base}_enabled_ns", 1),
                                (f"{base}_running_ns", 2)):  # fmt: skip
                    column = values[i, :, k]
                    # null where the event is not read (another CPU reads its package)
                    columns[name] = (
                        column
                        if opened[i].all()
                        else pl.Series(name, column).set(pl.Series(~opened[i]), None)
                    )
            frames.append(pl.DataFrame(columns))
        yield TABLE, pl.concat(frames)

    def _release(self) -> None:
        if self._counters is not None:
            self._counters.close()
            self._counters = None
