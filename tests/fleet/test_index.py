"""The dataset's index: `kernmlops fleet ls` prints it, DuckDB reads it as a table, and
`fleet reindex` rebuilds it from the manifests (rows counted from the parts' footers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.collect.manifest import read_manifest

# what a quick run says, however long a starved one takes (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("unhurried")

duckdb = pytest.importorskip("duckdb")


def test_fleet_ls_duckdb_and_reindex(fleet: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    listed = runner.invoke(cli, ["fleet", "ls", "--json", dest.as_uri()])
    assert listed.exit_code == 0, listed.output
    rows = {r["collection_id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert sorted(rows) == ["c1", "c2", "c3"]
    for cid, row in rows.items():
        [folder] = fleet.glob(f"*/collection_id={cid}")
        manifest = read_manifest(folder)
        assert row["rows"] == {t: r.rows for t, r in manifest.tables.items()}
        assert (row["host"], row["kernel"], row["cpu_model"], row["state"]) == (
            manifest.system["hostname"], manifest.system["kernel_release"],
            manifest.system["cpu_model"], "completed",
        )  # fmt: skip
        # ISO 8601 in UTC, whole seconds: the form jq's fromdateiso8601 reads
        started = datetime.fromisoformat(manifest.started_at).astimezone(UTC)
        assert row["started_at"] == started.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert time.strptime(row["started_at"], "%Y-%m-%dT%H:%M:%SZ")
    table = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert table.exit_code == 0 and "3 collections" in table.stdout and "node-b" in table.stdout
    types = dict(
        duckdb.sql(f"describe select * from read_parquet('{dest}/_index/*.parquet')")
        .fetchnumpy()
        .items()
    )
    kinds = dict(zip(types["column_name"], types["column_type"], strict=True))
    assert kinds["rows"] == "MAP(VARCHAR, BIGINT)" and kinds["started_at"].startswith("TIMESTAMP")
    # a collection deleted by hand and the index lost: reindex rebuilds what is there
    shutil.rmtree(dest / "_index")
    shutil.rmtree(dest / "benchmark=faux" / "collection_id=c2")
    rebuilt = runner.invoke(cli, ["fleet", "reindex", str(dest)])
    assert rebuilt.exit_code == 0 and "2 collections indexed" in rebuilt.stderr
    again = [
        json.loads(line)
        for line in runner.invoke(cli, ["fleet", "ls", "--json", str(dest)]).stdout.splitlines()
    ]
    assert {r["collection_id"]: r["rows"] for r in again} == {
        c: rows[c]["rows"] for c in ("c1", "c3")
    }


def test_fleet_ls_of_an_empty_or_bad_dataset(tmp_path: Path) -> None:
    runner = CliRunner()
    empty = runner.invoke(cli, ["fleet", "ls", str(tmp_path)])
    assert empty.exit_code == 0 and "no collections published" in empty.stderr
    bad = runner.invoke(cli, ["fleet", "ls", "nope://x"])
    assert bad.exit_code == 2 and "no filesystem for nope://" in bad.stderr
    assert "Traceback" not in bad.output


def one_error_line(result) -> str:
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_fleet_ls_and_reindex_of_what_is_not_a_dataset(fleet: Path, tmp_path: Path) -> None:
    """A typo must not read as an empty dataset: a missing path, a file, or a folder with
    neither _index/ nor benchmark=<b>/ in it is an error (exit 2); an empty folder (a push
    that published nothing leaves one) is an empty dataset."""
    runner = CliRunner()
    afile = tmp_path / "afile"
    afile.write_text("x")
    other = tmp_path / "other"
    (other / "notes").mkdir(parents=True)
    data = fleet.parent  # data/, holding curated/: local collections, not a dataset
    cases = {
        str(tmp_path / "nonexist"): "no such dataset",
        str(afile): "is a file, not a dataset",
        str(other): "not a dataset: no _index/ or benchmark=<b>/ folders in it",
        str(data): "kernmlops push",
    }
    for path, expected in cases.items():
        for args in (["ls", path], ["ls", "--json", path], ["reindex", path]):
            result = runner.invoke(cli, ["fleet", *args])
            assert result.exit_code == 2, (args, result.output)
            assert expected in one_error_line(result), args
            assert result.stdout == ""
    empty = tmp_path / "empty"
    empty.mkdir()
    listed = runner.invoke(cli, ["fleet", "ls", str(empty)])
    assert listed.exit_code == 0 and "no collections published" in listed.stderr
    rebuilt = runner.invoke(cli, ["fleet", "reindex", str(empty)])
    assert rebuilt.exit_code == 0 and "0 collections indexed" in rebuilt.stderr
    # a dataset copied without its index is one (reindex is for it), and ls says so
    dest = tmp_path / "dest"
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    shutil.rmtree(dest / "_index")
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 1 and "3 collection(s) with a manifest" in one_error_line(listed)
    rebuilt = runner.invoke(cli, ["fleet", "reindex", str(dest)])
    assert rebuilt.exit_code == 0 and "3 collections indexed" in rebuilt.stderr
    assert runner.invoke(cli, ["fleet", "ls", str(dest)]).exit_code == 0


def test_fleet_ls_of_collections_never_indexed_says_how_to_index_them(
    fleet: Path, tmp_path: Path
) -> None:
    """benchmark=<b>/ folders and no _index/: a collector's own folder (data/curated) or
    a dataset copied without its index. `fleet ls` says how many collections are there
    and the commands that index or publish them, as a warning (they are not listed:
    exit 1); folders a push is still filling (parts, no manifest yet) are no collection
    and get no such hint."""
    runner = CliRunner()
    for args in (["ls", str(fleet)], ["ls", "--json", str(fleet)]):
        listed = runner.invoke(cli, ["fleet", *args])
        assert listed.exit_code == 1, listed.output
        assert listed.stdout == ""
        assert one_error_line(listed) == (
            f"warning: {fleet}: no collections published (no index), but 3 collection(s) "
            f"with a manifest are here: `kernmlops fleet reindex {fleet}` indexes them "
            f"where they are, or `kernmlops push {fleet} DEST` publishes them to a "
            "dataset (local collections)"
        )
    # a push under way: the first collection's parts copied, its manifest not yet
    dest = tmp_path / "dest"
    [c1] = fleet.glob("*/collection_id=c1")
    shutil.copytree(c1, dest / c1.parent.name / c1.name,
                    ignore=shutil.ignore_patterns("manifest.json"))  # fmt: skip
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout == "" and listed.stderr.strip() == (
        f"no collections published at {dest} (1 collection folder(s) without a manifest: "
        "a push under way, or an interrupted one, which running it again resumes)"
    )
    # something else at the manifest's name is no push under way: reindex names it
    odd = tmp_path / "odd"
    shutil.copytree(c1, odd / c1.parent.name / c1.name,
                    ignore=shutil.ignore_patterns("manifest.json"))  # fmt: skip
    os.mkfifo(odd / c1.parent.name / c1.name / "manifest.json")
    listed = runner.invoke(cli, ["fleet", "ls", str(odd)])
    assert listed.exit_code == 1, listed.output
    assert "1 collection(s) with a manifest are here: `kernmlops fleet reindex" in listed.stderr
    # the push done: listed
    assert runner.invoke(cli, ["push", str(c1), str(dest)]).exit_code == 0
    listed = runner.invoke(cli, ["fleet", "ls", "--json", str(dest)])
    assert listed.exit_code == 0 and json.loads(listed.stdout)["collection_id"] == "c1"


def test_fleet_ls_of_a_damaged_index_file(fleet: Path, tmp_path: Path) -> None:
    """A damaged index file is one collection's row: the others are listed, the damaged
    file named in one warning with the command that rebuilds it, and the exit code is 1;
    `fleet reindex` rewrites it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernmlops.fleet import PublishError, open_dataset
    from kernmlops.fleet.index import read_index

    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    c2 = dest / "_index" / "c2.parquet"
    with open(c2, "r+b") as f:
        f.truncate(100)
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    assert [line.split()[1] for line in listed.stdout.splitlines()[2:]] == ["c1", "c3"]
    [warning] = listed.stderr.splitlines()
    assert warning.startswith(f"warning: {c2}: not a readable index file (Parquet magic")
    assert f"`kernmlops fleet reindex {dest}`" in warning
    as_json = runner.invoke(cli, ["fleet", "ls", "--json", str(dest)])
    assert as_json.exit_code == 1 and len(as_json.stderr.splitlines()) == 1
    assert [json.loads(line)["collection_id"] for line in as_json.stdout.splitlines()] == [
        "c1", "c3",
    ]  # fmt: skip
    # the library call raises, naming the file, unless told what to do with it
    with pytest.raises(PublishError, match=r"c2\.parquet: not a readable index file"):
        read_index(open_dataset(dest))
    # a Parquet file that is not an index row, and every file damaged: no rows, no
    # "no collections published", one warning each
    pq.write_table(pa.table({"x": [1]}), dest / "_index" / "c1.parquet")
    (dest / "_index" / "c3.parquet").write_bytes(b"")
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 1 and listed.stdout == ""
    assert len(listed.stderr.splitlines()) == 3 and "no collection_id" in listed.stderr
    rebuilt = runner.invoke(cli, ["fleet", "reindex", str(dest)])
    assert rebuilt.exit_code == 0 and "3 collections indexed" in rebuilt.stderr
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 0 and listed.stderr == ""
    assert "3 collections" in listed.stdout


def test_fleet_reindex_takes_a_damaged_collection_out_of_the_index(
    fleet: Path, tmp_path: Path
) -> None:
    """A damaged manifest or part skips its collection, named in one warning each, and
    the rest is indexed (exit 1). The skipped collection's row is removed, so that every
    reader of the index skips it, and `fleet ls` names it (exit 1) until a push copies
    it whole again, or it is deleted and the dataset reindexed."""
    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    c2 = dest / "benchmark=faux" / "collection_id=c2"
    (c2 / "manifest.json").write_text("{bad\n")
    c3 = dest / "benchmark=stress-ng" / "collection_id=c3"
    part = sorted((c3 / "quanta_runtime").glob("part-*.parquet"))[0]
    data = bytearray(part.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer + 4 : -12] = b"\xff" * (footer - 8)  # the footer's thrift, overwritten
    part.write_bytes(bytes(data))  # the same size as the source's

    def reindexed(*damaged: Path) -> None:
        result = runner.invoke(cli, ["fleet", "reindex", str(dest)])
        assert result.exit_code == (1 if damaged else 0), result.output
        assert "Traceback" not in result.output
        *warnings, summary = result.stderr.splitlines()
        assert [w.split(": ", 2)[1] for w in warnings] == [str(d) for d in damaged]
        assert all("not indexed, damaged (its row, if any, removed)" in w for w in warnings)
        if c2 in damaged:
            assert "manifest.json: the manifest is not valid JSON" in warnings[0]
        if c3 in damaged:
            assert f"quanta_runtime/{part.name}: not a readable Parquet file" in warnings[-1]
        assert f"{len(damaged)} damaged and skipped" in summary or not damaged, summary

    def listed() -> tuple[int, list[str], list[str]]:
        """ls's exit code, the collections it lists, the folders it warns about."""
        result = runner.invoke(cli, ["fleet", "ls", "--json", str(dest)])
        assert "Traceback" not in result.output
        ids = [json.loads(line)["collection_id"] for line in result.stdout.splitlines()]
        return result.exit_code, ids, [w.split(": ", 2)[1] for w in result.stderr.splitlines()]

    reindexed(c2, c3)
    # the rows the push wrote are gone: the index is what a reader of it sees
    assert listed() == (1, ["c1"], [str(c2), str(c3)])
    index = duckdb.sql(f"select collection_id from read_parquet('{dest}/_index/*.parquet')")
    assert index.fetchall() == [("c1",)]
    shown = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert shown.exit_code == 1 and [line.split()[1] for line in shown.stdout.splitlines()[2:]] == [
        "c1"
    ]
    warning = shown.stderr.splitlines()[1]
    assert warning.startswith(
        f"warning: {c3}: damaged (quanta_runtime/{part.name}: not a readable Parquet file ("
    )
    assert warning.endswith(
        "), left out of the index: push it again from its source, or delete it and run "
        f"`kernmlops fleet reindex {dest}`"
    )
    # a push copies the damaged collection whole (its damaged part has the source's
    # size: a push would otherwise take it for copied), and it is listed again
    [source] = fleet.glob("*/collection_id=c3")
    pushed = runner.invoke(cli, ["push", str(source), str(dest)])
    copied = pushed.stderr.splitlines()[0]
    assert pushed.exit_code == 0 and copied.startswith("c3: ") and "already" not in copied
    assert part.read_bytes() == (source / part.relative_to(c3)).read_bytes()
    assert listed() == (1, ["c1", "c3"], [str(c2)])
    reindexed(c2)
    assert listed() == (1, ["c1", "c3"], [str(c2)])
    # with the index lost, the damaged collection still has no row
    shutil.rmtree(dest / "_index")
    reindexed(c2)
    assert listed() == (1, ["c1", "c3"], [str(c2)])
    # every collection left damaged: ls names it, not "collections never indexed"
    shutil.rmtree(dest / "benchmark=faux" / "collection_id=c1")
    shutil.rmtree(c3)
    reindexed(c2)
    assert listed() == (1, [], [str(c2)])
    # deleted, and reindexed: nothing to warn about
    shutil.rmtree(c2)
    reindexed()
    assert listed() == (0, [], [])
    assert not list((dest / "_damaged").iterdir())


def test_fleet_reindex_finds_a_part_damaged_inside_a_page(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A byte flipped inside a page of a published part (the footer whole, the size the
    source's): reindex --pages reads every page against its checksum and leaves the
    collection out, naming the part; a reindex without it reads the footers only. A
    collection written without checksums (an older kernmlops) is indexed."""
    from kernmlops.collect import pagecheck
    from tests.fleet.conftest import make_collection
    from tests.parquet_damage import flip_page_byte

    monkeypatch.setitem(pagecheck.WRITE, "write_page_checksum", False)
    make_collection(fleet, "old", seed=5)
    monkeypatch.undo()
    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    c3 = dest / "benchmark=stress-ng" / "collection_id=c3"
    part = c3 / "page_faults" / "part-00000.parquet"
    flip_page_byte(part, "address", row_group=1)
    result = runner.invoke(cli, ["fleet", "reindex", "--pages", str(dest)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.stderr.splitlines() == [
        f"warning: {c3}: not indexed, damaged (its row, if any, removed): page_faults/"
        f"{part.name}: a page fails its checksum (row group 1, column 'address')",
        f"3 collections indexed, 1 damaged and skipped, 0 stale rows removed ({dest})",
    ]
    assert sorted(p.name for p in (dest / "_index").iterdir()) == [
        "c1.parquet", "c2.parquet", "old.parquet"
    ]  # fmt: skip
    quick = runner.invoke(cli, ["fleet", "reindex", str(dest)])
    assert quick.exit_code == 0, quick.output
    assert quick.stderr.splitlines() == [f"4 collections indexed, 0 stale rows removed ({dest})"]


def test_a_read_error_while_checking_pages_is_no_damage(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow raises OSError for a page failing its checksum and for a lost connection
    alike: the connection's error stops the reindex (no collection named damaged).
    Parts larger than read whole in one request, as here every part."""
    from kernmlops.fleet import index
    from kernmlops.fleet.store import open_dataset
    from tests.parquet_damage import flip_page_byte

    monkeypatch.setattr(index, "_WHOLE_PART", 0)
    dest = tmp_path / "dest"
    assert CliRunner().invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    dataset = open_dataset(str(dest))
    [part] = dest.glob("*/collection_id=c1/quanta_runtime/part-00000.parquet")
    path, size = dataset.path(str(part.relative_to(dest))), part.stat().st_size
    index._part_pages(dataset, path, size)  # whole: passes
    flip_page_byte(part, "pid", row_group=3)
    with pytest.raises(index._Damaged, match=r"fails its checksum \(row group 3, column 'pid'\)"):
        index._part_pages(dataset, path, size)

    class Lost:
        """The remote file, its connection lost after the footer was read."""

        def __init__(self, file: object) -> None:
            self.file = file

        def read(self, n: int = -1) -> bytes:
            raise ConnectionResetError(104, "Connection reset by peer")

        def __getattr__(self, name: str) -> object:
            return getattr(self.file, name)

    made = index._Recorded.__init__
    monkeypatch.setattr(index._Recorded, "__init__", lambda self, f: made(self, Lost(f)))
    with pytest.raises(ConnectionResetError):
        index._part_pages(dataset, path, size)
    result = CliRunner().invoke(cli, ["fleet", "reindex", "--pages", str(dest)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = result.stderr.splitlines()
    assert line.startswith(f"error: cannot reindex {dest}: ") and "reset by peer" in line, line
    assert not (dest / "_damaged").exists()


def test_fleet_reindex_names_a_manifest_that_is_no_plain_file_or_too_large(
    fleet: Path, tmp_path: Path
) -> None:
    """A FIFO at a collection's manifest.json (anyone who writes in the dataset can put
    one there) is a damaged collection, named as one, never "no manifest" nor a read
    that waits for a writer for ever; a manifest (sparse) or an index row made huge is
    named by its limit, never read whole."""
    import os

    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    c2 = dest / "benchmark=faux" / "collection_id=c2"
    (c2 / "manifest.json").unlink()
    os.mkfifo(c2 / "manifest.json")
    c3 = dest / "benchmark=stress-ng" / "collection_id=c3"
    os.truncate(c3 / "manifest.json", (16 << 20) + 1)
    done = subprocess.run(
        [sys.executable, "-m", "kernmlops", "fleet", "reindex", str(dest)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    *warnings, summary = done.stderr.splitlines()
    assert warnings == [
        f"warning: {c}: not indexed, damaged (its row, if any, removed): manifest.json: {why}"
        for c, why in [(c2, "not a plain file"), (c3, "over the 16.0 MiB limit")]
    ], done.stderr
    assert "1 collections indexed" in summary and "2 damaged and skipped" in summary, summary
    os.truncate(dest / "_index" / "c1.parquet", (16 << 20) + 1)
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 1 and "Traceback" not in listed.output
    warning = listed.stderr.splitlines()[0]
    c1 = dest / "_index" / "c1.parquet"
    assert "c3: damaged (manifest.json: over the 16.0 MiB limit)" in listed.stderr
    os.truncate(dest / "_damaged" / "c3.json", (1 << 20) + 1)  # its marker: not read whole
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert "c3: damaged (its marker _damaged/c3.json is not readable)" in listed.stderr
    warning = listed.stderr.splitlines()[0]
    assert warning.startswith(
        f"warning: {c1}: not a readable index file (over the 16.0 MiB limit of an index row)"
    ), listed.stderr


def test_fleet_ls_table_lines_up_and_reads_an_older_index_file(fleet: Path, tmp_path: Path) -> None:
    """The listing is plain aligned columns; an index file written before a column existed
    (or with another integer type) is read with the missing column as null."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dest = tmp_path / "dest"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    # c2's row as an older kernmlops wrote it: no kernmlops_version, logical_cpus int64
    old = pq.read_table(dest / "_index" / "c2.parquet").drop_columns(["kernmlops_version"])
    k = old.column_names.index("logical_cpus")
    old = old.set_column(k, "logical_cpus", old.column(k).cast(pa.int64()))
    pq.write_table(old, dest / "_index" / "c2.parquet")
    listed = runner.invoke(cli, ["fleet", "ls", str(dest)])
    assert listed.exit_code == 0, listed.output
    title, head, *lines = listed.stdout.splitlines()
    assert title == f"3 collections at {dest}"
    assert head.split() == [
        "benchmark", "collection_id", "host", "kernel", "cpu", "started", "state", "rows",
        "tables",
    ]  # fmt: skip
    # started 2026-11-02, -03, -04 (seeds 1, 2, 3): ordered by start
    assert [line.split()[1] for line in lines] == ["c1", "c2", "c3"]
    c2 = lines[1].split()
    assert c2[2:4] == ["node-b", "6.1.0-node-b"] and "CPU of node-b x2" in lines[1]
    # quanta_runtime and quanta_queued_time 1,500 each, 500 faults, 3 processes, 50 I/Os
    assert c2[-2:] == [f"{1500 * 2 + 500 + 3 + 50:,}", "5"]
    # every row's cells start where the header's do
    for name in ("host", "started", "state"):
        at = head.index(name)
        assert all(line[at - 2 : at] == "  " and line[at] != " " for line in lines)
    # the rows right-aligned under their header
    assert {len(line) for line in lines} == {len(head)}
    rows = {
        r["collection_id"]: r
        for r in map(
            json.loads, runner.invoke(cli, ["fleet", "ls", "--json", str(dest)]).stdout.splitlines()
        )
    }
    assert rows["c2"]["kernmlops_version"] is None and rows["c2"]["logical_cpus"] == 2
    assert rows["c1"]["kernmlops_version"] == "0.1.0"
    assert rows["c2"]["started_at"] == "2026-11-03T10:00:00Z"
    assert rows["c2"]["stopped_at"] == "2026-11-03T10:00:02Z"


def test_fleet_ls_imports_neither_pandas_nor_pydantic(fleet: Path, tmp_path: Path) -> None:
    """`fleet ls` starts without what it does not need: pyarrow.dataset and a zoned
    timestamp's to_pylist import pandas, a manifest pydantic (together over a second on a
    small machine)."""
    dest = tmp_path / "dest"
    assert CliRunner().invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    for args in (["fleet", "ls", str(dest)], ["fleet", "ls", "--json", str(dest)]):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "kernmlops", *args],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        assert "node-b" in done.stdout
        imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
        assert {"pyarrow", "kernmlops.fleet.index"} <= imported
        assert not imported & {"pandas", "pydantic", "pyarrow.dataset", "rich"}, args


def test_fleet_ls_and_reindex_over_s3_name_what_is_damaged(fleet: Path, s3) -> None:
    """Over an object store: a prefix with nothing under it is no dataset, a damaged index
    file and a damaged manifest are named, the rest listed and indexed (parts' footers
    read by range)."""
    bucket, client = s3
    uri = f"s3://{bucket}/lab/fleet"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), uri]).exit_code == 0
    missing = runner.invoke(cli, ["fleet", "ls", f"s3://{bucket}/lab/nope"])
    assert missing.exit_code == 2 and one_error_line(missing) == (
        f"error: s3://{bucket}/lab/nope: no such dataset: no object under this prefix "
        "(nothing was published there, and an object store keeps no empty folder): "
        "check the URI"
    )
    for where in (f"s3://{bucket}-nope/lab/fleet", f"s3://{bucket}-nope"):
        no_bucket = runner.invoke(cli, ["fleet", "ls", where])
        assert no_bucket.exit_code == 2 and one_error_line(no_bucket) == (
            f"error: {where}: no such dataset: the bucket '{bucket}-nope' does not exist: "
            "check the URI"
        )
    client.put_object(Bucket=bucket, Key="lab/fleet/_index/c1.parquet", Body=b"PAR1 damaged")
    prefix = "lab/fleet/benchmark=faux/collection_id=c2"
    client.put_object(Bucket=bucket, Key=f"{prefix}/manifest.json", Body=b"{bad")
    listed = runner.invoke(cli, ["fleet", "ls", "--json", uri])
    assert listed.exit_code == 1 and "_index/c1.parquet: not a readable index file" in (
        listed.stderr
    )
    assert [json.loads(line)["collection_id"] for line in listed.stdout.splitlines()] == [
        "c2", "c3",
    ]  # fmt: skip
    rebuilt = runner.invoke(cli, ["fleet", "reindex", uri])
    assert rebuilt.exit_code == 1, rebuilt.output
    [warning, summary] = rebuilt.stderr.splitlines()
    assert f"{uri}/benchmark=faux/collection_id=c2: not indexed, damaged" in warning
    assert summary.startswith("2 collections indexed, 1 damaged and skipped")
    # the damaged collection has no row, and is named
    listed = runner.invoke(cli, ["fleet", "ls", "--json", uri])
    rows = {r["collection_id"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert listed.exit_code == 1 and sorted(rows) == ["c1", "c3"]
    [warning] = listed.stderr.splitlines()
    assert warning.startswith(f"warning: {uri}/benchmark=faux/collection_id=c2: damaged (")
    [c1] = fleet.glob("*/collection_id=c1")
    assert rows["c1"]["rows"] == {t: r.rows for t, r in read_manifest(c1).tables.items()}


def readme_fleet_sql() -> list[str]:
    """The statements of the README's DuckDB recipe (its ```sql block under "Query a
    fleet's dataset"), as a reader copies them."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("### Query a fleet's dataset") :]
    block = section[section.index("```sql\n") + 7 : section.index("\n```", section.index("```sql"))]
    code = "\n".join(line for line in block.splitlines() if not line.startswith("--"))
    return [s.strip() for s in code.split(";") if s.strip()]


@pytest.mark.parametrize("pruning", [True, False], ids=["optimizer", "no-join-pruning"])
def test_the_readme_duckdb_recipe_leaves_out_damaged_collections(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pruning: bool
) -> None:
    """The README's queries, as written, over a dataset where `fleet reindex` found one
    collection's part and another's manifest damaged: the healthy collections' rows
    are all there, the damaged ones' are not, and no damaged file fails the query,
    whether DuckDB's optimizer prunes files by the index or not (an older DuckDB, or
    one that chose otherwise, does not)."""
    from tests.fleet.conftest import make_collection

    make_collection(fleet, "c4", host="node-c", seed=4, quanta=900)
    dest = tmp_path / "fleet"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    # c2's first quanta part: its footer overwritten (c2 sorts between c1 and c3, so a
    # min/max filter on collection_id would not skip it); c4's manifest not JSON
    part = sorted((dest / "benchmark=faux/collection_id=c2/quanta_runtime").glob("*.parquet"))[0]
    data = bytearray(part.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer + 4 : -12] = b"\xff" * (footer - 8)
    part.write_bytes(bytes(data))
    (dest / "benchmark=faux/collection_id=c4/manifest.json").write_text("{bad\n")
    assert runner.invoke(cli, ["fleet", "reindex", str(dest)]).exit_code == 1
    assert sorted(p.name for p in (dest / "_damaged").iterdir()) == ["c2.json", "c4.json"]
    # what each healthy collection holds, read from the source's own files
    expected = {
        cid: pl.read_parquet(next(fleet.glob(f"*/collection_id={cid}")) / "quanta_runtime").height
        for cid in ("c1", "c3")
    }
    monkeypatch.chdir(tmp_path)  # the recipe names the dataset 'fleet/'
    with duckdb.connect() as con:
        if not pruning:
            con.sql("set disabled_optimizers = 'join_filter_pushdown'")
        # in order, as a reader runs them: the index first, the table last
        first, *_, last = [con.sql(s) for s in readme_fleet_sql()]
        assert sorted(first.fetchall()) == [("node-a", "6.1.0-node-a", 2)]
        got = dict(last.fetchall())
    assert got == expected


#: the index's columns: fixed (see test_an_index_column_more_would_break_its_readers)
INDEX_COLUMNS = [
    "collection_id", "benchmark", "path", "host", "kernel", "cpu_model", "logical_cpus",
    "started_at", "stopped_at", "duration_s", "state", "exit_code", "rows", "total_rows",
    "files", "bytes", "kernmlops_version", "published_at",
]  # fmt: skip


@pytest.mark.parametrize("new_first", [False, True], ids=["old-first", "new-first"])
def test_an_index_column_more_would_break_its_readers(
    fleet: Path, tmp_path: Path, new_first: bool
) -> None:
    """Why the index has no recovered_from column (README): beside the rows older
    versions pushed, a row with a column more fails polars' read_parquet over the
    folder whichever file comes first, and DuckDB's read_parquet where it comes
    first; rows of one schema read in both. The columns stay as they are."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kernmlops.fleet.index import index_schema

    assert index_schema().names == INDEX_COLUMNS
    dest = tmp_path / "dest"
    assert CliRunner().invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    index = dest / "_index"
    polars_reads = lambda: pl.read_parquet(f"{index}/").height  # noqa: E731
    duckdb_reads = lambda: len(  # noqa: E731
        duckdb.sql(f"select * from read_parquet('{index}/*.parquet')").fetchall()
    )
    assert polars_reads() == duckdb_reads() == 3
    # a row as a version with the column would write it, named to sort first or last
    row = pq.read_table(index / "c1.parquet")
    newer = row.append_column("recovered_from", pa.array(["running"]))
    pq.write_table(newer, index / ("a0.parquet" if new_first else "z9.parquet"))
    with pytest.raises(pl.exceptions.PolarsError):
        polars_reads()
    if new_first:
        with pytest.raises(duckdb.Error, match="schema mismatch"):
            duckdb_reads()
    else:  # read with the first file's columns: the new one is not there
        assert duckdb_reads() == 4


def test_the_readme_recipe_says_what_recovered_collections_were_recovered_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's second DuckDB recipe, as written: each recovered collection of the
    index with its manifest's recovery (what it was recovered from, the error, the
    rows recover added); the others are not listed."""
    from tests.fleet.conftest import make_collection

    root = tmp_path / "data" / "curated"
    make_collection(root, "c1", seed=1)
    recovered = {
        "c2": {"recovered_from": "running", "error": None, "rows_added": {"quanta_runtime": 12}},
        "c3": {"recovered_from": "disk_full", "error": "no space left on /data",
               "rows_added": {"page_faults": 40}},
    }  # fmt: skip
    for seed, (cid, recovery) in enumerate(recovered.items(), 2):
        make_collection(root, cid, seed=seed, state="recovered", recovery=recovery)
    assert CliRunner().invoke(cli, ["push", str(root), str(tmp_path / "fleet")]).exit_code == 0
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("### Query a fleet's dataset") :]
    at = section.index("what each recovered collection was recovered from")
    block = section[at : section.index("\n```", at)]
    code = "\n".join(line for line in block.splitlines()[1:] if not line.startswith("--"))
    monkeypatch.chdir(tmp_path)  # the recipe names the dataset 'fleet/'
    with duckdb.connect() as con:
        *_, last = [con.sql(s) for s in code.split(";") if s.strip()]
        got = last.fetchall()
    assert [(cid, frm, err, {k: v for k, v in added.items() if v is not None})
            for cid, frm, err, added in got] == [
        (cid, r["recovered_from"], r["error"], r["rows_added"]) for cid, r in recovered.items()
    ]  # fmt: skip


def help_fleet_sql(dataset: Path) -> list[str]:
    """The DuckDB statements `kernmlops fleet --help` shows, URI replaced by ``dataset``."""
    text = CliRunner().invoke(cli, ["fleet", "--help"]).stdout
    block = text[text.index("duckdb:") + len("duckdb:") : text.index("spark:")]
    statements: list[str] = []
    for line in map(str.strip, block.splitlines()):
        if line.startswith(("select ", "set ")) or not statements:
            statements.append(line)
        else:  # a statement's next line
            statements[-1] += f" {line}"
    return [s.rstrip(";").replace("URI", str(dataset)) for s in statements if s]


def test_the_help_duckdb_recipe_reads_the_indexed_collections_only(
    fleet: Path, tmp_path: Path
) -> None:
    """`fleet --help`'s DuckDB statements, as a reader copies them, over a dataset where a
    push is under way (parts, no manifest, no index row) and `fleet reindex` took a
    damaged collection out of the index: the table holds the indexed collections' rows
    and nothing of the others (a glob over the dataset read the push under way and
    failed on the damaged part)."""
    from tests.fleet.conftest import make_collection

    dest = tmp_path / "fleet"
    runner = CliRunner()
    assert runner.invoke(cli, ["push", str(fleet), str(dest)]).exit_code == 0
    under_way = dest / "benchmark=faux" / "collection_id=c9"
    shutil.copytree(make_collection(tmp_path / "src", "c9", seed=9, quanta=700), under_way)
    (under_way / "manifest.json").unlink()
    part = sorted((dest / "benchmark=faux/collection_id=c2/quanta_runtime").glob("*.parquet"))[0]
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    assert runner.invoke(cli, ["fleet", "reindex", str(dest)]).exit_code == 1
    expected = {
        cid: pl.read_parquet(next(fleet.glob(f"*/collection_id={cid}")) / "quanta_runtime").height
        for cid in ("c1", "c3")
    }
    statements = help_fleet_sql(dest)
    assert any("quanta_runtime" in s for s in statements)
    with duckdb.connect() as con:
        results = [con.sql(s) for s in statements]
        index = results[0].fetchall()
        assert sorted(row[0] for row in index) == ["c1", "c3"]
        got = dict(results[-1].aggregate("collection_id, count(*)").fetchall())
    assert got == expected
