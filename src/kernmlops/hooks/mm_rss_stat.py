"""mm_rss_stat: every change of a process's RSS counters (kmem:rss_stat).

Columns: ``member`` (file, anon, swap, shmem: the kernel's MM_* counters),
``size_bytes`` and ``size_pages`` (the counter's new value, summed over CPUs),
``pid`` / ``tgid`` of the task running when it changed, and ``mm_tgid``, the
process whose mm it is. The tracepoint names the mm only by a hash (``mm_id``)
and whether it is current's (``curr``); events on an mm from another context
(reclaim, khugepaged, the teardown at exit) get ``mm_tgid`` from an earlier
event of the same mm with ``curr`` set, or 0 when there was none. The hash is
of the mm's address, which a freed mm passes on to a new one: once its owner
tears it down, the next event that is not its teardown (another process's, or
one raising a counter) starts a new mm, owner unknown.
RSS as /proc/<pid>/status counts it is file + anon + shmem.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, ClassVar

from kernmlops.ebpf.btf import RecordLayout
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


TABLE = "mm_rss_stat"


class MmRssStatHook(BpfHook[BpfHookOptions]):
    """RSS counter changes per process (file, anon, swap, shmem)."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name: ClassVar[str] = "mm_rss_stat"
    object_name: ClassVar[str] = "mm_rss_stat"
    rings: ClassVar[dict[str, str]] = {TABLE: "mm_rss_stat_rb"}
    needs: ClassVar[tuple[str, ...]] = ("tracepoint", "ringbuf")

    def to_frame(self, table: str, records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
        frame = records_to_frame(records, layout)
        # The kernel reports pages << PAGE_SHIFT.
        page = os.sysconf("SC_PAGE_SIZE")
        return frame.with_columns(size_pages=pl.col("size_bytes") // page)
