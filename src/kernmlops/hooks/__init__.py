"""Every hook, by name. A new hook: bpf/<name>.bpf.c, hooks/<name>.py, a line here."""

from __future__ import annotations

from kernmlops.errors import ConfigError
from kernmlops.hooks.base import Hook, HookContext, HookOptions, HookStatus
from kernmlops.hooks.block_io import BlockIoHook
from kernmlops.hooks.cpu_profile import CpuProfileHook
from kernmlops.hooks.memory_usage import MemoryUsageHook
from kernmlops.hooks.mm_rss_stat import MmRssStatHook
from kernmlops.hooks.page_faults import PageFaultsHook
from kernmlops.hooks.perf import PerfHook
from kernmlops.hooks.process_trace import ProcessTraceHook
from kernmlops.hooks.quanta_runtime import QuantaRuntimeHook
from kernmlops.hooks.sched_migrate import SchedMigrateHook
from kernmlops.hooks.syscalls import SyscallsHook
from kernmlops.hooks.system_info import SystemInfoHook

REGISTRY: dict[str, type[Hook]] = {
    h.name: h
    for h in (
        ProcessTraceHook,
        QuantaRuntimeHook,
        MemoryUsageHook,
        SystemInfoHook,
        SyscallsHook,
        PageFaultsHook,
        MmRssStatHook,
        BlockIoHook,
        SchedMigrateHook,
        PerfHook,
        CpuProfileHook,
    )
}
#: What `collect` runs unless told otherwise: cheap on any workload. Heavier
#: hooks (every syscall, every fault) are opt-in: --hooks or collector.hooks.
DEFAULT_HOOKS: tuple[str, ...] = ("process_trace", "quanta_runtime", "memory_usage", "system_info")


def get_hook(name: str) -> type[Hook]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown hook {name!r}; known: {', '.join(REGISTRY)}") from None


__all__ = ["DEFAULT_HOOKS", "REGISTRY", "Hook", "HookContext", "HookOptions", "HookStatus"]
