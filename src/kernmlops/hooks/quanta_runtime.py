"""quanta_runtime (on-CPU quanta) and quanta_queued_time (run-queue wait).

The BPF side writes one record per context switch holding both: the quantum
that ``prev`` ended and the wait that ``next`` ended (bpf/quanta_runtime.bpf.c).
One reservation per switch instead of one per row halves the ring's share of
the hot path; the record is split here into the two tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from kernmlops.ebpf.btf import us_from_ns
from kernmlops.hooks.bpf import BpfHook, BpfHookOptions
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from kernmlops.ebpf.btf import RecordLayout
    from kernmlops.tables import Rows
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")


#: table -> (columns of the switch record, in the table's order and names)
_SPLIT = {
    "quanta_runtime": (
        "has_run",
        {
            "ts_uptime_us": "ts_uptime_us",
            "run_length_us": "quanta_run_length_us",
            "cpu": "cpu",
            "prev_pid": "pid",
            "prev_tgid": "tgid",
        },
    ),
    "quanta_queued_time": (
        "has_queued",
        {
            "ts_uptime_us": "ts_uptime_us",
            "queued_time_us": "quanta_queued_time_us",
            "cpu": "cpu",
            "next_pid": "pid",
            "next_tgid": "tgid",
        },
    ),
}


class QuantaRuntimeHook(BpfHook[BpfHookOptions]):
    name = "quanta_runtime"
    object_name = "quanta_runtime"
    #: one ring; its records are split into both tables (see poll)
    rings: ClassVar[dict[str, str]] = {"quanta_switch": "quanta_switch_rb"}
    tables = ("quanta_runtime", "quanta_queued_time")

    def rows_from(
        self, key: str, records: np.ndarray, layout: RecordLayout
    ) -> Iterator[tuple[str, Rows]]:
        for table, rows in split_switches(records, layout).items():
            if rows.num_rows:
                yield table, rows


def split_switches(records: np.ndarray, layout: RecordLayout | None = None) -> dict[str, pa.Table]:
    """The two tables' rows from switch records (numpy structured array); ``layout``
    says which fields hold nanoseconds for microsecond columns.

    Each field is made contiguous once and filtered as a plain array: masking
    the structured records themselves would copy every 48-byte record per table.
    """
    scaled = layout.us_from_ns if layout is not None else {}
    cols = {
        name: us_from_ns(records[name], scaled[name])
        if name in scaled
        else np.ascontiguousarray(records[name])
        for name in records.dtype.names or ()
    }
    out: dict[str, pa.Table] = {}
    for table, (flag, columns) in _SPLIT.items():
        keep = cols[flag] != 0
        every = bool(keep.all())
        out[table] = pa.Table.from_arrays(
            [pa.array(cols[old] if every else cols[old][keep]) for old in columns],
            names=list(columns.values()),
        )
    return out
