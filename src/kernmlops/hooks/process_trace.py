"""process_trace: fork, exec and exit from the sched tracepoints."""

from typing import ClassVar

from pydantic import Field

from kernmlops.hooks.bpf import BpfHook, BpfHookOptions


class ProcessTraceOptions(BpfHookOptions):
    # A 48-byte record per fork, exec and exit: 1 MiB holds 21k of them,
    # seconds of a fork storm between drains, and costs 1 MiB of RSS, not 8.
    ring_kib: int = Field(
        1024, ge=4, le=1 << 20, description="size of each ring buffer in KiB (a power of two)"
    )


class ProcessTraceHook(BpfHook[ProcessTraceOptions]):
    name = "process_trace"
    object_name = "process_trace"
    rings: ClassVar[dict[str, str]] = {"process_trace": "process_trace_rb"}
