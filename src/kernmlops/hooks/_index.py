"""The plug-ins of kernmlops.hooks, by name: generated from the modules by
`python -m kernmlops.plugin_indexes` (make defaults); do not edit. A lookup imports
only the module its name points to (kernmlops.registry.Plugins)."""

INDEX: dict[str, tuple[str, str]] = {
    "block_io": ("block_io", "BlockIoHook"),
    "collapse_huge_pages": ("collapse_huge_pages", "CollapseHugePagesHook"),
    "cpu_profile": ("cpu_profile", "CpuProfileHook"),
    "disk_usage": ("disk_usage", "DiskUsageHook"),
    "file_data": ("file_data", "FileDataHook"),
    "memory_usage": ("memory_usage", "MemoryUsageHook"),
    "mm_rss_stat": ("mm_rss_stat", "MmRssStatHook"),
    "page_faults": ("page_faults", "PageFaultsHook"),
    "perf": ("perf_counters", "PerfHook"),
    "process_metadata": ("process_metadata", "ProcessMetadataHook"),
    "process_trace": ("process_trace", "ProcessTraceHook"),
    "quanta_runtime": ("quanta_runtime", "QuantaRuntimeHook"),
    "sched_migrate": ("sched_migrate", "SchedMigrateHook"),
    "syscalls": ("syscalls", "SyscallsHook"),
    "system_info": ("system_info", "SystemInfoHook"),
    "task_perf": ("task_perf", "TaskPerfHook"),
    "zswap_runtime": ("zswap_runtime", "ZswapRuntimeHook"),
}
