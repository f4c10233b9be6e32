"""sched_migrate: one row per task migration (sched_migrate_task), with the
length and load of the source and destination runqueues."""

from __future__ import annotations

from functools import cache
from typing import ClassVar

from pydantic import Field

from kernmlops.ebpf.btf import Kind, kernel_type
from kernmlops.hooks.base import HookContext
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions


@cache
def runqueues_readable() -> bool:
    """Whether this kernel lets the object reach other CPUs' runqueues: the
    program goes task -> cfs_rq -> task group -> cfs_rq[cpu] -> rq, which
    needs cfs_rq.rq and cfs_rq.tg (CONFIG_FAIR_GROUP_SCHED)."""
    cfs_rq = kernel_type(Kind.STRUCT, "cfs_rq")
    return cfs_rq is not None and {"rq", "tg"} <= {m[0] for m in cfs_rq.members}


class SchedMigrateOptions(BpfHookOptions):
    runqueues: bool = Field(
        True, description="read nr_running and load of both runqueues at each migration"
    )


class SchedMigrateHook(BpfHook[SchedMigrateOptions]):
    """Columns: pid, tgid, comm, orig_cpu, dest_cpu, cpu (where it was decided),
    on_rq, kind (``wakeup``: placed as it wakes, on_rq == 0 — also, mostly, a
    task that changes its own affinity; ``queued``: moved while runnable — load
    balancing, NUMA, another task changing its affinity), and
    ``{orig,dest}_{nr_running,load_avg,util_avg}`` from each runqueue (its
    root cfs_rq's PELT averages) where ``rq_valid``, and ``nr_migrations``
    (the task's se.nr_migrations before this event; only a move to another
    CPU counts, so with pid it names a move, for other programs on the
    tracepoint to be joined to). The status variant ends in
    ``+runqueues`` when those fields are read, ``-runqueues`` when not."""

    name = "sched_migrate"
    object_name = "sched_migrate"

    rings: ClassVar[dict[str, str]] = {"sched_migrate": "sched_migrate_rb"}

    def extra_globals(self) -> dict[str, int | bool]:
        return {"read_rq": self._read_rq()}

    def _read_rq(self) -> bool:
        return self.options.runqueues and runqueues_readable()

    def start(self, ctx: HookContext) -> None:
        super().start(ctx)
        self.status.variant = f"{self.status.variant}{'+' if self._read_rq() else '-'}runqueues"
