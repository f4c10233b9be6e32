"""kernmlops.data_import: KernMLOps' read_parquet_dir(path) -> {table: DataFrame} over
every collection, its README's use (filter a table by tgid), Collection as a mapping,
and our block_io in KernMLOps' shape (pure, and a real collection against
/sys/block/<dev>/stat)."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from kernmlops import data_import as di
from kernmlops.collect.manifest import write_manifest
from kernmlops.collect.parquet import ParquetSink
from kernmlops.data import read_collection
from kernmlops.errors import CollectionError

#: what KernMLOps' call gives for a collection with block_io rows
BLOCK_IO_TABLES = ["block_io", "block_io_latency", "block_io_queue_length"]


def _block_io_rows(**columns: list) -> pl.DataFrame:
    """Rows of our block_io table as its hook makes them (the columns of a collection
    before alloc_to_complete_us, inflight_segments, ... unless given)."""
    n = len(next(iter(columns.values()))) if columns else 1
    base: dict[str, list] = {
        "ts_uptime_us": [1_000] * n, "device": ["7:3"] * n, "major": [7] * n,
        "minor": [3] * n, "sector": [8] * n, "bytes": [4096] * n, "segments": [1] * n,
        "op": ["WRITE"] * n, "op_flags": ["WRITE|SYNC|IDLE"] * n,
        "cmd_flags": [1 | 1 << 11 | 1 << 15] * n, "queue_to_issue_us": [2] * n,
        "issue_to_complete_us": [40] * n, "inflight": [1] * n, "error": [0] * n,
        "pid": [7] * n, "tgid": [7] * n, "comm": ["dd"] * n,
    }  # fmt: skip
    base.update(columns)
    return pl.DataFrame(base).cast(
        {"major": pl.UInt32, "minor": pl.UInt32, "bytes": pl.UInt32, "segments": pl.UInt16,
         "cmd_flags": pl.UInt32, "pid": pl.UInt32, "tgid": pl.UInt32, "error": pl.UInt8}
    )  # fmt: skip


def _collection(root: Path, benchmark: str, cid: str, tgids: list[int]) -> None:
    folder = root / f"benchmark={benchmark}" / f"collection_id={cid}"
    with ParquetSink(folder, cid) as sink:
        sink.write(
            "dtlb_misses",
            pl.DataFrame({"tgid": tgids, "cumulative_count": [10 * t for t in tgids]}),
        )
        if benchmark == "gap":
            sink.write("block_io", _block_io_rows())
    write_manifest(folder, {"collection_id": cid, "benchmark": benchmark,
                            "tables": sink.files_written()})  # fmt: skip


@pytest.fixture
def curated(tmp_path: Path) -> Path:
    root = tmp_path / "curated"
    _collection(root, "faux", "a", [1, 2, 2])
    _collection(root, "gap", "b", [2, 3])
    _collection(root, "linux-build", "c", [4])
    return root


def test_every_table_of_every_collection(curated: Path) -> None:
    r = di.read_parquet_dir(curated)
    assert sorted(r.keys()) == [*BLOCK_IO_TABLES, "dtlb_misses"]
    dtlb = r["dtlb_misses"]
    assert dtlb.height == 6
    assert sorted(dtlb["collection_id"].unique()) == ["a", "b", "c"]
    # KernMLOps' README: a table, filtered to one program
    mine = dtlb.filter(pl.col("tgid") == 2)
    assert sorted(mine["collection_id"]) == ["a", "a", "b"]
    assert mine["cumulative_count"].to_list() == [20, 20, 20]
    assert r["block_io"]["benchmark"].to_list() == ["gap"]


def test_benchmark_name_keeps_one_benchmark(curated: Path) -> None:
    r = di.read_parquet_dir(curated, benchmark_name="gap")
    assert set(r) == {*BLOCK_IO_TABLES, "dtlb_misses"}
    assert r["dtlb_misses"]["tgid"].to_list() == [2, 3]
    # KernMLOps spells it linux_build
    r = di.read_parquet_dir(str(curated), benchmark_name="linux_build")
    assert list(r) == ["dtlb_misses"] and r["dtlb_misses"]["tgid"].to_list() == [4]
    with pytest.raises(CollectionError, match="no collections of benchmark 'redis'"):
        di.read_parquet_dir(curated, benchmark_name="redis")
    with pytest.raises(CollectionError, match="no collections"):
        di.read_parquet_dir(curated / "benchmark=faux" / "collection_id=a" / "dtlb_misses")


def test_benchmark_name_by_position_as_kernmlops_calls_it(curated: Path) -> None:
    """KernMLOps' signature is read_parquet_dir(data_dir, benchmark_name): either
    argument by position or by name, the same tables."""

    def heights(r: dict[str, pl.DataFrame]) -> dict[str, int]:
        return {table: frame.height for table, frame in r.items() if table != "block_io_latency"}

    by_name = di.read_parquet_dir(curated, benchmark_name="gap")
    assert heights(by_name) == {"block_io": 1, "block_io_queue_length": 1, "dtlb_misses": 2}
    for r in (
        di.read_parquet_dir(str(curated), "gap"),
        di.read_parquet_dir(data_dir=curated, benchmark_name="gap"),
    ):
        assert heights(r) == heights(by_name)
        assert r["dtlb_misses"]["tgid"].to_list() == [2, 3]
    everything = di.read_parquet_dir(curated, None)
    assert heights(everything) == {"block_io": 1, "block_io_queue_length": 1, "dtlb_misses": 6}


def test_the_data_folder_holding_curated_reads_as_curated(curated: Path) -> None:
    """data/ (as `collect -o data` writes it, and as push takes it) reads as data/curated."""
    r = di.read_parquet_dir(curated.parent)
    assert {k: v.height for k, v in r.items()} == dict.fromkeys(BLOCK_IO_TABLES, 1) | {
        "dtlb_misses": 6
    }
    r = di.read_parquet_dir(curated.parent, benchmark_name="gap")
    assert r["dtlb_misses"]["tgid"].to_list() == [2, 3]


def test_a_collection_is_a_mapping(curated: Path) -> None:
    col = read_collection(curated / "benchmark=gap" / "collection_id=b")
    assert sorted(col.keys()) == ["block_io", "dtlb_misses"]
    assert "block_io" in col and "nope" not in col
    assert dict(col.items())["block_io"]["bytes"].to_list() == [4096]
    assert [f.height for f in col.values()] == [col[k].height for k in col]
    assert col.get("nope") is None
    assert col == col and col != read_collection(col.path)
    assert len({col}) == 1


def _original(data: Path) -> Path:
    """A data folder as KernMLOps' own collect wrote it: data/curated/<table>/
    <collection_id>.<benchmark>.parquet, each table carrying its collection_id."""
    curated = data / "curated"
    for table, cid, bench, tgids in (
        ("dtlb_misses", "c1", "faux", [1, 2]),
        ("dtlb_misses", "c2", "linux_build", [3]),
        ("system_info", "c1", "faux", [0]),
    ):
        (curated / table).mkdir(parents=True, exist_ok=True)
        pl.DataFrame({"tgid": tgids, "collection_id": [cid] * len(tgids)}).write_parquet(
            curated / table / f"{cid}.{bench}.parquet"
        )
    return curated


def test_kernmlops_own_layout_is_read_by_its_own_call(tmp_path: Path) -> None:
    """A KernMLOps user's data, in KernMLOps' layout, read by KernMLOps' call (it was
    'no collections (expected benchmark=<b>/collection_id=<id>/ folders ...)')."""
    curated = _original(tmp_path / "data")
    for root in (curated, curated.parent, str(curated)):
        r = di.read_parquet_dir(root)
        assert sorted(r) == ["dtlb_misses", "system_info"]
        dtlb = r["dtlb_misses"].sort("tgid")
        assert dtlb.columns[:2] == ["benchmark", "collection_id"]
        assert dtlb.rows() == [("faux", "c1", 1), ("faux", "c1", 2), ("linux_build", "c2", 3)]
    # the benchmark as KernMLOps names it in the files, or as kernmlops does
    for name in ("linux_build", "linux-build"):
        r = di.read_parquet_dir(curated, name)
        assert list(r) == ["dtlb_misses"] and r["dtlb_misses"]["tgid"].to_list() == [3]
    with pytest.raises(CollectionError, match="no collections of benchmark 'redis'"):
        di.read_parquet_dir(curated, "redis")
    # a file that is not Parquet: one line naming the table
    (curated / "dtlb_misses" / "c3.faux.parquet").write_bytes(b"not parquet")
    with pytest.raises(CollectionError, match="cannot read table 'dtlb_misses'"):
        di.read_parquet_dir(curated)


def test_kernmlops_own_layout_of_a_user_is_read_by_root_through_no_link_of_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's KernMLOps data with a file linked to a root-only file: refused in one
    line naming it, as a part of a collection is, not read into root's frames."""
    from tests.conftest import skip_here

    if os.geteuid() != 0:
        skip_here("plays a user's folder read by root: needs root")
    monkeypatch.delenv("SUDO_UID", raising=False)
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    pl.DataFrame({"tgid": [666], "collection_id": ["s"]}).write_parquet(secret / "s.parquet")
    curated = _original(tmp_path / "alice" / "data")
    linked = curated / "dtlb_misses" / "s.faux.parquet"
    linked.symlink_to(secret / "s.parquet")
    for path in [curated.parent.parent, *curated.parent.parent.rglob("*")]:
        os.chown(path, 65534, 65534, follow_symlinks=False)
    with pytest.raises(CollectionError, match=f"{linked}: a link: as root"):
        di.read_parquet_dir(curated)


# -- block_io in KernMLOps' shape ------------------------------------------------------


def test_block_io_in_kernmlops_shape() -> None:
    """Each KernMLOps column from ours: the issue is the completion less the service
    time, device its dev_t, the flags string in its words; a completion never issued
    (a flush's parent) is in its latency table only, as its join kept none."""
    rows = _block_io_rows(
        ts_uptime_us=[5_000, 2_000, 3_000],
        op=["WRITE", "FLUSH", "READ"],
        op_flags=["WRITE|SYNC|IDLE|FUA", "FLUSH|PREFLUSH", "READ"],
        cmd_flags=[1 | 1 << 11 | 1 << 15 | 1 << 17, 2 | 1 << 18, 0],
        sector=[8, -1, 64],
        bytes=[16384, 0, 4097],
        segments=[3, 0, 2],
        issue_to_complete_us=[4_500, None, 100],
        alloc_to_complete_us=[4_600, None, 130],
        inflight=[2, None, 1],
        inflight_segments=[5, None, 2],
        inflight_4k_ios=[6, None, 2],
        cpu=[1, 0, 0],
        issue_cpu=[0, None, 1],
    ).with_columns(collection_id=pl.lit("c"))
    t = di.block_io_tables(rows)
    assert sorted(t) == BLOCK_IO_TABLES
    merged = t["block_io"]
    assert merged.columns[: len(di.KERNMLOPS_BLOCK_IO)] == list(di.KERNMLOPS_BLOCK_IO)
    kml = merged.select(di.KERNMLOPS_BLOCK_IO)
    assert all(
        dtype == (pl.String if c == "block_io_flags_string" else pl.Int64)
        for c, dtype in kml.schema.items()
    )
    # sorted by issue: the write (issued at 500) before the read (at 2,900)
    assert kml.rows() == [
        (0, 7 << 20 | 3, 8, 3, 16384, 500, 5_000, 4_600, 4_500, 4_500,
         1 | 1 << 11 | 1 << 15 | 1 << 17, "Idle-ForcedUnitAccess-Sync-Write", 5, 6),
        (1, 7 << 20 | 3, 64, 2, 4097, 2_900, 3_000, 130, 100, 100, 0, "Read", 2, 2),
    ]  # fmt: skip
    # ours beside, under our names
    assert merged["comm"].to_list() == ["dd", "dd"]
    assert merged["collection_id"].to_list() == ["c", "c"]
    assert merged["queue_to_issue_us"].to_list() == [2, 2]
    queue = t["block_io_queue_length"]
    assert queue["ts_uptime_us"].to_list() == [500, 2_900]
    assert queue["queue_length_4k_ios"].to_list() == [6, 2]
    assert queue["cpu"].to_list() == [0, 1]
    latency = t["block_io_latency"].sort("ts_uptime_us")
    # every completion, at its own time and CPU
    assert latency["ts_uptime_us"].to_list() == [2_000, 3_000, 5_000]
    assert latency["cpu"].to_list() == [0, 0, 1]
    assert latency["sector"].to_list() == [-1, 64, 8]  # KernMLOps' -1 for no sector
    assert latency["block_io_latency_us"].to_list() == [None, 100, 4_500]
    assert latency["block_latency_us"].to_list() == [None, 130, 4_600]


def test_block_io_of_an_older_collection() -> None:
    """A collection from before the allocation time, the queue's size and the CPUs
    reads too: those columns null, the rest as before."""
    t = di.block_io_tables(_block_io_rows())
    row = t["block_io"].row(0, named=True)
    assert (row["ts_uptime_us"], row["finish_ts_uptime_us"]) == (960, 1_000)
    assert row["block_io_latency_us"] == row["measured_latency_us"] == 40
    assert row["block_latency_us"] is None and row["queue_length_4k_ios"] is None
    assert row["cpu"] is None and row["inflight"] == 1
    assert di.block_io_tables(_block_io_rows().clear())["block_io"].height == 0


def test_block_io_of_older_and_newer_collections_in_one_folder(tmp_path: Path) -> None:
    """A folder holding a collection from before the added columns and one after: one
    table, the older one's rows null there."""
    added = {"alloc_to_complete_us": [50], "inflight_segments": [1], "inflight_4k_ios": [1],
             "cpu": [0], "issue_cpu": [1]}  # fmt: skip
    for cid, rows in (("old", _block_io_rows()), ("new", _block_io_rows(**added))):
        folder = tmp_path / "benchmark=faux" / f"collection_id={cid}"
        with ParquetSink(folder, cid) as sink:
            sink.write("block_io", rows)
        write_manifest(folder, {"collection_id": cid, "benchmark": "faux",
                                "tables": sink.files_written()})  # fmt: skip
    io = di.read_parquet_dir(tmp_path)["block_io"].sort("collection_id")
    assert io.select("collection_id", "block_latency_us", "queue_length_4k_ios", "cpu").rows() == [
        ("new", 50, 1, 1),
        ("old", None, None, None),
    ]


@pytest.mark.parametrize(
    ("op_flags", "expected"),
    [
        ("READ", "Read"),
        ("WRITE|SYNC|IDLE", "Idle-Sync-Write"),
        ("WRITE|SYNC|META|PRIO|NOMERGE|FUA|RAHEAD|BACKGROUND|NOWAIT",
         "NoWait-Background-ReadAhead-NoMerge-Priority-ForcedUnitAccess-Metadata-Sync-Write"),
        ("WRITE_ZEROES|NOUNMAP", "WriteZeros"),  # flags it had no word for: left out
        ("ZONE_APPEND", "Unknown"),
        ("OP4", "Unknown"),
        # a collector without BTF wrote cmd_flags in hex: KernMLOps' own numbers
        (hex(1 | 1 << 11 | 1 << 15), "Idle-Sync-Write"),
        (hex(9 | 1 << 19), "ReadAhead-WriteZeros"),
    ],
)  # fmt: skip
def test_kernmlops_flags_string(op_flags: str, expected: str) -> None:
    assert di.kernmlops_flags_string(op_flags) == expected


# -- a real collection against the kernel's disk statistics (root + BPF) ---------------

READS, READ_BYTES = 96, 32 << 10
WRITES, WRITE_BYTES = 64, 8 << 10


def test_a_damaged_collection_fails_the_read_or_is_skipped(curated: Path) -> None:
    """As KernMLOps' own call (one unreadable file fails the read), unless
    ``damaged="skip"``: the damaged collection is left out of its table, named in a
    warning, and the rest is read; its table gone where it was the only one."""
    from kernmlops.data import IncompleteCollectionWarning
    from tests.parquet_damage import flip_page_byte

    a = curated / "benchmark=faux" / "collection_id=a"
    flip_page_byte(a / "dtlb_misses" / "part-00000.parquet", "cumulative_count")
    with pytest.raises(CollectionError, match=r"part-00000.parquet is damaged: a page fails"):
        di.read_parquet_dir(curated)
    with pytest.warns(IncompleteCollectionWarning, match=f"^{a}: damaged, skipped"):
        r = di.read_parquet_dir(curated, damaged="skip")
    assert sorted(r) == ["block_io", "block_io_latency", "block_io_queue_length", "dtlb_misses"]
    assert sorted(r["dtlb_misses"]["collection_id"].unique()) == ["b", "c"]
    with pytest.warns(IncompleteCollectionWarning, match=f"^{a}: damaged, skipped"):
        assert di.read_parquet_dir(curated, "faux", damaged="skip") == {}


def test_a_damaged_file_of_kernmlops_own_layout_is_skipped(tmp_path: Path) -> None:
    from kernmlops.data import IncompleteCollectionWarning

    curated = _original(tmp_path / "data")
    bad = curated / "dtlb_misses" / "c3.faux.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.warns(IncompleteCollectionWarning, match=f"^{bad}: damaged, skipped"):
        r = di.read_parquet_dir(curated, damaged="skip")
    assert sorted(r["dtlb_misses"]["collection_id"]) == ["c1", "c1", "c2"]
