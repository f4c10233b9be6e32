"""PartFiles: a part under its temporary name until finished, never overwritten,
adopted into place, discarded after a failure; a table folder that is a link."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.partfiles import PartFiles
from kernmlops.collect.parts import PartFormat, TableState, conform
from kernmlops.data import read_collection
from kernmlops.errors import CollectionError
from kernmlops.host.pinned import UnsafePath

CID = "c0ffee"


def events(n: int, start: int = 0) -> pl.DataFrame:
    ts = np.arange(start, start + n, dtype=np.int64)
    return pl.DataFrame({"ts_uptime_us": ts, "pid": (ts % 97).astype(np.int32)})


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def part_files(folder: Path, *, rows_per_file: int = 1000) -> PartFiles:
    return PartFiles(folder, folder, PartFormat(CID, "zstd", 100), rows_per_file, compact=True)


def table(name: str, n: int, start: int = 0) -> tuple[TableState, pa.Table]:
    state = TableState(name)
    return state, conform(state, events(n, start).to_arrow())


def test_parts_are_written_under_a_temporary_name(tmp_path: Path) -> None:
    write_manifest(tmp_path, {"collection_id": CID})
    sink = ParquetSink(tmp_path, CID, row_group_rows=100)
    sink.write("events", events(250))
    # 200 rows are in the open part, 50 buffered: only the temporary file exists.
    assert listing(tmp_path / "events") == [".part-00000.parquet.tmp"]
    with pytest.raises(CollectionError, match="interrupted"):
        read_collection(tmp_path)

    sink.flush(durable=True)
    assert listing(tmp_path / "events") == ["part-00000.parquet"]
    assert read_collection(tmp_path)["events"].height == 250

    sink.write("events", events(150, start=250))
    assert listing(tmp_path / "events") == [".part-00001.parquet.tmp", "part-00000.parquet"]
    partial = read_collection(tmp_path)
    assert partial["events"].height == 250  # the open part is not read
    assert partial.incomplete == ("events",)

    assert sink.close() == {"events": 400}
    assert listing(tmp_path / "events") == ["part-00000.parquet", "part-00001.parquet"]
    assert not list(tmp_path.rglob("*.tmp"))
    done = read_collection(tmp_path)
    assert done["events"]["ts_uptime_us"].to_list() == list(range(400))
    assert done.incomplete == ()


def test_finished_parts_are_never_overwritten(tmp_path: Path) -> None:
    with ParquetSink(tmp_path, CID) as sink:
        sink.write("events", events(3))
    again = ParquetSink(tmp_path, CID)
    again.write("events", events(3))
    with pytest.raises(CollectionError, match="already exists"):
        again.flush()
    assert pl.read_parquet(tmp_path / "events" / "part-00000.parquet").height == 3


def test_a_part_is_finished_at_rows_per_file_and_counted(tmp_path: Path) -> None:
    parts = part_files(tmp_path, rows_per_file=300)
    state, rows = table("events", 700)
    parts.write(state, rows)
    # two full parts finished, the third open under its temporary name
    assert state.files == ["events/part-00000.parquet", "events/part-00001.parquet"]
    assert state.finished_rows == 600 and state.rows == 700 and state.part_rows == 100
    assert listing(tmp_path / "events") == [
        ".part-00002.parquet.tmp",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    parts.whole = True  # from now on parts are kept whole by compaction
    parts.finish(state)
    assert state.whole_parts == {"events/part-00002.parquet": 100}
    parts.close()
    back = pq.read_table(tmp_path / "events")
    assert back.num_rows == 700 and set(back["collection_id"].to_pylist()) == {CID}


def test_an_adopted_part_comes_after_the_written_ones(tmp_path: Path) -> None:
    parts = part_files(tmp_path)
    state, rows = table("events", 10)
    parts.write(state, rows)
    parts.finish(state)
    made = tmp_path / "made-elsewhere.parquet"
    pq.write_table(events(5, start=10).to_arrow(), made)
    parts.adopt(state, made, 5)
    assert not made.exists()
    assert state.files == ["events/part-00000.parquet", "events/part-00001.parquet"]
    assert state.whole_parts == {"events/part-00001.parquet": 5}
    assert (state.finished_rows, state.rows, state.part) == (15, 15, 2)
    # a finished part in the way is never overwritten
    (tmp_path / "events" / "part-00002.parquet").write_bytes(b"mine")
    pq.write_table(events(1).to_arrow(), made)
    with pytest.raises(CollectionError, match="already exists"):
        parts.adopt(state, made, 1)
    assert made.exists() and state.part == 2
    parts.close()


def test_discard_removes_the_unfinished_part_and_keeps_the_finished(tmp_path: Path) -> None:
    parts = part_files(tmp_path, rows_per_file=100)
    state, rows = table("events", 150)
    parts.write(state, rows)
    parts.discard(state)
    assert listing(tmp_path / "events") == ["part-00000.parquet"]
    assert state.writer is None and state.temp_fd is None and state.temp_path is None
    parts.close()


def test_a_table_folder_that_is_a_link_is_not_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    collection = tmp_path / "collection"
    collection.mkdir()
    (collection / "events").symlink_to(elsewhere)
    parts = part_files(collection)
    state, rows = table("events", 10)
    with pytest.raises(UnsafePath, match="link or a file"):
        parts.write(state, rows)
    assert list(elsewhere.iterdir()) == []
    parts.close()
