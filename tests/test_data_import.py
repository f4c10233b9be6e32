"""kernmlops.data_import: KernMLOps' read_parquet_dir(path) -> {table: DataFrame} over
every collection, its README's use (filter a table by tgid), and Collection as a mapping."""

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


def _collection(root: Path, benchmark: str, cid: str, tgids: list[int]) -> None:
    folder = root / f"benchmark={benchmark}" / f"collection_id={cid}"
    with ParquetSink(folder, cid) as sink:
        sink.write(
            "dtlb_misses",
            pl.DataFrame({"tgid": tgids, "cumulative_count": [10 * t for t in tgids]}),
        )
        if benchmark == "gap":
            sink.write("block_io", pl.DataFrame({"tgid": [7], "bytes": [4096]}))
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
    assert sorted(r.keys()) == ["block_io", "dtlb_misses"]
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
    assert set(r) == {"block_io", "dtlb_misses"}
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
        return {table: frame.height for table, frame in r.items()}

    by_name = di.read_parquet_dir(curated, benchmark_name="gap")
    assert heights(by_name) == {"block_io": 1, "dtlb_misses": 2}
    for r in (
        di.read_parquet_dir(str(curated), "gap"),
        di.read_parquet_dir(data_dir=curated, benchmark_name="gap"),
    ):
        assert heights(r) == heights(by_name)
        assert r["dtlb_misses"]["tgid"].to_list() == [2, 3]
    everything = di.read_parquet_dir(curated, None)
    assert heights(everything) == {"block_io": 1, "dtlb_misses": 6}


def test_the_data_folder_holding_curated_reads_as_curated(curated: Path) -> None:
    """data/ (as `collect -o data` writes it, and as push takes it) reads as data/curated."""
    r = di.read_parquet_dir(curated.parent)
    assert {k: v.height for k, v in r.items()} == {"block_io": 1, "dtlb_misses": 6}
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
    assert sorted(r) == ["block_io", "dtlb_misses"]
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
