"""syscalls: per (tgid, syscall) counts, errors and latency histograms.

The kernel keeps cumulative per-CPU sums per (tgid, syscall id) in a hash map
(bpf/syscalls.bpf.c). Every ``interval_s`` this hook reads the map and writes
one row per key that changed, holding the change since the previous read, so
summing a column over rows gives the total.

Why cumulative in the kernel and deltas in Python, rather than read-and-delete:
a BPF program increments a value through a pointer it got from a lookup, with
no lock, so a delete (even lookup-and-delete under the bucket lock) can race
with an increment on another CPU and lose it. Reading cumulative values never
loses a count. The map stays bounded because the keys of a process are deleted
once that process is gone: its tgid is seen absent from /proc *before* its
values are read, so nothing can add to them after that last read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from pydantic import Field

from kernmlops.ebpf import libbpf
from kernmlops.ebpf.btf import Kind, RecordLayout, record_layout
from kernmlops.ebpf.build import object_path
from kernmlops.ebpf.spec import object_spec
from kernmlops.hooks.base import HookContext, HookOptions
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.lazy import lazy_import
from kernmlops.syscall_names import parse_unistd, syscall_headers, syscall_table
from kernmlops.tables import UPTIME_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


__all__ = ["SyscallsHook", "parse_unistd", "syscall_headers", "syscall_table"]

TABLE = "syscalls"
STATS_MAP = "syscall_stats"
HIST = "latency_log2_hist"


def subtract_previous(
    prev_keys: np.ndarray, prev: np.ndarray, keys: np.ndarray, cur: np.ndarray
) -> np.ndarray:
    """``cur`` minus the previous cumulative values of the same keys (0 for new
    keys). ``prev_keys`` must be sorted; both value arrays share one dtype."""
    delta = cur.copy()
    if len(prev_keys) and len(keys):
        pos = np.searchsorted(prev_keys, keys).clip(max=len(prev_keys) - 1)
        seen = prev_keys[pos] == keys
        for name in cur.dtype.names or ():
            delta[name][seen] -= prev[name][pos[seen]]
    return delta


def _monotonic_us() -> int:
    # The clock of bpf_ktime_get_ns(), so rows join with the BPF tables.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class SyscallsOptions(BpfHookOptions):
    interval_s: float = Field(
        1.0, gt=0, le=3600, description="seconds between reads of the in-kernel counts"
    )


class SyscallsHook(BpfHook[SyscallsOptions]):
    """Syscall counts, errors and latency per (tgid, syscall), in-kernel aggregated."""

    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars

    name: ClassVar[str] = "syscalls"
    object_name: ClassVar[str] = "syscalls"
    rings: ClassVar[dict[str, str]] = {}  # a map-based table: see poll()
    tables: ClassVar[tuple[str, ...]] = (TABLE,)
    needs: ClassVar[tuple[str, ...]] = ("tp_btf|raw_tp", "task_storage")

    def __init__(self, options: SyscallsOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        self._key: RecordLayout | None = None
        self._value: np.dtype | None = None
        self._names: dict[int, str] = {}
        self._prev_keys = np.empty(0, np.uint64)
        self._prev: np.ndarray | None = None
        self._next_us = 0

    def start(self, ctx: HookContext) -> None:
        super().start(ctx)
        btf = object_spec(object_path(self.object_name, ctx.bpf_dir)).btf
        self._key = record_layout(btf, btf.find(Kind.STRUCT, "syscall_key"))
        value = record_layout(btf, btf.find(Kind.STRUCT, "syscall_stats")).dtype
        # Per-CPU values come back one per possible CPU, each 8-byte aligned.
        stride = (value.itemsize + 7) // 8 * 8
        names = list(value.names or ())
        self._value = np.dtype(
            {
                "names": names,
                "formats": [value.fields[n][0] for n in names],
                "offsets": [value.fields[n][1] for n in names],
                "itemsize": stride,
            }
        )
        self._names = syscall_table()
        self._prev = np.empty(0, self._value)
        self._next_us = _monotonic_us() + round(self.options.interval_s * 1e6)

    # -- reading the map ------------------------------------------------------
    def _read(self) -> tuple[np.ndarray, np.ndarray, set[int]]:
        """(keys, values summed over CPUs, tgids gone before the read)."""
        assert self.obj is not None and self._key is not None and self._value is not None
        stats = self.obj.map(STATS_MAP)
        raw_keys = list(stats.keys())
        keys = np.frombuffer(b"".join(raw_keys), self._key.dtype)
        # Decide who is dead before reading: a dead process adds nothing later.
        dead = {int(t) for t in np.unique(keys["tgid"]) if not os.path.exists(f"/proc/{t}")}
        ncpu = libbpf.num_possible_cpus()
        found, chunks = [], []
        for i, key in enumerate(raw_keys):
            value = stats.lookup(key)
            if value is not None:
                found.append(i)
                chunks.append(value)
        keys = keys[found]
        per_cpu = np.frombuffer(b"".join(chunks), self._value).reshape(len(found), ncpu)
        summed = np.zeros(len(found), self._value)
        for name in self._value.names or ():
            summed[name] = per_cpu[name].sum(axis=1)
        return keys, summed, dead

    def _flush(self) -> Iterator[tuple[str, pl.DataFrame]]:
        if self.obj is None or self._prev is None:
            return
        now = _monotonic_us()
        keys, cur, dead = self._read()
        # One sortable u64 per key: tgid, then the id as u32.
        ids = keys["syscall_id"].astype(np.int64)
        packed = (keys["tgid"].astype(np.uint64) << np.uint64(32)) | (ids & 0xFFFFFFFF).astype(
            np.uint64
        )
        order = np.argsort(packed)
        packed, keys, cur = packed[order], keys[order], cur[order]
        delta = subtract_previous(self._prev_keys, self._prev, packed, cur)
        changed = (delta["count"] > 0) | (delta["completed"] > 0)
        if dead:
            gone = np.isin(keys["tgid"], np.fromiter(dead, np.uint32, len(dead)))
            stats = self.obj.map(STATS_MAP)
            for key in keys[gone]:
                stats.delete(key.tobytes())
            packed, cur = packed[~gone], cur[~gone]
        self._prev_keys, self._prev = packed, cur
        if not changed.any():
            return
        rows, k = delta[changed], keys[changed]
        self.status.events += int(rows["count"].sum())
        ids = pl.Series("syscall_id", k["syscall_id"].astype(np.int32))
        hist = pl.Series(HIST, np.ascontiguousarray(rows[HIST])).cast(pl.List(pl.Int64))
        frame = pl.DataFrame(
            [
                pl.Series(UPTIME_TIMESTAMP, np.full(len(rows), now, np.int64)),
                pl.Series("tgid", k["tgid"].astype(np.uint32)),
                ids,
                ids.replace_strict(self._names, default=None, return_dtype=pl.String).alias(
                    "syscall"
                ),
                *(
                    pl.Series(name, np.ascontiguousarray(rows[name]))
                    for name in ("count", "errors", "completed", "total_latency_ns")
                ),
                hist,
            ]
        )
        yield TABLE, frame

    def poll(self) -> Iterator[tuple[str, pl.DataFrame]]:
        if self.obj is None or _monotonic_us() < self._next_us:
            return
        step = round(self.options.interval_s * 1e6)
        self._next_us += step
        if self._next_us <= _monotonic_us():  # after a stall, skip ahead
            self._next_us = _monotonic_us() + step
        yield from self._flush()

    def final_rows(self) -> Iterator[tuple[str, pl.DataFrame]]:
        return self._flush()  # what changed since the last interval

    def drop_slots(self) -> range:
        """Calls not counted because the map was full: drop slot 0 (no ring has
        one), so drops() and drops_by_cpu() count them."""
        return range(1)


# BpfHook names the tables after the rings; this table comes from a map.
