"""ParquetSink and MemorySink: row groups, rotation, memory bound, drift (the part
files themselves: test_partfiles)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.parquet import ParquetSink
from kernmlops.collect.sinks import MemorySink
from kernmlops.data import read_collection
from kernmlops.errors import CollectionError

CID = "c0ffee"


def events(n: int, start: int = 0) -> pl.DataFrame:
    ts = np.arange(start, start + n, dtype=np.int64)
    return pl.DataFrame({"ts_uptime_us": ts, "pid": (ts % 97).astype(np.int32)})


def row_groups(path: Path) -> list[int]:
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_one_large_frame_is_split_into_full_row_groups(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    sink.write("events", events(200_000))
    assert sink.close() == {"events": 200_000}
    assert sink.files_written() == {"events": ["events/part-00000.parquet"]}
    assert row_groups(tmp_path / "events" / "part-00000.parquet") == [65536, 65536, 65536, 3392]
    back = pl.read_parquet(tmp_path / "events" / "part-00000.parquet")
    expected = events(200_000).with_columns(collection_id=pl.lit(CID, pl.String))
    assert_frame_equal(back, expected)


def test_many_small_frames_are_gathered_into_full_row_groups(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    for i in range(200):
        sink.write("events", events(1000, start=i * 1000))
    assert sink.close() == {"events": 200_000}
    path = tmp_path / "events" / "part-00000.parquet"
    assert row_groups(path) == [65536, 65536, 65536, 3392]
    back = pl.read_parquet(path)
    # Order is kept and nothing is lost or repeated.
    assert back["ts_uptime_us"].to_list() == list(range(200_000))


def test_collection_id_column_is_added(tmp_path: Path) -> None:
    with ParquetSink(tmp_path, CID) as sink:
        sink.write("events", events(10))
    back = pl.read_parquet(tmp_path / "events" / "part-00000.parquet")
    assert back.columns == ["ts_uptime_us", "pid", "collection_id"]
    assert back.schema["collection_id"] == pl.String
    assert back["collection_id"].unique().to_list() == [CID]


def test_every_reader_sees_the_tables_own_schema(tmp_path: Path) -> None:
    """collection_id is written from a one-value dictionary (nothing hashed per row),
    yet pyarrow, polars and DuckDB read it as text, and nulls and fixed-size arrays
    keep their types."""
    frame = pl.DataFrame(
        {"ts_uptime_us": [3, 4, None], "comm": ["a", None, "c"], "v": [[1, 2], [3, 4], None]},
        schema_overrides={"ts_uptime_us": pl.UInt64, "v": pl.Array(pl.UInt32, 2)},
    )
    with ParquetSink(tmp_path, CID) as sink:
        sink.write("t", frame)
    path = tmp_path / "t" / "part-00000.parquet"
    expected = frame.to_arrow().schema.append(pa.field("collection_id", pa.string()))
    assert pq.read_schema(path).remove_metadata() == expected
    meta = pq.ParquetFile(path).metadata
    assert "RLE_DICTIONARY" in meta.row_group(0).column(3).encodings
    assert_frame_equal(pl.read_parquet(path), frame.with_columns(collection_id=pl.lit(CID)))
    duckdb = pytest.importorskip("duckdb")
    query = f"select any_value(typeof(collection_id)), count(v) from '{path}'"
    assert duckdb.sql(query).fetchall() == [("VARCHAR", 2)]


def test_flush_writes_a_smaller_row_group(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID, row_group_rows=65536)
    sink.write("events", events(1000))
    sink.flush()
    sink.write("events", events(2000, start=1000))
    sink.close()
    assert row_groups(tmp_path / "events" / "part-00000.parquet") == [1000, 2000]


def test_rotation_writes_several_parts(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID, row_group_rows=20_000, rows_per_file=50_000)
    sink.write("events", events(120_000))
    assert sink.close() == {"events": 120_000}
    names = ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert listing(tmp_path / "events") == names
    assert sink.files_written() == {"events": [f"events/{n}" for n in names]}
    groups = [row_groups(tmp_path / "events" / n) for n in names]
    assert groups == [[20_000, 20_000, 10_000], [10_000, 20_000, 20_000], [20_000]]
    back = pl.concat([pl.read_parquet(tmp_path / "events" / n) for n in names])
    assert back["ts_uptime_us"].to_list() == list(range(120_000))


def test_rotation_finishes_parts_while_collecting(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID, row_group_rows=100, rows_per_file=300)
    sink.write("events", events(450))
    # The first part is complete (300 rows) and renamed; the second has one row group of
    # 100 rows and is still being written; 50 rows are buffered.
    assert listing(tmp_path / "events") == [".part-00001.parquet.tmp", "part-00000.parquet"]
    assert sink.files_written() == {"events": ["events/part-00000.parquet"]}
    sink.close()


def test_memory_bound_holds(tmp_path: Path) -> None:
    bound = 100_000
    sink = ParquetSink(tmp_path, CID, row_group_rows=1_000_000, max_buffered_bytes=bound)
    rng = np.random.default_rng(0)
    seen = []
    for i in range(300):
        sink.write("events", events(1000, start=i * 1000))
        # A second table with strings, smaller frames: the largest buffer goes first.
        sink.write(
            "names",
            pl.DataFrame({"comm": rng.choice(["bash", "kworker/0:1", "python3"], 100)}),
        )
        seen.append(sink.buffered_bytes)
        assert sink.buffered_bytes <= bound
    assert max(seen) > 0
    assert sink.close() == {"events": 300_000, "names": 30_000}
    assert sink.buffered_bytes == 0
    groups = row_groups(tmp_path / "events" / "part-00000.parquet")
    assert sum(groups) == 300_000
    # The bound forced early, smaller row groups instead of one of 300k rows.
    assert len(groups) > 1
    # A buffer is written once it passes the bound, so it holds at most bound + one frame.
    frame_bytes = events(1000).with_columns(collection_id=pl.lit(CID)).estimated_size()
    assert max(groups) <= (bound + frame_bytes) / frame_bytes * 1000
    back = pl.read_parquet(tmp_path / "events" / "part-00000.parquet")
    assert back["ts_uptime_us"].to_list() == list(range(300_000))


def test_one_frame_larger_than_the_bound_is_written_at_once(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID, row_group_rows=1_000_000, max_buffered_bytes=1000)
    sink.write("events", events(10_000))
    assert sink.buffered_bytes == 0
    assert listing(tmp_path / "events") == [".part-00000.parquet.tmp"]
    sink.close()
    assert row_groups(tmp_path / "events" / "part-00000.parquet") == [10_000]


def test_schema_drift_names_the_table(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    sink.write("events", pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}))
    with pytest.raises(CollectionError, match=r"'events'.*a: int64 -> double"):
        sink.write("events", pl.DataFrame({"a": [1.5], "b": ["z"]}))
    with pytest.raises(CollectionError, match=r"'events'.*missing columns \['b'\]"):
        sink.write("events", pl.DataFrame({"a": [3]}))
    with pytest.raises(CollectionError, match=r"'events'.*new columns \['c'\]"):
        sink.write("events", pl.DataFrame({"a": [3], "b": ["z"], "c": [0]}))
    # Same columns in another order are fine; the rejected batches left no trace.
    sink.write("events", pl.DataFrame({"b": ["w"], "a": [4]}))
    assert sink.close() == {"events": 3}
    back = pl.read_parquet(tmp_path / "events" / "part-00000.parquet")
    assert back.select("a", "b").rows() == [(1, "x"), (2, "y"), (4, "w")]


def test_a_table_with_no_rows_makes_no_folder(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    sink.write("empty", pl.DataFrame({"a": pl.Series([], dtype=pl.Int64)}))
    sink.write("events", events(5))
    assert sink.close() == {"empty": 0, "events": 5}
    assert not (tmp_path / "empty").exists()
    assert sink.files_written() == {"events": ["events/part-00000.parquet"]}


def test_nothing_written_makes_no_folders(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path / "c", CID)
    assert sink.close() == {}
    assert not (tmp_path / "c").exists()


def test_close_is_idempotent_and_final(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    sink.write("events", events(3))
    assert sink.close() == {"events": 3}
    assert sink.close() == {"events": 3}
    sink.flush()  # harmless after close
    assert sink.closed
    with pytest.raises(RuntimeError, match="closed"):
        sink.write("events", events(1))
    assert listing(tmp_path / "events") == ["part-00000.parquet"]


def test_several_tables_get_their_own_folders(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path, CID)
    sink.write("events", events(7))
    sink.write("drops", pl.DataFrame({"hook": ["a"], "drops": [3]}))
    assert sink.close() == {"events": 7, "drops": 1}
    assert listing(tmp_path) == ["drops", "events"]
    assert pl.read_parquet(tmp_path / "drops" / "part-00000.parquet")["drops"].to_list() == [3]


@pytest.mark.parametrize("name", ["a/b", "x=y", ".hidden", "", "1st", "../up"])
def test_bad_table_names_are_refused(tmp_path: Path, name: str) -> None:
    sink = ParquetSink(tmp_path, CID)
    with pytest.raises(ValueError, match="table name"):
        sink.write(name, events(1))


def test_compression(tmp_path: Path) -> None:
    for codec in ("zstd", "snappy"):
        with ParquetSink(tmp_path / codec, CID, compression=codec) as sink:
            sink.write("events", events(100))
        meta = pq.ParquetFile(tmp_path / codec / "events" / "part-00000.parquet").metadata
        assert meta.row_group(0).column(0).compression == codec.upper()
    with pytest.raises(ValueError, match="compression"):
        ParquetSink(tmp_path, CID, compression="nope")


def test_growing_integers_are_stored_as_deltas_and_read_back_exactly(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 50_000
    ts = np.cumsum(rng.integers(0, 9, n)).astype(np.uint64) + 10**12
    ts[::20] -= 3  # out of order now and then, as rows from two CPUs are
    frame = pl.DataFrame(
        {
            "ts_uptime_us": ts,
            "length_us": rng.integers(0, 1 << 40, n, dtype=np.uint64),  # no trend
            "cpu": rng.integers(0, 2, n).astype(np.uint32),  # repeats: dictionary
        }
    )
    with ParquetSink(tmp_path, CID, row_group_rows=8192) as sink:
        sink.write("t", frame)
    path = tmp_path / "t" / "part-00000.parquet"
    meta = pq.ParquetFile(path).metadata
    encodings = {meta.schema.column(i).name: meta.row_group(0).column(i).encodings
                 for i in range(meta.num_columns)}  # fmt: skip
    assert "DELTA_BINARY_PACKED" in encodings["ts_uptime_us"]
    assert "DELTA_BINARY_PACKED" not in encodings["length_us"]
    assert "RLE_DICTIONARY" in encodings["cpu"]
    back = pl.read_parquet(path).drop("collection_id")
    assert_frame_equal(back, frame)
    duckdb = pytest.importorskip("duckdb")
    [(total,)] = duckdb.sql(f"select sum(ts_uptime_us::hugeint) from '{path}'").fetchall()
    assert int(total) == int(ts.astype(object).sum())


@pytest.mark.parametrize(
    "kwargs", [{"row_group_rows": 0}, {"rows_per_file": 0}, {"max_buffered_bytes": -1}]
)
def test_bad_settings_are_refused(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        ParquetSink(tmp_path, CID, **kwargs)


def test_rows_a_failed_write_costs_are_all_counted_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails (the disk full) discards the tables' buffered rows and their
    unfinished parts: each row is counted in lost_rows (the manifest's), so the rows
    on disk and those counted lost add up to the rows handed to the sink. Only the rows
    handed after the failure were counted: a full disk's memory_usage lost 15 rows and
    its manifest said 5, system_info's row was not counted at all."""
    import errno

    from kernmlops.collect import partfiles
    from kernmlops.errors import OutputError

    sink = ParquetSink(tmp_path, CID, row_group_rows=1024)
    sink.write("events", events(3000))  # two row groups in the open part, the rest buffered
    sink.write("other", events(10))
    sink.flush(durable=True)  # on disk from here: 3000 events, 10 other
    sink.write("events", events(2500, start=3000))  # an unfinished part, 452 buffered
    sink.write("other", events(5, start=10))  # buffered

    def full(self: object, state: object, piece: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(partfiles.PartFiles, "_write_row_group", full)
    with pytest.raises(OutputError, match="the disk is full"):
        sink.write("events", events(1024, start=5500))
    sink.write("other", events(7, start=15))  # after the failure
    sink.close()
    handed = {"events": 3000 + 2500 + 1024, "other": 10 + 5 + 7}
    on_disk = {t: pl.read_parquet(tmp_path / t / "*.parquet").height for t in handed}
    assert on_disk == {"events": 3000, "other": 10}
    assert sink.lost_rows == {t: handed[t] - on_disk[t] for t in handed}


def test_memory_sink() -> None:
    sink = MemorySink()
    assert sink.table("events").shape == (0, 0)
    sink.write("events", events(3))
    sink.write("events", events(2, start=3))
    sink.flush()
    assert sink.table("events")["ts_uptime_us"].to_list() == [0, 1, 2, 3, 4]
    assert sink.close() == {"events": 5}
    with pytest.raises(RuntimeError):
        sink.write("events", events(1))


# -- ThreadedSink ---------------------------------------------------------------------


def test_threaded_sink_writes_everything_in_order(tmp_path: Path) -> None:
    from kernmlops.collect.sinks import ThreadedSink

    sink = ThreadedSink(ParquetSink(tmp_path / "c", "cid", row_group_rows=4096))
    for i in range(50):
        sink.write("t", pl.DataFrame({"i": np.arange(i * 1000, (i + 1) * 1000)}))
        if i % 10 == 0:
            sink.flush()
    assert sink.close() == {"t": 50_000}
    got = pl.read_parquet(tmp_path / "c" / "t")
    assert got["i"].to_list() == list(range(50_000))
    assert set(got["collection_id"].to_list()) == {"cid"}


def _stalled_writer() -> tuple[MemorySink, threading.Event]:
    """A MemorySink whose writes wait until the event returned is set."""
    gate = threading.Event()

    class Stalled(MemorySink):
        def write(self, table: str, frame: pl.DataFrame) -> None:
            gate.wait()
            super().write(table, frame)

    return Stalled(), gate


def test_threaded_sink_bounds_what_waits(tmp_path: Path) -> None:
    """A slow writer makes write() wait instead of queueing without limit."""
    import time

    from kernmlops.collect.sinks import ThreadedSink

    inner, gate = _stalled_writer()
    frame = pl.DataFrame({"x": np.zeros(10_000, np.int64)})  # 80 kB
    sink = ThreadedSink(inner, max_queued_bytes=3 * frame.estimated_size())
    writer = threading.Thread(target=lambda: [sink.write("t", frame) for _ in range(10)])
    writer.start()
    # until the queue is full, not a fixed 0.3 s (a starved writer thread in CI's idle
    # lane may not have filled it by then)
    deadline = time.monotonic() + 60
    while sink.queued_bytes < 3 * frame.estimated_size():
        assert time.monotonic() < deadline, f"{sink.queued_bytes} bytes queued in 60 s"
        time.sleep(0.01)
    assert writer.is_alive()  # blocked: the queue is full
    assert sink.queued_bytes <= 3 * frame.estimated_size()
    gate.set()
    writer.join(timeout=60)
    assert sink.close() == {"t": 100_000}


def test_threaded_sink_queues_past_its_bound_when_told_not_to_wait() -> None:
    """The poll loop's rows in hand while it can still spill: queued past the bound at
    once, with a stalled writer; waiting again once it cannot."""
    from kernmlops.collect.sinks import ThreadedSink

    inner, gate = _stalled_writer()
    frame = pl.DataFrame({"x": np.zeros(10_000, np.int64)})  # 80 kB
    bound = 3 * frame.estimated_size()
    sink = ThreadedSink(inner, max_queued_bytes=bound)
    sink.wait_when_full = False
    done = threading.Event()

    def writes() -> None:
        for _ in range(10):
            sink.write("t", frame)
        done.set()

    threading.Thread(target=writes).start()
    assert done.wait(60), "a write waited for the stalled writer"
    assert sink.queued_bytes > bound and sink.behind
    sink.wait_when_full = True
    blocked = threading.Thread(target=sink.write, args=("t", frame))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # over its bound, waiting again
    gate.set()
    blocked.join(60)
    assert sink.close() == {"t": 110_000}


def test_threaded_sink_reports_the_writer_error(tmp_path: Path) -> None:
    from kernmlops.collect.sinks import ThreadedSink

    sink = ThreadedSink(ParquetSink(tmp_path / "c", "cid"))
    sink.write("t", pl.DataFrame({"a": [1]}))
    sink.write("t", pl.DataFrame({"a": ["text"]}))  # schema drift, found by the writer
    with pytest.raises(CollectionError, match="t"):
        sink.flush(durable=True)
    sink.close()


def test_threaded_sink_wakes_the_writer_for_a_flush_or_enough_bytes() -> None:
    import time

    from kernmlops.collect.sinks import MemorySink, ThreadedSink

    def written() -> int:
        return len(inner.frames.get("t", []))

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 60
        while written() < n:
            assert time.monotonic() < deadline, f"{written()} of {n} frames written"
            time.sleep(0.005)

    inner = MemorySink()
    sink = ThreadedSink(inner, wake_bytes=1_000_000)
    small = pl.DataFrame({"x": np.zeros(10, np.int64)})
    for _ in range(5):
        sink.write("t", small)
    time.sleep(0.2)
    assert written() == 0  # small frames wait for a flush
    sink.flush()
    wait_for(5)
    sink.write("t", pl.DataFrame({"x": np.zeros(200_000, np.int64)}))  # 1.6 MB
    wait_for(6)  # enough bytes wake the writer without a flush
    assert sink.close() == {"t": 50 + 200_000}


def test_the_manifest_a_flush_rewrites_describes_that_flush(tmp_path: Path) -> None:
    """The poll loop's flush: the writer thread finishes the parts, then has the running
    manifest rewritten (by the background writer) with them: each rewrite counts the
    rows of every part on disk, and ``flushes`` and ``last_flush_at`` move with it. A
    flush that failed rewrites nothing."""
    import functools
    import time

    from kernmlops.collect.manifest import Manifest, read_manifest
    from kernmlops.collect.running import RunningManifest
    from kernmlops.collect.sinks import ThreadedSink
    from kernmlops.collect.space import SpaceGuard

    folder = tmp_path / "c"
    parquet = ParquetSink(folder, CID)
    sink = ThreadedSink(parquet)
    running = RunningManifest(folder, SpaceGuard(folder, 1))
    running.manifest = Manifest(collection_id=CID, state="running")
    running.parquet = parquet
    running.save()
    running.write_in_background()

    def rewritten(flushes: int) -> Manifest:
        deadline = time.monotonic() + 60
        while (m := read_manifest(folder)).flushes < flushes:
            assert time.monotonic() < deadline, m
            time.sleep(0.005)
        return m

    times = []
    for n in (1, 2, 3):
        sink.write("events", events(100, start=100 * (n - 1)))
        sink.flush(durable=True, wait=False, then=functools.partial(running.flushed, {}))
        m = rewritten(n)
        on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/part-*"))
        assert m.flushes == n and sorted(m.tables["events"].files) == on_disk
        assert (
            m.tables["events"].rows
            == 100 * n
            == sum(pq.read_metadata(folder / f).num_rows for f in on_disk)
        )
        times.append(m.last_flush_at)
    assert times == sorted(set(times)) and None not in times
    sink.write("events", pl.DataFrame({"ts_uptime_us": ["text"]}))  # drift: the flush fails
    called = []
    with pytest.raises(CollectionError):
        sink.flush(durable=True, then=lambda: called.append(1))
    assert called == [] and running.stop_background() is None
    sink.close()


# -- compaction at stop -------------------------------------------------------------------


def flushed_parts(folder: Path, parts: int, rows: int = 3000, **kwargs: int) -> ParquetSink:
    """A closed sink whose table 'events' was flushed durably into ``parts`` parts."""
    sink = ParquetSink(folder, CID, row_group_rows=kwargs.pop("row_group_rows", 4096), **kwargs)
    for i in range(parts):
        sink.write("events", events(rows, start=i * rows))
        sink.write("rare", events(1, start=i))
        sink.flush(durable=True)
    sink.close()
    return sink


def test_compaction_rewrites_the_parts_as_one_file_in_full_row_groups(tmp_path: Path) -> None:
    sink = flushed_parts(tmp_path, parts=7)
    assert len(sink.files_written()["events"]) == 7
    write_manifest(tmp_path, {})
    before = read_collection(tmp_path)["events"]
    assert sink.compact() == {"events": "compacted", "rare": "compacted"}
    assert listing(tmp_path / "events") == ["part-00000.parquet"]
    assert sink.files_written()["events"] == ["events/part-00000.parquet"]
    assert row_groups(tmp_path / "events" / "part-00000.parquet") == [4096] * 5 + [21000 - 20480]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    after = read_collection(tmp_path)["events"]
    assert_frame_equal(after, before)
    assert after["ts_uptime_us"].to_list() == list(range(21000))  # flush order kept
    # The writer's encodings carry over: timestamps as deltas, the id as a dictionary.
    meta = pq.ParquetFile(tmp_path / "events" / "part-00000.parquet").metadata
    enc = {meta.schema.column(i).name: meta.row_group(0).column(i).encodings
           for i in range(meta.num_columns)}  # fmt: skip
    assert "DELTA_BINARY_PACKED" in enc["ts_uptime_us"]
    assert "RLE_DICTIONARY" in enc["collection_id"]


def encodings(path: Path) -> dict[str, tuple[str, list[str]]]:
    """column -> (codec, encodings) of the first row group of a Parquet file."""
    meta = pq.ParquetFile(path).metadata
    group = meta.row_group(0)
    return {
        meta.schema.column(i).name: (group.column(i).compression, list(group.column(i).encodings))
        for i in range(meta.num_columns)
    }


def test_fast_parts_are_cheap_until_compaction_encodes_them_compactly(tmp_path: Path) -> None:
    sink = flushed_parts(tmp_path, parts=3, fast_parts=True)
    write_manifest(tmp_path, {})
    before = read_collection(tmp_path)["events"]
    live = encodings(tmp_path / "events" / "part-00000.parquet")
    # While the run goes on: lz4, deltas, no dictionary (the id excepted).
    assert {codec for codec, _ in live.values()} == {"LZ4"}
    assert "RLE_DICTIONARY" not in live["pid"][1]
    assert "DELTA_BINARY_PACKED" in live["ts_uptime_us"][1]
    assert "RLE_DICTIONARY" in live["collection_id"][1]
    # A table of one part ('rare' has three, but a one-part table too) is rewritten.
    one = flushed_parts(tmp_path / "one", parts=1, fast_parts=True)
    assert one.compact() == {"events": "compacted", "rare": "compacted"}
    assert encodings(tmp_path / "one" / "events" / "part-00000.parquet")["pid"][0] == "ZSTD"
    assert sink.compact() == {"events": "compacted", "rare": "compacted"}
    done = encodings(tmp_path / "events" / "part-00000.parquet")
    assert {codec for codec, _ in done.values()} == {"ZSTD"}
    assert "RLE_DICTIONARY" in done["pid"][1]  # 97 values: the table's own dictionary
    assert "DELTA_BINARY_PACKED" in done["ts_uptime_us"][1]
    assert_frame_equal(read_collection(tmp_path)["events"], before)


def quanta_like(n: int, seed: int = 0) -> pl.DataFrame:
    """A switch storm's quanta rows: growing timestamps, short run lengths, two CPUs,
    a few tasks (28 bytes a row in memory)."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "ts_uptime_us": np.cumsum(rng.integers(0, 9, n)).astype(np.int64),
        "quanta_run_length_us": rng.integers(0, 50, n).astype(np.int64),
        "cpu": rng.integers(0, 2, n).astype(np.uint32),
        "pid": rng.integers(1000, 1010, n).astype(np.uint32),
        "tgid": rng.integers(1000, 1004, n).astype(np.uint32),
    })  # fmt: skip


def test_the_runs_parts_take_a_fraction_of_their_rows_bytes(tmp_path: Path) -> None:
    # The run's parts stay on disk until the stop compacts them: written with no
    # encoding they took more than a row's own 28 bytes (a 20-s storm: 234 MB of them
    # for a 3.9-MB collection); lz4 and the timestamps' deltas make them a few bytes
    # (these random values less so than a storm's: 1.3 bytes a row there).
    rows = quanta_like(300_000)
    sink = ParquetSink(tmp_path, CID, row_group_rows=65536, fast_parts=True)
    for start in range(0, rows.height, 10_000):  # as the hooks hand rows over
        sink.write("quanta", rows.slice(start, 10_000))
        if (start // 10_000) % 10 == 9:
            sink.flush(durable=True)  # a part a flush
    sink.flush(durable=True)
    parts = sorted((tmp_path / "quanta").glob("part-*.parquet"))
    assert len(parts) == 3
    on_disk = sum(p.stat().st_size for p in parts)
    assert on_disk < rows.estimated_size() / 3, f"{on_disk / rows.height:.2f} bytes a row"
    # readable as they are (a kill before the stop leaves them so), by DuckDB too
    assert_frame_equal(pl.concat([pl.read_parquet(p).drop("collection_id") for p in parts]),
                       rows, check_dtypes=True)  # fmt: skip
    duckdb = pytest.importorskip("duckdb")
    glob = tmp_path / "quanta" / "part-*.parquet"
    query = f"select count(*), sum(ts_uptime_us), sum(pid) from '{glob}'"
    assert duckdb.sql(query).fetchall() == [
        (rows.height, rows["ts_uptime_us"].sum(), rows["pid"].sum())
    ]
    sink.close()
    # and the stop rewrites them compactly, smaller still
    assert sink.compact() == {"quanta": "compacted"}
    (whole,) = (tmp_path / "quanta").glob("part-*.parquet")
    assert whole.stat().st_size < on_disk
    assert_frame_equal(pl.read_parquet(whole).drop("collection_id"), rows)


def test_without_fast_parts_the_run_writes_compact_parts(tmp_path: Path) -> None:
    flushed_parts(tmp_path, parts=1)
    part = encodings(tmp_path / "events" / "part-00000.parquet")
    assert part["pid"][0] == "ZSTD" and "RLE_DICTIONARY" in part["pid"][1]


def test_compaction_writes_parts_of_at_most_rows_per_file(tmp_path: Path) -> None:
    # A writer holds each row group's metadata until it closes: a long busy table is
    # compacted into parts of rows_per_file rows, not into one ever-growing file.
    sink = flushed_parts(tmp_path, parts=7, rows_per_file=8192)
    write_manifest(tmp_path, {})
    before = read_collection(tmp_path)["events"]
    assert sink.compact()["events"] == "compacted"
    names = [f"part-{i:05d}.parquet" for i in range(3)]
    assert listing(tmp_path / "events") == names
    assert sink.files_written()["events"] == [f"events/{n}" for n in names]
    assert [sum(row_groups(tmp_path / "events" / n)) for n in names] == [8192, 8192, 4616]
    assert row_groups(tmp_path / "events" / names[0]) == [4096, 4096]
    after = read_collection(tmp_path)["events"]
    assert_frame_equal(after, before)
    assert after["ts_uptime_us"].to_list() == list(range(21000))


def test_compaction_leaves_one_part_tables_and_open_sinks_alone(tmp_path: Path) -> None:
    sink = flushed_parts(tmp_path, parts=1)
    assert sink.compact() == {}
    open_sink = ParquetSink(tmp_path / "open", CID)
    open_sink.write("events", events(10))
    open_sink.flush(durable=True)
    assert open_sink.compact() == {}  # only after close


def test_a_failed_compaction_keeps_every_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = flushed_parts(tmp_path, parts=4)
    from kernmlops.collect import compaction

    def cannot(a: Path, b: Path) -> None:
        raise OSError(22, "Invalid argument")  # e.g. overlayfs cannot exchange

    monkeypatch.setattr(compaction, "exchange", cannot)
    assert sink.compact()["events"] == "skipped: Invalid argument"
    assert len(listing(tmp_path / "events")) == 4
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    write_manifest(tmp_path, {})
    assert read_collection(tmp_path)["events"].height == 12000


def test_compaction_skips_a_table_the_free_space_cannot_hold_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = flushed_parts(tmp_path, parts=3)
    from kernmlops.collect import compaction

    monkeypatch.setattr(compaction, "free_bytes", lambda path: 4 * 2**20)
    assert sink.compact()["events"].startswith("skipped: 4.0 MiB free")
    assert len(listing(tmp_path / "events")) == 3


def test_an_interrupted_compaction_keeps_the_parts_and_leaves_no_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = flushed_parts(tmp_path, parts=3)

    def ctrl_c(*args: object, **kwargs: object) -> int:
        raise KeyboardInterrupt

    from kernmlops.collect import compaction

    monkeypatch.setattr(compaction, "rewrite", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        sink.compact()
    assert len(listing(tmp_path / "events")) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events", "rare"]
