"""Compaction: a finished table's parts rewritten as few full ones, safely.

After a run, a table flushed every few seconds has one part per flush, written cheaply
(kernmlops.collect.parts.RUN) when ``collector.compact`` is on. :func:`compact_table`
rewrites them compactly encoded (kernmlops.collect.parts), in full row groups and at
most ``rows_per_file`` rows a part, in a hidden folder (``.compact-<table>``), then
swaps that folder with the table's in one atomic step (:func:`kernmlops.fileio.exchange`).
A reader, or a collector killed mid-way, sees either all the old parts or all the new
ones; anything that stops it (too little space, a file system that cannot swap folders,
an I/O error, Ctrl+C) leaves the parts as they were. :meth:`ParquetSink.compact
<kernmlops.collect.parquet.ParquetSink.compact>` runs it for each table.
"""

from __future__ import annotations

import os
import shutil
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.disk import free_bytes, human_bytes
from kernmlops.collect.parts import PartFormat, TableState, data_columns, part_name, temp_name
from kernmlops.fileio import exchange, fsync_path
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")

__all__ = ["compact_table", "rewrite"]

#: rows per batch compaction reads (it writes full row groups of row_group_rows)
_READ_BATCH_ROWS = 16384


def compact_table(
    state: TableState, collection_dir: Path, fmt: PartFormat, rows_per_file: int
) -> str:
    """Rewrite the finished parts of ``state``'s table under ``collection_dir`` and
    swap them in: ``"compacted"``, or why it was skipped (the parts then stay). Parts
    written compactly at stop (``state.whole_parts``) that hold a quarter of
    ``rows_per_file`` or more are kept as they are, linked into the new folder in
    their place."""
    folder = collection_dir / state.name
    # big enough to be a file of its own (a quarter of a full one): a collection of
    # short runs still ends in one file per table
    whole = {f for f, rows in state.whole_parts.items() if rows >= rows_per_file // 4}
    plain = [collection_dir / f for f in state.files if f not in whole]
    if all(f in state.whole_parts for f in state.files) and len(plain) <= 1:
        return "skipped: compact already"  # nothing plain, no small parts to join
    size = sum(p.stat().st_size for p in plain)
    free = free_bytes(collection_dir)
    # The new file is about as large as the parts; keep room for the manifest too.
    if free is not None and free < size + size // 8 + 16 * 2**20:
        return f"skipped: {human_bytes(free)} free, the table takes {human_bytes(size)}"
    scratch = collection_dir / f".compact-{state.name}"
    try:
        if scratch.exists():  # left by a collector killed while compacting
            shutil.rmtree(scratch)
        scratch.mkdir()
        names: list[str] = []
        for kept, run in groupby(state.files, key=lambda f: f in whole):
            parts = [collection_dir / f for f in run]
            if not kept:
                names += rewrite(state, parts, scratch, fmt, rows_per_file, first=len(names))
                continue
            for part in parts:  # a second name for the same file: no bytes copied
                os.link(part, scratch / part_name(len(names)), follow_symlinks=False)
                names.append(part_name(len(names)))
        counts = [pq.ParquetFile(scratch / name).metadata.num_rows for name in names]
        rows = sum(counts)
        if rows != state.finished_rows:  # never swap in files that lost rows
            return f"skipped: rewrote {rows} rows of {state.finished_rows}"
        fsync_path(scratch)
        exchange(scratch, folder)
        fsync_path(collection_dir)
    except OSError as err:
        shutil.rmtree(scratch, ignore_errors=True)
        return f"skipped: {err.strerror or err}"
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    # The old parts are now in the hidden folder.
    shutil.rmtree(scratch, ignore_errors=True)
    state.files = [f"{state.name}/{name}" for name in names]
    state.whole_parts = dict(zip(state.files, counts, strict=True))
    return "compacted"


def rewrite(
    state: TableState,
    parts: list[Path],
    folder: Path,
    fmt: PartFormat,
    rows_per_file: int,
    first: int = 0,
) -> list[str]:
    """Copy the rows of ``parts`` in order into new parts in ``folder`` (numbered from
    ``first``), in full row
    groups and at most ``rows_per_file`` rows a part (a writer holds every row
    group's metadata until it closes: about 10 KiB each, tens of MiB for one file
    of hours of a busy table); the names of the finished parts, in order."""
    assert state.arrow_schema is not None
    group = fmt.row_group_rows
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
        temp, name = folder / temp_name(first + len(names)), part_name(first + len(names))
        fsync_path(temp)
        os.replace(temp, folder / name)
        names.append(name)

    def write(batches: list[pa.RecordBatch], size: int | None = None) -> None:
        nonlocal writer, file_rows
        if writer is None:
            writer = fmt.writer(state, folder / temp_name(first + len(names)), compact=True)
            file_rows = 0
        table = data_columns(state, pa.Table.from_batches(batches))
        writer.write_table(fmt.part_rows(state, table), row_group_size=size)
        file_rows += table.num_rows
        if file_rows >= rows_per_file:
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
