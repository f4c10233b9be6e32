"""Parquet page checksums: the damage a part's footer cannot show.

A part's footer says what its pages hold, not whether they still hold it: a byte
flipped inside a data page (a disk, a copy, a hand) leaves the footer whole, and a
reader decodes wrong values without a word (polars checks no page checksum). So every
part is written with a CRC32 of each page (Parquet's ``PageHeader.crc``, pyarrow's
``write_page_checksum``: :data:`WRITE`), and what must not take a damaged part for a
good one reads its pages with pyarrow checking them (:func:`page_damage`): an eager
``read_collection`` and ``read_parquet_dir``, ``kernmlops push``, ``fleet reindex``,
compaction. A page written without a checksum (a part of an older kernmlops) passes:
the check finds only damage the writer recorded a checksum against, and damage that
stops a page from decoding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = ["READ", "WRITE", "page_damage"]

#: the writers' keyword arguments (pq.ParquetWriter, pq.write_table): a CRC32 per page
WRITE: dict[str, Any] = {"write_page_checksum": True}

#: the readers' keyword argument (pq.ParquetFile): each page's CRC32 checked as read
READ: dict[str, Any] = {"page_checksum_verification": True}

#: pyarrow's words for a page that fails its checksum
_CRC_FAILED = "CRC checksum verification failed"


def page_damage(source: str | pa.NativeFile | Any, *, pre_buffer: bool = False) -> str | None:
    """Why the Parquet file ``source`` (a path, a pyarrow file, a Python file) is
    damaged, in a few words (``a page fails its checksum (row group 0, column 'pid')``,
    ``not a readable Parquet file (...)``); None where every page of it reads and
    matches its checksum. Reads every page, a row group at a time (memory: one row
    group decoded), on this thread; ``pre_buffer``: each row group's column chunks in
    as few reads as pyarrow can merge them into (a remote file: a request each).

    An error reading ``source`` is returned as damage too: a caller reading over a
    network tells the two apart by its own file's errors (kernmlops.fleet.index).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(source, pre_buffer=pre_buffer, **READ)
    except (OSError, ValueError, pa.ArrowException) as err:
        return f"not a readable Parquet file ({_first_line(err)})"
    for group in range(parquet.metadata.num_row_groups):
        try:
            # a row group a call: a call a column costs ~0.1 ms each, 0.5 s for a
            # 52-column table of 100 small groups
            parquet.read_row_group(group, use_threads=False)
        except (OSError, ValueError, pa.ArrowException):
            return _which_column(parquet, group)
    return None


def _which_column(parquet: pq.ParquetFile, group: int) -> str:
    """Why row group ``group`` of ``parquet`` does not read, naming its first column
    that does not."""
    import pyarrow as pa

    for name in parquet.schema_arrow.names:
        try:
            parquet.read_row_group(group, columns=[name], use_threads=False)
        except (OSError, ValueError, pa.ArrowException) as err:
            where = f"row group {group}, column {name!r}"
            if _CRC_FAILED in str(err):
                return f"a page fails its checksum ({where})"
            return f"a page does not decode ({where}: {_first_line(err)})"
    return f"a page does not decode (row group {group})"  # only all columns together


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
