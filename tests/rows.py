"""Hook output as polars DataFrames, for assertions (hooks hand over Arrow tables or
polars DataFrames: see kernmlops.tables.Rows)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from kernmlops.tables import Rows


def as_frame(rows: Rows) -> pl.DataFrame:
    return rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows)  # type: ignore[return-value]


def polled(out: Iterable[tuple[str, Rows]]) -> list[tuple[str, pl.DataFrame]]:
    """Everything ``hook.poll()`` or ``hook.stop()`` yields, each as a DataFrame."""
    return [(table, as_frame(rows)) for table, rows in out]


#: task_perf's switch record as its BPF program lays it out (8 counter slots), for
#: tests that hand the hook's decoding synthetic records
TASK_PERF_RECORD = np.dtype(
    [("ts_uptime_us", "<u8"), ("count", "<u8", (8,)), ("cumulative", "<u8", (8,)),
     ("enabled_ns", "<u8", (8,)), ("running_ns", "<u8", (8,)), ("cpu", "<u4"),
     ("pid", "<u4"), ("tgid", "<u4"), ("out_pid", "<u4"), ("out_tgid", "<u4"),
     ("charge_task", "u1"), ("charge_out", "u1")]
)  # fmt: skip
