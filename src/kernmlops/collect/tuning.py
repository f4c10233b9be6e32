"""The collector's own process while it records: its libraries, heap, priority, OOM score.

The libraries that decode and write rows are imported in the background once the
probes are attached, and those a collection never uses are kept out. glibc's heap
thresholds are fixed for the storm (large blocks mapped on their own, a
heap that keeps what the next ring copies take again) and put back for the drain;
freed memory is given back before compaction. :class:`OwnPriority` lowers the
collector's nice value (and its autogroup's) where ``collector.nice`` asks, gives the
benchmark the usual one, shields the collector from the OOM killer while the benchmark
runs, and restores each afterwards.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import sys
from pathlib import Path

from kernmlops.errors import CollectionError
from kernmlops.host.capabilities import CAP_SYS_NICE, CAP_SYS_RESOURCE, holds
from kernmlops.host.cgroup import set_oom_score_adj
from kernmlops.host.cpus import autogroup_nice, set_autogroup_nice

__all__ = [
    "COLLECTOR_OOM_SCORE_ADJ",
    "DECODING_LIBRARIES",
    "UNUSED_LIBRARIES",
    "OwnPriority",
    "release_free_memory",
    "return_large_frees",
    "trim_as_usual",
]

#: imported in the background once the probes are attached (see kernmlops.lazy), with
#: each hook's own ``libraries``: rows are Arrow tables, polars only where a hook builds
#: them with it. Also what their first use imports on its own, which would otherwise
#: fall into the first flush under the storm being recorded (tests/test_lazy.py):
#: numpy 2's first ``np.unique`` imports numpy.ma (15 ms on an idle CPU), pyarrow's
#: first array from Python objects (memory_usage's rows) dateutil.relativedelta (26 ms,
#: with locale and calendar)
DECODING_LIBRARIES = (
    "numpy",
    "numpy.ma",
    "pyarrow",
    "pyarrow.parquet",
    "dateutil.relativedelta",
)
#: what ``pyarrow.parquet`` loads through ``pyarrow.fs`` and a collection never uses:
#: the S3, GCS, Azure and HDFS filesystems (libarrow_s3 and the AWS SDK's start-up:
#: 3.5-7 MiB of the collector's RSS, `python -m bench startup`). ``kernmlops collect`` keeps
#: them out of its process (kernmlops.lazy.keep_out); pyarrow.fs then reports them as
#: not built in. pandas too, where it is installed: pyarrow's first array from Python
#: objects would import it (with dateutil's parser and numpy.random) under the storm.
UNUSED_LIBRARIES = (
    "pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs", "pyarrow._hdfs", "pandas",
)  # fmt: skip
#: glibc's mmap threshold, fixed (M_MMAP_THRESHOLD). By default it rises to the
#: largest block freed so far (up to 32 MiB): after the first few-MiB block of a storm
#: (a late ring copy, a writer's batch) every block up to that size comes from the
#: threads' heaps, which keep what is freed: a 300-s storm's heap grew 62 -> 84 MiB.
#: Fixed at 4 MiB it stayed at 54-58 MiB; at 256 KiB at 43-53 MiB, but every ring copy
#: was then mapped and faulted in anew (+0.1 s of CPU per 5 s of storm; `python -m bench memory`).
MMAP_THRESHOLD = 4 << 20
M_MMAP_THRESHOLD = -3
#: free bytes a heap keeps at its top before giving them back (M_TRIM_THRESHOLD; fixing
#: the mmap threshold leaves it at 128 KiB). At 128 KiB the poll loop grew and trimmed
#: its heap around every ring copy, 21 brk calls a second under a storm, each a change
#: of the address space that took the GIL into the kernel with it, where one waited
#: 1.5 s for a VMA's lock (`python -m bench memory`). Kept, not new: the peak stays the peak.
TRIM_THRESHOLD = 16 << 20
DEFAULT_TRIM_THRESHOLD = 128 << 10
M_TRIM_THRESHOLD = -1
#: the collector's OOM score adjustment while a benchmark runs: the kernel's OOM killer
#: takes the benchmark (adjustment 0) long before the collector that records it
COLLECTOR_OOM_SCORE_ADJ = -900


def return_large_frees() -> None:
    """Have large blocks mapped on their own, and so returned to the system when freed,
    and the heaps keep what the next ring copies will take again (glibc; elsewhere
    nothing changes)."""
    _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def trim_as_usual() -> None:
    """glibc's trim threshold back to its default once the programs are detached: the
    drain makes rows at full speed, and a heap that keeps 16 MiB at its top after each
    batch raised the peak of a 300-s storm's drain to 139 MiB (133-136 before)."""
    _mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)


def _mallopt(param: int, value: int) -> None:
    """glibc's mallopt; elsewhere (musl, no libc symbol) nothing changes."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).mallopt(param, value)


def release_free_memory() -> None:
    """Give memory freed during the run back to the system before compaction allocates
    its own: the writer thread's malloc arena and Arrow's pool keep freed pages, and
    compaction (on this thread) would add to them, not reuse them."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).malloc_trim(0)
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()


def _read_oom_score_adj() -> int | None:
    """The collector's OOM score adjustment, where it may lower it (CAP_SYS_RESOURCE:
    uid 0 without it may not either), else None."""
    if not holds(CAP_SYS_RESOURCE):
        return None
    try:
        return int(Path("/proc/self/oom_score_adj").read_text())
    except (OSError, ValueError):
        return None


class OwnPriority:
    """The collector's nice value (``nice``: collector.nice, None leaves it) and OOM
    score, as they were when made, to be changed for the run and restored."""

    def __init__(self, nice: int | None) -> None:
        self.nice = nice
        self.own_nice = os.getpriority(os.PRIO_PROCESS, 0)
        self.own_group = autogroup_nice() if nice is not None else None
        self.own_oom: int | None = None
        #: why the collector's OOM score could not be lowered (None: it was, or not yet)
        self.oom_refused: str | None = None

    def check(self) -> None:
        """Refuse (one line) a ``nice`` this process may not take, before anything is
        made: below its own nice it takes CAP_SYS_NICE or an RLIMIT_NICE that allows it."""
        if self.nice is None or self.nice >= self.own_nice or holds(CAP_SYS_NICE):
            return
        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft == resource.RLIM_INFINITY or self.nice >= 20 - soft:
            return
        raise CollectionError(f"collector.nice {self.nice} needs root or CAP_SYS_NICE")

    def lower(self) -> None:
        """Take ``nice``. Before any thread starts: on Linux the nice value is per
        thread. With autogroups the benchmark (a session of its own) is weighed against
        the collector's session by the sessions' nice: set that too (restored)."""
        if self.nice is None:
            return
        try:
            os.setpriority(os.PRIO_PROCESS, 0, self.nice)
            if self.own_group is not None:
                set_autogroup_nice(self.nice)
        except PermissionError:
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, 0, self.own_nice)
            raise CollectionError(
                f"collector.nice {self.nice} needs root or CAP_SYS_NICE"
            ) from None

    def read_oom(self) -> None:
        """Note the OOM score adjustment to restore (where it may be lowered)."""
        self.own_oom = _read_oom_score_adj()
        if self.own_oom is None and not holds(CAP_SYS_RESOURCE):
            self.oom_refused = "lowering it needs CAP_SYS_RESOURCE"

    def give_usual(self, pid: int) -> None:
        """The benchmark, held at its gate, gets the usual nice: its children inherit it."""
        if self.nice is not None:
            os.setpriority(os.PRIO_PROCESS, pid, self.own_nice)

    def shield(self) -> None:
        """After the benchmark was forked (it keeps the usual score): the OOM killer
        takes it long before the collector."""
        if self.own_oom is not None and not set_oom_score_adj(
            "self", min(self.own_oom, COLLECTOR_OOM_SCORE_ADJ)
        ):
            self.oom_refused = "the kernel refused to lower it"
            self.own_oom = None  # nothing to restore

    def restore_nice(self) -> None:
        if self.nice is not None:
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, 0, self.own_nice)
            if self.own_group is not None:
                with contextlib.suppress(OSError):
                    set_autogroup_nice(self.own_group)

    def restore_oom(self) -> None:
        if self.own_oom is not None:
            set_oom_score_adj("self", self.own_oom)
