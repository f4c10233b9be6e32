"""System memory over time: /proc/meminfo sampled at a fixed rate."""

from __future__ import annotations

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


class MemoryUsageOptions(SampledHookOptions):
    """/proc/meminfo needs nothing beyond the sampling rate."""


class MemoryUsageHook(SampledHook[MemoryUsageOptions]):
    """Samples /proc/meminfo at ``poll_hz`` into the ``memory_usage`` table, in a thread
    of its own (missed intervals are counted as drops)."""

    name: ClassVar[str] = "memory_usage"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: MemoryUsageOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._file: IO[bytes] | None = None

    def start(self, ctx: HookContext | None = None) -> None:
        try:
            # Unbuffered and kept open: each sample is a seek and a read, no open().
            self._file = open(MEMINFO, "rb", buffering=0)  # noqa: SIM115
        except OSError as e:
            raise HookUnavailable(f"{self.name}: cannot read {MEMINFO}: {e.strerror}") from e
        self.status.attached = True
        self.status.variant = "procfs"
        self._start_sampling()  # the first sample at once

    def _sample(self, now_ns: int) -> None:
        assert self._file is not None
        self._file.seek(0)
        fields = parse_meminfo(self._file.read().decode("ascii", errors="replace"))
        self._rows.append({UPTIME_TIMESTAMP: now_ns // 1000, **fields})
        self.status.events += 1

    def _frames(self, taken: list[dict[str, int]]) -> Iterator[tuple[str, Rows]]:
        if taken:
            schema = pa.schema([(key, pa.int64()) for key in taken[0]])
            yield TABLE, pa.Table.from_pylist(taken, schema=schema)

    def _release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
