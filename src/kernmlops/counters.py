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
    import polars as pl
else:
    pl = lazy_import("polars")


def event_column(name: str) -> str:
    """``dTLB-load-misses`` -> ``dtlb_load_misses``; ``tlb:tlb_flush`` -> ``tlb_tlb_flush``."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def scaled(frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``<count>_scaled`` (count * enabled / running) for each event column:
    the estimate of the full count when the kernel multiplexed the counter."""
    exprs = []
    for col in frame.columns:
        base = col.removesuffix("_enabled_ns")
        if base == col:
            continue
        count = next((c for c in (base, f"{base}_ns") if c in frame.columns), None)
        if count is None:
            continue
        running = pl.col(f"{base}_running_ns")
        exprs.append(
            pl.when(running > 0)
            .then(pl.col(count) * pl.col(col) / running)
            .otherwise(None)
            .alias(f"{count}_scaled")
        )
    return frame.with_columns(exprs)
