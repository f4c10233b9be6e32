"""page_faults: user and kernel page faults (x86 exceptions tracepoints).

One row per fault: address, ip, error code, pid, tgid, cpu, kind (user or
kernel). With ``sample_every`` N > 1 the kernel keeps one fault in N (counted
per CPU over the traced tasks), so each row stands for N faults.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from kernmlops.hooks.bpf import BpfHook, BpfHookOptions

TABLE = "page_faults"


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

    def faults_seen(self) -> int:
        """Faults of the traced tasks so far, sampled or not."""
        if self.obj is None:
            return 0
        return self.obj.map("page_faults_seen").percpu_total(0)
