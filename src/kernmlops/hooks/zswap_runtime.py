"""zswap_runtime: what zswap (the compressed swap cache) does over time.

KernMLOps' zswap_runtime times every zswap_store / zswap_load /
zswap_invalidate call with kprobes and kretprobes. Those functions have no
tracepoints, and kernels without kprobes (this project's reference machine)
cannot time them: the per-call runtime is reported as unsupported with that
reason. What every kernel with zswap can give is zswap's own accounting,
sampled at ``poll_hz`` into ``zswap_stats``:

- ``enabled`` (0/1, zswap can be switched at run time);
- ``zswap_bytes`` / ``zswapped_bytes``: /proc/meminfo ``Zswap`` (compressed
  pool) and ``Zswapped`` (the pages it holds, uncompressed);
- ``zswpin`` / ``zswpout`` / ``zswpwb``: /proc/vmstat, cumulative pages loaded
  from, stored to, and written back from zswap;
- every counter of /sys/kernel/debug/zswap (``stored_pages``,
  ``pool_total_size``, ``reject_*``, ...) when debugfs is mounted and readable.

A kernel without zswap (no /sys/module/zswap) makes the hook unavailable with
the reason; ``kernmlops doctor`` says the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, ClassVar

from kernmlops.errors import HookUnavailable
from kernmlops.hooks.base import HookContext, HookOptions, SampledHook, SampledHookOptions
from kernmlops.host.meminfo import parse_meminfo
from kernmlops.host.zswap import (
    VMSTAT_KEYS,
    ZSWAP_DEBUGFS,
    ZSWAP_MODULE,
    read_vmstat,
    zswap_enabled,
    zswap_state,
)
from kernmlops.lazy import lazy_import
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import pyarrow as pa

    from kernmlops.tables import Rows
else:
    pa = lazy_import("pyarrow")

TABLE = "zswap_stats"
PER_CALL = "zswap_store/zswap_load/zswap_invalidate runtime"


class ZswapRuntimeHook(SampledHook[SampledHookOptions]):
    """zswap's pool and traffic, sampled (the per-call runtime needs kprobes)."""

    name: ClassVar[str] = "zswap_runtime"
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ("zswap",)
    #: where zswap's files are (tests point these elsewhere)
    module: ClassVar[Path] = ZSWAP_MODULE
    debugfs: ClassVar[Path] = ZSWAP_DEBUGFS
    proc: ClassVar[Path] = Path("/proc")

    def __init__(self, options: SampledHookOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._meminfo: IO[bytes] | None = None
        self._vmstat: IO[bytes] | None = None
        self._debug: list[Path] = []

    def start(self, ctx: HookContext | None = None) -> None:
        present, detail = zswap_state(self.module)
        if not present:
            raise HookUnavailable(f"{self.name}: {detail}")
        try:
            # Unbuffered and kept open: each sample is a seek and a read.
            self._meminfo = open(self.proc / "meminfo", "rb", buffering=0)  # noqa: SIM115
            self._vmstat = open(self.proc / "vmstat", "rb", buffering=0)  # noqa: SIM115
        except OSError as e:
            self._release()
            raise HookUnavailable(f"{self.name}: cannot read {e.filename}: {e.strerror}") from e
        try:
            self._debug = sorted(p for p in self.debugfs.iterdir() if p.is_file())
        except OSError:
            self._debug = []  # debugfs not mounted, or not readable: meminfo/vmstat only
        self.status.attached = True
        self.status.variant = "procfs+debugfs" if self._debug else "procfs"
        self.status.reason = detail
        self.status.unsupported = {
            PER_CALL: "KernMLOps times each call with kprobes; zswap has no tracepoints, "
            "so per-call runtime needs a kernel with kprobes (`kernmlops vm`)"
        }
        self._start_sampling()

    def _sample(self, now_ns: int) -> None:
        assert self._meminfo is not None and self._vmstat is not None
        self._meminfo.seek(0)
        mem = parse_meminfo(self._meminfo.read().decode("ascii", errors="replace"))
        self._vmstat.seek(0)
        vm = read_vmstat(self._vmstat.read().decode("ascii", errors="replace"))
        row: dict[str, int | None] = {
            UPTIME_TIMESTAMP: now_ns // 1000,
            "enabled": zswap_enabled(self.module),
            "zswap_bytes": mem.get("zswap_bytes", 0),
            "zswapped_bytes": mem.get("zswapped_bytes", 0),
            **{key: vm.get(key, 0) for key in VMSTAT_KEYS},
        }
        for path in self._debug:
            try:
                row[path.name] = int(path.read_text().strip() or 0)
            except (OSError, ValueError):
                row[path.name] = None
        self._rows.append(row)
        self.status.events += 1

    def _frames(self, taken: list[dict[str, int | None]]) -> Iterator[tuple[str, Rows]]:
        if taken:
            schema = pa.schema([(key, pa.int64()) for key in taken[0]])
            yield TABLE, pa.Table.from_pylist(taken, schema=schema)

    def _release(self) -> None:
        for f in (self._meminfo, self._vmstat):
            if f is not None:
                f.close()
        self._meminfo = self._vmstat = None
