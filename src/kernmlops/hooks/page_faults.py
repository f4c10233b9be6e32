"""page_faults: user and kernel page faults (x86 exceptions tracepoints).

One row per fault: address, ip, error code, pid, tgid, cpu, kind (user or
kernel). With ``sample_every`` N > 1 the kernel keeps one fault in N (counted
per CPU over the traced tasks), so each row stands for N faults; the exact
counts, by kind, are kept in the manifest (``hooks.page_faults.counters``:
``faults``, ``faults_user``, ``faults_kernel``).
"""

from __future__ import annotations

import struct
from typing import ClassVar

from pydantic import Field

from kernmlops.hooks.bpf import BpfHook, BpfHookOptions

TABLE = "page_faults"
#: the manifest's counters (hooks.page_faults.counters): every fault of the traced
#: tasks, and those of each kind (the table's ``kind`` values)
COUNTER_ALL = "faults"
KINDS = ("user", "kernel")  # the C enum page_fault_kind's order
#: struct page_faults_seen_value (a u64 per kind), one per CPU
SEEN = struct.Struct("<" + "Q" * len(KINDS))


def kind_counter(kind: str) -> str:
    """The manifest counter of faults of ``kind`` ("user" or "kernel")."""
    return f"{COUNTER_ALL}_{kind}"


class PageFaultsOptions(BpfHookOptions):
    sample_every: int = Field(
        1, ge=1, le=1 << 30, description="keep one fault in N per CPU (1: every fault)"
    )


class PageFaultsHook(BpfHook[PageFaultsOptions]):
    """Page faults of the traced tasks, all or 1 in ``sample_every``."""

    name: ClassVar[str] = "page_faults"
    object_name: ClassVar[str] = "page_faults"
    rings: ClassVar[dict[str, str]] = {TABLE: "page_faults_rb"}

    def extra_globals(self) -> dict[str, int | bool]:
        return {"sample_every": self.options.sample_every}

    def faults_by_kind(self) -> dict[str, int]:
        """Faults of the traced tasks so far, sampled or not, by kind."""
        if self.obj is None:
            return dict.fromkeys(KINDS, 0)
        # no numpy, as percpu_total: read at close, where drops are
        raw = self.obj.map("page_faults_seen").lookup(0) or b""
        totals = [sum(col) for col in zip(*SEEN.iter_unpack(raw), strict=True)]
        return dict(zip(KINDS, totals or [0] * len(KINDS), strict=True))

    def faults_seen(self) -> int:
        """Faults of the traced tasks so far, sampled or not."""
        return sum(self.faults_by_kind().values())

    def counters(self) -> dict[str, int]:
        # exact where the rows are 1 in sample_every (or fewer, where some dropped)
        by_kind = self.faults_by_kind()
        return {
            COUNTER_ALL: sum(by_kind.values()),
            **{kind_counter(k): n for k, n in by_kind.items()},
        }
