"""Table conventions shared by hooks, sinks and readers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import polars as pl
else:
    pl = lazy_import("polars")


#: CLOCK_MONOTONIC in microseconds, as ``bpf_ktime_get_ns() / 1000``.
UPTIME_TIMESTAMP = "ts_uptime_us"
COLLECTION_ID = "collection_id"
BENCHMARK = "benchmark"


class Sink(Protocol):
    """Where tables go: Parquet files, a Prometheus registry, memory (tests)."""

    def write(self, table: str, frame: pl.DataFrame) -> None:
        """Accept rows of ``table``; may buffer."""

    def flush(self) -> None:
        """Push every buffered row to durable storage."""

    def close(self) -> dict[str, int]:
        """Flush, release resources and return rows written per table."""
