"""pagecheck.page_damage walks the pages without decoding them: each finding is held
against pyarrow's own check (a read with page_checksum_verification), the independent
source, on files written by pyarrow: flipped bytes in data and dictionary pages and in
page headers, several row groups, compressed and uncompressed chunks, truncated files."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernmlops.collect import pagecheck
from kernmlops.collect.pagecheck import page_damage
from tests.parquet_damage import flip_page_byte

ROWS = 3000
COLUMNS = ("ts", "latency_ns", "comm", "score")


@pytest.fixture(params=["c", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The page headers parsed by thrift's C extension, and by its Python protocol (an
    install without the extension): the same findings."""
    if request.param == "python":
        header, protocol = pagecheck._thrift()

        class Python(protocol):  # type: ignore[misc,valid-type]
            def __init__(self, *args: object, **kwargs: object) -> None:
                super().__init__(*args, **kwargs)
                self._fast_decode = None

        monkeypatch.setattr(pagecheck, "_thrift", lambda: (header, Python))
    yield request.param


def _write(path: Path, compression: str, *, checksums: bool = True) -> Path:
    rng = np.random.default_rng(7)
    table = pa.table(
        {
            "ts": np.arange(ROWS, dtype=np.uint64) * 1000,
            "latency_ns": rng.integers(0, 1 << 40, ROWS),
            "comm": pa.array([f"task-{i % 5}" for i in range(ROWS)]),  # a dictionary
            "score": rng.random(ROWS),
        }
    )
    pq.write_table(table, path, compression=compression, row_group_size=1000,
                   data_page_size=2048, write_page_checksum=checksums)  # fmt: skip
    return path


def _pyarrow_damage(path: Path) -> str | None:
    """pyarrow's verdict: its first error reading every row group with each page's
    checksum checked (None: it reads)."""
    try:
        f = pq.ParquetFile(path, page_checksum_verification=True)
        for group in range(f.metadata.num_row_groups):
            f.read_row_group(group, use_threads=False)
    except (OSError, ValueError, pa.ArrowException) as err:
        return str(err)
    return None


@pytest.mark.parametrize("compression", ["none", "zstd", "snappy"])
def test_whole_files_pass_and_agree_with_pyarrow(tmp_path: Path, compression: str,
                                                 reader: str) -> None:  # fmt: skip
    part = _write(tmp_path / "p.parquet", compression)
    meta = pq.ParquetFile(part).metadata
    assert meta.num_row_groups == 3
    assert meta.row_group(0).column(2).has_dictionary_page
    assert page_damage(str(part)) is None and _pyarrow_damage(part) is None
    for source in (part, pa.OSFile(str(part)), open(part, "rb"),  # noqa: SIM115
                   pa.BufferReader(part.read_bytes()), io.BytesIO(part.read_bytes())):  # fmt: skip
        assert page_damage(source, pre_buffer=True) is None
        assert page_damage(source) is None
    assert page_damage(part) is None  # a Path as well


@pytest.mark.parametrize("compression", ["none", "zstd", "snappy"])
@pytest.mark.parametrize("column", COLUMNS)
@pytest.mark.parametrize("group", [0, 2])
def test_a_flipped_data_page_byte_names_its_row_group_and_column(
    tmp_path: Path, compression: str, column: str, group: int, reader: str
) -> None:
    part = _write(tmp_path / "p.parquet", compression)
    flip_page_byte(part, column, row_group=group)
    why = f"a page fails its checksum (row group {group}, column {column!r})"
    assert page_damage(str(part)) == why
    assert page_damage(str(part), pre_buffer=True) == page_damage(str(part))
    assert "CRC checksum verification failed" in (_pyarrow_damage(part) or "")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_flipped_dictionary_page_byte_fails_its_checksum(tmp_path: Path, compression: str,
                                                           reader: str) -> None:  # fmt: skip
    part = _write(tmp_path / "p.parquet", compression)
    flip_page_byte(part, "comm", row_group=1, dictionary=True)
    assert page_damage(str(part)) == "a page fails its checksum (row group 1, column 'comm')"
    assert "CRC checksum verification failed" in (_pyarrow_damage(part) or "")


@pytest.mark.parametrize("column", COLUMNS)
def test_a_flipped_page_header_byte_does_not_decode(tmp_path: Path, column: str,
                                                    reader: str) -> None:  # fmt: skip
    """A page header (no checksum covers it) whose first byte is damaged does not parse:
    named as a page that does not decode, where pyarrow fails to read it too."""
    part = _write(tmp_path / "p.parquet", "zstd")
    flip_page_byte(part, column, row_group=1, header=True)
    why = page_damage(str(part))
    assert why is not None
    assert why.startswith(f"a page does not decode (row group 1, column {column!r}: "), why
    assert _pyarrow_damage(part) is not None


def test_every_damaged_byte_pyarrow_finds_by_checksum_is_found(tmp_path: Path,
                                                               reader: str) -> None:  # fmt: skip
    """Each byte of a small file's pages and headers flipped in turn: where pyarrow's
    read fails its checksum, or a page header does not parse, page_damage finds damage
    too (what only decoding finds, a header's encoding changed, is beyond a check that
    decodes nothing), and a checksum it says fails is one pyarrow's fails."""
    t = pa.table({"a": np.arange(300), "s": pa.array([f"x{i % 3}" for i in range(300)])})
    buf = io.BytesIO()
    pq.write_table(t, buf, compression="snappy", row_group_size=150, data_page_size=256,
                   write_page_checksum=True)  # fmt: skip
    good = buf.getvalue()
    end = len(good) - 8 - pq.ParquetFile(pa.BufferReader(good)).metadata.serialized_size
    path = tmp_path / "f.parquet"
    for offset in range(4, end):
        damaged = bytearray(good)
        damaged[offset] ^= 0xFF
        path.write_bytes(damaged)
        ours, theirs = page_damage(str(path)), _pyarrow_damage(path)
        if theirs is not None and ("CRC" in theirs or "deserialize thrift" in theirs):
            assert ours is not None, (offset, theirs)
        if ours is not None and "fails its checksum" in ours:
            assert theirs is not None and "CRC" in theirs, (offset, ours)


def test_a_file_without_checksums_passes_unless_its_structure_is_damaged(
    tmp_path: Path, reader: str
) -> None:
    part = _write(tmp_path / "p.parquet", "zstd", checksums=False)
    good = part.read_bytes()
    flip_page_byte(part, "latency_ns", row_group=1)
    assert page_damage(str(part)) is None  # no checksum to hold the page against
    part.write_bytes(good)
    flip_page_byte(part, "latency_ns", row_group=1, header=True)
    assert page_damage(str(part)).startswith("a page does not decode (row group 1, ")


def test_a_truncated_file_is_damaged(tmp_path: Path, reader: str) -> None:
    part = _write(tmp_path / "p.parquet", "zstd")
    good = part.read_bytes()
    os.truncate(part, len(good) // 2)  # its footer gone
    assert page_damage(str(part)).startswith("not a readable Parquet file (")
    assert _pyarrow_damage(part) is not None
    # 100 bytes cut from the middle of a page, the footer kept: the chunks after it
    # lie where the footer no longer points
    meta = pq.ParquetFile(pa.BufferReader(good)).metadata
    cut = meta.row_group(1).column(1).data_page_offset + 10
    part.write_bytes(good[:cut] + good[cut + 100 :])
    why = page_damage(str(part))
    assert why is not None and why.startswith("a page "), why
    assert _pyarrow_damage(part) is not None


def test_pages_that_do_not_fill_their_chunk_are_damage(tmp_path: Path, reader: str) -> None:
    """A chunk the footer says is longer or shorter than its pages: the pages run past
    it, or bytes are left over that are no page."""
    t = pa.table({"a": np.arange(100), "b": np.arange(100) * 2})
    part = tmp_path / "p.parquet"
    # no checksum (a page of the wrong length would fail it first), no statistics (the
    # header written again below holds none)
    pq.write_table(t, part, compression="none", use_dictionary=False, write_statistics=False)
    data = part.read_bytes()
    chunk = pq.ParquetFile(part).metadata.row_group(0).column(0)
    size = _first_page_size(data, chunk.data_page_offset)
    assert page_damage(str(part)) is None
    # the page one byte longer than its chunk, or one shorter (a byte left that is no
    # page header)
    longer = _with_page_size(data, chunk.data_page_offset, size + 1)
    part.write_bytes(longer)
    assert page_damage(str(part)) == (
        "a page does not decode (row group 0, column 'a': a page runs past its column chunk)"
    )
    shorter = _with_page_size(data, chunk.data_page_offset, size - 1)
    part.write_bytes(shorter)
    why = page_damage(str(part))
    assert why is not None and why.startswith("a page does not decode (row group 0, column 'a': ")


def _size_fields(data: bytes, offset: int) -> dict[int, tuple[int, int, int]]:
    """The page header at ``offset``'s uncompressed and compressed sizes (fields 2, 3):
    field id -> (value, where its varint starts, where it ends)."""
    from thrift.protocol.TCompactProtocol import TCompactProtocol
    from thrift.Thrift import TType
    from thrift.transport.TTransport import TMemoryBuffer

    buffer = TMemoryBuffer(data, offset=offset)
    protocol = TCompactProtocol(buffer)
    found = {}
    protocol.readStructBegin()
    while True:
        _, kind, fid = protocol.readFieldBegin()
        if kind == TType.STOP or len(found) == 2:
            return found
        start = buffer.cstringio_buf.tell()
        if fid in (2, 3):
            found[fid] = (protocol.readI32(), start, buffer.cstringio_buf.tell())
        else:
            protocol.skip(kind)
        protocol.readFieldEnd()


def _first_page_size(data: bytes, offset: int) -> int:
    return _size_fields(data, offset)[3][0]


def _with_page_size(data: bytes, offset: int, size: int) -> bytes:
    """``data`` with the page header at ``offset`` saying its page holds ``size``
    bytes (compressed and not): each varint rewritten in place, its length kept."""
    out = bytearray(data)
    for _, start, end in _size_fields(data, offset).values():
        zigzag, varint = size << 1, bytearray()  # a size is never negative
        while True:
            low, zigzag = zigzag & 0x7F, zigzag >> 7
            varint.append(low | (0x80 if zigzag else 0))
            if not zigzag:
                break
        assert len(varint) == end - start, "a size of another varint length"
        out[start:end] = varint
    return bytes(out)
