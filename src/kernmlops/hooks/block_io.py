"""block_io: one row per completed block request (device, sector, size, op and
flags, queue, service and whole latency, the device's queue at issue in requests,
segments and 4 KiB units, the completing and issuing CPUs). KernMLOps' block_io
tables are made from these rows as they are read (kernmlops.data_import).

The op and flag names come from the running kernel's own ``enum req_op`` and
``enum req_flag_bits`` (read from /sys/kernel/btf/vmlinux), so they follow the
kernel rather than a table typed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, ClassVar

from kernmlops.ebpf.btf import Kind, RecordLayout, kernel_type
from kernmlops.ebpf.frames import records_to_frame
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


#: Slots of the object's ``block_io_stats`` map (enum block_io_stat in C).
STAT_MAP_FULL, STAT_UNKNOWN, STAT_REQUEUED, STAT_MISSED = 0, 1, 2, 3

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


class BlockIoHook(BpfHook[BpfHookOptions]):
    libraries: ClassVar[tuple[str, ...]] = ("polars",)  # rows are built with polars
    name = "block_io"
    object_name = "block_io"
    rings: ClassVar[dict[str, str]] = {"block_io": "block_io_rb"}

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
        return self.stats()

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
