"""block_io: one row per completed block request (device, sector, size, op and
flags, queue, service and whole latency, the device's queue at issue in requests,
segments and 4 KiB units, the completing and issuing CPUs). KernMLOps' block_io
tables are made from these rows as they are read (kernmlops.data_import).

The op and flag names come from the running kernel's own ``enum req_op`` and
``enum req_flag_bits`` (read from /sys/kernel/btf/vmlinux), so they follow the
kernel rather than a table typed here.

Nothing is lost silently: where the kernel skips the programs (6.18 does, for
bursts, under heavy I/O: bench/README.md, "block_io loses completions"), a
completion BPF can infer is counted (``missed_completions``, ``unknown_completions``),
and a system-wide collection sets each disk's rows and counts beside the kernel's own
count of its completions (/proc/diskstats, read after the attach and before the
detach): what neither holds is ``completions_not_seen`` (the manifest's
``hooks.block_io.reconciliation``). With a process filter it is not done:
/proc/diskstats counts every process's I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from kernmlops.ebpf.btf import Kind, RecordLayout, kernel_type
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.hooks.base import HookContext, HookOptions
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.host.diskstats import Device, DiskLine, read_diskstats, request_disks
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl

    from kernmlops.ebpf.objects import BpfObject
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


#: Slots of the object's ``block_io_stats`` map (enum block_io_stat in C).
STAT_MAP_FULL, STAT_UNKNOWN, STAT_REQUEUED, STAT_MISSED = 0, 1, 2, 3

#: a dev_inflight value (struct dev_queue in C): the queue, then the completions by fate
DEV_QUEUE = struct.Struct("<qQQQQQ")

COLUMNS = (
    "ts_uptime_us", "device", "major", "minor", "sector", "bytes", "segments",
    "op", "op_flags", "cmd_flags", "queue_to_issue_us", "issue_to_complete_us",
    "alloc_to_complete_us", "inflight", "inflight_segments", "inflight_4k_ios",
    "error", "pid", "tgid", "comm", "cpu", "issue_cpu",
)  # fmt: skip


@dataclass(frozen=True)
class CmdFlagsDecoder:
    """Turns a request's raw cmd_flags into "WRITE|SYNC|FUA"."""

    #: op value -> name (REQ_OP_WRITE -> WRITE)
    ops: dict[int, str]
    #: bit number -> name (__REQ_SYNC -> SYNC)
    bits: dict[int, str]
    #: the op occupies the bits below the first flag bit (REQ_OP_BITS)
    op_bits: int = 8

    @classmethod
    def from_enums(cls, req_op: dict[str, int], req_flag_bits: dict[str, int]) -> CmdFlagsDecoder:
        bits = {
            v: n.removeprefix("__REQ_")
            for n, v in req_flag_bits.items()
            if not n.endswith("NR_BITS") and v < 32
        }
        ops = {v: n.removeprefix("REQ_OP_") for n, v in req_op.items() if n != "REQ_OP_LAST"}
        return cls(ops=ops, bits=bits, op_bits=min(bits) if bits else 8)

    @classmethod
    @cache
    def for_running_kernel(cls) -> CmdFlagsDecoder | None:
        """From the running kernel's BTF; None where it lacks BTF or the enums."""
        req_op, flag_bits = (
            kernel_type(Kind.ENUM, "req_op"),
            kernel_type(Kind.ENUM, "req_flag_bits"),
        )
        if req_op is None or flag_bits is None:
            return None
        return cls.from_enums(dict(req_op.members), dict(flag_bits.members))

    def op(self, cmd_flags: int) -> str:
        op = cmd_flags & ((1 << self.op_bits) - 1)
        return self.ops.get(op, f"OP{op}")

    def describe(self, cmd_flags: int) -> str:
        parts = [self.op(cmd_flags)]
        rest = cmd_flags >> self.op_bits << self.op_bits
        for bit, name in sorted(self.bits.items()):
            if rest & (1 << bit):
                parts.append(name)
                rest &= ~(1 << bit)
        if rest:
            parts.append(hex(rest))
        return "|".join(parts)


def decode_cmd_flags(
    cmd_flags: np.ndarray, decoder: CmdFlagsDecoder | None
) -> tuple[pl.Series, pl.Series]:
    """The ``op`` and ``op_flags`` columns; decoded once per distinct value."""
    values = pl.Series("cmd_flags", np.ascontiguousarray(cmd_flags), pl.UInt32)
    if decoder is None:
        hexed = values.map_elements(hex, return_dtype=pl.String)
        return hexed.alias("op"), hexed.alias("op_flags")
    distinct = np.unique(cmd_flags).tolist()
    ops = {v: decoder.op(v) for v in distinct}
    described = {v: decoder.describe(v) for v in distinct}
    return (
        values.replace_strict(ops, return_dtype=pl.String).alias("op"),
        values.replace_strict(described, return_dtype=pl.String).alias("op_flags"),
    )


@dataclass(frozen=True)
class DiskSeen:
    """A disk's completions as the programs met them (dev_inflight's counts)."""

    #: a row each (or a drop, where the ring was full)
    rows: int = 0
    #: no row by design: the collector's own requests (system-wide)
    unwanted: int = 0
    missed: int = 0
    unknown: int = 0

    @property
    def counted(self) -> int:
        return self.rows + self.unwanted + self.missed + self.unknown


def reconcile(
    before: Mapping[Device, DiskLine],
    after: Mapping[Device, DiskLine],
    seen: Mapping[Device, DiskSeen],
    disks: Collection[Device],
) -> dict[str, dict[str, Any]]:
    """Each disk's completions by /proc/diskstats (``before`` and ``after`` the
    collection) against what the programs saw, keyed "major:minor" as the rows'
    ``device``. ``disks``: the whole request-based disks (request_disks); a line of
    another device (a partition, a bio-based device) is left out unless the
    programs saw it, and so is a disk with nothing completed and nothing seen.

    ``completions_not_seen`` is the kernel's count less the rows and the counted
    losses, never below 0; more seen than the kernel counted (``surplus``) means
    requests completing at the window's edges (the two readings lie just inside the
    programs' run). Where the kernel's count is unknown (the disk went away, or came
    and went, during the collection) both are None and ``note`` says why."""
    out: dict[str, dict[str, Any]] = {}
    for device in sorted(set(seen) | (set(disks) & (set(before) | set(after)))):
        mine = seen.get(device, DiskSeen())
        first, last = before.get(device), after.get(device)
        note = None
        kernel: int | None
        if first is not None and last is not None and last.completed >= first.completed:
            kernel = last.completed - first.completed
        elif last is not None:
            # a disk that appeared (or went and came back: its counters restart at 0)
            kernel = last.completed
            note = "added during the collection: the kernel's count is since then"
        else:
            kernel = None
            note = "removed during the collection: the kernel's count went with it"
        if not mine.counted and not kernel:
            continue
        line = last or first
        row: dict[str, Any] = {
            "name": line.name if line is not None else None,
            "kernel_completed": kernel,
            "rows": mine.rows,
            "collector_own": mine.unwanted,
            "missed_completions": mine.missed,
            "unknown_completions": mine.unknown,
            "completions_not_seen": None if kernel is None else max(0, kernel - mine.counted),
            "surplus": None if kernel is None else max(0, mine.counted - kernel),
        }
        if note:
            row["note"] = note
        out[f"{device[0]}:{device[1]}"] = row
    return out


#: why a collection with a process filter is not set against /proc/diskstats
FILTERED = "not done: a process filter (/proc/diskstats counts every process's I/O)"


class BlockIoHook(BpfHook[BpfHookOptions]):
    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars
    name = "block_io"
    object_name = "block_io"
    rings: ClassVar[dict[str, str]] = {"block_io": "block_io_rb"}

    def __init__(self, options: BpfHookOptions | HookOptions | None = None) -> None:
        super().__init__(options)
        #: set against /proc/diskstats (only system-wide): its readings and the disks
        #: at the attach and before the detach
        self._system_wide = False
        self._before: dict[Device, DiskLine] | None = None
        self._after: dict[Device, DiskLine] | None = None
        self._disks: set[Device] = set()
        self._unread: str | None = None  # why /proc/diskstats could not be read
        self._ring_drops = 0  # rows the ring refused, at the close

    def start(self, ctx: HookContext) -> None:
        self._system_wide = ctx.process_filter is None
        super().start(ctx)

    def attach(self, obj: BpfObject) -> None:
        super().attach(obj)
        # Read once every program runs: a completion the kernel counts from here
        # on is one the programs should have met.
        if self._system_wide:
            self._before = self._read_diskstats()
            self._disks = request_disks()

    def detach(self) -> None:
        # Read while the programs still run, once (the session's detach, then the
        # stop's): the kernel's window then lies inside theirs, so an edge adds to the
        # surplus (but a completion between its tracepoint and its count, the kernel's
        # next lines, as the programs attach: microseconds) and makes none look unseen.
        if self._system_wide and self._before is not None and self._after is None:
            self._after = self._read_diskstats()
            self._disks |= request_disks()  # a disk added during the collection
        super().detach()

    def _read_diskstats(self) -> dict[Device, DiskLine] | None:
        try:
            return read_diskstats()
        except OSError as err:
            self._unread = f"/proc/diskstats: {err.strerror or err}"
            return None

    def disks_seen(self) -> dict[Device, DiskSeen]:
        """Each disk's completions as the programs met them, so far."""
        if self.obj is None:
            return {}
        out = {}
        for key, value in self.obj.map("dev_inflight").items():
            dev = int.from_bytes(key, "little")
            _, _, rows, unwanted, missed, unknown = DEV_QUEUE.unpack_from(value)
            out[(dev >> 20, dev & 0xFFFFF)] = DiskSeen(rows, unwanted, missed, unknown)
        return out

    def reconciliation(self) -> dict[str, Any]:
        """The manifest's ``hooks.block_io.reconciliation``: each disk's completions by
        /proc/diskstats against the rows and the counted losses (see reconcile), or
        why it was not done. Empty before the start's reading."""
        if not self._system_wide:
            return {"status": FILTERED} if self.status.attached else {}
        if self._before is None or self._after is None:
            if self._unread is None:
                return {}
            return {"status": f"not done: {self._unread}"}
        disks = reconcile(self._before, self._after, self.disks_seen(), self._disks)
        return {"status": "done", "source": "/proc/diskstats", "disks": disks}

    def to_frame(self, table: str, records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
        df = records_to_frame(records, layout)
        op, op_flags = decode_cmd_flags(records["cmd_flags"], CmdFlagsDecoder.for_running_kernel())
        issued, inserted = pl.col("issued"), pl.col("inserted")
        return df.with_columns(
            device=pl.format("{}:{}", "major", "minor"),
            op=op,
            op_flags=op_flags,
            # never inserted (issued directly) or never issued: no such interval
            queue_to_issue_us=pl.when(issued & inserted).then("queue_to_issue_us"),
            issue_to_complete_us=pl.when(issued).then("issue_to_complete_us"),
            alloc_to_complete_us=pl.when("alloc_timed").then("alloc_to_complete_us"),
            inflight=pl.when(issued).then("inflight"),
            inflight_segments=pl.when(issued).then("inflight_segments"),
            inflight_4k_ios=pl.when(issued).then("inflight_4k_ios"),
            issue_cpu=pl.when(issued).then("issue_cpu"),
        ).select(COLUMNS)

    def stats(self) -> dict[str, int]:
        """In-kernel counters: requests not tracked for want of map room,
        completions of requests whose start was not seen (issued before the start,
        or while the kernel skipped the programs), requeues, and completions the
        kernel never ran the program for (``missed_completions``: each found when
        its request's address starts a new one; no row was written for them)."""
        if self.obj is None:
            return {}
        m = self.obj.map("block_io_stats")
        return {
            "map_full": m.percpu_total(STAT_MAP_FULL),
            "unknown_completions": m.percpu_total(STAT_UNKNOWN),
            "requeued": m.percpu_total(STAT_REQUEUED),
            "missed_completions": m.percpu_total(STAT_MISSED),
        }

    def counters(self) -> dict[str, int]:
        """stats(), and where the collection was set against /proc/diskstats, the
        completions no row nor count holds, over every disk (each disk's in
        ``reconciliation``)."""
        out = self.stats()
        disks = self.status.reconciliation.get("disks")
        if disks is not None:
            out["completions_not_seen"] = sum(
                d["completions_not_seen"] or 0 for d in disks.values()
            )
        return out

    def rows_settled(self, waiting: bool) -> None:
        """The rows the programs wrote into the ring (every disk's ``rows``, counted in
        the kernel) against the rows the table got: what the ring refused is a drop,
        and what went missing past it (the copier, the spool, the rows' making) is
        ``rows_not_in_collection``, which the disks' counts alone cannot show."""
        rec = self.status.reconciliation
        disks = rec.get("disks")
        if disks is None or waiting:
            return  # not set against diskstats, or rows still to come (recover)
        written = sum(d["rows"] for d in disks.values())
        got = self.status.rows.get("block_io", 0)
        rec["rows_written"] = written
        rec["rows_in_collection"] = got
        # ring drops (not map_full: a request the map had no room for writes no row)
        lost = written - self._ring_drops - got
        self.status.counters["rows_not_in_collection"] = max(0, lost)

    def close(self) -> None:
        if self.obj is not None and self.obj.loaded:
            if self._system_wide and self._before is not None and self._after is None:
                self._after = self._read_diskstats()  # closed without a detach
            self.status.reconciliation = self.reconciliation()
            self._ring_drops = super().drops()
        super().close()

    def drops(self) -> int:
        # A request the map had no room for is a row lost: count it as a drop.
        return super().drops() + self.stats().get("map_full", 0)

    def drops_by_cpu(self) -> list[int]:
        """The rings' losses and the requests the map had no room for, per CPU
        (they sum to drops())."""
        if self.obj is None or not self.drops():
            return []
        full = self.obj.map("block_io_stats").lookup_percpu(STAT_MAP_FULL)
        rings = super().drops_by_cpu()
        return [int(n) for n in (full + rings if rings else full)]
