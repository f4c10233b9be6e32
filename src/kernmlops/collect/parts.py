"""What a Parquet part of a collection is, apart from when it is written.

A table's rows go to ``<collection_dir>/<table>/part-NNNNN.parquet``, written under a
hidden temporary name first. This module owns those names, what is known of each table
(:class:`TableState`: its schema, its buffered rows, its open and finished parts), the
rule that every batch keeps the schema of the table's first one, and how a part is
encoded (:class:`PartFormat`: which columns get dictionaries or deltas, collection_id as
a dictionary of one value, cheaply during a run or compact for good). The sink that
writes a run's parts (kernmlops.collect.parquet) and the compaction that rewrites them
(kernmlops.collect.compaction) both take their parts from here.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect import pagecheck
from kernmlops.errors import CollectionError
from kernmlops.lazy import lazy_import
from kernmlops.tables import COLLECTION_ID

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    np = lazy_import("numpy")
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")

__all__ = [
    "COMPACT",
    "RUN",
    "Encoding",
    "PartFormat",
    "TableState",
    "check_table_name",
    "drift_message",
    "part_name",
    "temp_name",
]

# Table names become folder names; keep them plain so Hive readers never take one for a
# partition (``a=b``) or a hidden file (``.x``).
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def part_name(index: int) -> str:
    """The final file name of part ``index`` of a table."""
    return f"part-{index:05d}.parquet"


def temp_name(index: int) -> str:
    """The name a part has while it is being written (hidden, so globs skip it)."""
    return f".{part_name(index)}.tmp"


def check_table_name(table: str) -> None:
    """Refuse a table name that would not be a plain folder name (ValueError)."""
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ValueError(
            f"table name {table!r} is not valid: use letters, digits and '_', "
            "not starting with a digit"
        )


def drift_message(table: str, expected: pa.Schema, got: pa.Schema) -> str:
    want = {f.name: f.type for f in expected}
    have = {f.name: f.type for f in got}
    missing = [name for name in want if name not in have]
    extra = [name for name in have if name not in want]
    changed = [
        f"{name}: {want[name]} -> {have[name]}"
        for name in want
        if name in have and want[name] != have[name]
    ]
    parts = []
    if missing:
        parts.append(f"missing columns {missing}")
    if extra:
        parts.append(f"new columns {extra}")
    if changed:
        parts.append(f"changed types {changed}")
    return (
        f"table {table!r}: schema changed between batches ({'; '.join(parts)}); "
        "every batch of a table must have the schema of its first batch"
    )


@dataclass
class TableState:
    """Everything the sink knows about one table."""

    name: str
    schema: pa.Schema | None = None
    buffer: list[pa.Table] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0
    arrow_schema: pa.Schema | None = None
    writer: pq.ParquetWriter | None = None
    dictionary_columns: list[str] = field(default_factory=list)
    delta_columns: list[str] = field(default_factory=list)
    #: the schema the open part's writer takes (see part_schema)
    part_schema: pa.Schema | None = None
    temp_path: Path | None = None
    #: the open part's file, held open (its writer writes through it)
    temp_fd: int | None = None
    part: int = 0  # index of the part being (or next to be) written
    part_rows: int = 0
    rows: int = 0  # rows handed to Parquet writers (buffered rows not counted)
    finished_rows: int = 0  # rows in finished parts (readable after a crash)
    files: list[str] = field(default_factory=list)
    #: of ``files``, the parts written compactly encoded at stop (adopted from the row
    #: workers, or written once no workload runs), with their rows: compaction keeps
    #: each that is big enough to be a file of its own as it is
    whole_parts: dict[str, int] = field(default_factory=dict)


def conform(state: TableState, rows: pa.Table) -> pa.Table:
    """Check ``rows`` against the table's schema; reorder columns if only the order differs."""
    schema = rows.schema
    if state.schema is None:
        state.schema = schema.remove_metadata()
        return rows
    if schema.equals(state.schema):
        return rows
    if {f.name: f.type for f in schema} == {f.name: f.type for f in state.schema}:
        return rows.select(state.schema.names).cast(state.schema)
    raise CollectionError(drift_message(state.name, state.schema, schema))


def plan_encodings(state: TableState, sample: pa.Table) -> None:
    """Fix the table's Arrow schema and which columns are dictionaries or deltas, from
    the rows of its first part (once: every later part and compaction keep them)."""
    if state.arrow_schema is not None:
        return
    data = state.schema if state.schema is not None else sample.schema
    state.arrow_schema = data.append(pa.field(COLLECTION_ID, pa.string()))
    # Dictionary-encode only columns that repeat (cpu, comm, kind...):
    # for timestamps pyarrow would build a dictionary and then abandon it
    # for every chunk, the hottest cost of writing.
    limit = min(4096, max(1, sample.num_rows // 4))
    state.dictionary_columns = [c for c in sample.column_names if _distinct(sample[c]) <= limit] + [
        COLLECTION_ID
    ]
    # Integer columns that mostly grow (timestamps, counters) are stored as
    # deltas: half the CPU of plain + zstd for them, and smaller files.
    state.delta_columns = [
        c
        for c in sample.column_names
        if c not in state.dictionary_columns and _mostly_growing(sample[c])
    ]


def data_columns(state: TableState, table: pa.Table) -> pa.Table:
    """``table`` without collection_id, in the table's own types."""
    assert state.arrow_schema is not None
    public = state.arrow_schema
    data_schema = public.remove(public.get_field_index(COLLECTION_ID))
    if COLLECTION_ID in table.column_names:
        table = table.drop_columns([COLLECTION_ID])
    return table if table.schema == data_schema else table.cast(data_schema)


def part_schema(state: TableState) -> pa.Schema:
    """The writer's schema: the table's, with collection_id a dictionary of one
    value (nothing to hash per row: a fifth of the writing CPU)."""
    assert state.arrow_schema is not None
    at = state.arrow_schema.get_field_index(COLLECTION_ID)
    cid = pa.field(COLLECTION_ID, pa.dictionary(pa.int32(), pa.string()))
    return state.arrow_schema.set(at, cid)


@dataclass(frozen=True)
class Encoding:
    """How a part's columns are encoded (collection_id is always a dictionary of one
    value)."""

    #: the Parquet codec; None: the collection's own (ParquetSink's ``compression``)
    codec: str | None
    #: the table's repeating columns as dictionaries (plan_encodings picks them)
    dictionaries: bool
    #: its mostly growing integer columns as DELTA_BINARY_PACKED
    deltas: bool


#: a collection's parts for good: the collection's codec, dictionaries and deltas
COMPACT = Encoding(None, dictionaries=True, deltas=True)
#: the parts written while the workload runs where compaction rewrites them at stop
#: (collector.compact): growing columns as deltas and lz4 (Parquet's LZ4_RAW), no
#: dictionaries. As cheap as no encoding at all (46.6-48.3 against 46.6-47.9 ms of CPU
#: per 1M quanta rows) and 22x smaller (1.28 against 28.0 bytes a row; compact: 0.48 at
#: 70-74 ms); dictionaries cost 13-16 ms more (``python -m bench parts``, 2-vCPU VM)
RUN = Encoding("lz4", dictionaries=False, deltas=True)


class PartFormat:
    """How one collection's parts are written: its collection_id column and its codec.

    Makes no pyarrow object before the first part (pyarrow is not imported before the
    probes attach)."""

    def __init__(self, collection_id: str, compression: str, row_group_rows: int) -> None:
        self.collection_id = collection_id
        self.compression = compression
        self.row_group_rows = row_group_rows
        # collection_id's dictionary and indices, made at the first write
        self._cid_values: pa.Array | None = None
        self._zeros: pa.Array | None = None

    def part_rows(self, state: TableState, table: pa.Table) -> pa.Table:
        """``table`` (the data columns) with collection_id added, in the part's schema."""
        assert state.part_schema is not None
        n = table.num_rows
        if self._zeros is None or len(self._zeros) < n:
            self._zeros = pa.array(np.zeros(max(n, self.row_group_rows), np.int32))
        if self._cid_values is None:
            self._cid_values = pa.array([self.collection_id], pa.string())
        cid = pa.DictionaryArray.from_arrays(self._zeros.slice(0, n), self._cid_values)
        return pa.Table.from_arrays([*table.columns, cid], schema=state.part_schema)

    def writer(
        self, state: TableState, path: Path, *, compact: bool, encoding: Encoding | None = None
    ) -> pq.ParquetWriter:
        """A part's writer: compactly encoded (:data:`COMPACT`), or as a run's parts
        are (:data:`RUN`: ``fast_parts``, rewritten at stop); ``encoding`` another."""
        assert state.arrow_schema is not None
        state.part_schema = part_schema(state)
        how = encoding or (COMPACT if compact else RUN)
        dictionaries = state.dictionary_columns if how.dictionaries else []
        deltas = state.delta_columns if how.deltas else []
        writer = pq.ParquetWriter(
            path,
            state.part_schema,
            compression=how.codec or self.compression,
            use_dictionary=list(dict.fromkeys([*dictionaries, COLLECTION_ID])),
            column_encoding=dict.fromkeys(deltas, "DELTA_BINARY_PACKED") or None,
            # Readers get the table's own schema (collection_id as text), not the
            # writer's.
            store_schema=False,
            # a CRC32 per page: a byte damaged inside a page is found, not decoded
            # (kernmlops.collect.pagecheck)
            **pagecheck.WRITE,
        )
        writer.add_key_value_metadata({"ARROW:schema": _schema_metadata(state.arrow_schema)})
        return writer


def _schema_metadata(schema: pa.Schema) -> bytes:
    """``schema`` as pyarrow stores it in a Parquet file's ``ARROW:schema`` key."""
    return base64.b64encode(schema.serialize().to_pybytes())


def _distinct(col: pa.ChunkedArray) -> int:
    """Distinct values of ``col``, null counted as one; a column numpy cannot sort
    (fixed-size lists) counts as never repeating. numpy, not pyarrow.compute: this runs
    once per table, and Arrow's compute kernels cost the collector megabytes of RSS."""
    kind = col.type
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind):
        return len(col)
    values = col.to_numpy()
    if values.dtype == object:  # texts and binaries (None for null)
        return len(set(values.tolist()))
    return len(np.unique(values))  # NaN (a null number) counts once


def _mostly_growing(col: pa.ChunkedArray) -> bool:
    """An integer column whose values rise from row to row nine times in ten or
    more (DELTA_BINARY_PACKED stores such a column in a few bits a value)."""
    if not pa.types.is_integer(col.type):
        return False
    values = col.to_numpy()
    if col.null_count:  # numpy gives floats with NaN for nulls
        values = values[~np.isnan(values)]
    if len(values) < 2:
        return False
    if values.dtype == np.uint64:  # values past 2**63 compare as their own, not wrapped
        steps_up = values[1:] >= values[:-1]
    else:
        steps_up = np.diff(values.astype(np.int64)) >= 0
    return bool(steps_up.mean() >= 0.9)
