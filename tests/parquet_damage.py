"""A Parquet file damaged inside a page, its footer left whole: what a bad disk or copy
does, and what no footer check can see."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def page_byte(
    part: Path, column: str, row_group: int = 0, *, dictionary: bool = False, header: bool = False
) -> int:
    """The offset of a byte inside a page of ``column``'s chunk in ``row_group``, from
    the footer's column chunk offsets: the last byte of its data pages (a page's own
    bytes, never a page header), with ``dictionary`` the last of its dictionary page
    (just before the first data page), with ``header`` the first of the first data
    page's header (no checksum covers it: it does not parse)."""
    group = pq.ParquetFile(part).metadata.row_group(row_group)
    paths = [group.column(i).path_in_schema for i in range(group.num_columns)]
    chunk = group.column(paths.index(column))
    if header:
        return chunk.data_page_offset
    if dictionary:
        assert chunk.has_dictionary_page, f"{column} has no dictionary page"
        return chunk.data_page_offset - 1
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end = start + chunk.total_compressed_size
    assert chunk.data_page_offset < end - 1
    return end - 1


def flip_page_byte(
    part: Path, column: str, row_group: int = 0, *, dictionary: bool = False, header: bool = False
) -> None:
    """Flip every bit of one byte inside a page of ``column`` (:func:`page_byte`) in
    place: the file keeps its size and its footer."""
    offset = page_byte(part, column, row_group, dictionary=dictionary, header=header)
    footer = pq.ParquetFile(part).metadata.to_dict()
    with open(part, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert pq.ParquetFile(part).metadata.to_dict() == footer  # the footer still whole
