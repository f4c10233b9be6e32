"""A run's part files on disk: each table's folder held open, a part's life in it.

:class:`PartFiles` is what :class:`~kernmlops.collect.parquet.ParquetSink` writes
through. A part is opened under its hidden temporary name (``.part-NNNNN.parquet.tmp``),
made new and never through a link; it takes row groups until ``rows_per_file`` rows;
it is finished by closing its writer (the footer), syncing the file, renaming it to
``part-NNNNN.parquet`` and syncing the folder (the rename). A part another process
wrote (a row worker's, at stop) is adopted by renaming it into place as the table's
next part. After a failed write the unfinished parts are discarded (no footer: not
readable, and they hold space).

Each table's folder is opened once, without following a link, and held open until
:meth:`PartFiles.close`: every file is made through that descriptor, so a user who
owns the collection (a recovery's) cannot swap the folder for a link meanwhile
(kernmlops.host.pinned). The buffering, the lock and the sink's failure stay with
the sink; what a part holds and how it is encoded is kernmlops.collect.parts.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kernmlops.collect.parts import (
    PartFormat,
    TableState,
    data_columns,
    part_name,
    plan_encodings,
    temp_name,
)
from kernmlops.errors import CollectionError
from kernmlops.fileio import fsync_path
from kernmlops.host.pinned import UnsafePath, create_new, fd_path, subfolder

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PartFiles"]


class PartFiles:
    """The part files of a collection's tables under ``collection_dir``.

    Args:
        collection_dir: the collection's folder (made on the first part).
        shown: the folder as messages name it (collection_dir may be a held
            descriptor's).
        part_format: how a part is encoded.
        rows_per_file: a part is finished at this many rows.
        compact: parts are opened compactly encoded (False: cheaply, for a run whose
            parts compaction rewrites at stop).
    """

    def __init__(
        self,
        collection_dir: Path,
        shown: Path,
        part_format: PartFormat,
        rows_per_file: int,
        *,
        compact: bool,
    ) -> None:
        self.collection_dir = collection_dir
        self.shown = shown
        self.format = part_format
        self.rows_per_file = rows_per_file
        self.compact = compact
        #: parts finished from now on were written compactly at stop: compaction may
        #: keep them as they are (see TableState.whole_parts)
        self.whole = False
        #: each table's folder, held open (opened without following a link)
        self._folders: dict[str, int] = {}

    def write(self, state: TableState, chunk: pa.Table) -> None:
        """Write ``chunk`` as row groups of the table's open part, opening a part
        when none is open and finishing each that reaches ``rows_per_file`` rows."""
        while chunk.num_rows:
            if state.writer is None:
                self._open(state, chunk)
            room = self.rows_per_file - state.part_rows
            piece, chunk = chunk.slice(0, room), chunk.slice(room)
            self._write_row_group(state, piece)
            if state.part_rows >= self.rows_per_file:
                self.finish(state)

    def finish(self, state: TableState) -> None:
        """Finish the table's open part: footer, file synced, renamed, rename synced."""
        assert state.writer is not None and state.temp_path is not None
        assert state.temp_fd is not None
        state.writer.close()
        state.writer = None
        final = state.temp_path.parent / part_name(state.part)
        fsync_path(fd_path(state.temp_fd))  # the file held open, whatever its name now
        os.close(state.temp_fd)
        state.temp_fd = None
        os.replace(state.temp_path, final)
        fsync_path(fd_path(self._folders[state.name]))  # the rename itself
        state.files.append(f"{state.name}/{final.name}")
        if self.whole:
            state.whole_parts[state.files[-1]] = state.part_rows
        state.finished_rows += state.part_rows
        state.temp_path = None
        state.part += 1
        state.part_rows = 0

    def adopt(self, state: TableState, part: Path, rows: int) -> None:
        """Rename ``part`` (finished, compactly encoded, ``rows`` rows, on this
        filesystem) into place as the table's next part."""
        final = self.folder(state.name) / part_name(state.part)
        if final.exists() or final.is_symlink():
            raise CollectionError(
                f"{self.shown / state.name / final.name} already exists: refusing to "
                "overwrite a finished part"
            )
        os.rename(part, final)
        fsync_path(fd_path(self._folders[state.name]))  # the rename itself
        name = f"{state.name}/{final.name}"
        state.files.append(name)
        state.whole_parts[name] = rows
        state.finished_rows += rows
        state.rows += rows
        state.part += 1

    def discard(self, state: TableState) -> None:
        """After a failed write: drop the table's unfinished part, quietly."""
        if state.writer is not None:
            with contextlib.suppress(Exception):
                state.writer.close()
            state.writer = None
        # An unfinished part has no footer: unreadable, and it holds space.
        if state.temp_path is not None:
            with contextlib.suppress(OSError):
                state.temp_path.unlink()
            state.temp_path = None
        if state.temp_fd is not None:
            with contextlib.suppress(OSError):
                os.close(state.temp_fd)
            state.temp_fd = None

    def release(self, state: TableState) -> None:
        """Let go of what the table still holds open (at close, after the flush)."""
        if state.writer is not None:
            state.writer.close()
            state.writer = None
        if state.temp_fd is not None:
            os.close(state.temp_fd)
            state.temp_fd = None

    def close(self) -> None:
        """Let go of the table folders held open."""
        for fd in self._folders.values():
            os.close(fd)
        self._folders.clear()

    def folder(self, table: str) -> Path:
        """The table's folder, made if missing and held open: a user who owns the
        collection (a recovery's) cannot swap it for a link meanwhile."""
        fd = self._folders.get(table)
        if fd is None:
            self.collection_dir.mkdir(parents=True, exist_ok=True)  # created on first write
            try:
                fd = self._folders[table] = subfolder(self.collection_dir, table)
            except UnsafePath:
                raise UnsafePath(
                    f"cannot write to {self.shown / table}: it is a link or a file, not a "
                    "folder: not written through"
                ) from None
        return fd_path(fd)

    def _open(self, state: TableState, sample: pa.Table) -> None:
        folder = self.folder(state.name)
        final = folder / part_name(state.part)
        if final.exists() or final.is_symlink():
            raise CollectionError(
                f"{self.shown / state.name / final.name} already exists: refusing to "
                "overwrite a finished part (use a new collection folder)"
            )
        plan_encodings(state, sample)
        state.temp_path = folder / temp_name(state.part)
        # a new file, never through a link; pyarrow writes it through its descriptor
        state.temp_fd = create_new(state.temp_path)
        state.writer = self.format.writer(state, fd_path(state.temp_fd), compact=self.compact)
        state.part_rows = 0

    def _write_row_group(self, state: TableState, piece: pa.Table) -> None:
        assert state.writer is not None and state.arrow_schema is not None
        table = data_columns(state, piece)
        assert state.writer is not None
        # One call, one row group: row_group_size covers the whole piece.
        state.writer.write_table(self.format.part_rows(state, table), row_group_size=table.num_rows)
        state.part_rows += table.num_rows
        state.rows += table.num_rows
