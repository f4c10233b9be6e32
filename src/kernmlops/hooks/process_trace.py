"""process_trace: fork, exec and exit from the sched tracepoints."""

from typing import ClassVar

from kernmlops.hooks.bpf import BpfHook


class ProcessTraceHook(BpfHook):
    name = "process_trace"
    object_name = "process_trace"
    rings: ClassVar[dict[str, str]] = {"process_trace": "process_trace_rb"}
