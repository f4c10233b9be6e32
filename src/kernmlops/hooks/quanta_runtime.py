"""quanta_runtime (on-CPU quanta) and quanta_queued_time (run-queue wait)."""

from typing import ClassVar

from kernmlops.hooks.bpf import BpfHook


class QuantaRuntimeHook(BpfHook):
    name = "quanta_runtime"
    object_name = "quanta_runtime"
    rings: ClassVar[dict[str, str]] = {
        "quanta_runtime": "quanta_runtime_rb",
        "quanta_queued_time": "quanta_queued_rb",
    }
