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


#: the high half of a duration that is not there (KMO_NO_TIME in the program)
NO_TIME = 0xFFFF

#: table -> (its duration, the record's columns in the table's order and names)
_SPLIT = {
    "quanta_runtime": (
        "run_ns",
        {
            "ts_uptime_us": "at_ns",
            "quanta_run_length_us": "run_ns",
            "cpu": "cpu",
            "pid": "prev_pid",
            "tgid": "prev_tgid",
        },
    ),
    "quanta_queued_time": (
        "queued_ns",
        {
            "ts_uptime_us": "at_ns",
            "quanta_queued_time_us": "queued_ns",
            "cpu": "cpu",
            "pid": "next_pid",
            "tgid": "next_tgid",
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
        for table, rows in split_switches(records).items():
            if rows.num_rows:
                yield table, rows


def split_switches(records: np.ndarray) -> dict[str, pa.Table]:
    """The two tables' rows from switch records as ``unbatch`` gives them (numpy
    structured array: ``at_ns`` in nanoseconds, the batch's ``cpu``, each duration
    in a high u16 and a low u32 of nanoseconds).

    Each column is made once and filtered as a plain array: masking the
    structured records themselves would copy every record per table.
    """
    ts_us = us_from_ns(records["at_ns"], False)
    cols: dict[str, np.ndarray] = {"at_ns": ts_us}
    keeps: dict[str, np.ndarray] = {}
    for name in ("run_ns", "queued_ns"):
        hi = records[name + "_hi"]
        keeps[name] = hi != NO_TIME
        ns = (hi.astype(np.int64) << 32) | records[name + "_lo"]
        cols[name] = us_from_ns(ns, True)
    for name in ("cpu", "prev_pid", "prev_tgid", "next_pid", "next_tgid"):
        cols[name] = np.ascontiguousarray(records[name])
    out: dict[str, pa.Table] = {}
    for table, (duration, columns) in _SPLIT.items():
        keep = keeps[duration]
        every = bool(keep.all())
        out[table] = pa.Table.from_arrays(
            [pa.array(cols[old] if every else cols[old][keep]) for old in columns.values()],
            names=list(columns),
        )
    return out
