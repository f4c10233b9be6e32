"""The dataset's index: `kernmlops fleet ls` prints it, DuckDB reads it as a table, and
`fleet reindex` rebuilds it from the manifests (rows counted from the parts' footers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernmlops.cli import cli
from kernmlops.collect.manifest import read_manifest

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
        assert row["started_at"].startswith(manifest.started_at[:19].replace("T", " "))
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
