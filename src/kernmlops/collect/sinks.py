"""Sinks: where the tables of a collection go.

:class:`ParquetSink` writes one folder per table, ``<collection_dir>/<table>/part-NNNNN.parquet``,
in row groups of ``row_group_rows`` rows. Each part is written under a temporary name
(``.part-NNNNN.parquet.tmp``, hidden from polars, DuckDB and Spark) and renamed when finished,
so a reader never sees half a file. A durable flush finishes every open part (footer, fsync,
rename): the session does one every ``collector.flush_interval_s``, so a collector killed the
next instant loses at most one interval of rows, and every finished part stays readable.

A failed write (a full disk, an I/O error) fails the sink once: its unfinished temporary
parts are removed (they free the space they took), finished parts stay, and later rows are
counted as lost instead of raising again.
:class:`MemorySink` keeps frames in memory for tests.

Rows arrive as Arrow tables (or polars DataFrames, converted): the sink is Arrow
throughout and needs no DataFrame library.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from kernmlops.errors import CollectionError, OutputError
from kernmlops.fileio import exchange, fsync_path
from kernmlops.lazy import lazy_import
from kernmlops.tables import COLLECTION_ID, Rows, as_arrow, row_count, rows_nbytes

if TYPE_CHECKING:
    import numpy as np
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    np = lazy_import("numpy")
    pl = lazy_import("polars")
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")


__all__ = ["MemorySink", "ParquetSink", "is_disk_full", "part_name", "temp_name"]

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_DURABLE = 1  # the size slot of a flush marker: 1 asks for a durable flush


def is_disk_full(err: BaseException) -> bool:
    """A write failed for want of space (pyarrow's errors carry the errno in the text)."""
    while err is not None:
        if isinstance(err, OSError) and (
            err.errno in _DISK_FULL
            or "No space left on device" in str(err)
            or "Disk quota exceeded" in str(err)
        ):
            return True
        err = err.__cause__  # type: ignore[assignment]
    return False


def free_bytes(path: Path) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s file system."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


# Table names become folder names; keep them plain so Hive readers never take one for a
# partition (``a=b``) or a hidden file (``.x``).
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def part_name(index: int) -> str:
    """The final file name of part ``index`` of a table."""
    return f"part-{index:05d}.parquet"


def temp_name(index: int) -> str:
    """The name a part has while it is being written (hidden, so globs skip it)."""
    return f".{part_name(index)}.tmp"


def _check_table_name(table: str) -> None:
    if not isinstance(table, str) or not _TABLE_NAME.match(table):
        raise ValueError(
            f"table name {table!r} is not valid: use letters, digits and '_', "
            "not starting with a digit"
        )


def _drift_message(table: str, expected: pa.Schema, got: pa.Schema) -> str:
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
class _TableState:
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
    #: the schema the open part's writer takes (see ParquetSink._part_schema)
    part_schema: pa.Schema | None = None
    temp_path: Path | None = None
    part: int = 0  # index of the part being (or next to be) written
    part_rows: int = 0
    rows: int = 0  # rows handed to Parquet writers (buffered rows not counted)
    finished_rows: int = 0  # rows in finished parts (readable after a crash)
    files: list[str] = field(default_factory=list)


class ParquetSink:
    """Write tables as Parquet parts under ``collection_dir``, one folder per table.

    Args:
        collection_dir: the collection's folder (created on the first write).
        collection_id: stored in a constant ``collection_id`` column of every table.
        row_group_rows: rows per row group; smaller groups only come from :meth:`flush`
            or from the memory bound.
        max_buffered_bytes: bound on the rows held in memory across all tables; past it the
            largest buffer is written out at once.
        rows_per_file: a part is finished (renamed to its final name) at this many rows
            and the next rows go to a new part.
        compression: a Parquet codec pyarrow knows (``zstd``, ``snappy``, ``gzip``,
            ``lz4``, ``brotli``, ``none``).
        fast_parts: write the parts of the run plain (no compression, no dictionaries
            but collection_id's, no delta encoding), for a collection that
            :meth:`compact` rewrites at stop: that rewrite then encodes every such
            table compactly, one part or many. Writing plain costs about 40% of the
            CPU per row of the compact encoding (`python -m bench ingest`), while
            the workload runs; the parts take 3-8 times the space until compacted,
            and stay readable as they are after a crash.
    """

    def __init__(
        self,
        collection_dir: Path,
        collection_id: str,
        *,
        row_group_rows: int = 65536,
        max_buffered_bytes: int = 64 * 2**20,
        rows_per_file: int = 4_000_000,
        compression: str = "zstd",
        fast_parts: bool = False,
    ) -> None:
        if row_group_rows < 1:
            raise ValueError(f"row_group_rows must be at least 1, got {row_group_rows}")
        if rows_per_file < 1:
            raise ValueError(f"rows_per_file must be at least 1, got {rows_per_file}")
        if max_buffered_bytes < 0:
            raise ValueError(f"max_buffered_bytes must be >= 0, got {max_buffered_bytes}")
        # zstd is in every pyarrow wheel: asking pyarrow would import it before the
        # probes attach (the session makes its sink first).
        if compression.lower() not in (
            "none",
            "uncompressed",
            "zstd",
        ) and not pa.Codec.is_available(compression):
            raise ValueError(f"compression {compression!r} is not available in pyarrow")
        if not collection_id:
            raise ValueError("collection_id must not be empty")
        self.collection_dir = Path(collection_dir)
        self.collection_id = collection_id
        self.row_group_rows = row_group_rows
        self.max_buffered_bytes = max_buffered_bytes
        self.rows_per_file = rows_per_file
        self.compression = compression
        self.fast_parts = fast_parts
        self._tables: dict[str, _TableState] = {}
        self._buffered_bytes = 0
        self._closed = False
        self._result: dict[str, int] | None = None
        #: the write error that failed the sink (a full disk ...); None while healthy
        self.failure: OSError | None = None
        #: rows handed to the sink after it failed, per table
        self.lost_rows: dict[str, int] = {}
        #: durable flushes done, and the wall-clock time (time.time()) of the last one
        self.durable_flushes = 0
        self.last_durable_flush: float | None = None
        self._checkpoint: tuple[dict[str, list[str]], dict[str, int]] = ({}, {})
        # The session may flush from a timer thread while hooks write.
        self._lock = threading.RLock()
        # collection_id's dictionary and indices, made at the first write (pyarrow
        # is not imported before the probes attach)
        self._cid_values: pa.Array | None = None
        self._zeros: pa.Array | None = None

    # -- the Sink protocol -------------------------------------------------------------

    def write(self, table: str, frame: Rows) -> None:
        """Buffer ``frame`` as rows of ``table``; write full row groups as they fill.

        Raises:
            CollectionError: the frame's schema differs from the table's first batch.
            RuntimeError: the sink is closed.
        """
        _check_table_name(table)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"ParquetSink for {self.collection_dir} is closed")
            rows = as_arrow(frame)
            if rows.num_columns == 0:
                return
            if self.failure is not None:
                self.lost_rows[table] = self.lost_rows.get(table, 0) + rows.num_rows
                return
            # collection_id is added per row group when written (see _write_row_group).
            state = self._tables.get(table)
            if state is None:
                state = self._tables[table] = _TableState(table)
            rows = self._conform(state, rows)
            if rows.num_rows == 0:
                return
            size = rows.nbytes
            state.buffer.append(rows)
            state.buffered_rows += rows.num_rows
            state.buffered_bytes += size
            self._buffered_bytes += size
            with self._guard():
                while state.buffered_rows >= self.row_group_rows:
                    self._write_rows(state, self.row_group_rows)
                # The memory bound: write the largest buffers early, as smaller row groups.
                while self._buffered_bytes > self.max_buffered_bytes:
                    largest = max(self._tables.values(), key=lambda s: s.buffered_bytes)
                    if largest.buffered_rows == 0:
                        break
                    self._write_rows(largest, largest.buffered_rows)

    def flush(self, *, durable: bool = False) -> None:
        """Write every buffered row as a row group of its table's open part.

        With ``durable=True`` also finish the open parts (footer written, file synced and
        renamed to its final name), so everything written so far is readable; later rows go
        to new parts.
        """
        with self._lock:
            if self._closed or self.failure is not None:
                return
            with self._guard():
                for state in self._tables.values():
                    if state.buffered_rows:
                        self._write_rows(state, state.buffered_rows)
                if durable:
                    for state in self._tables.values():
                        if state.writer is not None:
                            self._finish_part(state)
                    self.durable_flushes += 1
                    self.last_durable_flush = time.time()
                    # One assignment: read without the lock (see checkpoint()).
                    self._checkpoint = (
                        {n: list(st.files) for n, st in self._tables.items() if st.files},
                        {n: st.finished_rows for n, st in self._tables.items()},
                    )

    def close(self) -> dict[str, int]:
        """Flush, finish every part and return rows written per table (idempotent).

        Tables that only ever got empty frames appear with 0 rows and have no folder.
        """
        with self._lock:
            if self._result is not None:
                return dict(self._result)
            try:
                self.flush(durable=True)
            finally:
                # After a failure only finished parts remain (see _fail).
                for state in self._tables.values():
                    if state.writer is not None:
                        state.writer.close()
                        state.writer = None
                self._closed = True
            self._result = {name: state.finished_rows for name, state in self._tables.items()}
            return dict(self._result)

    def compact(
        self,
        *,
        min_parts: int = 2,
        on_table: Callable[[str, int], None] | None = None,
    ) -> dict[str, str]:
        """After :meth:`close`: rewrite each table of ``min_parts`` parts or more as full
        parts (``rows_per_file`` rows in row groups of ``row_group_rows``), so readers
        open one file per few million rows instead of one per flush.

        Crash-safe at every instant: the new parts are written and synced in a hidden
        folder (``.compact-<table>``), then swapped with the table's folder in one atomic
        step (:func:`kernmlops.fileio.exchange`). A reader, or a collector killed
        mid-way, sees either all the old parts or all the new ones. Anything that stops
        a table's compaction (too little space, a file system that cannot swap folders,
        an I/O error, Ctrl+C) leaves its parts as they were.

        Args:
            min_parts: tables with fewer finished parts are left alone (with
                ``fast_parts``, every table with a part is rewritten).
            on_table: called with (table, parts) before each table is rewritten.

        Returns:
            Per table that was considered: ``"compacted"`` or why it was not.
        """
        outcome: dict[str, str] = {}
        if not self._closed or self.failure is not None:
            return outcome
        for state in self._tables.values():
            # parts written plain are rewritten compactly even when there is only one
            least = 1 if self.fast_parts else min_parts
            if len(state.files) < least or state.arrow_schema is None:
                continue
            if on_table is not None:
                on_table(state.name, len(state.files))
            outcome[state.name] = self._compact_table(state)
        return outcome

    def _compact_table(self, state: _TableState) -> str:
        folder = self.collection_dir / state.name
        parts = [self.collection_dir / f for f in state.files]
        size = sum(p.stat().st_size for p in parts)
        free = free_bytes(self.collection_dir)
        # The new file is about as large as the parts; keep room for the manifest too.
        if free is not None and free < size + size // 8 + 16 * 2**20:
            return f"skipped: {human_bytes(free)} free, the table takes {human_bytes(size)}"
        scratch = self.collection_dir / f".compact-{state.name}"
        try:
            if scratch.exists():  # left by a collector killed while compacting
                shutil.rmtree(scratch)
            scratch.mkdir()
            names = self._rewrite(state, parts, scratch)
            rows = sum(pq.ParquetFile(scratch / name).metadata.num_rows for name in names)
            if rows != state.finished_rows:  # never swap in files that lost rows
                return f"skipped: rewrote {rows} rows of {state.finished_rows}"
            fsync_path(scratch)
            exchange(scratch, folder)
            fsync_path(self.collection_dir)
        except OSError as err:
            shutil.rmtree(scratch, ignore_errors=True)
            return f"skipped: {err.strerror or err}"
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        # The old parts are now in the hidden folder.
        shutil.rmtree(scratch, ignore_errors=True)
        state.files = [f"{state.name}/{name}" for name in names]
        return "compacted"

    def _rewrite(self, state: _TableState, parts: list[Path], folder: Path) -> list[str]:
        """Copy the rows of ``parts`` in order into new parts in ``folder``, in full row
        groups and at most ``rows_per_file`` rows a part (a writer holds every row
        group's metadata until it closes: about 10 KiB each, tens of MiB for one file
        of hours of a busy table); the names of the finished parts, in order."""
        assert state.arrow_schema is not None
        group = self.row_group_rows
        names: list[str] = []
        writer: pq.ParquetWriter | None = None
        file_rows = 0
        pending: list[pa.RecordBatch] = []
        held = 0

        def finish() -> None:
            nonlocal writer
            assert writer is not None
            writer.close()
            writer = None
            temp, name = folder / temp_name(len(names)), part_name(len(names))
            fsync_path(temp)
            os.replace(temp, folder / name)
            names.append(name)

        def write(batches: list[pa.RecordBatch], size: int | None = None) -> None:
            nonlocal writer, file_rows
            if writer is None:
                writer = self._writer(state, folder / temp_name(len(names)), compact=True)
                file_rows = 0
            table = self._data_columns(state, pa.Table.from_batches(batches))
            writer.write_table(self._part_rows(state, table), row_group_size=size)
            file_rows += table.num_rows
            if file_rows >= self.rows_per_file:
                finish()

        try:
            for part in parts:
                # Small batches on this thread: pre-buffering and decoding threads held
                # tens of MiB more at the collector's peak (bench/memory.py), and a
                # 64k-row batch held three times the decoded pages of a 16k-row one
                # (compaction's added RSS 36 -> 21 MiB on 30M rows).
                source = pq.ParquetFile(part, pre_buffer=False)
                for batch in source.iter_batches(batch_size=_READ_BATCH_ROWS, use_threads=False):
                    pending.append(batch)
                    held += batch.num_rows
                    if held >= group:
                        whole = pa.Table.from_batches(pending)
                        cut = held - held % group
                        write(whole.slice(0, cut).to_batches(), group)
                        rest = whole.slice(cut)
                        pending, held = rest.to_batches(), rest.num_rows
            if held:
                write(pending)
            if writer is not None:
                finish()
        finally:
            if writer is not None:
                writer.close()
        return names

    # -- inspection ----------------------------------------------------------------------

    def resume(self, table: str, parts: int) -> None:
        """Number ``table``'s next part after ``parts`` finished ones already on disk
        (a recovery adds parts to a killed collection's own)."""
        _check_table_name(table)
        with self._lock:
            state = self._tables.setdefault(table, _TableState(table))
            state.part = max(state.part, parts)

    @property
    def buffered_bytes(self) -> int:
        """Estimated bytes of rows buffered in memory, across all tables."""
        return self._buffered_bytes

    @property
    def closed(self) -> bool:
        return self._closed

    def files_written(self) -> dict[str, list[str]]:
        """Finished part files per table, relative to ``collection_dir`` (for the manifest)."""
        with self._lock:
            return {name: list(s.files) for name, s in self._tables.items() if s.files}

    def checkpoint(self) -> tuple[dict[str, list[str]], dict[str, int]]:
        """Finished files and rows per table as of the last durable flush. Takes no lock:
        the poll loop must never wait for the writer thread."""
        return self._checkpoint

    def finished_rows(self) -> dict[str, int]:
        """Rows in finished (readable) parts per table."""
        with self._lock:
            return {name: s.finished_rows for name, s in self._tables.items()}

    def __enter__(self) -> ParquetSink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"ParquetSink({str(self.collection_dir)!r}, {self.collection_id!r}, {state})"

    # -- internals -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Turn a failed write into one OutputError and a failed sink."""
        try:
            yield
        except OSError as err:
            self._fail(err)
            free = human_bytes(free_bytes(self.collection_dir))
            what = "the disk is full" if is_disk_full(err) else "a write failed"
            raise OutputError(
                f"cannot write to {self.collection_dir}: {what} ({err}); {free} free. "
                "Finished parts are kept."
            ) from err

    def _fail(self, err: OSError) -> None:
        self.failure = err
        for state in self._tables.values():
            if state.writer is not None:
                with contextlib.suppress(Exception):
                    state.writer.close()
                state.writer = None
            # An unfinished part has no footer: unreadable, and it holds space.
            if state.temp_path is not None:
                with contextlib.suppress(OSError):
                    state.temp_path.unlink()
                state.temp_path = None
            state.buffer, state.buffered_rows, state.buffered_bytes = [], 0, 0
        self._buffered_bytes = 0

    def _conform(self, state: _TableState, rows: pa.Table) -> pa.Table:
        """Check ``rows`` against the table's schema; reorder columns if only the order differs."""
        schema = rows.schema
        if state.schema is None:
            state.schema = schema.remove_metadata()
            return rows
        if schema.equals(state.schema):
            return rows
        if {f.name: f.type for f in schema} == {f.name: f.type for f in state.schema}:
            return rows.select(state.schema.names).cast(state.schema)
        raise CollectionError(_drift_message(state.name, state.schema, schema))

    def _take(self, state: _TableState, n: int) -> pa.Table:
        """Remove the first ``n`` buffered rows of ``state`` and return them."""
        # Concatenating tables and slicing them copies nothing.
        whole = pa.concat_tables(state.buffer) if len(state.buffer) > 1 else state.buffer[0]
        head, rest = whole.slice(0, n), whole.slice(n)
        rest_bytes = rest.nbytes if rest.num_rows else 0
        self._buffered_bytes += rest_bytes - state.buffered_bytes
        state.buffer = [rest] if rest.num_rows else []
        state.buffered_rows = rest.num_rows
        state.buffered_bytes = rest_bytes
        return head

    def _write_rows(self, state: _TableState, n: int) -> None:
        chunk = self._take(state, n)
        while chunk.num_rows:
            if state.writer is None:
                self._open_part(state, chunk)
            room = self.rows_per_file - state.part_rows
            piece, chunk = chunk.slice(0, room), chunk.slice(room)
            self._write_row_group(state, piece)
            if state.part_rows >= self.rows_per_file:
                self._finish_part(state)

    def _write_row_group(self, state: _TableState, piece: pa.Table) -> None:
        assert state.writer is not None and state.arrow_schema is not None
        table = self._data_columns(state, piece)
        assert state.writer is not None
        # One call, one row group: row_group_size covers the whole piece.
        state.writer.write_table(self._part_rows(state, table), row_group_size=table.num_rows)
        state.part_rows += table.num_rows
        state.rows += table.num_rows

    @staticmethod
    def _data_columns(state: _TableState, table: pa.Table) -> pa.Table:
        """``table`` without collection_id, in the table's own types."""
        assert state.arrow_schema is not None
        public = state.arrow_schema
        data_schema = public.remove(public.get_field_index(COLLECTION_ID))
        if COLLECTION_ID in table.column_names:
            table = table.drop_columns([COLLECTION_ID])
        return table if table.schema == data_schema else table.cast(data_schema)

    def _part_schema(self, state: _TableState) -> pa.Schema:
        """The writer's schema: the table's, with collection_id a dictionary of one
        value (nothing to hash per row: a fifth of the writing CPU)."""
        assert state.arrow_schema is not None
        at = state.arrow_schema.get_field_index(COLLECTION_ID)
        cid = pa.field(COLLECTION_ID, pa.dictionary(pa.int32(), pa.string()))
        return state.arrow_schema.set(at, cid)

    def _part_rows(self, state: _TableState, table: pa.Table) -> pa.Table:
        """``table`` (the data columns) with collection_id added, in the part's schema."""
        assert state.part_schema is not None
        n = table.num_rows
        if self._zeros is None or len(self._zeros) < n:
            self._zeros = pa.array(np.zeros(max(n, self.row_group_rows), np.int32))
        if self._cid_values is None:
            self._cid_values = pa.array([self.collection_id], pa.string())
        cid = pa.DictionaryArray.from_arrays(self._zeros.slice(0, n), self._cid_values)
        return pa.Table.from_arrays([*table.columns, cid], schema=state.part_schema)

    def _open_part(self, state: _TableState, sample: pa.Table) -> None:
        folder = self.collection_dir / state.name
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / part_name(state.part)
        if final.exists():
            raise CollectionError(
                f"{final} already exists: refusing to overwrite a finished part "
                "(use a new collection folder)"
            )
        if state.arrow_schema is None:
            data = state.schema if state.schema is not None else sample.schema
            state.arrow_schema = data.append(pa.field(COLLECTION_ID, pa.string()))
            # Dictionary-encode only columns that repeat (cpu, comm, kind...):
            # for timestamps pyarrow would build a dictionary and then abandon it
            # for every chunk, the hottest cost of writing.
            limit = min(4096, max(1, sample.num_rows // 4))
            state.dictionary_columns = [
                c for c in sample.column_names if _distinct(sample[c]) <= limit
            ] + [COLLECTION_ID]
            # Integer columns that mostly grow (timestamps, counters) are stored as
            # deltas: half the CPU of plain + zstd for them, and smaller files.
            state.delta_columns = [
                c
                for c in sample.column_names
                if c not in state.dictionary_columns and _mostly_growing(sample[c])
            ]
        state.temp_path = folder / temp_name(state.part)
        state.writer = self._writer(state, state.temp_path, compact=not self.fast_parts)
        state.part_rows = 0

    def _writer(self, state: _TableState, path: Path, *, compact: bool) -> pq.ParquetWriter:
        """A part's writer: compactly encoded, or plain (a run's parts with
        ``fast_parts``; only collection_id keeps its one-value dictionary)."""
        assert state.arrow_schema is not None
        state.part_schema = self._part_schema(state)
        writer = pq.ParquetWriter(
            path,
            state.part_schema,
            compression=self.compression if compact else "none",
            use_dictionary=state.dictionary_columns if compact else [COLLECTION_ID],
            column_encoding=(
                dict.fromkeys(state.delta_columns, "DELTA_BINARY_PACKED") if compact else None
            )
            or None,
            # Readers get the table's own schema (collection_id as text), not the
            # writer's.
            store_schema=False,
        )
        writer.add_key_value_metadata({"ARROW:schema": _schema_metadata(state.arrow_schema)})
        return writer

    def _finish_part(self, state: _TableState) -> None:
        assert state.writer is not None and state.temp_path is not None
        state.writer.close()
        state.writer = None
        final = state.temp_path.parent / part_name(state.part)
        fsync_path(state.temp_path)
        os.replace(state.temp_path, final)
        fsync_path(final.parent)
        state.files.append(final.relative_to(self.collection_dir).as_posix())
        state.finished_rows += state.part_rows
        state.temp_path = None
        state.part += 1
        state.part_rows = 0


#: rows per batch compaction reads (it writes full row groups of row_group_rows)
_READ_BATCH_ROWS = 16384


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


class MemorySink:
    """A sink that keeps every frame in memory; for tests."""

    def __init__(self) -> None:
        self.frames: dict[str, list[Rows]] = {}
        self.flushes = 0
        self.closed = False

    def write(self, table: str, frame: Rows) -> None:
        if self.closed:
            raise RuntimeError("MemorySink is closed")
        self.frames.setdefault(table, []).append(frame)

    def flush(self, *, durable: bool = False) -> None:
        self.flushes += 1

    def close(self) -> dict[str, int]:
        self.closed = True
        return {name: sum(row_count(f) for f in frames) for name, frames in self.frames.items()}

    def table(self, name: str) -> pl.DataFrame:
        """All rows written to ``name``, in order (an empty DataFrame if none)."""
        frames = self.frames.get(name)
        if not frames:
            return pl.DataFrame()
        return pl.concat(
            [f if isinstance(f, pl.DataFrame) else pl.from_arrow(f) for f in frames],
            how="vertical",
        )

    def tables(self) -> list[str]:
        return sorted(self.frames)


class ThreadedSink:
    """Runs another sink's writes in a background thread.

    The poll loop hands frames over and goes back to draining ring buffers
    while Parquet encodes (pyarrow and polars release the GIL). Frames waiting
    are bounded in bytes: when ``max_queued_bytes`` is reached, ``write``
    blocks, and the rings, not memory, absorb the backlog (and count drops).
    An error in the writer is raised by the next call.

    The writer is woken only by a flush, or by ``wake_bytes`` queued: small
    frames wait for the next flush. Waking it for every frame cost more CPU
    (two threads passing the GIL a hundred times a second) than writing them.
    """

    def __init__(
        self,
        inner: ParquetSink | MemorySink,
        max_queued_bytes: int = 32 * 2**20,
        wake_bytes: int = 2**20,
    ) -> None:
        self.inner = inner
        self.max_queued_bytes = max_queued_bytes
        self.wake_bytes = min(wake_bytes, max_queued_bytes)
        # (table, frame, bytes); table None is a flush marker (frame None: durable)
        self._queue: list[tuple[str | None, Rows | None, int]] = []
        self._queued_bytes = 0
        self._cond = threading.Condition()
        self._busy = False
        self._closing = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="kernmlops-sink", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                table, frame, size = self._queue.pop(0)
                self._busy = True
            try:
                if self._error is None:
                    if table is None:
                        self.inner.flush(durable=size == _DURABLE)
                    else:
                        self.inner.write(table, frame)  # type: ignore[arg-type]
            except BaseException as err:  # handed to the caller
                self._error = err
            finally:
                with self._cond:
                    self._queued_bytes -= size if table is not None else 0
                    self._busy = False
                    self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def check(self) -> None:
        """Raise the writer's error now (a full disk), not at the next call."""
        self._raise()

    def write(self, table: str, frame: Rows) -> None:
        self._raise()
        size = rows_nbytes(frame)
        with self._cond:
            while self._queued_bytes and self._queued_bytes + size > self.max_queued_bytes:
                self._cond.notify_all()  # the writer may be waiting for wake_bytes
                self._cond.wait()
            self._queue.append((table, frame, size))
            self._queued_bytes += size
            if self._queued_bytes >= self.wake_bytes:
                self._cond.notify_all()

    def _wait_idle(self) -> None:
        with self._cond:
            while self._queue or self._busy:
                self._cond.notify_all()
                self._cond.wait()

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    @property
    def behind(self) -> bool:
        """Whether a write soon could block: the queue is half way to its bound (the writer is
        stalled, e.g. in an fsync of a slow disk, or starved of CPU)."""
        return self._queued_bytes >= self.max_queued_bytes // 2

    def flush(self, *, durable: bool = False, wait: bool | None = None) -> None:
        """Queue a flush after what is queued; ``durable`` finishes the open parts.

        ``wait`` (default: ``durable``) blocks until it is done; the poll loop passes
        ``wait=False`` and goes on draining while the writer finishes the parts.
        """
        self._raise()
        with self._cond:
            self._queue.append((None, None, _DURABLE if durable else 0))
            self._cond.notify_all()
        if durable if wait is None else wait:
            self._wait_idle()
            self._raise()

    def close(self) -> dict[str, int]:
        self._wait_idle()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        rows = self.inner.close()  # close even after an error: finish the parts
        self._raise()
        return rows
