"""Parquet page checksums: the damage a part's footer cannot show.

A part's footer says what its pages hold, not whether they still hold it: a byte
flipped inside a data page (a disk, a copy, a hand) leaves the footer whole, and a
reader decodes wrong values without a word (polars checks no page checksum). So every
part is written with a CRC32 of each page (Parquet's ``PageHeader.crc``, pyarrow's
``write_page_checksum``: :data:`WRITE`), and what must not take a damaged part for a
good one checks its pages (:func:`page_damage`): every ``read_collection`` (lazy too)
and ``read_parquet_dir``, ``kernmlops push``, ``fleet reindex``, compaction.

The check decodes no value: each column chunk the footer lists is read (a read a chunk,
or adjacent chunks together), its pages walked by their headers (Thrift's compact
protocol, parsed by the ``thrift`` package), and each page's bytes run through CRC32
against the checksum its header holds: about a tenth of what decoding them with
pyarrow (``page_checksum_verification``) costs. A page written without a checksum (a
part of an older kernmlops) passes: the check finds damage the writer recorded a
checksum against, and damage to the page structure itself (a header that does not
parse, a page running past its chunk, a chunk past the file).
"""

from __future__ import annotations

import functools
import os
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

__all__ = ["READ", "WRITE", "page_damage"]

#: the writers' keyword arguments (pq.ParquetWriter, pq.write_table): a CRC32 per page
WRITE: dict[str, Any] = {"write_page_checksum": True}

#: the readers' keyword argument (pq.ParquetFile): each page's CRC32 checked as read
#: (compaction, which decodes the pages anyway to rewrite them)
READ: dict[str, Any] = {"page_checksum_verification": True}

#: ``pre_buffer``: adjacent column chunks read together up to this many bytes (a
#: remote file: a request each); a larger chunk is read alone
_COALESCE = 64 << 20


@dataclass(frozen=True)
class _Chunk:
    group: int
    column: str
    start: int
    size: int
    values: int  # the footer's count: its data pages' num_values add up to it
    compressed: bool

    @property
    def where(self) -> str:
        return f"row group {self.group}, column {self.column!r}"


def page_damage(source: str | os.PathLike[str] | pa.NativeFile | Any, *,
                pre_buffer: bool = False) -> str | None:  # fmt: skip
    """Why the Parquet file ``source`` (a path, a pyarrow file, a Python file) is
    damaged, in a few words (``a page fails its checksum (row group 0, column 'pid')``,
    ``a page does not decode (row group 0, column 'pid': ...)``, ``not a readable
    Parquet file (...)``); None where every page of it matches its checksum and its
    pages fill their column chunks. No value is decoded: each column chunk is read (a
    read a chunk; memory: one chunk), on this thread; ``pre_buffer``: adjacent chunks
    read together, up to 64 MiB a read (a remote file: fewer requests).

    An error reading ``source`` is returned as damage too: a caller reading over a
    network tells the two apart by its own file's errors (kernmlops.fleet.index).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    opened = isinstance(source, str | os.PathLike)
    try:
        if opened:
            file: pa.NativeFile = pa.OSFile(os.fspath(source))
        elif isinstance(source, pa.NativeFile):
            file = source
        else:  # a Python file: wrapped, never closed here (closing it closes theirs)
            file = pa.PythonFile(source, mode="r")
    except (OSError, ValueError, pa.ArrowException) as err:
        return f"not a readable Parquet file ({_first_line(err)})"
    try:
        try:
            meta = pq.ParquetFile(file, pre_buffer=False).metadata
            size = file.size()
        except (OSError, ValueError, pa.ArrowException) as err:
            return f"not a readable Parquet file ({_first_line(err)})"
        return _damage(file, meta, size, pre_buffer)
    finally:
        if opened:  # the caller's own files stay open
            file.close()


def _damage(file: pa.NativeFile, meta: pq.FileMetaData, size: int, pre_buffer: bool) -> str | None:
    """page_damage of ``file`` (``size`` bytes), its footer read into ``meta``."""
    import pyarrow as pa

    # pages lie between the leading magic and the footer (its length and magic last)
    pages_end = size - 8 - meta.serialized_size
    chunks: list[_Chunk] = []
    for group in range(meta.num_row_groups):
        row_group = meta.row_group(group)
        for i in range(row_group.num_columns):
            column = row_group.column(i)
            start = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset:
                start = min(start, column.dictionary_page_offset)
            chunk = _Chunk(
                group,
                column.path_in_schema,
                start,
                column.total_compressed_size,
                column.num_values,
                column.compression != "UNCOMPRESSED",
            )
            if chunk.start < 4 or chunk.size < 0 or chunk.start + chunk.size > pages_end:
                return f"a page does not decode ({chunk.where}: its chunk lies past the pages)"
            chunks.append(chunk)
    for run in _runs(chunks, _COALESCE if pre_buffer else 0):
        start = run[0].start
        length = run[-1].start + run[-1].size - start
        try:
            data = file.read_at(length, start)
        except (OSError, ValueError, pa.ArrowException) as err:
            return f"a page does not decode ({run[0].where}: {_first_line(err)})"
        if len(data) != length:  # the file shrank since its footer was read
            return f"a page does not decode ({run[0].where}: its chunk lies past the file)"
        for chunk in run:
            why = _chunk_damage(data, chunk.start - start, chunk)
            if why is not None:
                if why == _CHECKSUM:
                    return f"a page fails its checksum ({chunk.where})"
                return f"a page does not decode ({chunk.where}: {why})"
    return None


def _runs(chunks: list[_Chunk], most: int) -> list[list[_Chunk]]:
    """``chunks`` in file order, grouped into runs read at once: chunks that follow
    each other without a gap, up to ``most`` bytes a run (0: a chunk a run)."""
    runs: list[list[_Chunk]] = []
    for chunk in chunks:
        if runs:
            last = runs[-1][-1]
            end = last.start + last.size
            if chunk.start == end and end + chunk.size - runs[-1][0].start <= most:
                runs[-1].append(chunk)
                continue
        runs.append([chunk])
    return runs


#: _chunk_damage's word for a page that fails its checksum
_CHECKSUM = "checksum"

#: PageType (parquet.thrift)
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3


def _chunk_damage(data: bytes, offset: int, chunk: _Chunk) -> str | None:
    """Why ``chunk``, at ``offset`` of ``data``, is damaged: _CHECKSUM where a page
    fails its CRC32, a few words where a page header does not parse or say what the
    footer does, or its pages do not fill it; None where it is whole."""
    from thrift.transport.TTransport import TMemoryBuffer

    header_type, protocol_type = _thrift()
    view = memoryview(data)
    pos, end = offset, offset + chunk.size
    values = 0
    while pos < end:
        # BytesIO over bytes shares them: a header parsed where it lies, not copied
        buffer = TMemoryBuffer(data, offset=pos)
        # a length (a statistic's value, a list) past the chunk is damage, not a large
        # allocation
        protocol = protocol_type(buffer, end - pos, end - pos)
        header = header_type()
        try:
            header.read(protocol)
        except Exception:  # any bytes that do not parse as a header (EOF, bad type, ...)
            return "its page header does not parse"
        body = buffer.cstringio_buf.tell()
        if body > end:
            return "its page header runs past its column chunk"
        why = _header_damage(header, chunk, first=pos == offset)
        if why is not None:
            return why
        pos = body + header.compressed_page_size
        if pos > end:
            return "a page runs past its column chunk"
        # the header's crc is a signed i32, zlib's unsigned
        if header.crc is not None and zlib.crc32(view[body:pos]) != header.crc & 0xFFFFFFFF:
            return _CHECKSUM
        if header.type == _DATA_PAGE:
            values += header.data_page_header.num_values
        elif header.type == _DATA_PAGE_V2:
            values += header.data_page_header_v2.num_values
    if values != chunk.values:
        return f"its pages hold {values} values, its footer says {chunk.values}"
    return None


def _header_damage(header: Any, chunk: _Chunk, *, first: bool) -> str | None:
    """Why a page ``header`` of ``chunk`` cannot be (a field Parquet requires missing,
    a size below zero, its kind's own header absent), or None. The checks pyarrow's
    reader makes of a header, so that what it would refuse is not passed."""
    bad = "its page header does not parse"
    sizes = (header.uncompressed_page_size, header.compressed_page_size)
    if header.type is None or None in sizes or min(sizes) < 0:
        return bad
    if not chunk.compressed and sizes[0] != sizes[1]:
        return bad  # an uncompressed page's two sizes are one
    kind = header.type
    if kind == _DATA_PAGE:
        page = header.data_page_header
        fields = ("num_values", "encoding", "definition_level_encoding",
                  "repetition_level_encoding")  # fmt: skip
    elif kind == _DICTIONARY_PAGE:
        if not first:
            return "a dictionary page after its first page"
        page = header.dictionary_page_header
        fields = ("num_values", "encoding")
    elif kind == _DATA_PAGE_V2:
        page = header.data_page_header_v2
        fields = ("num_values", "num_nulls", "num_rows", "encoding",
                  "definition_levels_byte_length", "repetition_levels_byte_length")  # fmt: skip
    else:
        return None if kind == _INDEX_PAGE else bad
    if page is None or any(getattr(page, f) is None for f in fields):
        return bad
    counts = [getattr(page, f) for f in fields if f != "encoding" and not f.endswith("_encoding")]
    if min(counts) < 0:
        return bad
    if kind == _DATA_PAGE_V2 and sum(counts[-2:]) > header.compressed_page_size:
        return bad  # its levels, stored uncompressed, larger than the page
    return None


@functools.cache
def _thrift() -> tuple[type, type]:
    """Parquet's PageHeader as the thrift package reads a struct (its integer fields
    and its page kind's header; statistics skipped), and the compact protocol that
    reads it: in C where the package has its extension (fastbinary), else in Python, a
    binary field skipped as bytes (the generic skip reads it as UTF-8, and a page's
    statistics are any bytes)."""
    from thrift.protocol.TBase import TBase
    from thrift.protocol.TCompactProtocol import TCompactProtocolAccelerated
    from thrift.Thrift import TType

    def struct(name: str, fields: list[tuple[int, int, str, Any]]) -> type:
        # (field id, type, name, type arguments, default), as generated code has it (a
        # struct's arguments: [its class, its spec]);
        # a field id this spec lacks is skipped
        spec: list[Any] = [None] * (max(f[0] for f in fields) + 1)
        for fid, kind, field, args in fields:
            spec[fid] = (fid, kind, field, args, None)
        names = tuple(f[2] for f in fields)

        def __init__(self: Any, **given: Any) -> None:
            for n in names:
                setattr(self, n, given.get(n))

        return type(name, (TBase,), {"__slots__": names, "thrift_spec": tuple(spec),
                                     "__init__": __init__})  # fmt: skip

    i32 = TType.I32
    data = struct("DataPageHeader", [(1, i32, "num_values", None), (2, i32, "encoding", None),
                  (3, i32, "definition_level_encoding", None),
                  (4, i32, "repetition_level_encoding", None)])  # fmt: skip
    dictionary = struct("DictionaryPageHeader", [(1, i32, "num_values", None),
                        (2, i32, "encoding", None)])  # fmt: skip
    data_v2 = struct("DataPageHeaderV2", [(1, i32, "num_values", None),
                     (2, i32, "num_nulls", None), (3, i32, "num_rows", None),
                     (4, i32, "encoding", None), (5, i32, "definition_levels_byte_length", None),
                     (6, i32, "repetition_levels_byte_length", None)])  # fmt: skip
    header = struct("PageHeader", [
        (1, i32, "type", None), (2, i32, "uncompressed_page_size", None),
        (3, i32, "compressed_page_size", None), (4, i32, "crc", None),
        (5, TType.STRUCT, "data_page_header", [data, data.thrift_spec]),
        (7, TType.STRUCT, "dictionary_page_header", [dictionary, dictionary.thrift_spec]),
        (8, TType.STRUCT, "data_page_header_v2", [data_v2, data_v2.thrift_spec]),
    ])  # fmt: skip

    class Protocol(TCompactProtocolAccelerated):
        def skip(self, ttype: int, max_depth: int = 64) -> None:
            if ttype == TType.STRING:
                self.readBinary()
            else:
                super().skip(ttype, max_depth)

    return header, Protocol


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
