"""Table conventions shared by hooks, sinks and readers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
    import pyarrow as pa
else:
    pa = lazy_import("pyarrow")

#: Rows of one table as hooks hand them over: an Arrow table (the collector's own
#: hooks, no DataFrame library loaded) or a polars DataFrame (hooks that transform
#: rows with polars, benchmark results).
Rows: TypeAlias = "pa.Table | pl.DataFrame"


#: CLOCK_MONOTONIC in microseconds, as ``bpf_ktime_get_ns() / 1000``.
UPTIME_TIMESTAMP = "ts_uptime_us"
COLLECTION_ID = "collection_id"
BENCHMARK = "benchmark"


class Sink(Protocol):
    """Where tables go: Parquet files, a Prometheus registry, memory (tests)."""

    def write(self, table: str, frame: Rows) -> None:
        """Accept rows of ``table``; may buffer."""

    def flush(self, *, durable: bool = False) -> None:
        """Hand every buffered row on; ``durable``: to storage that survives a crash."""

    def close(self) -> dict[str, int]:
        """Flush, release resources and return rows written per table."""


def as_arrow(rows: Rows) -> pa.Table:
    """``rows`` as an Arrow table (a polars DataFrame is converted, mostly without copies)."""
    if isinstance(rows, pa.Table):
        return rows
    to_arrow = getattr(rows, "to_arrow", None)
    if to_arrow is None:
        raise TypeError(f"rows must be a pyarrow Table or a polars DataFrame, not {type(rows)}")
    return to_arrow()


def row_count(rows: Rows) -> int:
    return rows.num_rows if isinstance(rows, pa.Table) else rows.height


def rows_nbytes(rows: Rows) -> int:
    """Bytes the rows hold in memory (an estimate for polars)."""
    return rows.nbytes if isinstance(rows, pa.Table) else rows.estimated_size()
