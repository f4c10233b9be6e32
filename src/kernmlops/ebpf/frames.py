"""Records (numpy structured arrays) to Arrow tables, vectorized.

The collector writes Arrow (``records_to_table``) and never needs polars: a
DataFrame library costs a collection tens of MiB of resident memory and a copy
per batch. ``records_to_frame`` gives the same columns as a polars DataFrame
for hooks and tools that transform rows with polars.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernmlops.ebpf.btf import RecordLayout, us_from_ns
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
    import pyarrow as pa
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")
    pa = lazy_import("pyarrow")


def _strings(col: np.ndarray) -> pa.Array:
    """Fixed-width C strings to text. Kernel strings are nearly always ASCII;
    the rare others (e.g. a comm cut inside a UTF-8 sequence) are decoded
    one by one with replacement characters."""
    width = col.dtype.itemsize
    n = len(col)
    # Cut at the first NUL: ring memory is not zeroed, so bytes after a short
    # string may be a previous record's.
    u8 = np.ascontiguousarray(col).view(np.uint8).reshape(-1, width)
    nul = u8 == 0
    lengths = np.where(nul.any(axis=1), nul.argmax(axis=1), width)
    keep = np.arange(width) < lengths[:, None]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.ascontiguousarray(u8[keep])  # row-major: each string's bytes in order
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    if not (data >= 0x80).any():
        return pa.Array.from_buffers(pa.large_string(), n, buffers)
    raw = pa.Array.from_buffers(pa.large_binary(), n, buffers)
    return pa.array(
        [b.decode("utf-8", errors="replace") for b in raw.to_pylist()], pa.large_string()
    )


def _labels(col: np.ndarray, labels: dict[int, str]) -> pa.Array:
    """Enum values to their labels; a value without a label becomes null."""
    keys = np.array(sorted(labels), dtype=np.int64)
    names = pa.array([labels[k] for k in keys.tolist()], pa.large_string())
    values = col.astype(np.int64, copy=False)
    at = np.minimum(np.searchsorted(keys, values), max(len(keys) - 1, 0))
    known = keys[at] == values if len(keys) else np.zeros(len(values), bool)
    return names.take(pa.array(at, mask=~known))


def records_to_table(records: np.ndarray, layout: RecordLayout) -> pa.Table:
    """One column per record field; enums become their labels, char arrays text.

    Integer columns share the records' memory where they are contiguous.
    """
    names = list(layout.dtype.names or ())
    arrays: list[pa.Array] = []
    for name in names:
        col = records[name]
        if name in layout.strings:
            arrays.append(_strings(col))
        elif name in layout.enums:
            arrays.append(_labels(col, layout.enums[name]))
        elif col.ndim > 1:  # a fixed-size array field
            width = col.shape[1]
            flat = pa.array(np.ascontiguousarray(col).reshape(-1))
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, width))
        elif name in layout.us_from_ns:
            arrays.append(pa.array(us_from_ns(col, layout.us_from_ns[name])))
        else:
            arrays.append(pa.array(np.ascontiguousarray(col)))
    return pa.Table.from_arrays(arrays, names=names)


def records_to_frame(records: np.ndarray, layout: RecordLayout) -> pl.DataFrame:
    """:func:`records_to_table` as a polars DataFrame."""
    return pl.from_arrow(records_to_table(records, layout))  # type: ignore[return-value]


def empty_frame(layout: RecordLayout) -> pl.DataFrame:
    return records_to_frame(np.empty(0, layout.dtype), layout)
