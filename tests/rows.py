"""Hook output as polars DataFrames, for assertions (hooks hand over Arrow tables or
polars DataFrames: see kernmlops.tables.Rows)."""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl

from kernmlops.tables import Rows


def as_frame(rows: Rows) -> pl.DataFrame:
    return rows if isinstance(rows, pl.DataFrame) else pl.from_arrow(rows)  # type: ignore[return-value]


def polled(out: Iterable[tuple[str, Rows]]) -> list[tuple[str, pl.DataFrame]]:
    """Everything ``hook.poll()`` or ``hook.stop()`` yields, each as a DataFrame."""
    return [(table, as_frame(rows)) for table, rows in out]
