"""Records (numpy structured arrays) to polars DataFrames, vectorized."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernmlops.ebpf.btf import RecordLayout
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")


def _strings(col: np.ndarray, name: str) -> pl.Series:
    """Fixed-width C strings to text. Kernel strings are nearly always ASCII;
    the rare others (e.g. a comm cut inside a UTF-8 sequence) are decoded
    one by one with replacement characters."""
    width = col.dtype.itemsize
    # Cut at the first NUL: ring memory is not zeroed, so bytes after a short
    # string may be a previous record's.
    u8 = np.ascontiguousarray(col).view(np.uint8).reshape(-1, width).copy()
    u8[np.cumsum(u8 == 0, axis=1) > 0] = 0
    col = u8.view(col.dtype).ravel()
    raw = pl.Series(name, col)  # Binary, trailing NULs stripped
    high = (u8 >= 0x80).any(axis=1)
    if not high.any():
        return raw.cast(pl.String)
    values = raw.to_list()
    for i in np.flatnonzero(high):
        values[i] = values[i].decode("utf-8", errors="replace")
    return pl.Series(name, [v if isinstance(v, str) else v.decode() for v in values], pl.String)


def records_to_frame(records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
    """One column per record field; enums become their labels, char arrays text."""
    columns: list[pl.Series] = []
    for name in layout.dtype.names or ():
        col = records[name]
        if name in layout.strings:
            columns.append(_strings(col, name))
        elif name in layout.enums:
            labels = layout.enums[name]
            columns.append(
                pl.Series(name, col).replace_strict(labels, default=None, return_dtype=pl.String)
            )
        elif col.ndim > 1:
            columns.append(pl.Series(name, col))  # fixed-size array column
        else:
            columns.append(pl.Series(name, np.ascontiguousarray(col)))
    return pl.DataFrame(columns)


def empty_frame(layout: RecordLayout) -> pl.DataFrame:
    return records_to_frame(np.empty(0, layout.dtype), layout)
