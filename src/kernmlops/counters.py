"""The perf table's columns, for the collector and the analysis alike: the
column an event's name becomes, and counts scaled for multiplexing.

Pure data functions (no libbpf, no perf_event_open): graphs and notebooks use
them without loading anything of the kernel side.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import polars as pl
else:
    pl = lazy_import("polars")


#: task_perf's tables (one per event): the growth charged to a task over a quantum,
#: and the counter's cumulative enabled and running times (multiplexing).
TASK_PERF_COUNT = "count"
TASK_PERF_TIMES: tuple[str, str] = ("pmu_enabled_time_us", "pmu_running_time_us")


def is_counter_time(column: str) -> bool:
    """A counter's enabled or running time (perf's ``<event>_enabled_ns``, task_perf's
    ``pmu_*_time_us``): the scale of its count, not a figure of the workload."""
    return column.endswith(("_enabled_ns", "_running_ns")) or column in TASK_PERF_TIMES


def counter_value(columns: Iterable[str]) -> str | None:
    """The column holding the counter's value where ``columns`` are a task_perf
    table's (its count, with the counter's times), else None."""
    names = set(columns)
    if TASK_PERF_COUNT in names and names.issuperset(TASK_PERF_TIMES):
        return TASK_PERF_COUNT
    return None


def event_column(name: str) -> str:
    """``dTLB-load-misses`` -> ``dtlb_load_misses``; ``tlb:tlb_flush`` -> ``tlb_tlb_flush``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def enabled_column(count: str, columns: Sequence[str]) -> str | None:
    """The ``<event>_enabled_ns`` column of count column ``count`` (``task_clock_ns``:
    ``task_clock_enabled_ns``; scaled()'s pairing the other way), None where there is
    none."""
    for base in (count, count.removesuffix("_ns")):
        if f"{base}_enabled_ns" in columns:
            return f"{base}_enabled_ns"
    return None


def scaled(frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``<count>_scaled`` (count * enabled / running, Float64) for each event
    column: the estimate of the full count when the kernel multiplexed the counter;
    null where the counter never ran.

    The product ``count * enabled`` of two cumulative 64-bit values passes 2**63
    within seconds (3.1e9 ns squared), so nothing here multiplies integers: where
    the counter ran all the time it was enabled (no multiplexing, the usual case)
    the estimate is the count itself, exact (a Float64 holds every integer up to
    2**53: 104 days of one CPU's nanoseconds); else the count times the ratio
    ``enabled / running`` (>= 1), in Float64."""
    exprs = []
    for col in frame.columns:
        base = col.removesuffix("_enabled_ns")
        if base == col:
            continue
        count = next((c for c in (base, f"{base}_ns") if c in frame.columns), None)
        if count is None:
            continue
        value = pl.col(count).cast(pl.Float64)
        enabled = pl.col(col)
        running = pl.col(f"{base}_running_ns")
        exprs.append(
            pl.when(running == enabled, running > 0)
            .then(value)
            .when(running > 0)
            .then(value * (enabled.cast(pl.Float64) / running.cast(pl.Float64)))
            .otherwise(None)
            .alias(f"{count}_scaled")
        )
    return frame.with_columns(exprs)
