"""The shipped Spark job on a real standalone cluster (a master and a worker on this
machine: the test run's ``spark``, tests/spark.py): summaries and the MLLB data set over
a pushed dataset, compared with the same numbers computed from the source parts with
polars and numpy."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.collect.manifest import write_manifest
from kernmlops.data import read_parquet_dir
from kernmlops.fleet import open_dataset
from kernmlops.fleet.push import push
from tests.conftest import REQUIRE_BPF, needs_tools
from tests.fleet.conftest import T0, make_collection
from tests.parquet_damage import flip_page_byte

pytestmark = [
    needs_tools("java"),
    pytest.mark.skipif(
        importlib.util.find_spec("pyspark") is None and not REQUIRE_BPF,
        reason="pyspark is not installed (make test installs it)",
    ),
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(source root, published dataset): three collections, one of them an `lb collect`
    one, and the parts of a fourth whose push did not finish (no manifest, no index)."""
    tmp = tmp_path_factory.mktemp("fleet")
    src = tmp / "curated"
    make_collection(src, "c1", host="node-a", seed=1)
    # page faults sampled 1 in 4 (hooks.page_faults.sample_every): a row stands for 4
    sampled = {"hooks": {"page_faults": {"sample_every": 4}}}
    c2 = make_collection(src, "c2", host="node-b", seed=2, quanta=1500, config=sampled)
    # its benchmark ran 1.6 s of the collection's 2 s (the collector's start and its
    # last flush around it): the rates are per second of the benchmark
    manifest = json.loads((c2 / "manifest.json").read_text())
    manifest["benchmark"].update(started_uptime_us=T0, stopped_uptime_us=T0 + 1_600_000)
    write_manifest(c2, manifest)
    make_collection(src, "lb1", benchmark="lb-stress", host="node-a", seed=3, quanta=800, lb=600)
    dest = tmp / "dest"
    results, refused = push(sorted(src.glob("*/collection_id=*")), open_dataset(str(dest)))
    assert len(results) == 3 and not refused
    half = make_collection(tmp / "half", "half", seed=5)
    copy = dest / "benchmark=faux" / "collection_id=half"
    shutil.copytree(half, copy)
    (copy / "manifest.json").unlink()
    return src, dest


def test_the_job_on_a_standalone_cluster(spark, dataset: tuple[Path, Path], tmp_path: Path) -> None:
    from kernmlops.fleet.spark_job import read_table, run
    from kernmlops.lb.features import conform, float_features
    from kernmlops.lb.names import FEATURES
    from kernmlops.lb.pipeline import prepare

    src, dest = dataset
    assert spark.sparkContext.master.startswith("spark://127.0.0.1:")
    written = run(spark, str(dest), str(tmp_path / "out"))
    assert written == {"collections": 3, "quanta_by_comm": 9, "mllb": written["mllb"]}

    # the index is a table for Spark too, with natural types
    index = spark.read.parquet(f"{dest}/_index")
    types = dict(index.dtypes)
    assert types["started_at"] == "timestamp" and types["rows"] == "map<string,bigint>"
    assert sorted(r.collection_id for r in index.collect()) == ["c1", "c2", "lb1"]

    # every column read with its natural type: the unsigned 64-bit address is a bigint
    faults = read_table(spark, str(dest), "page_faults")
    assert dict(faults.dtypes)["address"] == "bigint"
    assert {r.address for r in faults.select("address").distinct().collect()} == {
        0xFFFF_8880_0000_1000 - 2**64
    }
    out = {name: pl.read_parquet(tmp_path / "out" / name / "*.parquet") for name in written}
    # the rows the job says it wrote are the rows in the files
    assert written == {name: frame.height for name, frame in out.items()}
    for name, frame in out.items():
        assert not [c for c, t in frame.schema.items() if isinstance(t, pl.Decimal)], name
    # the start: the index's UTC instant, written as one (Spark's default, INT96, reads
    # back as a time without its zone)
    starts = pl.read_parquet(dest / "_index" / "*.parquet").select("collection_id", "started_at")
    assert out["collections"].schema["started_at"] == pl.Datetime("us", "UTC")
    assert (
        out["collections"]
        .select("collection_id", "started_at")
        .sort("collection_id")
        .equals(starts.sort("collection_id"))
    )

    # per collection, against the source parts
    quanta = read_parquet_dir(src, "quanta_runtime")
    io = read_parquet_dir(src, "block_io")
    pf = read_parquet_dir(src, "page_faults")
    # the faults the kernel saw: a row of c2, sampled 1 in 4, stands for 4
    every = {"c1": 1, "c2": 4, "lb1": 1}
    rows = pf.group_by("collection_id").len()
    assert dict(out["collections"].select("collection_id", "faults").iter_rows()) == {
        cid: n * every[cid] for cid, n in rows.iter_rows()
    }
    # per second of c2's benchmark (its manifest's start and stop), else of the collection
    seconds = {"c1": 2.0, "c2": 1.6, "lb1": 2.0}
    counts = quanta.group_by("collection_id").len()
    assert dict(out["collections"].select("collection_id", "switches_per_s").iter_rows()) == {
        cid: pytest.approx(n / seconds[cid]) for cid, n in counts.iter_rows()
    }
    for row in out["collections"].iter_rows(named=True):
        cid = row["collection_id"]
        q = quanta.filter(pl.col("collection_id") == cid)
        lat = io.filter(pl.col("collection_id") == cid)["issue_to_complete_us"].to_numpy()
        assert row["quanta"] == q.height
        assert row["benchmark_s"] == (1.6 if cid == "c2" else None)
        assert row["faults_per_s"] == pytest.approx(row["faults"] / seconds[cid])
        assert row["fault_sample_every"] == every[cid]
        # no exact count in these manifests (made as before the hook kept one): rows x N,
        # an estimate where N > 1
        assert row["faults_estimated"] == (every[cid] > 1)
        assert row["block_io_p50_us"] == np.quantile(lat, 0.5, method="inverted_cdf")
        assert row["block_io_p99_us"] == np.quantile(lat, 0.99, method="inverted_cdf")
        assert row["host"] == {"c1": "node-a", "c2": "node-b", "lb1": "node-a"}[cid]

    # quanta per comm
    comms = read_parquet_dir(src, "process_trace").select("collection_id", "pid", "comm")
    queued = read_parquet_dir(src, "quanta_queued_time").join(comms, on=["collection_id", "pid"])
    quanta = quanta.join(comms, on=["collection_id", "pid"])
    for row in out["quanta_by_comm"].iter_rows(named=True):
        key = (pl.col("collection_id") == row["collection_id"]) & (pl.col("comm") == row["comm"])
        run_us = quanta.filter(key)["quanta_run_length_us"].to_numpy()
        wait_us = queued.filter(key)["quanta_queued_time_us"].to_numpy()
        assert row["quanta"] == len(run_us) and row["queued"] == len(wait_us)
        assert row["runtime_mean_us"] == pytest.approx(run_us.mean())
        assert row["runtime_p50_us"] == np.quantile(run_us, 0.5, method="inverted_cdf")
        assert row["runtime_p99_us"] == np.quantile(run_us, 0.99, method="inverted_cdf")
        assert row["queue_p99_us"] == np.quantile(wait_us, 0.99, method="inverted_cdf")

    # the MLLB data set: the rows and features kernmlops lb computes locally
    local = prepare(conform(read_parquet_dir(src, "lb_decisions")))
    got = out["mllb"].sort("ts_uptime_us") if "ts_uptime_us" in out["mllb"].columns else None
    assert got is None  # the data set is features and label only
    assert out["mllb"].height == local.height > 0
    assert set(out["mllb"]["collection_id"]) == {"lb1"}
    expected = np.sort(float_features(local), axis=0)
    assert np.allclose(np.sort(out["mllb"].select(FEATURES).to_numpy(), axis=0), expected)
    assert out["mllb"]["can_migrate"].sum() == local["can_migrate"].sum()


def test_a_second_run_in_one_session_sees_what_was_published_since(spark, tmp_path: Path) -> None:
    """The job's cached index goes with its run: Spark matches a later read of the same
    folder to a cache left behind, and a notebook running the job again after more
    pushes would summarise only the first collections."""
    from kernmlops.fleet.spark_job import run

    src, dest = tmp_path / "curated", str(tmp_path / "dest")
    push([make_collection(src, "a1", seed=1, quanta=300)], open_dataset(dest))
    assert run(spark, dest, str(tmp_path / "out"))["collections"] == 1
    push([make_collection(src, "a2", seed=2, quanta=300)], open_dataset(dest))
    assert run(spark, dest, str(tmp_path / "out"))["collections"] == 2


def test_a_table_with_no_input_leaves_no_earlier_runs_table_in_out(spark, tmp_path: Path) -> None:
    """OUT holds one run's tables: a run over a dataset without lb collections writes no
    mllb table, and removes the one an earlier run wrote there (it was kept, read as
    this run's MLLB data set beside this run's summaries)."""
    from kernmlops.fleet.spark_job import run

    out = tmp_path / "out"
    with_lb = _pushed(tmp_path / "a", ("lb1", {"benchmark": "lb-stress", "quanta": 300, "lb": 200}))
    assert set(run(spark, str(with_lb), str(out))) == {"collections", "quanta_by_comm", "mllb"}
    assert (out / "mllb").is_dir()
    without = _pushed(tmp_path / "b", ("c1", {"seed": 1, "quanta": 300}))
    assert set(run(spark, str(without), str(out))) == {"collections", "quanta_by_comm"}
    assert sorted(p.name for p in out.iterdir()) == ["collections", "quanta_by_comm"]
    assert pl.read_parquet(out / "collections" / "*.parquet")["collection_id"].to_list() == ["c1"]


def _pushed(tmp_path: Path, *collections: tuple[str, dict]) -> Path:
    src, dest = tmp_path / "curated", tmp_path / "dest"
    folders = [make_collection(src, cid, **kw) for cid, kw in collections]
    results, refused = push(folders, open_dataset(dest))
    assert len(results) == len(collections) and not refused
    return dest


def test_a_damaged_part_is_named_and_reindex_lets_the_job_skip_it(spark, tmp_path: Path) -> None:
    """A part Spark cannot read stops the job before it writes anything, with one line
    naming the file, its collection and what to do; after `fleet reindex` (which takes
    the collection out of the index) the job summarises the others."""
    from kernmlops.fleet.spark_job import JobError, run

    dest = _pushed(tmp_path, ("c1", {"seed": 1, "quanta": 300}), ("c2", {"seed": 2, "quanta": 300}))
    out = tmp_path / "out"
    earlier = out / "collections" / "part-0.parquet"  # a run's results from before
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"earlier")
    part = dest / "benchmark=faux" / "collection_id=c2" / "quanta_runtime" / "part-00000.parquet"
    os.truncate(part, part.stat().st_size // 2)
    with pytest.raises(JobError) as failed:
        run(spark, str(dest), str(out))
    assert str(failed.value) == (
        f"{part}: not a readable Parquet file (its footer cannot be read): collection c2 is "
        f"damaged: push it again from its source, or `kernmlops fleet reindex {dest}` takes "
        f"it out of the index (the job then skips it) (nothing written to {out})"
    )
    assert [p.name for p in out.rglob("*")] == ["collections", "part-0.parquet"]
    assert earlier.read_bytes() == b"earlier"

    assert CliRunner().invoke(cli, ["fleet", "reindex", str(dest)]).exit_code == 1
    assert run(spark, str(dest), str(out)) == {"collections": 1, "quanta_by_comm": 3}
    got = pl.read_parquet(out / "collections" / "*.parquet")
    assert got["collection_id"].to_list() == ["c1"] and got["quanta"].to_list() == [300]


def test_a_write_that_fails_keeps_the_tables_before_it_and_no_earlier_ones(
    spark, tmp_path: Path
) -> None:
    """A data page damaged by one byte (the footer whole, so found only as the rows are
    read, by its checksum: parquet-mr checks none unless told) fails the table being
    written: the tables written before it are kept, and OUT holds no table of an
    earlier run beside them. The line's advice is a reindex that reads the pages
    (a footers-only one would keep the collection); after it the job runs."""
    from kernmlops.fleet.spark_job import JobError, run

    dest = _pushed(tmp_path, ("lb1", {"benchmark": "lb-stress", "quanta": 300, "lb": 200}))
    out = tmp_path / "out"
    earlier = out / "mllb" / "part-0.parquet"
    earlier.parent.mkdir(parents=True)
    earlier.write_bytes(b"earlier")
    folder = dest / "benchmark=lb-stress" / "collection_id=lb1"
    [part] = (folder / "lb_decisions").glob("part-*.parquet")
    flip_page_byte(part, next(iter(pl.read_parquet_schema(part))))
    with pytest.raises(JobError) as failed:
        run(spark, str(dest), str(out))
    assert str(failed.value) == (
        f"{part}: not a readable Parquet file (a page fails its checksum): collection lb1 "
        "is damaged: push it again from its source, or `kernmlops fleet reindex --pages "
        f"{dest}` takes it out of the index (the job then skips it) (written: "
        f"{out}/collections, {out}/quanta_by_comm; not written: mllb, their folders "
        "removed: mllb)"
    )
    assert sorted(p.name for p in out.iterdir()) == ["collections", "quanta_by_comm"]
    assert pl.read_parquet(out / "collections" / "*.parquet")["collection_id"].to_list() == ["lb1"]
    assert CliRunner().invoke(cli, ["fleet", "reindex", "--pages", str(dest)]).exit_code == 1
    assert not (dest / "_index" / "lb1.parquet").exists()  # the job's next run skips it
