"""read_collection, read_parquet_dir and list_collections over collections made by the sink."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from kernmlops.collect.manifest import read_manifest, write_manifest
from kernmlops.collect.parquet import ParquetSink
from kernmlops.data import (
    Collection,
    LazyCollection,
    list_collections,
    read_collection,
    read_parquet_dir,
    wall_clock,
)
from kernmlops.errors import CollectionError
from tests.conftest import skip_here

# (benchmark, collection_id) -> rows of "events"; "drops" only in the faux collections.
ROWS = {("faux", "f1"): 1000, ("faux", "f2"): 2500, ("gap", "g1"): 700, ("gap", "g2"): 1}


def events(n: int, offset: int) -> pl.DataFrame:
    ts = np.arange(n, dtype=np.int64) + offset
    return pl.DataFrame({"ts_uptime_us": ts, "latency_ns": ts * 3})


def make_collection(folder: Path, benchmark: str, cid: str, n: int) -> None:
    # Small parts, so a table spans several part files.
    with ParquetSink(folder, cid, row_group_rows=256, rows_per_file=1000) as sink:
        sink.write("events", events(n, offset=0))
        if benchmark == "faux":
            sink.write("drops", pl.DataFrame({"hook": ["block_io"], "drops": [n // 100]}))
    files = sink.files_written()  # after close: every part is finished
    write_manifest(
        folder,
        {
            "collection_id": cid,
            "benchmark": benchmark,
            "started_at": f"2024-05-0{len(cid)}T00:00:00+00:00",
            "tables": files,
        },
    )


@pytest.fixture
def curated(tmp_path: Path) -> Path:
    root = tmp_path / "curated"
    for (benchmark, cid), n in ROWS.items():
        make_collection(root / f"benchmark={benchmark}" / f"collection_id={cid}", benchmark, cid, n)
    return root


def test_read_collection(curated: Path) -> None:
    folder = curated / "benchmark=faux" / "collection_id=f2"
    c = read_collection(folder)
    assert isinstance(c, Collection)
    assert c.path == folder
    assert c.collection_id == "f2"
    assert c.benchmark == "faux"
    assert c.manifest["started_at"] == "2024-05-02T00:00:00+00:00"
    assert sorted(c.tables) == ["drops", "events"]
    assert [p.name for p in c.files["events"]] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    expected = events(2500, 0).with_columns(collection_id=pl.lit("f2", pl.String))
    assert_frame_equal(c["events"], expected)
    assert c["drops"].rows() == [("block_io", 25, "f2")]
    assert "events" in c and len(c) == 2
    assert "events: 2500 rows" in repr(c)


def test_manifest_lists_the_files(curated: Path) -> None:
    c = read_collection(curated / "benchmark=gap" / "collection_id=g2")
    assert c.manifest.tables["events"].files == ["events/part-00000.parquet"]
    assert c.complete is False  # a hand-made manifest has no state: not finalised


def test_a_running_collection_is_read_with_a_warning(tmp_path: Path) -> None:
    """A collector killed mid-run leaves state 'running': read, and said so."""
    from kernmlops.data import IncompleteCollectionWarning

    folder = tmp_path / "benchmark=faux" / "collection_id=k"
    make_collection(folder, "faux", "k", 300)
    write_manifest(folder, {"collection_id": "k", "state": "running",
                            "last_flush_at": "2026-01-01T00:00:05+00:00"})  # fmt: skip
    with pytest.warns(IncompleteCollectionWarning, match="incomplete.*00:00:05"):
        c = read_collection(folder)
    assert not c.complete and c["events"].height == 300
    listed = list_collections(tmp_path)
    assert listed["state"].to_list() == ["running"]


def test_a_collection_still_being_collected_is_said_so_not_stopped(tmp_path: Path) -> None:
    """A collector that still runs (its process has kernmlops in its command line, as
    push and recover tell one) is no dead one: the warning says it is still being
    collected, with no `recover` to run, and list_collections names its pid; once
    it is gone, the collection is one whose collector stopped."""
    from kernmlops.data import IncompleteCollectionWarning

    folder = tmp_path / "benchmark=faux" / "collection_id=live"
    make_collection(folder, "faux", "live", 300)
    (folder / ".spool").mkdir()  # rows still spooled: its collector will flush them
    (folder / ".spool" / "quanta_switch.00000.ring").write_bytes(b"\0" * 64)
    alive = subprocess.Popen(["sh", "-c", "sleep 60", "kernmlops"])
    try:
        write_manifest(folder, {"collection_id": "live", "state": "running",
                                "collector_pid": alive.pid,
                                "last_flush_at": "2026-01-01T00:00:05+00:00"})  # fmt: skip
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            c = read_collection(folder)
        assert [str(w.message) for w in said] == [
            f"{folder}: still being collected (collector pid {alive.pid}): reading what was "
            "flushed so far (last flush 2026-01-01T00:00:05+00:00)"
        ]
        assert issubclass(said[0].category, IncompleteCollectionWarning)
        assert not c.complete and c["events"].height == 300
        listed = list_collections(tmp_path)
        assert listed.select("state", "collector_pid").rows() == [("running", alive.pid)]
        shutil.rmtree(folder / "events")
        shutil.rmtree(folder / "drops")
        with pytest.raises(CollectionError, match=rf"no Parquet tables yet: still being "
                           rf"collected \(collector pid {alive.pid}\)"):  # fmt: skip
            read_collection(folder)
        make_collection(folder, "faux", "live", 300)
        write_manifest(folder, {"collection_id": "live", "state": "running",
                                "collector_pid": alive.pid})  # fmt: skip
    finally:
        alive.kill()
        alive.wait()
    with pytest.warns(IncompleteCollectionWarning, match="stopped without finishing.*recover"):
        read_collection(folder)
    listed = list_collections(tmp_path)
    assert listed.select("state", "collector_pid").rows() == [("running", None)]


def test_a_table_its_manifest_counts_rows_in_is_named_when_its_folder_is_gone(
    tmp_path: Path,
) -> None:
    from kernmlops.data import IncompleteCollectionWarning

    folder = tmp_path / "benchmark=faux" / "collection_id=d"
    make_collection(folder, "faux", "d", 2500)
    counted = {"events": {"rows": 2500}, "drops": {"rows": 1}}  # as collect's manifest has
    write_manifest(folder, {"collection_id": "d", "state": "completed", "tables": counted})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing: no warning
        assert sorted(read_collection(folder).tables) == ["drops", "events"]
    shutil.rmtree(folder / "drops")  # deleted by hand, or moved: its row is not here
    with pytest.warns(IncompleteCollectionWarning, match=r"no part here: drops \(1 rows\)$"):
        c = read_collection(folder, lazy=True)
    assert sorted(c.tables) == ["events"]


@pytest.mark.parametrize("lazy", [False, True])
def test_a_table_with_a_damaged_part_is_refused_or_left_out_and_named(
    tmp_path: Path, lazy: bool
) -> None:
    from kernmlops.data import IncompleteCollectionWarning

    folder = tmp_path / "benchmark=faux" / "collection_id=t"
    make_collection(folder, "faux", "t", 2500)
    part = sorted((folder / "events").glob("part-*.parquet"))[0]
    os.truncate(part, 300)  # its footer gone (a scan reads the first part's)
    with pytest.raises(CollectionError, match=r"events: cannot read table 'events'"):
        read_collection(folder, lazy=lazy)
    with pytest.warns(IncompleteCollectionWarning, match=r"events'.*: the table is left out"):
        c = read_collection(folder, lazy=lazy, damaged="skip")
    assert sorted(c.tables) == ["drops"] and list(c.damaged) == ["events"]
    assert "events" not in c.files
    drops = c["drops"].collect() if lazy else c["drops"]
    assert drops["drops"].to_list() == [25]


@pytest.mark.parametrize("column", ["latency_ns", "ts_uptime_us"])
def test_a_part_damaged_inside_a_page_is_refused_or_left_out_naming_the_part(
    tmp_path: Path, column: str
) -> None:
    """A byte damaged inside a data page, the footer whole (polars may decode it into
    wrong values: tests/collect/test_pagecheck.py): read_collection checks every
    page's checksum and refuses the table, naming the part (skip: leaves it out, as a
    torn footer is); an undamaged part reads as before."""
    from kernmlops.data import IncompleteCollectionWarning
    from tests.parquet_damage import flip_page_byte

    folder = tmp_path / "benchmark=faux" / "collection_id=t"
    make_collection(folder, "faux", "t", 2500)
    assert read_collection(folder)["events"].height == 2500
    part = sorted((folder / "events").glob("part-*.parquet"))[1]
    flip_page_byte(part, column, row_group=1)
    why = (
        f"{folder / 'events'}: cannot read table 'events': part-00001.parquet is damaged: "
        f"a page fails its checksum (row group 1, column {column!r})"
    )
    with pytest.raises(CollectionError) as err:
        read_collection(folder)
    assert str(err.value) == why
    with pytest.warns(IncompleteCollectionWarning) as said:
        c = read_collection(folder, damaged="skip")
    assert [str(w.message) for w in said] == [f"{why}: the table is left out"]
    assert sorted(c.tables) == ["drops"] and c.damaged == {"events": why}
    assert c["drops"]["drops"].to_list() == [25]


def test_a_lazy_read_checks_the_pages_unless_told_not_to(tmp_path: Path) -> None:
    """A lazy read checks every page too (its footers whole, a scan would read the
    damaged page's wrong values): it refuses the table, or leaves it out with
    ``damaged="skip"``; ``pages=False`` scans it unchecked."""
    from kernmlops.data import IncompleteCollectionWarning
    from tests.parquet_damage import flip_page_byte

    folder = tmp_path / "benchmark=faux" / "collection_id=t"
    make_collection(folder, "faux", "t", 2500)
    flip_page_byte(sorted((folder / "events").glob("part-*.parquet"))[1], "latency_ns", 1)
    why = (
        f"{folder / 'events'}: cannot read table 'events': part-00001.parquet is damaged: "
        "a page fails its checksum (row group 1, column 'latency_ns')"
    )
    with pytest.raises(CollectionError) as err:
        read_collection(folder, lazy=True)
    assert str(err.value) == why
    with pytest.warns(IncompleteCollectionWarning) as said:
        lazy = read_collection(folder, lazy=True, damaged="skip")
    assert [str(w.message) for w in said] == [f"{why}: the table is left out"]
    assert sorted(lazy.tables) == ["drops"] and lazy.damaged == {"events": why}
    assert "events" in read_collection(folder, lazy=True, pages=False)  # scanned unchecked


def test_parts_written_without_page_checksums_read_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection of an older kernmlops (no page checksums) reads, its values equal
    to the same rows written with them."""
    from kernmlops.collect import pagecheck

    new = tmp_path / "benchmark=faux" / "collection_id=new"
    make_collection(new, "faux", "new", 2500)
    monkeypatch.setitem(pagecheck.WRITE, "write_page_checksum", False)
    old = tmp_path / "benchmark=faux" / "collection_id=old"
    make_collection(old, "faux", "new", 2500)  # the same id: the same rows, to compare
    # the writer's switch took: the old parts are smaller by their pages' checksums
    sizes = [sum(p.stat().st_size for p in c.rglob("*.parquet")) for c in (old, new)]
    assert sizes[0] < sizes[1]
    for table in ("events", "drops"):
        assert_frame_equal(read_collection(old)[table], read_collection(new)[table])
    both = read_parquet_dir(tmp_path, "events").partition_by("collection_id", as_dict=True)
    assert_frame_equal(both["old",].drop("collection_id"), both["new",].drop("collection_id"))


def test_rows_left_in_a_spool_are_named_with_the_command_that_adds_them(tmp_path: Path) -> None:
    from kernmlops.data import IncompleteCollectionWarning

    folder = tmp_path / "benchmark=faux" / "collection_id=s"
    make_collection(folder, "faux", "s", 10)
    write_manifest(folder, {"collection_id": "s", "state": "disk_full"})
    (folder / ".spool").mkdir()
    (folder / ".spool" / "quanta_switch.00000.ring").write_bytes(b"")
    with pytest.warns(IncompleteCollectionWarning, match=r"kernmlops recover .*collection_id=s"):
        read_collection(folder)
    for table in ("events", "drops"):  # nothing but the spool
        (folder / table).rename(tmp_path / table)
    with pytest.raises(CollectionError, match=r"no Parquet tables.*kernmlops recover"):
        read_collection(folder)


def test_read_collection_from_the_manifest_path(curated: Path) -> None:
    c = read_collection(curated / "benchmark=gap" / "collection_id=g1" / "manifest.json")
    assert c["events"].height == 700


def test_scan_matches_the_eager_table(curated: Path) -> None:
    c = read_collection(curated / "benchmark=faux" / "collection_id=f1")
    lazy = c.scan("events")
    assert isinstance(lazy, pl.LazyFrame)
    assert_frame_equal(lazy.collect(), c["events"])
    assert lazy.select(pl.col("latency_ns").sum()).collect().item() == 3 * sum(range(1000))


def test_unknown_table_lists_the_tables(curated: Path) -> None:
    c = read_collection(curated / "benchmark=gap" / "collection_id=g1")
    with pytest.raises(KeyError, match=r"no table 'drops'.*tables: events"):
        c["drops"]
    with pytest.raises(KeyError, match="no table 'nope'"):
        c.scan("nope")


def test_benchmark_falls_back_to_the_folder(tmp_path: Path) -> None:
    folder = tmp_path / "benchmark=stress%20ng" / "collection_id=x1"
    with ParquetSink(folder, "x1") as sink:
        sink.write("events", events(3, 0))
    write_manifest(folder, {})
    c = read_collection(folder)
    assert c.benchmark == "stress ng"
    assert c.collection_id == "x1"


def test_read_collection_errors(tmp_path: Path) -> None:
    with pytest.raises(CollectionError, match="no such collection folder") as info:
        read_collection(tmp_path / "missing")
    assert str(tmp_path / "missing") in str(info.value)

    with pytest.raises(CollectionError, match="no manifest"):
        read_collection(tmp_path)

    write_manifest(tmp_path, {"collection_id": "x"})
    (tmp_path / "graphs").mkdir()  # a folder without parquet is not a table
    with pytest.raises(CollectionError, match="no Parquet tables") as info:
        read_collection(tmp_path)
    assert str(tmp_path) in str(info.value)

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CollectionError, match="not a folder"):
        read_collection(tmp_path / "notes.txt")


def test_a_folder_of_collections_or_a_table_folder_names_the_collection_to_read(
    curated: Path,
) -> None:
    """`kernmlops graph data` (or a benchmark= folder, or a table's folder) said only
    'no manifest (is data a collection folder?)': it says which collection to name."""
    one = curated / "benchmark=faux" / "collection_id=f1"
    assert (one / "manifest.json").is_file()  # the fixture's first collection
    for given, said in (
        (curated, f"{curated} holds 4 collections: name one, e.g. {one}"),
        (curated.parent, f"{curated.parent} holds 4 collections: name one, e.g. {one}"),
        (curated / "benchmark=faux", f"holds 2 collections: name one, e.g. {one}"),
        (one / "events", f"{one / 'events'} is a table of the collection {one}: name the"),
    ):
        with pytest.raises(CollectionError, match="no manifest") as info:
            read_collection(given)
        assert said in str(info.value)
    empty = curated.parent / "empty"
    empty.mkdir()
    with pytest.raises(CollectionError, match=r"is .*empty a collection folder\?"):
        read_collection(empty)


def test_a_finished_collection_without_rows_is_empty_not_damaged(tmp_path: Path) -> None:
    from kernmlops.errors import EmptyCollectionError

    hooks = {
        "block_io": {"attached": True, "events": 0, "rows": {"block_io": 0}},
        "syscalls": {"attached": True, "events": 1, "rows": {"syscalls": 0}},
        "cpu_profile": {"attached": False, "reason": "needs perf_event with stacks"},
    }
    finished = {"collection_id": "e", "state": "completed", "duration_s": 2.26, "hooks": hooks,
                "tables": {"block_io": {"rows": 0}, "syscalls": {"rows": 0}}}  # fmt: skip
    write_manifest(tmp_path, finished)
    with pytest.raises(EmptyCollectionError) as info:
        read_collection(tmp_path)
    assert str(info.value) == (
        f"{tmp_path}: the collection recorded no rows (completed after 2.3 s; "
        "block_io: 0 events, syscalls: 1 event, cpu_profile: not attached "
        "(needs perf_event with stacks))"
    )
    assert info.value.exit_code == 1
    # Damage still reads as damage: a collector that died (rows unknown), a table the
    # manifest counts rows in with no part, unfinished parts
    for change in (
        {"state": "running"},
        {"tables": {"block_io": {"rows": 5}}},
        {"hooks": {"block_io": {"attached": True, "events": 5, "rows": {"block_io": 5}}}},
    ):
        write_manifest(tmp_path, {**finished, **change})
        with pytest.raises(CollectionError, match="no Parquet tables") as damaged:
            read_collection(tmp_path)
        assert not isinstance(damaged.value, EmptyCollectionError)
    write_manifest(tmp_path, finished)
    (tmp_path / "block_io").mkdir()
    (tmp_path / "block_io" / ".part-00000.parquet.tmp").write_bytes(b"")
    with pytest.raises(CollectionError, match="only unfinished temporary parts in block_io"):
        read_collection(tmp_path)


def test_unreadable_part_names_the_table(tmp_path: Path) -> None:
    write_manifest(tmp_path, {})
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(CollectionError, match="cannot read table 'events'"):
        read_collection(tmp_path)


@pytest.fixture(params=["root", "user"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """read_collection as root and as a user (parts opened through held folders by
    both; as root no link another user made is followed)."""
    if request.param == "user":
        monkeypatch.setattr("os.geteuid", lambda: 1000)
    elif os.geteuid() != 0:
        skip_here("reads as root: needs root")
    return request.param


def test_lazy_read_scans_what_the_eager_read_reads(curated: Path, reader: str) -> None:
    folder = curated / "benchmark=faux" / "collection_id=f2"
    eager = read_collection(folder)
    lazy = read_collection(folder, lazy=True)
    assert isinstance(lazy, LazyCollection) and isinstance(lazy["events"], pl.LazyFrame)
    assert lazy.files == eager.files and len(lazy.files["events"]) == 3
    assert (lazy.collection_id, lazy.benchmark, lazy.manifest) == ("f2", "faux", eager.manifest)
    for name in eager:
        assert_frame_equal(lazy[name].collect(), eager[name])
        assert lazy.scan(name) is lazy[name]
    total = lazy["events"].select(pl.len(), pl.col("latency_ns").sum()).collect(engine="streaming")
    assert total.row(0) == (2500, 3 * sum(range(2500)))
    assert "events: 3 parts" in repr(lazy)
    with pytest.raises(KeyError, match=r"no table 'nope'.*tables: drops, events"):
        lazy["nope"]


def test_lazy_read_refuses_a_part_that_is_not_parquet_at_once(tmp_path: Path, reader: str) -> None:
    write_manifest(tmp_path, {})
    make_collection(tmp_path, "gap", "x", 10)
    (tmp_path / "events" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(CollectionError, match="cannot read table 'events'") as info:
        read_collection(tmp_path, lazy=True)
    assert str(info.value).startswith(f"{tmp_path / 'events'}: ")


def test_rows_are_counted_whatever_the_first_column_holds(tmp_path: Path) -> None:
    """count_rows counts every row, nulls in its first column too (it counts in 64 bits:
    polars' pl.len() fails past 2^32 - 1 rows, which a ten-minute 16-core storm's
    quanta table passes; measured in bench/README.md, too slow for a test)."""
    from kernmlops.data import count_rows

    frame = pl.DataFrame({"a": [None, 2, None, 4, 5], "b": ["x", None, "z", "w", None]})
    pl.concat([frame] * 3).write_parquet(tmp_path / "one.parquet")
    frame.write_parquet(tmp_path / "two.parquet")
    scan = pl.scan_parquet([tmp_path / "one.parquet", tmp_path / "two.parquet"])
    assert count_rows(scan) == 20 == scan.collect().height
    assert count_rows(scan.filter(pl.col("b").is_null())) == 8
    assert count_rows(scan.head(0)) == 0


def test_a_query_and_its_groups_count_rows_by_one_rule(tmp_path: Path) -> None:
    """len64 is the one 64-bit count: count_rows counts a whole query with it, a
    group_by (the fleet's per-collection summaries, a notebook's per-pid counts) each
    group; both give pl.len()'s numbers where pl.len() works, whichever column is first
    (a group's key or a column with nulls) and in a UInt64 that does not stop at 2^32."""
    from kernmlops.data import count_rows, len64

    frame = pl.DataFrame({"a": [None, 2, None, 4, 5], "b": ["x", None, "z", "w", None]})
    pl.concat([frame] * 3).write_parquet(tmp_path / "one.parquet")
    scan = pl.scan_parquet(tmp_path / "one.parquet")
    whole = scan.select(len64()).collect(engine="streaming")
    assert whole.schema == {"len": pl.UInt64} and whole.item() == count_rows(scan) == 15
    for key in ("a", "b"):
        got = scan.group_by(key).agg(len64(), n=pl.len()).collect(engine="streaming")
        assert got["len"].dtype == pl.UInt64
        assert got["len"].to_list() == got["n"].to_list(), key
        assert got["len"].sum() == count_rows(scan)


def test_the_memory_a_table_needs_is_at_most_what_polars_holds_once_read(curated: Path) -> None:
    from kernmlops.data import needed_bytes

    c = read_collection(curated / "benchmark=faux" / "collection_id=f2", lazy=True)
    for name in c:
        frame = c[name].collect()
        needed = needed_bytes(c[name])
        assert 0 < needed <= frame.estimated_size()
        numeric = frame.select(pl.selectors.numeric())
        assert needed >= numeric.estimated_size()  # all but the strings' text


def test_a_collection_larger_than_the_memory_left_is_refused_and_scans(
    curated: Path, reader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that would take more memory than is left (and be killed for it): one
    line that says how much and names the lazy read, which works."""
    folder = curated / "benchmark=faux" / "collection_id=f2"
    monkeypatch.setattr("kernmlops.host.meminfo.available_bytes", lambda: 40_000)

    from kernmlops.data import _part_damage as part_damage

    def never(fd: int) -> None:
        raise AssertionError("a page read for a read refused for its memory")

    # the pages are checked once the read is known to fit, never before
    monkeypatch.setattr("kernmlops.data._part_damage", never)
    with pytest.raises(CollectionError) as info:
        read_collection(folder)
    assert str(info.value).startswith(f"{folder}: reading it needs at least 39.")
    assert " KiB of memory and 39.1 KiB is available: scan it instead" in str(info.value)
    assert "read_collection(path, lazy=True)" in str(info.value)
    with pytest.raises(CollectionError, match=r"read_parquet_dir\(path, 'events', lazy=True\)"):
        read_parquet_dir(curated, "events")
    # the lazy reads check the pages (nothing of the pages is held in memory)
    monkeypatch.setattr("kernmlops.data._part_damage", part_damage)
    lazy = read_collection(folder, lazy=True)
    assert lazy["events"].collect().height == 2500
    assert lazy.read("drops").height == 1  # one table read: it fits
    with pytest.raises(CollectionError, match=r"lazy=True\)\['events'\], then collect"):
        lazy.read("events")
    assert read_parquet_dir(curated, "events", lazy=True).collect().height == sum(ROWS.values())
    monkeypatch.undo()
    monkeypatch.setattr("kernmlops.host.meminfo.available_bytes", lambda: 80_000)
    assert read_collection(folder)["events"].height == 2500  # 2,500 rows x 16 bytes fit


def test_temporary_parts_are_never_read(curated: Path) -> None:
    folder = curated / "benchmark=gap" / "collection_id=g1"
    (folder / "events" / ".part-00001.parquet.tmp").write_bytes(b"half a file")
    c = read_collection(folder)
    assert c["events"].height == 700
    assert c.incomplete == ("events",)
    assert read_parquet_dir(curated, "events").height == sum(ROWS.values())


def test_read_parquet_dir_over_all_collections(curated: Path) -> None:
    df = read_parquet_dir(curated, "events")
    assert isinstance(df, pl.DataFrame)
    assert df.columns == ["benchmark", "collection_id", "ts_uptime_us", "latency_ns"]
    assert df.schema["benchmark"] == pl.String
    assert df.schema["collection_id"] == pl.String
    counts = df.group_by("benchmark", "collection_id").len().sort("benchmark", "collection_id")
    assert counts.rows() == [(b, c, n) for (b, c), n in sorted(ROWS.items())]
    # Values are kept exactly, per collection.
    f2 = df.filter(collection_id="f2")
    assert f2["ts_uptime_us"].to_list() == list(range(2500))


def test_a_table_of_more_parts_than_the_soft_fd_limit_is_read(tmp_path: Path) -> None:
    # Each part is opened once and scanned through its descriptor, which a lazy table
    # holds until collected: a fleet's read_parquet_dir holds one per part at once.
    # Debian's soft limit (1,024) refused it ("Too many open files"); the readers
    # raise it to the hard limit, as the exporter does. Here a soft limit of 64
    # against 120 parts.
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 256:
        skip_here(f"the hard RLIMIT_NOFILE is {hard}: no room above a soft limit of 64")
    folder = tmp_path / "curated" / "benchmark=faux" / "collection_id=many"
    with ParquetSink(folder, "many", row_group_rows=10, rows_per_file=10) as sink:
        for i in range(120):
            sink.write("events", events(10, offset=10 * i))
    write_manifest(folder, {"collection_id": "many", "benchmark": "faux",
                            "started_at": "2024-05-01T00:00:00+00:00",
                            "tables": sink.files_written()})  # fmt: skip
    assert len(list((folder / "events").glob("part-*.parquet"))) == 120
    script = (
        "import resource, sys\n"
        "from kernmlops.data import read_collection, read_parquet_dir, count_rows\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "lazy = read_parquet_dir(sys.argv[1], 'events', lazy=True)\n"
        "c = read_collection(sys.argv[2], lazy=True)\n"
        "print(count_rows(lazy), count_rows(c['events']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "curated"), str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1200", "1200"]


def test_read_parquet_dir_table_in_some_collections(curated: Path) -> None:
    drops = read_parquet_dir(curated, "drops")
    assert drops.sort("collection_id").rows() == [
        ("faux", "f1", "block_io", 10),
        ("faux", "f2", "block_io", 25),
    ]


def test_read_parquet_dir_lazy(curated: Path) -> None:
    lazy = read_parquet_dir(curated, "events", lazy=True)
    assert isinstance(lazy, pl.LazyFrame)
    total = lazy.group_by("benchmark").agg(pl.len()).sort("benchmark").collect()
    assert total.rows() == [("faux", 3500), ("gap", 701)]
    assert_frame_equal(lazy.collect(), read_parquet_dir(curated, "events"))


def test_read_parquet_dir_one_benchmark_or_collection(curated: Path) -> None:
    gap = read_parquet_dir(curated / "benchmark=gap", "events")
    assert gap["benchmark"].unique().to_list() == ["gap"]
    assert gap.height == 701
    one = read_parquet_dir(curated / "benchmark=faux" / "collection_id=f1", "events")
    assert one.select("benchmark", "collection_id").unique().rows() == [("faux", "f1")]
    assert one.height == 1000


def test_read_parquet_dir_path_wins_over_file_values(curated: Path) -> None:
    # A copied folder: the files still say f1, the path says f9 (as Hive readers see it).
    src = curated / "benchmark=faux" / "collection_id=f1"
    dst = curated / "benchmark=other" / "collection_id=f9"
    dst.mkdir(parents=True)
    src.rename(dst)
    df = read_parquet_dir(curated / "benchmark=other", "events")
    assert df.select("benchmark", "collection_id").unique().rows() == [("other", "f9")]


def test_read_parquet_dir_combines_schemas(curated: Path) -> None:
    folder = curated / "benchmark=gap" / "collection_id=g3"
    with ParquetSink(folder, "g3") as sink:
        sink.write("events", events(2, 0).with_columns(cpu=pl.Series([0, 1], dtype=pl.Int16)))
    write_manifest(folder, {"collection_id": "g3"})
    df = read_parquet_dir(curated, "events")
    assert df.columns[-1] == "cpu"
    assert df["cpu"].null_count() == sum(ROWS.values())
    assert df.filter(collection_id="g3")["cpu"].to_list() == [0, 1]


@pytest.mark.parametrize("as_root", [True, False], ids=["root", "user"])
def test_read_parquet_dir_says_which_collections_it_read_are_not_whole(
    curated: Path, monkeypatch: pytest.MonkeyPatch, as_root: bool
) -> None:
    """A collection whose collector died, one with rows still in its spool and one with
    no manifest (a copy or a push under way) are read as far as they are, and named in
    one warning, as read_collection names each: rows of every collection are there,
    and no whole one is named. As root and as a user."""
    from kernmlops.data import IncompleteCollectionWarning

    if as_root and os.geteuid() != 0:
        skip_here("reads as root: run as root (make test does)")
    elif not as_root and os.geteuid() == 0:  # root reads as any user would
        monkeypatch.setattr("kernmlops.data.os.geteuid", lambda: 1000)

    def folder(benchmark: str, cid: str) -> Path:
        return curated / f"benchmark={benchmark}" / f"collection_id={cid}"

    def done(benchmark: str, cid: str, **fields: object) -> None:
        write_manifest(folder(benchmark, cid), {"collection_id": cid, "state": "completed",
                                                "benchmark": benchmark, **fields})  # fmt: skip

    for benchmark, cid in ROWS:
        done(benchmark, cid)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every collection whole: nothing said
        assert read_parquet_dir(curated, "events").height == sum(ROWS.values())
    done("faux", "f1", state="running")  # its collector killed
    spool = folder("faux", "f2") / ".spool"
    spool.mkdir()
    (spool / "quanta_switch.00000.ring").write_bytes(b"\0" * 64)
    (folder("gap", "g1") / "manifest.json").unlink()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        df = read_parquet_dir(curated, "events")
    assert df.height == sum(ROWS.values())
    [warning] = [str(w.message) for w in said]
    assert issubclass(said[0].category, IncompleteCollectionWarning)
    assert warning == (
        f"{curated}: 3 of the 4 collections read are not whole (read as far as they are): "
        f"{folder('faux', 'f1')} (its collector stopped without finishing), "
        f"{folder('faux', 'f2')} (rows still in its spool: `kernmlops recover` adds them), "
        f"{folder('gap', 'g1')} (no readable manifest: a copy or push under way?)"
    )
    # a collection without the table is not one read
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        read_parquet_dir(curated, "drops", lazy=True)
    assert [str(w.message) for w in said] == [
        f"{curated}: 2 of the 2 collections read are not whole (read as far as they are): "
        f"{folder('faux', 'f1')} (its collector stopped without finishing), "
        f"{folder('faux', 'f2')} (rows still in its spool: `kernmlops recover` adds them)"
    ]


def test_read_parquet_dir_refuses_or_skips_a_damaged_collection(
    curated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection damaged inside a page (found by its checksum), one whose footer is
    torn and one written without checksums whose damaged page header does not parse: by
    default the read fails, naming the part; ``damaged="skip"`` leaves each out,
    named in a warning of its own, and reads the others (the same rows as without
    them)."""
    from kernmlops.collect import pagecheck
    from kernmlops.data import IncompleteCollectionWarning
    from tests.parquet_damage import flip_page_byte

    def folder(benchmark: str, cid: str) -> Path:
        return curated / f"benchmark={benchmark}" / f"collection_id={cid}"

    # f2 written again as an older kernmlops wrote it: no page checksum
    shutil.rmtree(folder("faux", "f2"))
    monkeypatch.setitem(pagecheck.WRITE, "write_page_checksum", False)
    make_collection(folder("faux", "f2"), "faux", "f2", ROWS["faux", "f2"])
    whole = read_parquet_dir(curated, "events")
    flip_page_byte(folder("faux", "f1") / "events" / "part-00000.parquet", "latency_ns")
    f2 = folder("faux", "f2") / "events" / "part-00001.parquet"
    flip_page_byte(f2, "latency_ns", header=True)
    with pytest.raises(CollectionError) as err:
        read_parquet_dir(curated, "events")
    assert str(err.value) == (
        f"{folder('faux', 'f1') / 'events'}: cannot read table 'events': part-00000.parquet "
        "is damaged: a page fails its checksum (row group 0, column 'latency_ns')"
    )
    os.truncate(folder("gap", "g1") / "events" / "part-00000.parquet", 300)
    with pytest.raises(CollectionError, match=r"collection_id=g1/events: cannot read table"):
        read_parquet_dir(curated, "events")  # the footers read before any page
    with pytest.warns(IncompleteCollectionWarning) as said:
        read = read_parquet_dir(curated, "events", damaged="skip")
    assert_frame_equal(read, whole.filter(pl.col("collection_id") == "g2"))
    lines = [str(w.message) for w in said]
    # the torn footer first: every footer is read (each part opened once) before a page
    assert [line.split(": ", 1)[0] for line in lines] == [
        str(folder("gap", "g1")), str(folder("faux", "f1")), str(folder("faux", "f2"))
    ]  # fmt: skip
    assert all(": damaged, skipped (not read): events: cannot read table" in x for x in lines)
    assert "part-00000.parquet is damaged: a page fails its checksum" in lines[1]
    assert "part-00001.parquet is damaged: a page does not decode (row group 0" in lines[2]
    # damage only polars finds as it reads (no page check saw it): left out as read
    monkeypatch.setattr("kernmlops.data._part_damage", lambda fd: None)
    with pytest.warns(IncompleteCollectionWarning) as said:
        read = read_parquet_dir(curated, "events", damaged="skip")
    assert_frame_equal(read, whole.filter(pl.col("collection_id") == "g2"))
    assert [str(w.message).split(": ", 1)[0] for w in said][-1] == str(folder("faux", "f2"))
    monkeypatch.undo()
    # lazy: every page checked as well, each damaged collection named
    with pytest.warns(IncompleteCollectionWarning) as said:
        lazy = read_parquet_dir(curated, "events", lazy=True, damaged="skip")
    assert [str(w.message) for w in said] == lines
    assert_frame_equal(lazy.collect(), whole.filter(pl.col("collection_id") == "g2"))
    # pages=False: what its footers show (g1's), the pages not read
    with pytest.warns(IncompleteCollectionWarning, match="collection_id=g1: damaged, skipped"):
        lazy = read_parquet_dir(curated, "events", lazy=True, damaged="skip", pages=False)
    assert sorted(lazy.select("collection_id").unique().collect().to_series()) == ["f1", "f2", "g2"]
    # every collection that has the table damaged: one line, each named above
    os.truncate(folder("gap", "g2") / "events" / "part-00000.parquet", 300)
    with pytest.warns(IncompleteCollectionWarning), pytest.raises(CollectionError) as err:
        read_parquet_dir(curated, "events", damaged="skip")
    assert "damaged" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("as_root", [True, False], ids=["root", "user"])
def test_read_parquet_dir_names_why_a_manifest_does_not_read(
    curated: Path, monkeypatch: pytest.MonkeyPatch, as_root: bool
) -> None:
    """A manifest there but not read (a newer kernmlops wrote it, or it is damaged) is
    named with the reason, as read_collection gives it: not as a missing manifest (a
    copy under way), which would send the user waiting for a copy that never ends."""
    import json

    from kernmlops.data import IncompleteCollectionWarning

    if as_root and os.geteuid() != 0:
        skip_here("reads as root: run as root (make test does)")
    elif not as_root and os.geteuid() == 0:
        monkeypatch.setattr("kernmlops.data.os.geteuid", lambda: 1000)
    newer = curated / "benchmark=faux" / "collection_id=f1" / "manifest.json"
    newer.write_text(json.dumps({**json.loads(newer.read_text()), "version": 9}))
    damaged = curated / "benchmark=gap" / "collection_id=g1" / "manifest.json"
    damaged.write_text('{"broken')
    fifo = curated / "benchmark=faux" / "collection_id=f2" / "manifest.json"
    fifo.unlink()
    os.mkfifo(fifo)  # read as root and as a user, worded alike
    with pytest.raises(CollectionError, match="upgrade kernmlops"):
        read_collection(newer.parent)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        read_parquet_dir(curated, "events")
    [warning] = [str(w.message) for w in said]
    assert issubclass(said[0].category, IncompleteCollectionWarning)
    assert "copy or push" not in warning, warning
    assert (
        f"{newer.parent} (manifest not read: written with format version 9, this "
        "kernmlops reads up to version 3; upgrade kernmlops to read it)" in warning
    ), warning
    assert f"{damaged.parent} (manifest not read: the manifest is not valid JSON" in warning
    said_of_fifo = f"{fifo.parent} (manifest not read: cannot read the manifest: not a plain file)"
    assert said_of_fifo in warning, warning


def test_read_parquet_dir_errors(curated: Path, tmp_path: Path) -> None:
    with pytest.raises(CollectionError, match="no table 'nope' in any of its 4 collection"):
        read_parquet_dir(curated, "nope")
    with pytest.raises(CollectionError, match="no collections") as info:
        read_parquet_dir(
            tmp_path / "curated" / "benchmark=faux" / "collection_id=f1" / "events", "x"
        )
    assert "events" in str(info.value)
    with pytest.raises(CollectionError, match="no such folder"):
        read_parquet_dir(tmp_path / "missing", "events")
    # a file is there: not 'no such folder'
    manifest = curated / "benchmark=faux" / "collection_id=f1" / "manifest.json"
    for reader in (lambda p: read_parquet_dir(p, "events"), list_collections):
        with pytest.raises(CollectionError, match=f"^{re.escape(str(manifest))}: not a folder$"):
            reader(manifest)


@pytest.mark.parametrize("uri", ["s3://kdata/fleet", "gs://b/p/", "S3://k/f?region=x"])
def test_a_uri_is_refused_in_one_line_as_given(uri: str) -> None:
    """The readers read local folders (as documented); a dataset's URI is said so, as
    the user wrote it (a Path made s3://kdata/fleet the folder s3:/kdata/fleet)."""
    from kernmlops import data_import as di

    calls = [
        lambda: read_parquet_dir(uri, "events"),
        lambda: list_collections(uri),
        lambda: read_collection(uri),
        lambda: di.read_parquet_dir(uri, "command"),
    ]
    for call in calls:
        with pytest.raises(CollectionError) as refused:
            call()
        said = str(refused.value)
        assert said.startswith(f"{uri}: a URI: collections are read from local folders only")
        assert "\n" not in said


def test_a_file_uri_is_refused_naming_its_folder(curated: Path) -> None:
    uri = curated.as_uri()
    with pytest.raises(CollectionError, match=rf"^{uri}: a URI: name its folder instead \("):
        read_parquet_dir(uri, "events")
    assert read_parquet_dir(curated, "events").height == sum(ROWS.values())


def test_list_collections(curated: Path) -> None:
    df = list_collections(curated)
    assert df.columns == [
        "benchmark", "collection_id", "path", "started_at", "state", "tables", "collector_pid",
    ]  # fmt: skip
    assert df.select("benchmark", "collection_id").rows() == sorted(ROWS)
    assert df.schema["started_at"] == pl.Datetime("us", "UTC")
    assert df["started_at"].to_list() == [datetime(2024, 5, 2, tzinfo=UTC)] * 4
    assert df["tables"].to_list() == [["drops", "events"]] * 2 + [["events"]] * 2
    assert df["path"][0] == str(curated / "benchmark=faux" / "collection_id=f1")


def test_list_collections_started_at_is_the_index_s_utc_timestamp(curated: Path) -> None:
    """started_at is a UTC timestamp, as the fleet index types it (an offset is made
    UTC, a time without one is UTC's, what is not a time is null): the same instant
    as the index row a push of the collection writes."""
    from kernmlops.collect.manifest import read_manifest
    from kernmlops.fleet.index import index_row

    written = {
        "f1": "2024-05-01T12:30:00.250000+02:00",
        "f2": "2024-05-01T12:30:00",
        "g1": "not a time",
    }
    for (benchmark, cid), _ in ROWS.items():
        folder = curated / f"benchmark={benchmark}" / f"collection_id={cid}"
        manifest = read_manifest(folder).model_copy(update={"started_at": written.get(cid)})
        write_manifest(folder, manifest)
    df = list_collections(curated)
    assert df.schema["started_at"] == pl.Datetime("us", "UTC")
    assert dict(zip(df["collection_id"], df["started_at"], strict=True)) == {
        "f1": datetime(2024, 5, 1, 10, 30, 0, 250000, tzinfo=UTC),
        "f2": datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        "g1": None,
        "g2": None,
    }
    for cid, at in zip(df["collection_id"], df["started_at"], strict=True):
        folder = Path(df.filter(pl.col("collection_id") == cid)["path"][0])
        assert (
            index_row(read_manifest(folder), "benchmark=x/collection_id=y", [])["started_at"] == at
        )
    # the index's own type: the column goes into it as it is
    import pyarrow as pa

    from kernmlops.fleet.index import index_schema

    assert (
        df.to_arrow()["started_at"].type
        == index_schema().field("started_at").type
        == (pa.timestamp("us", tz="UTC"))
    )


def test_a_part_that_is_no_plain_file_leaves_out_its_table_not_the_collection(
    curated: Path,
) -> None:
    """A FIFO at a part's name (as root, refused unread): list_collections still gives
    the manifest's start (and state), and the collection's other tables (as root they
    were null and [], as if it had no readable manifest)."""
    folder = curated / "benchmark=faux" / "collection_id=f1"
    os.mkfifo(folder / "events" / "part-09999.parquet")
    row = list_collections(curated).filter(pl.col("collection_id") == "f1").row(0, named=True)
    assert read_manifest(folder).started_at is not None
    assert row["started_at"] == datetime(2024, 5, 2, tzinfo=UTC)
    assert "drops" in row["tables"]


def test_list_collections_empty(tmp_path: Path) -> None:
    assert list_collections(tmp_path).height == 0


def test_the_data_folder_holding_curated_is_read_as_push_takes_it(
    curated: Path, tmp_path: Path
) -> None:
    """`collect -o data` writes data/curated/...; push and lb train take data, and so do
    read_parquet_dir and list_collections (they found no collections in it)."""
    data = curated.parent
    assert_frame_equal(read_parquet_dir(data, "events"), read_parquet_dir(curated, "events"))
    assert_frame_equal(list_collections(data), list_collections(curated))
    assert list_collections(data)["path"][0] == str(curated / "benchmark=faux" / "collection_id=f1")
    # an empty curated/: the error names the folder it looked in
    (tmp_path / "other" / "curated").mkdir(parents=True)
    with pytest.raises(CollectionError, match=r"other/curated: no collections"):
        read_parquet_dir(tmp_path / "other", "events")
    assert list_collections(tmp_path / "other").height == 0


NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="plays sudo: needs root")


def _sudo(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {"SUDO_UID": NOBODY, "SUDO_GID": NOBODY, "SUDO_USER": "nobody"}.items():
        monkeypatch.setenv(key, str(value))


@as_root
def test_read_under_sudo_reads_the_same(curated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under sudo the collection is read through held folders: the same tables, files,
    warnings and errors as without."""
    folder = curated / "benchmark=gap" / "collection_id=g1"
    (folder / "events" / ".part-00001.parquet.tmp").write_bytes(b"half a file")
    plain = read_collection(folder)
    _sudo(monkeypatch)
    held = read_collection(folder / "manifest.json")
    assert held.path == plain.path and held.files == plain.files
    assert held.manifest == plain.manifest and held.incomplete == plain.incomplete == ("events",)
    for name in plain:
        assert_frame_equal(held[name], plain[name])
        assert_frame_equal(held.scan(name).collect(), plain[name])
    with pytest.raises(CollectionError, match="no such collection folder"):
        read_collection(curated / "missing")
    with pytest.raises(CollectionError, match="not a folder"):
        read_collection(folder / "events" / "part-00000.parquet")
    with pytest.raises(CollectionError, match="no manifest"):
        read_collection(curated)
    (folder / "events" / "part-00000.parquet").write_bytes(b"not parquet")
    with pytest.raises(CollectionError, match="cannot read table 'events'") as info:
        read_collection(folder)
    assert "/proc/self/fd" not in str(info.value)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder of root's any user may enter, like /home (tmp_path's parents are
    root's alone: a user's link through them leads nowhere they could go)."""
    top = Path(tempfile.mkdtemp(prefix="kmo-data-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@as_root
def test_read_as_root_follows_no_link_a_user_planted(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nobody's collection with a part linked to a root-only Parquet file (a symbolic
    link, then a hard link): refused as root without sudo (a cron job, a root shell)
    as under sudo, in one message naming the part."""
    secret = shared / "root-only"
    secret.mkdir(mode=0o700)
    make_collection(secret / "c", "faux", "s1", 10)
    col = shared / "alice" / "c"
    make_collection(col, "faux", "a1", 10)
    part = col / "events" / "part-00000.parquet"
    part.unlink()
    part.symlink_to(secret / "c" / "events" / "part-00000.parquet")
    for path in [col.parent, *col.parent.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    monkeypatch.delenv("SUDO_UID", raising=False)
    with pytest.raises(CollectionError) as info:
        read_collection(col)  # root, no sudo: the link is nobody's, not followed
    assert str(info.value).startswith(f"{part}: a link: as root, kernmlops reads no link")
    _sudo(monkeypatch)  # nobody's own link, followed with nobody's rights: not into root's
    with pytest.raises(CollectionError) as info:
        read_collection(col)
    assert f"{part} is a link in a folder nobody can change, to {secret}, which nobody " in str(
        info.value
    )
    monkeypatch.delenv("SUDO_UID")
    part.unlink()
    os.link(secret / "c" / "events" / "part-00000.parquet", part)
    with pytest.raises(CollectionError, match="a hard link to a file of another owner"):
        read_collection(col)
    _sudo(monkeypatch)
    with pytest.raises(CollectionError, match="a hard link to a file of another owner"):
        read_collection(col)
    (col / "manifest.json").unlink()
    (col / "manifest.json").symlink_to(secret / "c" / "manifest.json")
    with pytest.raises(CollectionError, match="cannot read the manifest: a link"):
        read_collection(col)
    monkeypatch.delenv("SUDO_UID")
    with pytest.raises(CollectionError, match="cannot read the manifest: a link"):
        read_collection(col)


@as_root
def test_read_as_root_follows_a_link_of_roots_in_a_folder_only_root_changes(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """root's own collection, a part and a table folder links of root's to root's
    files (no one else could have made them): followed, with sudo or without."""
    make_collection(shared / "other", "faux", "o1", 10)
    col = shared / "c"
    make_collection(col, "faux", "c1", 10)
    part = col / "events" / "part-00000.parquet"
    part.unlink()
    part.symlink_to(Path("..") / ".." / "other" / "events" / "part-00000.parquet")
    (col / "drops").rename(shared / "drops")
    (col / "drops").symlink_to(shared / "drops")
    monkeypatch.delenv("SUDO_UID", raising=False)
    read = read_collection(col)
    assert read["events"].height == 10 and "drops" in read
    _sudo(monkeypatch)
    assert read_collection(col)["events"].height == 10


@as_root
def test_under_sudo_the_invokers_own_links_are_followed_where_they_may_read(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nobody's collection whose table folder is nobody's link to nobody's folder
    elsewhere (~/c/events -> /scratch/nobody/events): read under sudo as nobody (their
    own link), refused as root without sudo and when the link is another user's."""
    col = shared / "alice" / "c"
    make_collection(col, "faux", "a1", 10)
    scratch = shared / "scratch" / "alice"
    scratch.mkdir(parents=True)
    (col / "events").rename(scratch / "events")
    (col / "events").symlink_to(scratch / "events")
    for path in [col.parent, *col.parent.rglob("*"), scratch, *scratch.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    _sudo(monkeypatch)
    assert read_collection(col)["events"].height == 10
    monkeypatch.delenv("SUDO_UID")
    with pytest.raises(CollectionError, match=f"{col / 'events'}: a link: as root"):
        read_collection(col)
    os.chown(col / "events", 4242, 4242, follow_symlinks=False)  # a third user's link
    _sudo(monkeypatch)
    with pytest.raises(CollectionError, match=f"{col / 'events'}: a link: as root"):
        read_collection(col)


@as_root
def test_read_parquet_dir_and_list_collections_as_root_follow_no_link_a_user_planted(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A curated folder of nobody's, one collection's manifest and part linked to a
    root-only collection's: read_parquet_dir refuses in one line naming the part (as
    read_collection does), list_collections lists it with nothing of the root-only
    files (neither its manifest's start nor its tables), with sudo or without."""
    secret = shared / "root-only"
    secret.mkdir(mode=0o700)
    make_collection(secret / "c", "faux", "sss", 10)  # started 2024-05-03
    curated = shared / "alice" / "curated"
    col = curated / "benchmark=faux" / "collection_id=a1"
    make_collection(col, "faux", "a1", 10)
    make_collection(curated / "benchmark=faux" / "collection_id=a2", "faux", "a2", 7)
    for path in [curated.parent, *curated.parent.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    monkeypatch.delenv("SUDO_UID", raising=False)
    assert read_parquet_dir(curated, "events").height == 17  # nothing planted: read as root
    (col / "manifest.json").unlink()
    (col / "manifest.json").symlink_to(secret / "c" / "manifest.json")
    part = col / "events" / "part-00000.parquet"
    part.unlink()
    part.symlink_to(secret / "c" / "events" / "part-00000.parquet")
    for sudo in (False, True):
        if sudo:
            _sudo(monkeypatch)
        with pytest.raises(CollectionError) as info:
            read_parquet_dir(curated, "events")
        assert f"{part}: a link" in str(info.value) or f"{part} is a link" in str(info.value)
        with pytest.raises(CollectionError, match="link"):
            read_parquet_dir(curated, "events", lazy=True)
        listed = {r["collection_id"]: r for r in list_collections(curated).iter_rows(named=True)}
        # its own drops part is its own: listed; the linked events part is not
        assert listed["a1"]["started_at"] is None and listed["a1"]["tables"] == ["drops"]
        assert listed["a2"]["started_at"] == datetime(2024, 5, 2, tzinfo=UTC)
        assert listed["a2"]["tables"] == ["drops", "events"]
    # the links gone, root reads every collection again (lazily too)
    monkeypatch.delenv("SUDO_UID")
    shutil.rmtree(col)
    make_collection(col, "faux", "a1", 10)
    for path in [curated.parent, *curated.parent.rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    assert read_parquet_dir(curated, "events", lazy=True).collect().height == 17


@as_root
def test_a_lazy_read_as_root_reads_the_files_it_opened(
    shared: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's collection scanned by root: a part the user swaps for a link to a
    root-only file (or for other data) after the scan is not what the scan reads, and
    neither is read_parquet_dir's lazy frame: root reads the files it vetted."""
    secret = shared / "root-only"
    secret.mkdir(mode=0o700)
    make_collection(secret / "c", "faux", "s1", 5)
    (secret / "c" / "events" / "part-00000.parquet").unlink()
    pl.DataFrame({"ts_uptime_us": [7] * 5, "latency_ns": [-1] * 5}).write_parquet(
        secret / "c" / "events" / "part-00000.parquet"
    )
    col = shared / "alice" / "benchmark=faux" / "collection_id=a1"
    make_collection(col, "faux", "a1", 10)
    for path in [col.parents[1], *col.parents[1].rglob("*")]:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    monkeypatch.delenv("SUDO_UID", raising=False)
    lazy = read_collection(col, lazy=True)["events"].select(pl.col("latency_ns").sum())
    fleet = read_parquet_dir(col.parents[1], "events", lazy=True)
    part = col / "events" / "part-00000.parquet"
    part.unlink()  # the user swaps the part for a link into root's folder
    part.symlink_to(secret / "c" / "events" / "part-00000.parquet")
    os.chown(part, NOBODY, NOBODY, follow_symlinks=False)
    assert lazy.collect().item() == 3 * sum(range(10))
    assert fleet.collect()["latency_ns"].to_list() == [3 * i for i in range(10)]
    with pytest.raises(CollectionError, match="a link"):
        read_collection(col, lazy=True)  # read again: the link is seen and refused


#: Writes the wall clock (time.time_ns) to the file it is given, then exits at once:
#: its process_trace exit row is made within moments of that time.
STAMP = (
    "import os, sys, time\n"
    "t = time.time_ns()\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
    "os.write(fd, str(t).encode())\n"
    "os._exit(0)\n"
)


def test_wall_clock_from_the_pairs_or_the_boot_time() -> None:
    from kernmlops.collect.manifest import Manifest

    mono, real = 5_000_000_000_000, 1_800_000_000_000_000_000
    frame = pl.DataFrame(
        {"ts_uptime_us": [mono // 1000 - 10, mono // 1000 + 1, mono // 1000 + 3_000_001]}
    )
    one = Manifest(
        clock={"start": {"monotonic_ns": mono, "realtime_ns": real, "uncertainty_ns": 80}}
    )
    got = frame.select(wall_clock(one))["ts_uptime_us"].dt.epoch("us").to_list()
    assert got == [real // 1000 - 10, real // 1000 + 1, real // 1000 + 3_000_001]
    # the wall clock stepped 2 ms ahead between start and stop (3 s apart): the offset
    # moves with the time between them, and is the nearer pair's outside
    stop = {"monotonic_ns": mono + 3 * 10**9, "realtime_ns": real + 3 * 10**9 + 2_000_000,
            "uncertainty_ns": 90}  # fmt: skip
    two = Manifest(clock={"start": one.clock.start.model_dump(), "stop": stop})
    frame = pl.DataFrame(
        {"ts_uptime_us": [mono // 1000 - 5, mono // 1000 + 1_500_000, mono // 1000 + 4_000_000]}
    )
    got = frame.select(wall_clock(two))["ts_uptime_us"].dt.epoch("us").to_list()
    assert got == [
        real // 1000 - 5,
        real // 1000 + 1_500_000 + 1000,
        real // 1000 + 4_000_000 + 2000,
    ]
    # an older manifest: the boot time, whole seconds
    old = Manifest(system={"boot_time_unix": 1_700_000_000})
    assert frame.select(wall_clock(old))["ts_uptime_us"].dt.epoch("us")[0] == (
        1_700_000_000 * 10**6 + mono // 1000 - 5
    )
    with pytest.raises(CollectionError, match=r"no clock pair and no system\.boot_time_unix"):
        wall_clock(Manifest())


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        # a hand-edited or damaged manifest: numbers past what a clock reads (int64 ns)
        ({"clock": {"start": {"monotonic_ns": 10**30, "realtime_ns": 1, "uncertainty_ns": 1}}},
         r"clock\.start"),
        ({"clock": {"start": {"monotonic_ns": 1, "realtime_ns": 2**63 + 5, "uncertainty_ns": 1},
                    "stop": {"monotonic_ns": 2, "realtime_ns": 2**62, "uncertainty_ns": 1}}},
         r"clock\.start"),
        ({"clock": {"start": {"monotonic_ns": -1, "realtime_ns": 1, "uncertainty_ns": 1}}},
         r"clock\.start"),
        ({"system": {"boot_time_unix": float("nan")}}, r"system\.boot_time_unix"),
        ({"system": {"boot_time_unix": float("inf")}}, r"system\.boot_time_unix"),
        ({"system": {"boot_time_unix": 10**20}}, r"system\.boot_time_unix"),
        ({"system": {"boot_time_unix": True}}, r"system\.boot_time_unix"),
    ],
)  # fmt: skip
def test_wall_clock_refuses_a_damaged_clock(fields: dict, named: str) -> None:
    """A clock value no clock can read is named in one error, never turned into null
    times, times wrapped past 2262, or a ValueError/OverflowError from int()."""
    from kernmlops.collect.manifest import Manifest

    manifest = Manifest(**fields)
    frame = pl.DataFrame({"ts_uptime_us": [1_000_000, 2_000_000]})
    with pytest.raises(CollectionError, match=named):
        frame.select(wall_clock(manifest))
