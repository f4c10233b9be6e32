"""System memory over time: /proc/meminfo sampled at a fixed rate."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, ClassVar

from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookContext, HookOptions, SampledHook, SampledHookOptions
from kernmlops.host.meminfo import parse_meminfo
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import pyarrow as pa

    from kernmlops.tables import Rows
else:
    pa = lazy_import("pyarrow")


MEMINFO = "/proc/meminfo"
TABLE = "memory_usage"
#: KernMLOps' memory_usage columns that ours name otherwise -> ours: the same
#: meminfo field, also under its name, so its users' code reads our table
KERNMLOPS_COLUMNS = {
    "anon_pages_total_bytes": "anon_pages_bytes",
    "anon_hugepages_total_bytes": "anon_huge_pages_bytes",
    "mapped_total_bytes": "mapped_bytes",
    "shmem_total_bytes": "shmem_bytes",
    "hugepages_reserved": "hugepages_rsvd",
    # a kernel without CONFIG_MEMORY_FAILURE has no such field: null, not 0
    "hardware_corrupted_bytes": "hardware_corrupted_bytes",
}


def meminfo_row(text: str) -> dict[str, int | None]:
    """One sample's columns: every meminfo field, then KernMLOps' names."""
    row: dict[str, int | None] = dict(parse_meminfo(text))
    for theirs, ours in KERNMLOPS_COLUMNS.items():
        row[theirs] = row.get(ours)
    return row


class MemoryUsageOptions(SampledHookOptions):
    """/proc/meminfo needs nothing beyond the sampling rate."""


class MemoryUsageHook(SampledHook[MemoryUsageOptions]):
    """Samples /proc/meminfo at ``poll_hz`` into the ``memory_usage`` table, in a thread
    of its own: the native sampler's where the library is built, else Python's
    (missed intervals are counted as drops)."""

    name: ClassVar[str] = "memory_usage"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: MemoryUsageOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._file: IO[bytes] | None = None
        self._read_size = 8192  # /proc/meminfo is ~1.5 KiB

    def start(self, ctx: HookContext | None = None) -> None:
        try:
            # Kept open: each sample is one pread, no open().
            self._file = open(MEMINFO, "rb", buffering=0)  # noqa: SIM115
        except OSError as e:
            raise HookUnavailable(f"{self.name}: cannot read {MEMINFO}: {e.strerror}") from e
        self.status.attached = True
        self.status.variant = "procfs"
        if ctx is not None:
            self._priority = ctx.copier_priority  # the native sampler's, as the copier's
        self._start_sampling()  # the first sample at once

    def _sample(self, now_ns: int) -> None:
        # Only the read: the sampler wakes every 100 ms with cold caches, where
        # parsing the text cost 2-5x what it does in a loop (0.1-0.24 vs 0.045 ms).
        assert self._file is not None
        fd = self._file.fileno()
        text = os.pread(fd, self._read_size, 0)
        while len(text) == self._read_size:  # a file larger than we thought
            self._read_size *= 2
            text = os.pread(fd, self._read_size, 0)
        self._rows.append((now_ns, text))
        self.status.events += 1

    def native_files(self) -> list[int] | None:
        return [self._file.fileno()] if self._file is not None else None

    def _sampled(self, now_ns: int, data: list[bytes]) -> None:
        self._rows.append((now_ns, data[0]))

    def _frames(self, taken: list[tuple[int, bytes]]) -> Iterator[tuple[str, Rows]]:
        if taken:
            rows = [
                {UPTIME_TIMESTAMP: now_ns // 1000, **meminfo_row(text.decode("ascii", "replace"))}
                for now_ns, text in taken
            ]
            schema = pa.schema([(key, pa.int64()) for key in rows[0]])
            yield TABLE, pa.Table.from_pylist(rows, schema=schema)

    def _release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
