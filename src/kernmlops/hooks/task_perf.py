"""task_perf: perf counters charged to each task, one table per event.

Where the ``perf`` hook samples per-CPU counters at a fixed rate (who ran in
between is unknown), this hook reads them in the kernel at every context
switch and charges each quantum's growth to the task that ran it
(bpf/task_perf.bpf.c). Summing a process's ``count`` gives its own count.

Each event gets a table named as KernMLOps names it where KernMLOps has the
event (``dtlb_misses``, ``itlb_misses``, ``tlb_flushes``), else after the
event (``minor_faults``, ``context_switches``, ...). Columns, as KernMLOps'
perf tables plus ``count``:

- ``cpu``, ``pid``, ``tgid``, ``ts_uptime_us`` (the switch ending the quantum);
- ``count``: the growth charged to the task over the quantum;
- ``cumulative_count``: the CPU's counter at that switch (KernMLOps' column:
  its differences per CPU give the CPU's count);
- ``pmu_enabled_time_us``, ``pmu_running_time_us``: the counter's cumulative
  enabled and running times (they differ when the PMU multiplexes).

``context-switches`` is counted by the kernel just after the switch
tracepoint, when the previous task leaves: its growth over a quantum is the
switch that began it, charged to the task switched out then.

Opt-in: a program on every context switch costs (`python -m bench overhead`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field, field_validator

from kernmlops.counters import TASK_PERF_COUNT, TASK_PERF_TIMES, event_column
from kernmlops.ebpf import libbpf
from kernmlops.ebpf.objects import BpfObject
from kernmlops.ebpf.perf_counters import CounterSet, EventSpec, resolve_all
from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookOptions
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.hooks.perf_counters import check_event_name
from kernmlops.host.cpus import online_cpus
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from kernmlops.hooks.base import HookContext
    from kernmlops.tables import Rows
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")

#: Slots per CPU in the kernel's counter array (KMO_TASK_PERF_EVENTS).
MAX_EVENTS = 8
#: Events KernMLOps has a table for: the same table names here.
KERNMLOPS_TABLES: dict[str, str] = {
    "dTLB-load-misses": "dtlb_misses",
    "iTLB-load-misses": "itlb_misses",
    "tlb:tlb_flush": "tlb_flushes",
}
#: Counted when the previous task is switched out (after the tracepoint): the
#: growth over a quantum belongs to the task switched out when it began.
SWITCH_OUT_EVENTS = frozenset({"context-switches"})
#: Always counted (software: every machine has them).
SOFTWARE_EVENTS: tuple[str, ...] = (
    "task-clock",
    "context-switches",
    "cpu-migrations",
    "minor-faults",
    "major-faults",
)
DEFAULT_EVENTS: tuple[str, ...] = ("dTLB-load-misses", "iTLB-load-misses", "tlb:tlb_flush")
#: Events whose names collide with another hook's table, and what to count instead.
_REFUSED = {"page-faults": "minor-faults and major-faults (their sum)"}


def table_name(event: str) -> str:
    """The table of ``event``: KernMLOps' name where it has one."""
    return KERNMLOPS_TABLES.get(event) or event_column(event)


class TaskPerfOptions(BpfHookOptions):
    events: list[str] = Field(
        default_factory=lambda: list(DEFAULT_EVENTS),
        description=(
            "events besides the software set (task-clock, context-switches, "
            "cpu-migrations, minor-faults, major-faults), by their `kernmlops "
            f"perf-list` names; at most {MAX_EVENTS} in all. Those the machine "
            "cannot count (hardware events in most VMs) are reported in the manifest"
        ),
    )

    @field_validator("events")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        names = [check_event_name(v) for v in value]
        for name in names:
            if name in _REFUSED:
                raise ValueError(f"{name}: count {_REFUSED[name]} instead")
        extra = [n for n in dict.fromkeys(names) if n not in SOFTWARE_EVENTS]
        if len(SOFTWARE_EVENTS) + len(extra) > MAX_EVENTS:
            raise ValueError(
                f"at most {MAX_EVENTS - len(SOFTWARE_EVENTS)} events besides the "
                f"software set, got {len(extra)}"
            )
        return names


class TaskPerfHook(BpfHook[TaskPerfOptions]):
    """Per-task perf counts, exact to the quantum, one table per event."""

    name: ClassVar[str] = "task_perf"
    object_name: ClassVar[str] = "task_perf"
    rings: ClassVar[dict[str, str]] = {"task_perf": "task_perf_rb"}
    tables: ClassVar[tuple[str, ...]] = tuple(
        table_name(e) for e in (*SOFTWARE_EVENTS, *DEFAULT_EVENTS)
    )
    needs: ClassVar[tuple[str, ...]] = ("tp_btf|raw_tp", "ringbuf", "sw_cpu_clock")

    def __init__(self, options: TaskPerfOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._counters: CounterSet | None = None
        self.unsupported: dict[str, str] = {}

    @property
    def events(self) -> list[EventSpec]:
        """The events being counted (empty before start)."""
        return list(self._counters.events) if self._counters else []

    def written_tables(self) -> tuple[str, ...]:
        # the events configured, not the defaults in ``tables`` (the manifest's rows)
        events = (*SOFTWARE_EVENTS, *self.options.events)
        return tuple(dict.fromkeys(table_name(e) for e in events))

    def _open_counters(self) -> CounterSet:
        specs, left_out = resolve_all([*SOFTWARE_EVENTS, *self.options.events])
        self.unsupported.update(left_out)
        counters = CounterSet(specs, online_cpus(), skip_unsupported=True, everywhere=True)
        self.unsupported.update(counters.unsupported)
        return counters

    def start(self, ctx: HookContext) -> None:
        self.unsupported = {}
        try:
            self._counters = self._open_counters()
        except OSError as err:
            raise HookUnavailable(f"{self.name}: {err}") from err
        if not self._counters.events:
            self.close()
            raise HookUnavailable(f"{self.name}: no event can be counted: {self.unsupported}")
        try:
            super().start(ctx)
        except HookUnavailable:
            self.close()
            raise
        self.status.unsupported = dict(self.unsupported)
        if self.unsupported:
            self.status.reason = "not counted: " + "; ".join(
                f"{n} ({why})" for n, why in self.unsupported.items()
            )
        self.status.programs.append("perf_event " + ", ".join(e.name for e in self.events))

    def extra_globals(self) -> dict[str, int | bool]:
        return {"n_events": len(self.events)}

    def extra_max_entries(self) -> dict[str, int]:
        return {"task_perf_counters": libbpf.num_possible_cpus() * MAX_EVENTS}

    def attach(self, obj: BpfObject) -> None:
        # Counters first: the program reads them from its first run.
        assert self._counters is not None
        slots = obj.map("task_perf_counters")
        for e in range(len(self._counters.events)):
            for i, cpu in enumerate(self._counters.cpus):
                fd = self._counters.fd(e, i)
                assert fd is not None  # every event is opened on every CPU (everywhere)
                slots.update(cpu * MAX_EVENTS + e, fd.to_bytes(4, "little"))
        obj.attach_all()

    def poll(self) -> Iterator[tuple[str, Rows]]:
        for _, records, _ in self.drain_due():
            yield from split_events(records, [e.name for e in self.events]).items()

    def counters(self) -> dict[str, int]:
        if self.obj is None:
            return {}
        stats = self.obj.map("task_perf_stats")
        lost = self.obj.map("task_perf_unattributed")
        return {
            "quanta_unseen_start": stats.percpu_total(0),
            "counter_read_errors": stats.percpu_total(1),
            # what each event grew by in quanta not charged to anyone
            **{
                f"unattributed_{table_name(e.name)}": lost.percpu_total(i)
                for i, e in enumerate(self.events)
            },
        }

    def close(self) -> None:
        super().close()
        if self._counters is not None:
            self._counters.close()
            self._counters = None


def split_events(records: np.ndarray, events: list[str]) -> dict[str, pa.Table]:
    """One table per event from switch records (numpy structured array)."""
    out: dict[str, pa.Table] = {}
    cols = {
        n: np.ascontiguousarray(records[n])
        for n in ("ts_uptime_us", "cpu", "pid", "tgid", "out_pid", "out_tgid")
    }
    charge_task = records["charge_task"] != 0
    charge_out = records["charge_out"] != 0
    for i, event in enumerate(events):
        out_charged = event in SWITCH_OUT_EVENTS
        keep = charge_out if out_charged else charge_task
        pid, tgid = ("out_pid", "out_tgid") if out_charged else ("pid", "tgid")
        columns = {
            "cpu": cols["cpu"][keep],
            "pid": cols[pid][keep],
            "tgid": cols[tgid][keep],
            UPTIME_TIMESTAMP: cols["ts_uptime_us"][keep],
            TASK_PERF_COUNT: records["count"][keep, i],
            "cumulative_count": records["cumulative"][keep, i],
            TASK_PERF_TIMES[0]: records["enabled_ns"][keep, i] // 1000,
            TASK_PERF_TIMES[1]: records["running_ns"][keep, i] // 1000,
        }
        out[table_name(event)] = pa.Table.from_arrays(
            [
                pa.array(np.ascontiguousarray(c).astype(np.int64, copy=False))
                for c in columns.values()
            ],
            names=list(columns),
        )
    return out
