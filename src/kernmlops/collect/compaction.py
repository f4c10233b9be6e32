"""Compaction: a finished table's parts rewritten as few full ones, safely.

After a run, a table flushed every few seconds has one part per flush, written cheaply
(kernmlops.collect.parts.RUN) when ``collector.compact`` is on. :func:`compact_table`
rewrites them compactly encoded (kernmlops.collect.parts), in full row groups and at
most ``rows_per_file`` rows a part, in a hidden folder (``.compact-<table>``), then
swaps that folder with the table's in one atomic step (:func:`kernmlops.fileio.exchange`).
A reader, or a collector killed mid-way, sees either all the old parts or all the new
ones; anything that stops it (too little space, a file system that cannot swap folders,
an I/O error, Ctrl+C) leaves the parts as they were. :meth:`ParquetSink.compact
<kernmlops.collect.parquet.ParquetSink.compact>` runs it for each table at stop;
``kernmlops recover`` for each table of a killed collection (:func:`table_on_disk`:
its parts as no sink knows them any more).

``recover`` runs as root in collections their users own: the table's folder is held
open (kernmlops.host.pinned) and its parts are read through it, never through a link,
nor a second name of another owner's file; the new parts are made in a folder of
compaction's own, held open too.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect import pagecheck
from kernmlops.collect.disk import free_bytes, human_bytes
from kernmlops.collect.parts import (
    PartFormat,
    TableState,
    data_columns,
    part_name,
    plan_encodings,
    temp_name,
)
from kernmlops.fileio import exchange, fsync_path
from kernmlops.host.pinned import UnsafePath, create_new, fd_path, subfolder
from kernmlops.lazy import lazy_import

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq
else:
    pa = lazy_import("pyarrow")
    pq = lazy_import("pyarrow.parquet")

__all__ = ["compact_table", "rewrite", "table_on_disk"]

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
    # big enough to be a file of its own (a quarter of a full one): a collection of
    # short runs still ends in one file per table
    whole = {f for f, rows in state.whole_parts.items() if rows >= rows_per_file // 4}
    if all(f in state.whole_parts for f in state.files) and (
        sum(f not in whole for f in state.files) <= 1
    ):
        return "skipped: compact already"  # nothing plain, no small parts to join
    try:
        table = subfolder(collection_dir, state.name, create=False)
    except UnsafePath:
        return f"skipped: {state.name} is a link or a file, not a folder"
    except OSError as err:
        return f"skipped: {err.strerror or err}"
    try:
        return _compact_held(state, collection_dir, table, whole, fmt, rows_per_file)
    finally:
        os.close(table)


def _compact_held(state: TableState, collection_dir: Path, table: int, whole: set[str],
                  fmt: PartFormat, rows_per_file: int) -> str:  # fmt: skip
    """:func:`compact_table` with the table's folder held open (``table``)."""
    held = fd_path(table)
    plain = [held / Path(f).name for f in state.files if f not in whole]
    scratch = collection_dir / f".compact-{state.name}"
    try:
        size = sum(os.stat(p, follow_symlinks=False).st_size for p in plain)
        free = free_bytes(collection_dir)
        # The new file is about as large as the parts; keep room for the manifest too.
        if free is not None and free < size + size // 8 + 16 * 2**20:
            return f"skipped: {human_bytes(free)} free, the table takes {human_bytes(size)}"
        if os.path.islink(scratch):  # planted: only the link goes
            os.unlink(scratch)
        elif scratch.exists():  # left by a collector killed while compacting
            shutil.rmtree(scratch)
        # written through while held: a folder swapped in under its name is not
        out = subfolder(collection_dir, scratch.name, fresh=True)
        try:
            names = _rewrite_all(state, plain, whole, table, out, fmt, rows_per_file)
            counts = [pq.ParquetFile(fd_path(out) / name).metadata.num_rows for name in names]
            rows = sum(counts)
            if rows != state.finished_rows:  # never swap in files that lost rows
                shutil.rmtree(scratch, ignore_errors=True)
                return f"skipped: rewrote {rows} rows of {state.finished_rows}"
            os.fsync(out)
        finally:
            os.close(out)
        exchange(scratch, collection_dir / state.name)
        fsync_path(collection_dir)
    except UnsafePath as err:  # not ours: left as it is
        return f"skipped: {err}"
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


def _rewrite_all(state: TableState, plain: list[Path], whole: set[str], table: int, out: int,
                 fmt: PartFormat, rows_per_file: int) -> list[str]:  # fmt: skip
    """The table's parts, in order, as new parts in the held folder ``out``: the plain
    ones rewritten, the whole ones linked (no bytes copied); their names."""
    names: list[str] = []
    rewritten = iter(plain)
    for kept, run in groupby(state.files, key=lambda f: f in whole):
        files = list(run)
        if not kept:
            parts = [next(rewritten) for _ in files]
            names += rewrite(state, parts, fd_path(out), fmt, rows_per_file, first=len(names))
            continue
        for f in files:  # a second name for the same file
            name = part_name(len(names))
            os.link(Path(f).name, name, src_dir_fd=table, dst_dir_fd=out, follow_symlinks=False)
            names.append(name)
    return names


def _open_part(path: Path) -> int:
    """A part of a held table folder opened for reading: never through a link, only a
    plain file and, as root, never a second name of a file of another owner than the
    folder's (a hard link a user made to root's file)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    owner = os.stat(path.parent).st_uid
    if not stat.S_ISREG(st.st_mode) or (
        os.geteuid() == 0 and st.st_nlink != 1 and st.st_uid != owner
    ):
        os.close(fd)
        raise OSError(errno.EPERM, f"{path.name} is not a plain file of the collection's")
    return fd


def table_on_disk(collection_dir: Path, table: str, parts: dict[str, int]) -> TableState:
    """The state compaction needs of a table whose sink is gone (a killed collector's):
    ``parts`` (``table/part-….parquet`` to rows, in order) with the table's schema, as
    every part stores it, and its encodings planned from the first part's first row
    group, as the sink planned them from its first rows.

    Raises:
        ValueError: a part's schema differs from the first's (rows of two versions).
        OSError: a part cannot be read (or is a link: see :func:`_open_part`).
    """
    from kernmlops.tables import COLLECTION_ID

    state = TableState(table)
    state.files = list(parts)
    state.finished_rows = state.rows = sum(parts.values())
    held = subfolder(collection_dir, table, create=False)
    try:
        schemas = []
        sample = None
        for f in state.files:
            with open(_open_part(fd_path(held) / Path(f).name), "rb") as file:
                source = pq.ParquetFile(file, pre_buffer=False)
                schemas.append(source.schema_arrow.remove_metadata())
                if sample is None and source.metadata.num_row_groups:
                    sample = source.read_row_group(0, use_threads=False)
    finally:
        os.close(held)
    if not schemas or sample is None:
        raise ValueError("no rows")
    if any(not s.equals(schemas[0]) for s in schemas):
        raise ValueError("its parts have different schemas")
    if COLLECTION_ID not in schemas[0].names:
        raise ValueError(f"its parts have no {COLLECTION_ID} column")
    state.schema = schemas[0].remove(schemas[0].get_field_index(COLLECTION_ID))
    plan_encodings(state, sample.drop_columns([COLLECTION_ID]))
    return state


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
    temp_fd: int | None = None
    file_rows = 0
    pending: list[pa.RecordBatch] = []
    held = 0

    def finish() -> None:
        nonlocal writer, temp_fd
        assert writer is not None and temp_fd is not None
        writer.close()
        writer = None
        os.fsync(temp_fd)  # the file held open, whatever its name now
        os.close(temp_fd)
        temp_fd = None
        temp, name = folder / temp_name(first + len(names)), part_name(first + len(names))
        os.replace(temp, folder / name)
        names.append(name)

    def write(batches: list[pa.RecordBatch], size: int | None = None) -> None:
        nonlocal writer, file_rows, temp_fd
        if writer is None:
            # a new file, never through a link; pyarrow writes it through its descriptor
            temp_fd = create_new(folder / temp_name(first + len(names)))
            writer = fmt.writer(state, fd_path(temp_fd), compact=True)
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
            with open(_open_part(part), "rb") as file:
                # pages checked: a damaged run part is refused, never rewritten into a
                # part with fresh checksums over its wrong values
                source = pq.ParquetFile(file, pre_buffer=False, **pagecheck.READ)
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
        if temp_fd is not None:
            os.close(temp_fd)
    return names
