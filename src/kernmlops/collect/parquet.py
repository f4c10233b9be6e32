"""The Parquet sink: a collection's tables written as parts while it runs.

:class:`ParquetSink` writes one folder per table, ``<collection_dir>/<table>/part-NNNNN.parquet``,
in row groups of ``row_group_rows`` rows. Each part is written under a temporary name
(``.part-NNNNN.parquet.tmp``, hidden from polars, DuckDB and Spark) and renamed when finished,
so a reader never sees half a file. A durable flush finishes every open part (footer, fsync,
rename): the session does one every ``collector.flush_interval_s``, so a collector killed the
next instant loses at most one interval of rows, and every finished part stays readable.

A failed write (a full disk, an I/O error) fails the sink once: its unfinished temporary
parts are removed (they free the space they took), finished parts stay, and later rows are
counted as lost instead of raising again.

This module owns the buffering, the lock, the sink's API and its failure; the part
files themselves (table folders held open, a part opened, its row groups, finished,
adopted, discarded) are kernmlops.collect.partfiles, what a part is and how it is
encoded kernmlops.collect.parts, the rewrite at stop kernmlops.collect.compaction.
Rows arrive as Arrow tables (or polars DataFrames, converted): the sink is Arrow
throughout and needs no DataFrame library.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from kernmlops.collect.compaction import compact_table
from kernmlops.collect.disk import free_bytes, human_bytes, is_disk_full
from kernmlops.collect.partfiles import PartFiles
from kernmlops.collect.parts import (
    PartFormat,
    TableState,
    check_table_name,
    conform,
    drift_message,
)
from kernmlops.errors import CollectionError, OutputError
from kernmlops.lazy import lazy_import
from kernmlops.tables import Rows, as_arrow

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_import("pyarrow")

__all__ = ["ParquetSink"]


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
        fast_parts: write the parts of the run cheaply (:data:`~kernmlops.collect.
            parts.RUN`: lz4 and deltas, no dictionaries but collection_id's), for a
            collection that :meth:`compact` rewrites at stop: that rewrite then
            encodes every such table compactly, one part or many. The run's parts
            cost about two thirds of the CPU per row of the compact encoding and as
            little as parts with no encoding at all (`python -m bench parts`), while
            the workload runs; they take about 2.7 times the space of the compacted
            file until then (parts with no encoding took 60 times), and stay
            readable as they are after a crash.
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
        shown: Path | None = None,
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
        #: the folder as messages name it (collection_dir may be a held descriptor's)
        self.shown = Path(shown or collection_dir)
        self.collection_id = collection_id
        self.row_group_rows = row_group_rows
        self.max_buffered_bytes = max_buffered_bytes
        self.rows_per_file = rows_per_file
        self.compression = compression
        self._tables: dict[str, TableState] = {}
        self._buffered_bytes = 0
        self._closed = False
        self._result: dict[str, int] | None = None
        #: the write error that failed the sink (a full disk ...); None while healthy
        self.failure: OSError | None = None
        #: rows the sink lost, per table: those buffered or in an unfinished part when
        #: a write failed, and those handed to it after
        self.lost_rows: dict[str, int] = {}
        #: per table, rows handed to write() and rows of adopted parts: what a failure
        #: leaves outside the finished parts is the difference (see _fail)
        self._handed: dict[str, int] = {}
        self._adopted: dict[str, int] = {}
        #: durable flushes done, and the wall-clock time (time.time()) of the last one
        self.durable_flushes = 0
        self.last_durable_flush: float | None = None
        self._checkpoint: tuple[dict[str, list[str]], dict[str, int]] = ({}, {})
        # The session may flush from a timer thread while hooks write.
        self._lock = threading.RLock()
        #: the run's parts were written cheaply (fast_parts, even once it is switched off)
        self._plain_run = fast_parts
        self._format = PartFormat(collection_id, compression, row_group_rows)
        #: the part files: folders held open, parts opened, finished, adopted
        self._parts = PartFiles(
            self.collection_dir, self.shown, self._format, rows_per_file, compact=not fast_parts
        )

    # -- the Sink protocol -------------------------------------------------------------

    def write(self, table: str, frame: Rows) -> None:
        """Buffer ``frame`` as rows of ``table``; write full row groups as they fill.

        Raises:
            CollectionError: the frame's schema differs from the table's first batch.
            RuntimeError: the sink is closed.
        """
        check_table_name(table)
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
                state = self._tables[table] = TableState(table)
            rows = conform(state, rows)
            if rows.num_rows == 0:
                return
            self._handed[table] = self._handed.get(table, 0) + rows.num_rows
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
                            self._parts.finish(state)
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
                    self._parts.release(state)
                self._parts.close()
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
            # the run's parts are rewritten compactly even when there is only one
            least = 1 if self._plain_run else min_parts
            if len(state.files) < least or state.arrow_schema is None:
                continue
            if on_table is not None:
                on_table(state.name, len(state.files))
            outcome[state.name] = compact_table(
                state, self.collection_dir, self._format, self.rows_per_file
            )
        return outcome

    def write_whole_parts(self) -> None:
        """From now on (the stop: no workload to leave the CPU to) write parts compactly
        encoded, which :meth:`compact` keeps as they are instead of reading them back;
        the parts open now are finished first (they are the run's)."""
        with self._lock:
            if self._closed or self.failure is not None or not self.fast_parts:
                return
            with self._guard():
                for state in self._tables.values():
                    if state.buffered_rows:
                        self._write_rows(state, state.buffered_rows)
                    if state.writer is not None:
                        self._parts.finish(state)
            self._parts.compact = self._parts.whole = True

    def adopt(self, table: str, part: Path, rows: int, schema: pa.Schema) -> None:
        """Make ``part`` (a finished, compactly encoded part written by another process
        on this filesystem, of ``rows`` rows of ``schema``) the table's next part: it
        is renamed into place after every part written so far (flush first)."""
        check_table_name(table)
        with self._lock:
            if self._closed or self.failure is not None:
                raise RuntimeError(f"ParquetSink for {self.collection_dir} cannot adopt parts")
            state = self._tables.get(table)
            if state is None:
                state = self._tables[table] = TableState(table)
            if state.buffered_rows or state.writer is not None:
                raise RuntimeError(f"table {table!r} has rows not flushed: flush before adopting")
            if state.schema is None:
                state.schema = schema
            elif not schema.equals(state.schema):
                raise CollectionError(drift_message(table, state.schema, schema))
            with self._guard():
                self._parts.adopt(state, part, rows)
            self._adopted[table] = self._adopted.get(table, 0) + rows

    # -- inspection ----------------------------------------------------------------------

    def resume(self, table: str, parts: int) -> None:
        """Number ``table``'s next part after ``parts`` finished ones already on disk
        (a recovery adds parts to a killed collection's own)."""
        check_table_name(table)
        with self._lock:
            state = self._tables.setdefault(table, TableState(table))
            state.part = max(state.part, parts)

    @property
    def buffered_bytes(self) -> int:
        """Estimated bytes of rows buffered in memory, across all tables."""
        return self._buffered_bytes

    @property
    def fast_parts(self) -> bool:
        """Whether parts are written cheaply now (until :meth:`write_whole_parts`)."""
        return not self._parts.compact

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

    def table_schema(self, table: str) -> pa.Schema | None:
        """The schema every batch of ``table`` has (its first batch's), if it had one."""
        with self._lock:
            state = self._tables.get(table)
            return state.schema if state is not None else None

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
                f"cannot write to {self.shown}: {what} ({err}); {free} free. "
                "Finished parts are kept."
            ) from err

    def _fail(self, err: OSError) -> None:
        self.failure = err
        for state in self._tables.values():
            # buffered, in the unfinished part or in the write that failed: all lost
            written = state.finished_rows - self._adopted.get(state.name, 0)
            lost = self._handed.get(state.name, 0) - written
            if lost > 0:
                self.lost_rows[state.name] = self.lost_rows.get(state.name, 0) + lost
            self._parts.discard(state)  # unfinished parts go; finished ones stay
            state.buffer, state.buffered_rows, state.buffered_bytes = [], 0, 0
        self._buffered_bytes = 0

    def _take(self, state: TableState, n: int) -> pa.Table:
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

    def _write_rows(self, state: TableState, n: int) -> None:
        self._parts.write(state, self._take(state, n))
